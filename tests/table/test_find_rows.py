"""find_rows (find and the found keys' rows in one op) on every device: equal to find without a touch
followed by gather_rows, on a real table's state and value rows; bad values raise before anything
runs. The CUDA kernel is also compared with the CPU op in test_cuda_ops.py."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.config import MAX_BUCKET_CAPACITY
from dynamicemb_core.ops import table_ops
from dynamicemb_core.table import ScoredHashTable, TableSpec


def _table(device: torch.device, width: int) -> ScoredHashTable:
    specs = [
        TableSpec("a", row_width=width, init_capacity=256, max_capacity=256, bucket_capacity=16),
        TableSpec("b", row_width=width, init_capacity=128, max_capacity=128, bucket_capacity=128),
    ]
    table = ScoredHashTable(specs, device=device)
    g = torch.Generator().manual_seed(width)
    for t in range(2):
        keys = torch.randint(-50, 400, (300,), generator=g).unique().to(device)
        rows = torch.randn(keys.numel(), width, generator=g).to(device)
        table.insert(keys, t, rows=rows)
    return table


@pytest.mark.parametrize("width", [1, 8, 64, 130])
def test_find_rows_is_find_then_gather(device: torch.device, width: int) -> None:
    table = _table(device, width)
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(-60, 500, (2000,), generator=g).to(device)  # present, missing, repeated
    for t in range(2):
        tids = torch.full_like(keys, t)
        words_before = table.state.scores.clone()
        slots, found, rows = table_ops.find_rows(keys, tids, table.state, table.values(t))
        assert torch.equal(table.state.scores, words_before), "find_rows touched scores"
        cur = torch.zeros(2, dtype=torch.int64, device=device)
        want_slots, want_found, _ = table_ops.find(keys, tids, table.state, cur, False)
        assert torch.equal(slots, want_slots) and torch.equal(found, want_found)
        assert bool(found.any()) and not bool(found.all())
        assert torch.equal(rows, table_ops.gather_rows(table.values(t), want_slots))
        assert not bool(rows[~found].any()), "a missing key read a non-zero row"


def test_find_rows_reads_zeros_past_the_values_rows(device: torch.device) -> None:
    """values shorter than the table: a found slot past its rows reads zeros (as an unchecked
    gather_rows does), never memory outside it."""
    table = _table(device, 4)
    keys = table.export(0).keys
    tids = torch.zeros_like(keys)
    short = table.values(0)[:100]
    slots, found, rows = table_ops.find_rows(keys, tids, table.state, short)
    assert bool(found.all()) and bool((slots >= 100).any()) and bool((slots < 100).any())
    past = slots >= 100
    assert not bool(rows[past].any())
    assert torch.equal(rows[~past], table_ops.gather_rows(short, slots[~past]))


def test_find_rows_rejects_bad_values(device: torch.device) -> None:
    table = _table(device, 4)
    keys = torch.tensor([1, 2], device=device)
    tids = torch.zeros_like(keys)
    with pytest.raises(ValueError, match="values must be a contiguous"):
        table_ops.find_rows(keys, tids, table.state, table.values(0)[:, 0])
    with pytest.raises(ValueError, match="values must be a contiguous"):
        table_ops.find_rows(keys, tids, table.state, table.values(0).t())
    other = "cuda" if device.type == "cpu" else "cpu"
    if other == "cuda" and not torch.cuda.is_available():
        return
    with pytest.raises(ValueError, match="values must be on"):
        table_ops.find_rows(keys, tids, table.state, table.values(0).to(other))


@pytest.mark.parametrize("width", [8, 64, 1040])
def test_find_rows_mixed_buckets_in_one_call(device: torch.device, width: int) -> None:
    """One call over three tables whose buckets the CUDA kernel probes in different ways (256
    slots: two probe steps; one 200-slot bucket, not whole 16-byte digest chunks; 16 slots) mixed
    within each warp, 3001 keys (a partial last warp) and rows of 32
    bytes, 256 bytes and 4,160 bytes (wider than one 4 KB stage); values shorter than the largest
    table, so some found slots read zeros. Equal to find then gather_rows."""
    specs = [
        TableSpec("big", row_width=width, init_capacity=512, max_capacity=512, bucket_capacity=256),
        TableSpec(
            "one",
            row_width=width,
            init_capacity=200,
            max_capacity=200,
            bucket_capacity=MAX_BUCKET_CAPACITY,
        ),
        TableSpec("small", row_width=width, init_capacity=64, max_capacity=64, bucket_capacity=16),
    ]
    table = ScoredHashTable(specs, device=device)
    g = torch.Generator().manual_seed(width + 7)
    for t, count in enumerate((400, 180, 50)):
        keys = torch.randperm(2000, generator=g)[:count].to(device)
        table.insert(keys, t, rows=torch.randn(count, width, generator=g).to(device))
    keys = torch.randint(0, 2500, (3001,), generator=g).to(device)
    tids = torch.randint(0, 3, (3001,), generator=g).to(device)
    values = table.values(0)[:300]
    slots, found, rows = table_ops.find_rows(keys, tids, table.state, values, check=False)
    cur = torch.zeros(3, dtype=torch.int64, device=device)
    want_slots, want_found, _ = table_ops.find(keys, tids, table.state, cur, False, check=False)
    assert torch.equal(slots, want_slots) and torch.equal(found, want_found)
    for t in range(3):  # every table has found and missing keys in the call
        assert bool(found[tids == t].any()) and not bool(found[tids == t].all())
    assert bool((slots >= 300).any()) and bool(((slots >= 0) & (slots < 300)).any())
    inside = torch.where(slots < 300, slots, torch.full_like(slots, -1))
    assert torch.equal(rows, table_ops.gather_rows(values, inside))


def test_find_rows_many_keys(device: torch.device) -> None:
    """300,001 keys in one call (more than the CUDA kernel's warps hold at once, so a warp takes
    several groups of keys in turn where the grid is capped): equal to find then gather_rows."""
    table = _table(device, 64)
    g = torch.Generator().manual_seed(3)
    keys = torch.randint(-60, 500, (300_001,), generator=g).to(device)
    tids = torch.randint(0, 2, (300_001,), generator=g).to(device)
    slots, found, rows = table_ops.find_rows(keys, tids, table.state, table.values(0))
    cur = torch.zeros(2, dtype=torch.int64, device=device)
    want_slots, want_found, _ = table_ops.find(keys, tids, table.state, cur, False)
    assert torch.equal(slots, want_slots) and torch.equal(found, want_found)
    assert bool(found.any()) and not bool(found.all())
    assert torch.equal(rows, table_ops.gather_rows(table.values(0), want_slots))
