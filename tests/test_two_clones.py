"""Two clones' `./dev` side by side: each imports its own sources and plugins, neither re-points
the other, and the second clone reuses the installed base environment (seconds, not 1.4 GB).

Two copies of this checkout start `./dev python` at the same moment, with the DEMB_HOME (and so
the base environment) and the build cache of the environment running this test. Each builds its
own small virtualenv (scripts/bootstrap.sh, step 2), then reports which files it imported and
which plugins its registry found. Then both run again, concurrently: their bootstrap must do nothing (silent) and each
must still see its own files. This process's imports must not have moved either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import dynamicemb_core

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import layout as repo_layout  # noqa: E402  (scripts/ is not a package)

BASE = repo_layout.base_of(Path(sys.prefix))

pytestmark = pytest.mark.skipif(
    BASE is None, reason="needs the base environment of ./dev (scripts/bootstrap.sh)"
)

# What a clone needs for `./dev python`: the scripts, the lock (the same lock: the same base), the
# package, its sources and the plugins (their tests stay behind).
_COPIED = ("dev", "scripts", "requirements", "dynamicemb_core", "csrc", "plugins")
_COPIED_FILES = ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in")

# Which files the clone's python imports, and the plugins its registry finds (what `info` lists,
# without importing FBGEMM and TorchRec: the check is about imports, not the torch set).
_REPORT = """
import importlib, json, sys
from dynamicemb_core.plugins.registry import get_registry
modules = ["dynamicemb_core", *sys.argv[1:]]
print(json.dumps({
    "files": {m: importlib.import_module(m).__file__ for m in modules},
    "plugins": [[p.name, p.distribution] for p in get_registry().plugins()],
}))
"""


def _copy_clone(target: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "tests", "*.so")
    target.mkdir()
    for name in _COPIED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, target / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, target / name)
    for name in _COPIED_FILES:
        shutil.copy2(REPO / name, target / name)
    return target


def _start(clone: Path, env: Dict[str, str], plugins: List[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(clone / "dev"), "python", "-c", _REPORT, *plugins],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _check_sees_itself(report: Dict, clone: Path, plugins: List[str]) -> None:
    for module, file in report["files"].items():
        assert Path(file).is_relative_to(clone), f"{clone.name} imported {module} from {file}"
    distributions = {distribution for _, distribution in report["plugins"]}
    assert {p.replace("_", "-") for p in plugins} <= distributions, report["plugins"]


def test_two_clones_run_side_by_side_without_breaking_each_other(tmp_path: Path) -> None:
    assert BASE is not None
    plugins = [p.name for p in repo_layout.plugin_dirs()]
    clones = [_copy_clone(tmp_path / name) for name in ("clone_a", "clone_b")]
    env = {
        **os.environ,
        "DEMB_HOME": str(BASE.parent),
        "DEMB_PYTHON": sys._base_executable,  # type: ignore[attr-defined]
    }
    env.pop("PYTHONPATH", None)
    key = repo_layout.lock_hash()
    venvs = [BASE.parent / f"venv-{key}-{repo_layout.clone_key(c)}" for c in clones]
    before = dynamicemb_core.__file__
    try:
        start = time.monotonic()
        first = [_finish(p) for p in [_start(c, env, plugins) for c in clones]]
        first_s = time.monotonic() - start
        for (report, err), clone, venv in zip(first, clones, venvs):
            _check_sees_itself(report, clone, plugins)
            assert f"creating {venv}" in err, err  # its own virtualenv...
            assert "installing requirements/lock.txt" not in err, err  # ...on the shared base
        assert venvs[0] != venvs[1]
        # Both again, together: nothing to redo, and each still sees its own sources.
        again = [_finish(p) for p in [_start(c, env, plugins) for c in clones]]
        for (report, err), clone in zip(again, clones):
            _check_sees_itself(report, clone, plugins)
            assert err == "", err
        print(f"two clones' first ./dev python side by side: {first_s:.1f} s")
    finally:
        for venv in venvs:
            shutil.rmtree(venv, ignore_errors=True)
            Path(f"{venv}.lock").unlink(missing_ok=True)
    assert dynamicemb_core.__file__ == before
    assert Path(before).is_relative_to(REPO)
