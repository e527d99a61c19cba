"""nox sessions: the suites one at a time, each plugin alone, lint, types, demo, benchmarks.

    ./dev nox -l                    # list sessions (./dev runs nox from the pinned environment)
    ./dev nox -s tests              # core suite, no plugin installed
    ./dev nox -s "plugin(demb_redis)"   # one plugin with the core, its own tests
    PLUGINS=demb_redis ./dev nox -s plugin plugins_with_core
    ./dev nox -s lint typecheck
    ./dev nox -s docs               # the API reference, HTML under build/docs/reference/
    ./dev nox -s wheels             # the wheels of the core and every plugin, in dist/

The quick path for day-to-day work is ./dev (README.md); nox is for checking one piece in a clean
environment. Every session installs the pinned set from requirements/lock.txt with `--no-deps`
(torch from torch.txt, which the lock includes: never resolved), the core editable with
`--no-deps --no-build-isolation`, then what it tests. Virtualenvs live outside the clone, under
$DEMB_HOME/nox (default ~/.cache/dynamicemb-core/nox), and are reused: the pinned set is reinstalled
only when the lock changes. Plugins are the folders under plugins/ with a pyproject.toml, selected
by PLUGINS=a,b and SKIP_PLUGINS=c (comma-separated folder names); each plugin left out is logged
with the reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

import nox
from nox.logger import logger

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import layout

PYTHON = "3.11"  # the lock's wheels are for CPython 3.11
REPO = layout.REPO

nox.options.reuse_venv = "yes"
nox.options.envdir = str(layout.demb_home() / "nox")
nox.options.sessions = ["tests", "plugin", "plugins_with_core", "lint", "docs"]


def _names(variable: str) -> List[str]:
    """Comma-separated folder names from an environment variable (empty when unset)."""
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def select_plugins() -> Dict[str, Path]:
    """{name: folder} of the plugins to test, after PLUGINS / SKIP_PLUGINS; log every one left out.

    Raises:
        ValueError: when PLUGINS or SKIP_PLUGINS names a folder that is not a plugin.
    """
    found = {path.name: path for path in layout.plugin_dirs()}
    root = REPO / "plugins"
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.is_dir() and folder.name not in found:
            logger.warning(
                f"plugin {folder.name}: left out, plugins/{folder.name} has no pyproject.toml"
            )
    wanted, skipped = _names("PLUGINS"), _names("SKIP_PLUGINS")
    for variable, names in (("PLUGINS", wanted), ("SKIP_PLUGINS", skipped)):
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise ValueError(
                f"{variable}: no plugin folder named {', '.join(unknown)}; "
                f"plugins: {', '.join(sorted(found)) or 'none'}"
            )
    selected: Dict[str, Path] = {}
    for name, path in found.items():
        if wanted and name not in wanted:
            logger.info(f"plugin {name}: left out, not in PLUGINS={','.join(wanted)}")
        elif name in skipped:
            logger.info(f"plugin {name}: left out, in SKIP_PLUGINS={','.join(skipped)}")
        else:
            selected[name] = path
    return selected


SELECTED_PLUGINS = select_plugins()


def install_pinned(session: nox.Session) -> None:
    """Install requirements/lock.txt with --no-deps, unless this venv already has this lock."""
    stamp = Path(session.virtualenv.location) / ".demb-lock"
    key = layout.lock_hash()
    if stamp.is_file() and stamp.read_text() == key:
        return
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    try:
        session.log(f"torch comes from {layout.check_torch_is_local(python)}")
    except RuntimeError as error:
        session.error(str(error))
    session.install("--no-deps", "-r", str(layout.LOCK))
    stamp.write_text(key)


def install_core(session: nox.Session, *plugins: Path) -> None:
    """Pinned set, then the core and ``plugins`` editable, then the C++ ops built ahead of time."""
    install_pinned(session)
    editables: List[str] = []
    for path in (REPO, *plugins):
        editables += ["-e", str(path)]
    # DYNAMICEMB_WHEEL_OPS=0: an editable install bundles no ops library (setup.py).
    session.install(
        "--no-deps", "--no-build-isolation", *editables, env={"DYNAMICEMB_WHEEL_OPS": "0"}
    )
    if (REPO / "dynamicemb_core" / "ops" / "build.py").is_file():
        session.run("python", "-m", "dynamicemb_core", "build")
    else:
        session.log("no `python -m dynamicemb_core build` yet: the ops compile on first use")


def install_redis(session: nox.Session) -> None:
    """The redis-server binary, for plugin tests (scripts/install_redis.sh; starts nothing)."""
    session.run("bash", str(REPO / "scripts" / "install_redis.sh"), external=True)


def pytest(session: nox.Session, tests: Path, *default_args: str) -> None:
    """pytest on one tests folder with ``default_args``.

    Arguments after `--` replace both, so `nox -s tests -- tests/table -x` runs just that folder.
    """
    args = session.posargs or [str(tests.relative_to(REPO)), *default_args]
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *args)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The core suite without any plugin installed (slow tests deselected)."""
    install_core(session)
    pytest(session, REPO / "tests", "-m", "not slow")


@nox.session(python=PYTHON, default=False)
def slow(session: nox.Session) -> None:
    """Only the tests marked slow: core and every selected plugin, all installed together."""
    install_core(session, *SELECTED_PLUGINS.values())
    install_redis(session)
    run_tests = str(REPO / "scripts" / "run_tests.py")
    session.run("python", run_tests, "--no-docs", "-m", "slow", *session.posargs)


if SELECTED_PLUGINS:

    @nox.session(python=PYTHON)
    @nox.parametrize("name", list(SELECTED_PLUGINS), ids=list(SELECTED_PLUGINS))
    def plugin(session: nox.Session, name: str) -> None:
        """One plugin installed with the core, running that plugin's own tests."""
        path = SELECTED_PLUGINS[name]
        install_core(session, path)
        install_redis(session)
        if not (path / "tests").is_dir():
            session.skip(f"plugins/{name} has no tests/ folder")
        pytest(session, path / "tests", "-m", "not slow")

else:

    @nox.session(venv_backend="none")
    def plugin(session: nox.Session) -> None:
        """Stands in for the per-plugin sessions when no plugin is selected."""
        session.skip("no plugin selected (see the log above for why each was left out)")


@nox.session(python=PYTHON)
def plugins_with_core(session: nox.Session) -> None:
    """Every selected plugin installed at once, then the core suite: plugins must not break it."""
    install_core(session, *SELECTED_PLUGINS.values())
    pytest(session, REPO / "tests", "-m", "not slow")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the repository (ruff's version from the lock)."""
    session.install("--no-deps", layout.pin("ruff"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON, default=False)
def typecheck(session: nox.Session) -> None:
    """mypy over the package, with the pinned torch set for type information."""
    install_core(session)
    session.run("mypy", "dynamicemb_core", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The API reference from the docstrings (Sphinx, every warning an error).

    HTML goes to build/docs/reference/ (or the folder given after `--`). scripts/build_docs.py is
    the one build both this session and `./dev test` (scripts/run_tests.py) run.
    """
    install_core(session)
    session.run("python", str(REPO / "scripts" / "build_docs.py"), *session.posargs)


@nox.session(python=PYTHON, default=False)
def wheels(session: nox.Session) -> None:
    """The wheels (and sdists) of the core and every plugin: scripts/build_wheels.py, into dist/
    (or the folder given after `--`). The core's carries the ops library for the lock's torch."""
    install_pinned(session)
    session.run("python", str(REPO / "scripts" / "build_wheels.py"), *session.posargs)


@nox.session(python=PYTHON, default=False)
def demo(session: nox.Session) -> None:
    """The README's demo: python -m dynamicemb_core demo."""
    install_core(session)
    session.run("python", "-m", "dynamicemb_core", "demo", *session.posargs)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py that takes --small, run small: a check that they work, not a measurement.

    A benchmark opts in by accepting `--small` (few sizes, few repeats), its own or through
    benchmarks/small.py's add_small_flag; the others are left out, each with a log line saying so.
    """
    scripts = []
    for script in sorted((REPO / "benchmarks").glob("bench_*.py")):
        text = script.read_text()
        if '"--small"' in text or "add_small_flag(" in text:
            scripts.append(script)
        else:
            session.log(f"{script.name}: left out, it has no --small option")
    if not scripts:
        session.skip("no benchmarks/bench_*.py takes --small")
    install_core(session, *SELECTED_PLUGINS.values())
    install_redis(session)
    for script in scripts:
        session.run("python", str(script), "--small", *session.posargs)
