"""NO_EVICTION tables that cannot grow (issue 17, item 3).

Keys whose hashes share their low 40 bits share their home bucket in every table of up to 2**40
buckets (power-of-two bucket counts), so no doubling separates them: a NO_EVICTION table used to
double until the allocator failed. Growth now stops at ``max_capacity`` and before a doubling that
the device's free memory could not hold; the table warns once, leaves the keys it cannot place
unplaced (``safe_check_mode`` decides what the caller sees) and keeps every stored key.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.table import ScoredHashTable, TableSpec, expansion
from dynamicemb_core.table.hashing import bucket_of, hash_key
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

_M = 1 << 64
_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _key_with_hash(h: int) -> int:
    """The int64 key whose fmix64 hash is ``h`` (fmix64 is a bijection: undo each step)."""
    x = h
    x ^= x >> 33
    x = (x * pow(_C2, -1, _M)) % _M
    x ^= x >> 33
    x = (x * pow(_C1, -1, _M)) % _M
    x ^= x >> 33
    return x - _M if x >= 1 << 63 else x


def colliding_keys(n: int, start: int = 1) -> torch.Tensor:
    """``n`` keys with home bucket 0 in every power-of-two table up to 2**40 buckets."""
    keys = [_key_with_hash(j << 40) for j in range(start, start + n)]
    assert all(bucket_of(k, 1 << 20) == 0 and hash_key(k) >> 40 != 0 for k in keys)
    return torch.tensor(keys, dtype=torch.int64)


def _table(mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE) -> ScoredHashTable:
    spec = TableSpec(
        "ne",
        row_width=1,
        init_capacity=64,
        max_capacity=256,
        bucket_capacity=16,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        safe_check_mode=mode,
    )
    return ScoredHashTable([spec], "cpu")


def _rows(keys: torch.Tensor) -> torch.Tensor:
    return keys.remainder(1000).to(torch.float32).unsqueeze(1)


def test_keys_no_bucket_count_separates_stop_at_max_capacity_warned_once() -> None:
    table = _table()
    # bucket 0 full, plus keys that never share it (h % 4 != 0: not in bucket 0 of any table)
    others = torch.tensor([k for k in range(100) if bucket_of(k, 4) != 0][:20])
    old = torch.cat([colliding_keys(16), others])
    assert bool((table.insert(old, rows=_rows(old)) >= 0).all())
    extra = colliding_keys(8, start=100)
    with pytest.warns(
        DynamicEmbWarning, match=r"'ne' cannot grow beyond 256 slots: .*max_capacity"
    ):
        slots = table.insert(extra, rows=_rows(extra))
    assert bool((slots < 0).all()) and table.capacity(0) == 256  # grew to the cap, no further
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicEmbWarning)  # warned once per table
        assert bool((table.insert(colliding_keys(4, start=200)) < 0).all())
    found = table.find(old)
    assert bool(found.found.all())  # old keys intact, with their rows
    torch.testing.assert_close(table.read_rows(0, found.slots), _rows(old))
    assert table.size(0) == old.numel()


def test_unplaced_keys_follow_safe_check_mode() -> None:
    table = _table(DynamicEmbCheckMode.ERROR)
    table.insert(colliding_keys(16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        with pytest.raises(DynamicEmbError, match="could not be inserted"):
            table.insert(colliding_keys(3, start=50))


def test_growth_stops_before_a_doubling_free_memory_cannot_hold(monkeypatch) -> None:
    table = _table()
    table.insert(colliding_keys(16))
    monkeypatch.setattr(expansion, "free_bytes", lambda device: 1000)
    with pytest.warns(DynamicEmbWarning, match=r"needs \d+ bytes and 1000 are free on cpu"):
        slots = table.insert(colliding_keys(2, start=60))
    assert bool((slots < 0).all()) and table.capacity(0) == 64  # no allocation tried
    assert bool(table.find(colliding_keys(16)).found.all())


def test_module_with_no_eviction_that_cannot_grow_raises_under_error_mode() -> None:
    def module(mode: DynamicEmbCheckMode) -> BatchedDynamicEmbeddingTables:
        opts = DynamicEmbTableOptions(
            dim=4,
            init_capacity=64,
            max_capacity=256,
            bucket_capacity=16,
            score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
            safe_check_mode=mode,
        )
        return BatchedDynamicEmbeddingTables(
            [opts], ["t"], [0], DynamicEmbPoolingMode.SUM, EmbOptimType.SGD, torch.device("cpu")
        )

    first, extra = colliding_keys(16), colliding_keys(6, start=300)
    strict = module(DynamicEmbCheckMode.ERROR)
    strict(first, torch.tensor([0, 16])).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        with pytest.raises(DynamicEmbError, match="could not be inserted"):
            strict(extra, torch.tensor([0, 6]))
    assert strict.tables[0].capacity(0) == 256
    assert bool(strict.tables[0].find(0, first)[0].all())
    lenient = module(DynamicEmbCheckMode.WARNING)
    lenient(first, torch.tensor([0, 16]))
    with pytest.warns(DynamicEmbWarning, match="could not be inserted"):
        lenient(extra, torch.tensor([0, 6]))
