"""Where things are in this repository and the development environment: one answer for all tools.

scripts/bootstrap.sh, scripts/run_tests.py and noxfile.py all need the same few facts (which plugin
folders exist, where their tests are, which virtualenv matches the lock, which version of a tool
the lock pins). They ask this module, so a rule such as "a plugin is a folder under plugins/ with a
pyproject.toml" is written once. Standard library only: bootstrap runs it before any venv exists.

Command line (used by bootstrap.sh)::

    python scripts/layout.py base-dir   # the shared environment of the current lock's packages
    python scripts/layout.py venv-dir   # this clone's virtualenv (the lock AND the clone's path)
    python scripts/layout.py link-base VENV BASE   # make VENV see BASE's packages (a .pth file)
    python scripts/layout.py prune-venvs   # remove the virtualenvs of clones that are gone
    python scripts/layout.py plugins    # one plugin folder per line
    python scripts/layout.py pin NAME   # the version the lock pins for NAME
    python scripts/layout.py check-torch PYTHON   # refuse a torch that pip would download
    python scripts/layout.py editable-key   # changes when the editable installs must be redone
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Dict, List, NamedTuple, Optional

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "requirements"
LOCK = REQUIREMENTS / "lock.txt"
TORCH_REQUIREMENTS = REQUIREMENTS / "torch.txt"
PLUGINS = REPO / "plugins"


class SuiteTarget(NamedTuple):
    """One pytest run of the default test command: a name for the report and a tests folder."""

    name: str
    path: Path


def plugin_dirs(repo: Path = REPO) -> List[Path]:
    """Plugin packages: every folder directly under plugins/ that has a pyproject.toml, sorted."""
    root = repo / "plugins"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "pyproject.toml").is_file())


def suite_targets(repo: Path = REPO) -> List[SuiteTarget]:
    """The core suite, then each plugin's tests/ folder (plugins without one are left out)."""
    targets = [SuiteTarget("core", repo / "tests")]
    for plugin in plugin_dirs(repo):
        if (plugin / "tests").is_dir():
            targets.append(SuiteTarget(plugin.name, plugin / "tests"))
    return targets


def editable_key(repo: Path = REPO) -> str:
    """16 hex digits naming the editable installs bootstrap.sh made: redone when this changes.

    It covers the clone's path (another clone must re-point the installs) and, for the core and
    each plugin, the folder and its pyproject.toml (a new plugin, or new metadata or entry points).
    """
    digest = hashlib.sha256(str(repo).encode() + b"\0")
    for folder in (repo, *plugin_dirs(repo)):
        digest.update(str(folder).encode() + b"\0")
        digest.update(hashlib.sha256((folder / "pyproject.toml").read_bytes()).digest())
    return digest.hexdigest()[:16]


def _requirement_lines(path: Path) -> List[str]:
    """Requirement lines of a pip requirements file, following `-r` includes, comments dropped."""
    lines: List[str] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            lines.extend(_requirement_lines(path.parent / line.split(None, 1)[1]))
        else:
            lines.append(line)
    return lines


def normalize(name: str) -> str:
    """PEP 503 normalized project name (`fbgemm_gpu-cpu` -> `fbgemm-gpu-cpu`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: Path = LOCK) -> Dict[str, str]:
    """{normalized name: exact version} of every `name==version` line of the lock and its includes.

    Raises:
        ValueError: for a line that is not an exact `name==version` pin.
    """
    pins: Dict[str, str] = {}
    for line in _requirement_lines(lock):
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;=<>!~]+)", line)
        if match is None:
            raise ValueError(f"{lock}: expected an exact `name==version` pin, found {line!r}")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def pin(name: str) -> str:
    """`name==version` as the lock pins it, for installing one tool alone (nox's lint session).

    Raises:
        ValueError: when the lock has no pin for ``name``.
    """
    pins = lock_pins()
    key = normalize(name)
    if key not in pins:
        raise ValueError(f"{LOCK}: no pin for {name!r}; pinned: {', '.join(sorted(pins))}")
    return f"{key}=={pins[key]}"


def lock_hash(python_tag: Optional[str] = None) -> str:
    """12 hex digits identifying the pinned environment: the lock files and the Python minor version."""
    digest = hashlib.sha256()
    digest.update((python_tag or f"{sys.version_info[0]}.{sys.version_info[1]}").encode())
    for path in sorted(REQUIREMENTS.glob("*.txt")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _cache_dirs_module() -> ModuleType:
    """dynamicemb_core/ops/cache_dirs.py, loaded by path (no venv, no torch needed)."""
    path = REPO / "dynamicemb_core" / "ops" / "cache_dirs.py"
    spec = importlib.util.spec_from_file_location("_demb_cache_dirs", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demb_home() -> Path:
    """Root of everything the tools keep outside the clone (venvs, nox envs): $DEMB_HOME, else
    ``dynamicemb-core`` under $XDG_CACHE_HOME or ~/.cache (the package's one cache-location rule)."""
    return Path(_cache_dirs_module().cache_dir("home"))


def base_dir() -> Path:
    """The base environment: every package of the current lock, installed once and shared.

    Nothing clone-specific ever goes into it (no editable install), so any number of clones can
    use it at once; each sees it through its own :func:`venv_dir`.
    """
    return demb_home() / f"base-{lock_hash()}"


def clone_key(repo: Path = REPO) -> str:
    """8 hex digits naming a clone by its resolved path (two clones never share a virtualenv)."""
    return hashlib.sha256(str(repo.resolve()).encode()).hexdigest()[:8]


def venv_dir(repo: Path = REPO) -> Path:
    """This clone's virtualenv (outside the clone), keyed by the lock and the clone's path.

    It holds only the clone's editable installs (core and plugins) and sees the lock's packages
    through a .pth file pointing at :func:`base_dir` (:func:`link_base`), so a second clone costs
    under 1 MB and seconds, and one clone's `./dev` never re-points another's imports.
    """
    return demb_home() / f"venv-{lock_hash()}-{clone_key(repo)}"


def site_packages(venv: Path) -> Path:
    """A virtualenv's site-packages folder (the layout `python -m venv` makes on POSIX)."""
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def base_of(venv: Path) -> Optional[Path]:
    """The base environment a clone's virtualenv sees (what bootstrap.sh recorded), or None for
    a virtualenv bootstrap.sh did not make."""
    marker = venv / ".demb-base"
    return Path(marker.read_text().strip()) if marker.is_file() else None


# The .pth file of a clone's virtualenv that adds the base's site-packages (site.addsitedir also
# runs the base's own .pth files, as for any site folder). It sorts after the editable installs'.
BASE_PTH = "zz_demb_base.pth"


def link_base(venv: Path, base: Path) -> Path:
    """Make ``venv``'s python see ``base``'s packages after its own; return the .pth file written."""
    pth = site_packages(venv) / BASE_PTH
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text(f"import site; site.addsitedir({str(site_packages(base))!r})\n")
    return pth


def prune_venvs(home: Optional[Path] = None) -> List[Path]:
    """Remove per-clone virtualenvs (any lock) whose clone folder no longer exists; return them.

    Only folders bootstrap.sh made (they record their clone in `.demb-clone`) are considered, and
    one whose lock file another bootstrap holds is left alone.
    """
    import fcntl
    import shutil

    removed: List[Path] = []
    root = demb_home() if home is None else home
    for marker in sorted(root.glob("venv-*/.demb-clone")):
        venv = marker.parent
        clone = Path(marker.read_text().strip())
        if (clone / "dev").is_file():
            continue
        with open(f"{venv}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            shutil.rmtree(venv, ignore_errors=True)
        Path(f"{venv}.lock").unlink(missing_ok=True)
        removed.append(venv)
    return removed


def torch_source(python: str) -> str:
    """The URL of the file pip would install for requirements/torch.txt into ``python``'s env.

    A dry run: nothing is downloaded or installed. On this machine kind the answer is the CPU wheel
    on local disk (``file://...torch-2.13.0+cpu...whl``).

    Raises:
        RuntimeError: when pip cannot find a torch that matches the pin.
    """
    with tempfile.TemporaryDirectory(prefix="demb-torch-") as tmp:
        report = Path(tmp) / "report.json"
        command = [python, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps"]
        command += ["--ignore-installed", "--report", str(report), "-r", str(TORCH_REQUIREMENTS)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not report.is_file():
            raise RuntimeError(f"pip finds no torch for {TORCH_REQUIREMENTS}:\n{done.stderr}")
        return str(json.loads(report.read_text())["install"][0]["download_info"]["url"])


def check_torch_is_local(python: str) -> str:
    """Return torch's source URL if it is a local file; raise otherwise (unless allowed).

    An unpinned or non-local torch is a CUDA build of several GB; we refuse to start that download
    unless DEMB_ALLOW_TORCH_DOWNLOAD=1.

    Raises:
        RuntimeError: when torch would be downloaded and the download is not allowed.
    """
    url = torch_source(python)
    if not url.startswith("file://") and os.environ.get("DEMB_ALLOW_TORCH_DOWNLOAD") != "1":
        raise RuntimeError(
            f"torch would be downloaded from {url} instead of taken from local disk (likely a CUDA "
            "build of several GB); put the CPU wheel in pip's find-links, or set "
            "DEMB_ALLOW_TORCH_DOWNLOAD=1 to accept the download"
        )
    return url


def main(argv: List[str]) -> int:
    """Answer one question on stdout (see the module docstring)."""
    if argv == ["venv-dir"]:
        print(venv_dir())
    elif argv == ["base-dir"]:
        print(base_dir())
    elif len(argv) == 3 and argv[0] == "link-base":
        link_base(Path(argv[1]), Path(argv[2]))
    elif argv == ["prune-venvs"]:
        for venv in prune_venvs():
            print(f"removed {venv} (its clone is gone)", file=sys.stderr)
    elif argv == ["plugins"]:
        for plugin in plugin_dirs():
            print(plugin)
    elif argv == ["editable-key"]:
        print(editable_key())
    elif len(argv) == 2 and argv[0] == "pin":
        print(pin(argv[1]))
    elif len(argv) == 2 and argv[0] == "check-torch":
        try:
            print(check_torch_is_local(argv[1]))
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
