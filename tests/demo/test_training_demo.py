"""The training demo runs end to end with tiny arguments: it trains, evicts, reports and plots."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamicemb_core.demo.data import ClickData, ClickDataConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--steps", "12", "--batch-size", "64", "--rows", "256", "--interval", "4", "--no-progress"]


def _run(cmd, tmp_path: Path, timeout: float = 180) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _check_report(out: str, tmp_path: Path, world: int) -> None:
    intervals = re.findall(r"step\s+(\d+)\s+loss (\d+\.\d+)", out)
    assert [int(s) for s, _ in intervals] == [4, 8, 12]
    evictions = [int(e) for e in re.findall(r"ev (\d+)", out)]
    assert max(evictions) > 0, "the id space must outgrow the tables"
    assert f"on {world} process(es)" in out
    assert re.search(r"table t_user_id: \d+ keys in \d+ slots", out)
    png = tmp_path / "out" / "demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_tensorboard_log(out, tmp_path / "out" / "tensorboard")


def _check_tensorboard_log(out: str, log_dir: Path) -> None:
    """The log beside the PNG holds, per interval, each table's size and capacity as printed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert f"tensorboard: tensorboard --logdir {Path('out') / 'tensorboard'}" in out
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    printed = re.findall(r"(t_\w+): (\d+)/(\d+) \(\d+%\) ev \d+", out)
    assert printed
    steps = [int(s) for s in re.findall(r"step\s+(\d+)\s+loss", out)]
    per_step = len(printed) // len(steps)
    for i, (table, size, capacity) in enumerate(printed):
        step = steps[i // per_step]
        for name, value in (("size", size), ("capacity", capacity)):
            (tag,) = [t for t in tags if t.endswith(f"/{table}/{name}")]
            logged = {e.step: e.value for e in acc.Scalars(tag)}
            assert logged[step] == int(value), (tag, step)
    assert {e.step for e in acc.Scalars("demo/loss")} == set(steps)


def test_demo_trains_evicts_and_plots_with_tiny_args(tmp_path: Path) -> None:
    out = _run([sys.executable, "-m", "dynamicemb_core", "demo", *TINY, "--out", "out"], tmp_path)
    _check_report(out, tmp_path, world=1)


def test_demo_runs_under_torchrun_with_two_processes(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "dynamicemb_core",
        "demo",
        *TINY,
        "--out",
        "out",
    ]
    out = _run(cmd, tmp_path)
    _check_report(out, tmp_path, world=2)


def test_click_data_is_seeded_power_law_and_drifts() -> None:
    data = ClickData(ClickDataConfig(("a", "b"), id_space=10_000, drift=100, seed=3))
    d1, s1, y1 = data.batch(5, 2000)
    d2, s2, y2 = data.batch(5, 2000)
    assert torch.equal(s1.values(), s2.values()) and torch.equal(y1, y2) and torch.equal(d1, d2)
    ids = s1["a"].values()
    _, counts = torch.unique(ids, return_counts=True)
    assert counts.max() > 50  # a hot head...
    assert len(counts) > 500  # ...and a long tail
    later = data.batch(500, 2000)[1]["a"].values()
    overlap = torch.isin(later, ids).float().mean()
    assert overlap < 0.5  # the hot set has moved on
    assert 0.05 < float(y1.mean()) < 0.95


@pytest.mark.parametrize("bad", [["--device", "tpu"]])
def test_demo_rejects_unknown_device(bad, tmp_path: Path) -> None:
    from dynamicemb_core.demo.training_demo import parse_args

    with pytest.raises(SystemExit):
        parse_args(bad)
