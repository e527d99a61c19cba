"""Run the default test suite: the core's tests/, then every plugin's tests/, one pytest each;
then build the API reference.

    python scripts/run_tests.py [--no-docs] [extra pytest arguments]   (./dev test does this)

Each suite runs in its own pytest process: the core and the plugins each have a `tests` folder, and
two folders of that name in one process collide as packages and as conftest modules. Every run gets
`-m "not slow"` (an extra `-m` given here replaces it). pytest's exit code 5 ("no tests collected")
is fine for one suite, for instance a plugin whose tests are all GPU-only, but a failure when no suite
ran a single test. The last line sums the runs in the plain `N passed, N failed` form.

The last step builds the API reference (scripts/build_docs.py, the function nox's `docs` session
calls) with every Sphinx warning an error, so CI, which runs this command, fails on a docstring that
Sphinx cannot read. It shows as its own summary row and fails the run like a failing suite;
`--no-docs` leaves it out.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_docs
from layout import REPO, SuiteTarget, suite_targets

# pytest's exit codes (pytest.ExitCode), spelled out so this script does not import pytest.
_OK, _TESTS_FAILED, _NO_TESTS = 0, 1, 5
# A single test running longer than this is stuck, not slow: fail it rather than eat CI's 90 minutes.
_PER_TEST_TIMEOUT_S = 600


@dataclass
class SuiteResult:
    """Counts of one pytest run, read from its JUnit XML report."""

    name: str
    exit_code: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the run passed or only found nothing to run."""
        return self.exit_code in (_OK, _NO_TESTS)


def _read_counts(result: SuiteResult, report: Path) -> None:
    """Fill ``result``'s counts from a JUnit XML file; leave them at 0 if pytest wrote none."""
    if not report.is_file():
        return
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        tests = int(suite.get("tests", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        result.passed += tests - failed - skipped
        result.failed += failed
        result.skipped += skipped


def _timeout_args() -> List[str]:
    """``--timeout`` when pytest-timeout is installed (it is in the lock; maybe not elsewhere)."""
    if importlib.util.find_spec("pytest_timeout") is None:
        return []
    return [f"--timeout={_PER_TEST_TIMEOUT_S}"]


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (shorter test ids), else as is."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_suite(target: SuiteTarget, extra: List[str], workdir: Path) -> SuiteResult:
    """Run pytest on one tests folder from the repository root and return its counts."""
    report = workdir / f"{target.name}.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        _shown(target.path),
        "-m",
        "not slow",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        *_timeout_args(),
        *extra,
    ]
    print(f"\n=== {target.name}: python {shlex.join(command[1:])}", flush=True)
    start = time.monotonic()
    exit_code = subprocess.call(command, cwd=REPO)
    result = SuiteResult(target.name, exit_code, seconds=time.monotonic() - start)
    _read_counts(result, report)
    return result


def build_reference(workdir: Path) -> int:
    """Build the API reference into ``workdir`` (warnings are errors); return Sphinx's exit code."""
    print(
        "\n=== API reference: python scripts/build_docs.py (Sphinx, warnings as errors)", flush=True
    )
    return build_docs.build(workdir / "reference")


def summarize(results: List[SuiteResult], docs_exit: Optional[int] = None) -> int:
    """Print one row per suite (and the reference's), then the total line; return the exit code.

    Args:
        results: the suites' counts.
        docs_exit: Sphinx's exit code when the reference was built, None when it was left out.
    """
    print("\n=== summary")
    for r in results:
        state = "ok" if r.ok else f"FAILED (pytest exit {r.exit_code})"
        if r.exit_code == _NO_TESTS:
            state = "ok, no tests selected"
        print(
            f"  {r.name:<16} {r.passed:>5} passed {r.failed:>4} failed {r.skipped:>4} skipped "
            f"{r.seconds:>7.1f} s  {state}"
        )
    docs_ok = docs_exit in (None, 0)
    if docs_exit is not None:
        state = "ok, no warnings" if docs_ok else f"FAILED (sphinx exit {docs_exit}, see above)"
        print(f"  {'API reference':<16} {state}")
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results)
    skipped = sum(r.skipped for r in results)
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    if passed + failed == 0:
        print("error: no test ran in any suite", file=sys.stderr)
        return _NO_TESTS
    return _OK if docs_ok and all(r.ok for r in results) else _TESTS_FAILED


def main(
    argv: Optional[List[str]] = None,
    targets: Optional[List[SuiteTarget]] = None,
    docs: Optional[bool] = None,
) -> int:
    """Run every suite (the core first), whatever the earlier ones did, then the reference build.

    Args:
        argv: extra pytest arguments (default: this process's command line); `--no-docs` among
            them skips the reference build.
        targets: the suites to run (default: :func:`layout.suite_targets`, core first).
        docs: build the API reference; default: when running the default suites and `--no-docs`
            was not given.
    """
    extra = list(sys.argv[1:] if argv is None else argv)
    if "--no-docs" in extra:
        extra.remove("--no-docs")
        docs = False
    if docs is None:
        docs = targets is None
    targets = suite_targets() if targets is None else targets
    missing = [t for t in targets if not t.path.is_dir()]
    if missing:
        print(f"error: no tests folder for {missing[0].name} at {missing[0].path}", file=sys.stderr)
        return _NO_TESTS
    with tempfile.TemporaryDirectory(prefix="demb-junit-") as tmp:
        results = [run_suite(target, extra, Path(tmp)) for target in targets]
        docs_exit = build_reference(Path(tmp)) if docs else None
    return summarize(results, docs_exit)


if __name__ == "__main__":
    sys.exit(main())
