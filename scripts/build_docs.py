"""Build the API reference (docs/reference/) from the package's docstrings, every warning an error.

    python scripts/build_docs.py [OUTPUT_DIR]     (default: build/docs/reference, HTML)

One function, :func:`build`, used by both callers: nox's ``docs`` session (``./dev nox -s docs``)
and scripts/run_tests.py, whose default run (``./dev test``, CI) ends with this build, so a
docstring that Sphinx cannot read fails CI the way a failing test does.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout import REPO

SOURCE = REPO / "docs" / "reference"
DEFAULT_OUTPUT = REPO / "build" / "docs" / "reference"


def sphinx_command(
    output: Path, doctrees: Path, source: Path = SOURCE, python: str = sys.executable
) -> List[str]:
    """The sphinx-build command line: HTML, fresh environment (-E), warnings as errors (-W).

    ``--keep-going`` reports every warning of the run, not just the first, before failing.
    """
    return [
        python,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-E",
        "-W",
        "--keep-going",
        "-q",
        "-d",
        str(doctrees),
        str(source),
        str(output),
    ]


def build(output: Path = DEFAULT_OUTPUT, source: Optional[Path] = None) -> int:
    """Run Sphinx over ``source`` (default docs/reference/) into ``output``; return its exit code.

    0 means built without a single warning.

    Sphinx prints each warning (file, line, what) on stderr; the doctrees (Sphinx's cache) go to
    a temporary folder so that nothing stale is reused.
    """
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="demb-doctrees-") as doctrees:
        command = sphinx_command(output, Path(doctrees), source or SOURCE)
        return subprocess.call(command, cwd=REPO)


def main(argv: Optional[List[str]] = None) -> int:
    """Build into the folder given on the command line (default build/docs/reference)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(__doc__, file=sys.stderr)
        return 2
    output = Path(args[0]).resolve() if args else DEFAULT_OUTPUT
    code = build(output)
    if code == 0:
        print(f"API reference: {output / 'index.html'}", file=sys.stderr)
    else:
        print(
            f"error: the API reference did not build cleanly (sphinx exit {code})", file=sys.stderr
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
