"""``python -m dynamicemb_core info``: what it reports matches the environment, and a broken
install is reported as a problem with exit code 1."""

from __future__ import annotations

import importlib.metadata as metadata
import io
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

from dynamicemb_core import info
from dynamicemb_core.ops import loader
from dynamicemb_core.plugins.registry import get_registry

REPO = Path(__file__).resolve().parents[1]


def _rows(text: str) -> Dict[str, str]:
    """{key: value} of the report's aligned lines (keys are separated by two spaces)."""
    rows = {}
    for line in text.splitlines():
        if "  " in line and not line.startswith(" "):
            key, value = line.split("  ", 1)
            rows[key.strip()] = value.strip()
    return rows


def _installed(*names: str) -> str:
    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError(f"none of {names} installed")


def test_info_command_reports_this_environment() -> None:
    loader.ensure_loaded()  # the library exists, so the report must count its ops
    done = subprocess.run(
        [sys.executable, "-m", "dynamicemb_core", "info"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(done.stdout)
    assert rows["torch"] == torch.__version__
    assert rows["torch CUDA"] == (torch.version.cuda or "none (CPU build)")
    assert rows["FBGEMM"] == _installed(*info.FBGEMM[0])
    assert rows["TorchRec"] == _installed(*info.TORCHREC[0])
    assert rows["ops library"] == str(loader.build_plan().library_path)
    assert rows["ops origin"] == "built just in time"  # a checkout: no wheel, no prebuilt library
    ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("dynamicemb::")]
    assert ops, "the loaded library registered no op"
    assert rows["ops built"] == f"yes, {len(ops)} ops in torch.ops.dynamicemb"
    plugins = get_registry().plugins()
    assert rows["plugins"].startswith(f"{len(plugins)}: ")
    for plugin in plugins:
        assert f"{plugin.name} ({plugin.distribution}" in rows["plugins"]
    assert rows["status"] == "ok"


def test_missing_package_is_a_problem() -> None:
    label, problem = info.package_version(("no-such-dist",), "no_such_module_demb")
    assert label == "not installed"
    assert problem == "no_such_module_demb is not installed"


def test_package_that_does_not_import_is_a_problem() -> None:
    def broken(name: str) -> object:
        raise ImportError("undefined symbol: _ZN3c10")

    label, problem = info.package_version(info.TORCHREC[0], "torchrec", importer=broken)
    assert label == _installed(*info.TORCHREC[0])
    assert problem == "torchrec does not import (ImportError: undefined symbol: _ZN3c10)"


def test_problems_make_exit_code_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(info, "TORCHREC", (("no-such-dist",), "no_such_module_demb"))
    out = io.StringIO()
    assert info.main([], out=out) == 1
    text = out.getvalue()
    assert _rows(text)["TorchRec"] == "not installed"
    assert _rows(text)["status"] == "PROBLEMS (see below)"
    assert text.rstrip().endswith("- no_such_module_demb is not installed")


def test_unbuilt_library_is_reported_but_not_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNAMICEMB_CACHE_DIR", str(tmp_path / "empty-cache"))
    report = info.Report()
    info._ops_rows(report)
    rows = dict(report.rows)
    assert rows["ops library"].startswith(str(tmp_path / "empty-cache"))
    assert rows["ops built"].startswith("no: compiles on first use")
    assert report.problems == []


def test_build_quiet_prints_nothing_when_cached() -> None:
    loader.ensure_loaded()
    done = subprocess.run(
        [sys.executable, "-m", "dynamicemb_core", "build", "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    loud = subprocess.run(
        [sys.executable, "-m", "dynamicemb_core", "build"], capture_output=True, text=True, cwd=REPO
    )
    assert (
        loud.stdout.startswith("dynamicemb ops library: ") and "found in the cache" in loud.stdout
    )
