"""The wheels install and work as a user's would: no compiler, no source tree, no build cache.

scripts/build_wheels.py builds the core's and every plugin's wheel (`python -m build --no-isolation`);
they go with `pip install --no-deps` into a fresh virtualenv that sees the lock's packages (the base
environment of scripts/bootstrap.sh, as a clone's virtualenv does, rather than 1.4 GB installed
again). From a temporary folder (no checkout on sys.path), with a PATH that has no compiler, CXX and
CC naming a missing file and an empty build cache, `python -m dynamicemb_core info` must load the
wheel's prebuilt ops library and a short training run (the demo) must train.

The ops library is compiled once for the wheel, or taken from $DYNAMICEMB_CACHE_DIR, where
`./dev`'s bootstrap already built it for these sources and this torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import build_wheels  # noqa: E402  (scripts/ is not a package)
import layout as repo_layout  # noqa: E402

COMPILERS = ("gcc", "g++", "c++", "cc", "clang", "clang++", "nvcc", "ninja")
BASE = repo_layout.base_of(Path(sys.prefix))

pytestmark = pytest.mark.skipif(
    BASE is None, reason="needs the base environment of ./dev (scripts/bootstrap.sh)"
)


def _rows(text: str) -> Dict[str, str]:
    rows = {}
    for line in text.splitlines():
        if "  " in line and not line.startswith(" "):
            key, value = line.split("  ", 1)
            rows[key.strip()] = value.strip()
    return rows


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """{distribution name: wheel} built by scripts/build_wheels.py."""
    out = tmp_path_factory.mktemp("dist")
    built = build_wheels.build_wheels(out, quiet=True)
    return {path.name.split("-", 1)[0]: path for path in built}


def test_core_wheel_is_named_for_its_torch_and_carries_the_library(wheels) -> None:
    core = wheels["dynamicemb_core"]
    label = "torch" + re.sub(r"[^0-9A-Za-z.]", "", torch.__version__)
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert core.name == f"dynamicemb_core-0.1.0+{label}-{py}-{py}-linux_x86_64.whl"
    names = set(zipfile.ZipFile(core).namelist())
    assert "dynamicemb_core/ops/prebuilt/manifest.json" in names
    assert "dynamicemb_core/ops/prebuilt/cpu/dynamicemb_ops.so" in names
    assert "dynamicemb_core/csrc/ops.cpp" in names  # the just-in-time fallback's sources
    plugins = {p.name.replace("-", "_") for p in repo_layout.plugin_dirs()}
    assert set(wheels) == {"dynamicemb_core", *plugins}
    for name in plugins:
        assert wheels[name].name.endswith("-py3-none-any.whl"), wheels[name].name


def test_wheels_install_and_train_without_compiler_or_sources(wheels, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(venv)],  # type: ignore[attr-defined]
        check=True,
    )
    repo_layout.link_base(venv, BASE)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        + [str(w) for w in wheels.values()],
        check=True,
        capture_output=True,
    )
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    for compiler in COMPILERS:
        assert shutil.which(compiler, path=str(empty_bin)) is None
    env = {
        "PATH": str(empty_bin),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "CXX": str(tmp_path / "no-such-c++"),
        "CC": str(tmp_path / "no-such-cc"),
        "DYNAMICEMB_CACHE_DIR": str(tmp_path / "empty-cache"),  # nothing to find, nowhere to build
        "OMP_NUM_THREADS": "1",
    }
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )

    info = run("-m", "dynamicemb_core", "info")
    assert info.returncode == 0, info.stdout + info.stderr
    rows = _rows(info.stdout)
    assert rows["status"] == "ok"
    installed = (
        venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    )
    assert rows["dynamicemb_core"].endswith(f"({installed / 'dynamicemb_core' / '__init__.py'})")
    assert rows["ops library"] == str(
        installed / "dynamicemb_core" / "ops" / "prebuilt" / "cpu" / "dynamicemb_ops.so"
    )
    assert rows["ops origin"].startswith(f"prebuilt in the wheel, for torch {torch.__version__}")
    assert rows["ops built"].startswith("yes, ")
    for plugin in repo_layout.plugin_dirs():
        assert f"({plugin.name.replace('_', '-')} " in rows["plugins"], rows["plugins"]
    assert "building" not in info.stderr
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())

    tiny = ["--steps", "8", "--batch-size", "64", "--rows", "256", "--interval", "4"]
    demo = run("-m", "dynamicemb_core", "demo", *tiny, "--no-progress", "--out", "out")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "trained 8 steps" in demo.stdout
    assert (work / "out" / "demo.png").is_file()
    assert "building" not in demo.stderr

    # The same wheel under another torch (its manifest says so): `info` names both torches, and
    # the just-in-time build is tried, says why, and fails here, where there is no compiler.
    manifest = installed / "dynamicemb_core" / "ops" / "prebuilt" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(torch.__version__, "2.11.0+cu130"))
    info = run("-m", "dynamicemb_core", "info")
    assert info.returncode == 0, info.stdout + info.stderr
    origin = _rows(info.stdout)["ops origin"]
    prefix = "built just in time (the wheel's prebuilt ops library is for torch 2.11.0+cu130, "
    assert origin.startswith(prefix), origin
    assert f"; this is torch {torch.__version__}, " in origin
    build = run("-m", "dynamicemb_core", "build")
    assert build.returncode != 0
    assert "building the ops from the packaged sources" in build.stderr
