"""Build the wheels (and source distributions) of the core and every plugin.

    python scripts/build_wheels.py [OUT]      (./dev wheels [OUT], ./dev nox -s wheels; OUT: dist/)

One `python -m build --no-isolation` per project (the core, then each folder under plugins/ with a
pyproject.toml): a source distribution, then the wheel built from it in a fresh folder, so nothing
left in a build/ folder of the checkout can slip into a wheel. `--no-isolation` builds with the
packages of the running environment (setuptools, and the torch the core's ops are compiled
against): an isolated build would have pip resolve a torch. The core's wheel carries the compiled
ops library for that torch and is named for it (setup.py: `dynamicemb_core-0.1.0+torch2.13.0cpu-
cp311-cp311-linux_x86_64.whl`); the library comes from the build cache ($DYNAMICEMB_CACHE_DIR) when
it already holds it. The plugins' wheels are pure Python (`py3-none-any`).

Install them where torch, FBGEMM and TorchRec already are, with `pip install --no-deps`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout import REPO, plugin_dirs

__all__ = ["build_wheels", "projects"]


def projects(repo: Path = REPO) -> List[Path]:
    """The folders to build: the core, then every plugin."""
    return [repo, *plugin_dirs(repo)]


def build_wheels(out: Path, repo: Path = REPO, quiet: bool = False) -> List[Path]:
    """Build every project's sdist and wheel into ``out``; return the wheels, the core's first.

    Raises:
        subprocess.CalledProcessError: when a build fails (its output is shown, also when
            ``quiet`` hides the output of the builds that work).
    """
    out.mkdir(parents=True, exist_ok=True)
    wheels: List[Path] = []
    for project in projects(repo):
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="demb-wheel-") as tmp:
            command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp]
            done = subprocess.run(
                [*command, str(project)],
                stdout=subprocess.PIPE if quiet else None,
                stderr=subprocess.STDOUT if quiet else None,
                text=True,
            )
            if done.returncode != 0:
                if quiet:
                    print(done.stdout, end="", file=sys.stderr)
                raise subprocess.CalledProcessError(done.returncode, done.args)
            for built in sorted(Path(tmp).iterdir()):
                target = out / built.name
                target.unlink(missing_ok=True)
                shutil.move(str(built), target)
                if target.suffix == ".whl":
                    wheels.append(target)
                    print(
                        f"built {target.name} ({target.stat().st_size / 1e6:.1f} MB) in "
                        f"{time.monotonic() - start:.1f} s",
                        flush=True,
                    )
    return wheels


def main(argv: Optional[List[str]] = None) -> int:
    """Build into the folder given (default dist/ of the checkout); print each wheel."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]).resolve() if args else REPO / "dist"
    wheels = build_wheels(out, quiet=True)
    print(f"{len(wheels)} wheels in {out}; install with: pip install --no-deps {out}/*.whl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
