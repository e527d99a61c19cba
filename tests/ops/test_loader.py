"""The build plan of the JIT loader: which sources, which cache folder, what changes the key."""

from __future__ import annotations

import os
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


_CHILD = """
import torch
from dynamicemb_core.ops import ensure_loaded
path = ensure_loaded()
v = torch.arange(6.0).reshape(3, 2)
assert torch.ops.dynamicemb.gather_rows(v, torch.tensor([2, -1])).tolist() == [[4.0, 5.0], [0.0, 0.0]]
print(path)
"""


@pytest.mark.slow
def test_two_processes_building_at_once_share_one_clean_cache(tmp_path: Path) -> None:
    """Both builds succeed and load; one cache folder survives, no temporary folder is left."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DYNAMICEMB_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root))
    env.pop("DYNAMICEMB_CSRC_DIR", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    assert len({out.strip().splitlines()[-1] for out, _ in outs}) == 1
    entries = sorted(e.name for e in tmp_path.iterdir())
    assert len(entries) == 1 and not entries[0].startswith("."), entries
    assert (tmp_path / entries[0] / f"{loader.LIBRARY_NAME}.so").is_file()


def test_prune_builds_keeps_current_recent_and_newest(tmp_path: Path) -> None:
    """Old builds go only when beyond the newest KEEP_BUILDS and unused for PRUNE_AGE_S."""
    now = 1_000_000_000.0
    day = loader.PRUNE_AGE_S

    def build(name: str, age: float) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "dynamicemb_ops.so").write_bytes(b"x")
        os.utime(path, (now - age, now - age))
        return path

    current = build("dynamicemb_ops-current", 10 * day)  # never removed, however old
    recent = [build(f"dynamicemb_ops-r{i}", i * 60.0) for i in range(loader.KEEP_BUILDS + 2)]
    old = [build(f"dynamicemb_ops-o{i}", 2 * day + i) for i in range(3)]
    killed = build(".dynamicemb_ops-abc-tmp", 2 * day)
    running = build(".dynamicemb_ops-def-tmp", 10.0)
    unrelated = build("something-else", 5 * day)

    removed = set(loader.prune_builds(tmp_path, current, now=now))

    assert removed == set(old) | {killed}
    for path in [current, *recent, running, unrelated]:
        assert path.is_dir(), path
    for path in removed:
        assert not path.exists()
