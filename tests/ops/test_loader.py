"""The build plan of the JIT loader: which sources, which cache folder, what changes the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from dynamicemb_core.ops import loader


@pytest.fixture
def csrc_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "csrc"
    shutil.copytree(loader.csrc_dir(), copy)
    monkeypatch.setenv("DYNAMICEMB_CSRC_DIR", str(copy))
    monkeypatch.setenv("DYNAMICEMB_CACHE_DIR", str(tmp_path / "cache"))
    return copy


def test_plan_globs_cpu_sources_and_cuda_only_with_cuda(csrc_copy: Path) -> None:
    (csrc_copy / "cpu" / "extra_group.cpp").write_text("// a new op group\n")
    plan = loader.build_plan()
    names = [p.name for p in plan.sources]
    assert names[0] == "ops.cpp" and "table.cpp" in names and "extra_group.cpp" in names
    has_cu = any(p.suffix == ".cu" for p in plan.sources)
    assert has_cu == (torch.version.cuda is not None and torch.cuda.is_available())
    assert "-O3" in plan.cflags and "-fopenmp" in plan.cflags


def test_cache_folder_is_keyed_by_sources(csrc_copy: Path, tmp_path: Path) -> None:
    first = loader.build_plan()
    assert first.directory.parent == tmp_path / "cache"
    assert loader.build_plan().key == first.key  # stable
    header = csrc_copy / "include" / "dynamicemb" / "hashing.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert loader.build_plan().key != first.key  # a header edit is a new build
