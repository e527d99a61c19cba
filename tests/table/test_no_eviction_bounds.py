"""NO_EVICTION growth: past ``max_capacity`` while memory allows, and what happens when it cannot.

The seed: "the table's capacity doubles whenever there are not enough slots for new keys, and this
continues until available memory is exhausted ... a warning message, and training can continue"
(issue 28, item 7). Growth stops before a doubling that would leave less than the growth headroom
free (``expansion.memory_headroom``); the table then warns once, leaves the keys it cannot place
unplaced (counted; ``safe_check_mode`` decides what the caller sees) and keeps every stored key.

Keys whose hashes share their low 40 bits share their home bucket in every table of up to 2**40
buckets (power-of-two bucket counts), so no doubling separates them (issue 17, item 3): the tests
that use them shrink the free memory the growth rule sees (:func:`_memory`), else the table would
grow until the headroom of this machine's memory.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.lookup.initializers import DEBUG_MODULUS
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


def _memory(monkeypatch, free: int, headroom: int = 0) -> None:
    """Make the growth rule see ``free`` bytes free, ``headroom`` of them to keep."""
    monkeypatch.setattr(expansion, "free_bytes", lambda device: free)
    monkeypatch.setattr(expansion, "memory_headroom", lambda device: headroom)


# Doubling the 1-column table of _table from 256 to 512 slots needs 27,648 bytes (doubling_bytes),
# from 128 to 256 13,824: with 20,000 free the table grows to 256 slots (past max_capacity 64).
_FREE_FOR_256 = 20_000


def _table(mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE) -> ScoredHashTable:
    spec = TableSpec(
        "ne",
        row_width=1,
        init_capacity=64,
        max_capacity=64,
        bucket_capacity=16,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        safe_check_mode=mode,
    )
    return ScoredHashTable([spec], "cpu")


def _rows(keys: torch.Tensor) -> torch.Tensor:
    return keys.remainder(1000).to(torch.float32).unsqueeze(1)


def test_keys_no_bucket_count_separates_stop_at_the_memory_headroom_warned_once(
    monkeypatch,
) -> None:
    _memory(monkeypatch, _FREE_FOR_256)
    table = _table()
    # bucket 0 full, plus keys that never share it (h % 4 != 0: not in bucket 0 of any table)
    others = torch.tensor([k for k in range(100) if bucket_of(k, 4) != 0][:20])
    old = torch.cat([colliding_keys(16), others])
    assert bool((table.insert(old, rows=_rows(old)) >= 0).all())
    extra = colliding_keys(8, start=100)
    with pytest.warns(
        DynamicEmbWarning, match=r"'ne' cannot grow beyond 256 slots: doubling needs 27648 bytes"
    ):
        slots = table.insert(extra, rows=_rows(extra))
    # grew past max_capacity (64) while memory allowed, no further
    assert bool((slots < 0).all()) and table.capacity(0) == 256
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicEmbWarning)  # warned once per table
        assert bool((table.insert(colliding_keys(4, start=200)) < 0).all())
    found = table.find(old)
    assert bool(found.found.all())  # old keys intact, with their rows
    torch.testing.assert_close(table.read_rows(0, found.slots), _rows(old))
    assert table.size(0) == old.numel()


def test_unplaced_keys_follow_safe_check_mode(monkeypatch) -> None:
    _memory(monkeypatch, _FREE_FOR_256)
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


def test_the_headroom_stays_free(monkeypatch) -> None:
    """The one rule: a doubling needing ``n`` bytes is tried only while ``n <= free - headroom``."""
    needed, headroom = 5000, 3000
    monkeypatch.setattr(expansion, "memory_headroom", lambda device: headroom)
    for free, allowed in ((needed + headroom, True), (needed + headroom - 1, False)):
        monkeypatch.setattr(expansion, "free_bytes", lambda device, free=free: free)
        refusal = expansion.GrowthGuard.refusal(64, 64, needed, torch.device("cpu"), True)
        assert (refusal is None) == allowed, free
    # an evicting table stops at max_capacity; NO_EVICTION only at the headroom
    monkeypatch.setattr(expansion, "free_bytes", lambda device: 1 << 40)
    assert "max_capacity" in expansion.GrowthGuard.refusal(64, 64, 1, torch.device("cpu"), False)
    assert expansion.GrowthGuard.refusal(64, 64, 1, torch.device("cpu"), True) is None
    # the default headroom: 10 % of the device's memory, at least 1 GiB
    monkeypatch.undo()
    total = expansion.total_bytes(torch.device("cpu"))
    assert total is not None
    assert expansion.memory_headroom(torch.device("cpu")) == max(total // 10, 1 << 30)


def test_module_with_no_eviction_that_cannot_grow_raises_under_error_mode(monkeypatch) -> None:
    # 20,000 bytes: 256 slots (128 -> 256 needs 16,896 with the group's rows; 256 -> 512 33,792)
    _memory(monkeypatch, _FREE_FOR_256)

    def module(mode: DynamicEmbCheckMode) -> BatchedDynamicEmbeddingTables:
        opts = DynamicEmbTableOptions(
            dim=4,
            init_capacity=64,
            max_capacity=64,
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


def _no_eviction_module(**kw) -> BatchedDynamicEmbeddingTables:
    fields = dict(
        dim=4,
        init_capacity=16,
        max_capacity=16,
        bucket_capacity=16,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    )
    opts = DynamicEmbTableOptions(**{**fields, **kw})
    return BatchedDynamicEmbeddingTables(
        [opts],
        ["t"],
        [0],
        DynamicEmbPoolingMode.NONE,
        EmbOptimType.EXACT_SGD,
        torch.device("cpu"),
        learning_rate=0.5,
    )


def _debug_row(keys: torch.Tensor) -> torch.Tensor:
    """The DEBUG initializer's row of each key (``key % DEBUG_MODULUS`` in every column)."""
    return (keys % DEBUG_MODULUS).to(torch.float32).unsqueeze(1).expand(-1, 4)


def test_no_eviction_grows_past_max_capacity_and_trains_every_key() -> None:
    """The issue's case: max_capacity 16, 100 new keys -> all 100 placed and trained (oracle: the
    DEBUG row, then one SGD step of lr 0.5 on a gradient of 1 per element), none unplaced."""
    m = _no_eviction_module()
    keys = torch.arange(1, 101)
    offsets = torch.tensor([0, 100])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicEmbWarning)  # nothing to warn about
        out = m(keys, offsets)
        torch.testing.assert_close(out, _debug_row(keys))
        out.sum().backward()
        again = m(keys, offsets)
    torch.testing.assert_close(again, _debug_row(keys) - 0.5)
    table = m.tables[0]
    assert table.capacity(0) >= 200  # doubled past max_capacity (16), load factor 0.5
    assert m.metrics()["t"]["unplaced"] == 0 and m.metrics()["t"]["placed"] == 100


def test_growth_stopped_by_the_headroom_warns_once_counts_and_trains_on(monkeypatch) -> None:
    """Memory for 64 slots only: one warning, the rest unplaced (zeros, counted), no crash; the
    placed keys keep training."""
    # 16 -> 32 -> 64 fit (2,112 and 4,224 bytes with the group's rows), 64 -> 128 (8,448) not
    _memory(monkeypatch, 5_000)
    m = _no_eviction_module()
    keys = torch.arange(1, 101)
    offsets = torch.tensor([0, 100])
    with pytest.warns(DynamicEmbWarning, match=r"'t' cannot grow beyond 64 slots") as caught:
        out = m(keys, offsets)
        out.sum().backward()
        again = m(keys, offsets)  # warned once per table: no second warning
        again.sum().backward()
    growth = [w for w in caught if "cannot grow" in str(w.message)]
    assert len(growth) == 1
    table = m.tables[0]
    assert table.capacity(0) == 64
    stored = table.find(0, keys)[0]
    placed = int(stored.sum())
    assert 0 < placed <= 64
    lost = ~stored
    assert bool((out.detach()[lost] == 0).all()) and bool((again.detach()[lost] == 0).all())
    # placed keys: DEBUG rows, one SGD step applied between the two forwards
    torch.testing.assert_close(again.detach()[stored], _debug_row(keys[stored]) - 0.5)
    metrics = m.metrics()["t"]
    assert metrics["unplaced"] == 2 * (100 - placed) and metrics["placed"] == placed


def test_a_no_eviction_cache_keeps_its_size_and_its_next_tier_grows() -> None:
    """A cache's size is its device budget: a NO_EVICTION cached table's cache stays at its 16
    slots (keys that do not fit spill to the host table) and the host table grows past
    max_capacity (64), so all 100 keys are kept, none unplaced, nothing warned."""
    m = _no_eviction_module(max_capacity=64, caching=True, local_hbm_for_values=16 * 16)
    keys = torch.arange(1, 101)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicEmbWarning)
        out = m(keys, torch.tensor([0, 100]))
    torch.testing.assert_close(out, _debug_row(keys))
    tier = m.tables[0]
    assert tier.capacity(0) == 16
    assert bool(tier.find(0, keys)[0].all())
    assert m.metrics()["t"]["unplaced"] == 0


def test_a_table_grown_past_max_capacity_round_trips_a_checkpoint(tmp_path) -> None:
    """Load inserts into a table at its planned size; a NO_EVICTION one grows again to take every
    key of a checkpoint that outgrew max_capacity, with its rows, optimizer state and numbers."""
    from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
    from tests.checkpoint.helpers import assert_same_rows_by_key, make_model, snapshot

    kw = dict(
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        max_capacity=16,
        init_capacity=16,
        bucket_capacity=16,
    )
    src = make_model(**kw)
    keys = [list(range(100)), list(range(500, 540))]
    flat = torch.tensor([k for ks in keys for k in ks])
    offsets = torch.tensor([0, 100, 140])
    src(flat, offsets).pow(2).sum().backward()
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicEmbWarning)
        DynamicEmbLoad(str(tmp_path), dst, optim=True)
    a, b = snapshot(src), snapshot(dst)
    assert sorted(a["model.ebc/t0"].slots) == keys[0] and sorted(a["model.ebc/t1"].slots) == keys[1]
    assert_same_rows_by_key(a, b)
    for name in a:
        assert a[name].scores == b[name].scores, name
        assert a[name].slots == b[name].slots, name  # slot-exact: it grew to the source's capacity
