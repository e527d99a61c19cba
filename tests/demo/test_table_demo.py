"""The table demo (`python -m dynamicemb_core table-demo`) shows what its docstring says it shows."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamicemb_core.config import DynamicEmbScoreStrategy as S
from dynamicemb_core.demo import table_demo

BATCHES, HOT, FRESH = 4, 8, 24


@pytest.fixture(scope="module")
def demo_run():
    """The demo's table after its default run, and everything it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table = table_demo.run(batches=BATCHES, hot=HOT, fresh=FRESH)
    return table, out.getvalue()


def _table_id(name: str) -> int:
    return [t.name for t in table_demo.DEMO_TABLES].index(name)


def _hot_found(table, name: str) -> int:
    found = table.find(torch.arange(HOT), _table_id(name)).found
    return int(found.sum())


def test_demo_covers_every_strategy_and_the_compound_one():
    strategies = {t.strategy for t in table_demo.DEMO_TABLES}
    assert strategies == {*S, (S.TIMESTAMP, S.LFU)}
    compound = table_demo.DEMO_TABLES[_table_id("compound")]
    assert compound.score_function is table_demo.decayed_lfu_score


def test_batch_zero_repeats_hot_keys_and_later_batches_are_fresh():
    first = table_demo.batch_keys(0, HOT, FRESH)
    assert torch.equal(
        torch.bincount(first[first < HOT]), torch.full((HOT,), table_demo.HOT_REPEATS)
    )
    later = torch.cat([table_demo.batch_keys(b, HOT, FRESH) for b in range(1, BATCHES)])
    assert int((later < table_demo.FIRST_FRESH_KEY).sum()) == 0
    assert later.unique().numel() == later.numel() == FRESH * (BATCHES - 1)


@pytest.mark.parametrize("name", ["timestamp", "step", "customized", "lfu", "compound"])
def test_evicting_tables_grow_to_max_capacity_then_stay_full(demo_run, name):
    table, _ = demo_run
    t = _table_id(name)
    assert table.capacity(t) == 64
    assert table.size(t) == 64  # 8 + 4 * 24 = 104 distinct keys were inserted


def test_recency_strategies_evict_hot_keys_first_and_frequency_keeps_them(demo_run):
    table, _ = demo_run
    for name in ("lfu", "compound"):
        assert _hot_found(table, name) == HOT, name
    for name in ("timestamp", "step", "customized"):
        assert _hot_found(table, name) < HOT, name


def test_no_eviction_keeps_every_key_and_grows(demo_run):
    table, _ = demo_run
    t = _table_id("no_eviction")
    assert table.size(t) == HOT + BATCHES * FRESH
    assert table.capacity(t) >= 2 * table.size(t)  # doubled while above load factor 0.5
    every_key = torch.cat([table_demo.batch_keys(b, HOT, FRESH) for b in range(BATCHES)]).unique()
    assert bool(table.find(every_key, t).found.all())


def test_value_rows_follow_their_keys_through_growth(demo_run):
    table, _ = demo_run
    for t, _demo in enumerate(table_demo.DEMO_TABLES):
        exported = table.export(t)
        rows = table.read_rows(t, exported.slots)
        assert torch.equal(rows[:, 0], exported.keys.to(rows.dtype)), _demo.name


def test_demo_prints_each_batch_and_each_export(demo_run):
    _, out = demo_run
    for t in table_demo.DEMO_TABLES:
        assert f"[{t.name}] exports" in out
    assert "ranked by decayed_lfu_score" in out
    assert "[lfu] exports 64 keys, 8 of them hot" in out


def test_main_rejects_negative_sizes(capsys):
    with pytest.raises(SystemExit):
        table_demo.main(["--fresh", "-1"])
    assert "--fresh must be >= 0, got -1" in capsys.readouterr().err


def test_cli_runs_the_table_demo():
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "dynamicemb_core", "table-demo", "--batches", "2", "--fresh", "8"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "[no_eviction] exports 24 keys, 8 of them hot" in done.stdout
