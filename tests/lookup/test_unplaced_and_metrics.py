"""Keys that find no place read zeros; every table counts hits / misses / placed / evicted / unplaced.

The seed (DynamicEmbCheckMode): keys a full bucket cannot take read 0.0 under WARNING and IGNORE and
get no update. The counters are checked against an independent count taken from the table's own
contents before and after each forward (one placing call per table per forward), for device tables,
hybrid tables (rows split between device and host buffers) and caches.
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Set

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core import table_metrics
from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.lookup.initializers import DEBUG_MODULUS
from dynamicemb_core.storage.table_views import CachedTableView
from dynamicemb_core.types import DynamicEmbWarning
from tests.lookup import oracle

DIM = 4
ROW_BYTES = DIM * 4  # EXACT_SGD: the embedding only, float32
TABLES = ("t0", "t1")
# 2 buckets of 16 slots per table: batches of 40 distinct keys cannot all be placed
KINDS = {
    "grouped": {},
    "hybrid": {"local_hbm_for_values": 16 * ROW_BYTES},
}


def _module(device, mode=DynamicEmbCheckMode.IGNORE, **kw) -> BatchedDynamicEmbeddingTables:
    opts = [
        DynamicEmbTableOptions(
            dim=DIM,
            max_capacity=32,
            bucket_capacity=16,
            safe_check_mode=mode,
            initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
            **oracle.device_resident(dict(kw)),
        )
        for _ in TABLES
    ]
    return BatchedDynamicEmbeddingTables(
        opts,
        list(TABLES),
        list(range(len(TABLES))),
        DynamicEmbPoolingMode.NONE,
        EmbOptimType.EXACT_SGD,
        device,
        learning_rate=0.1,
    )


def _batch(step: int, device, per_feature: int = 40):
    """Feature-major keys, distinct within a feature, from [1, 120) (DEBUG rows are nonzero)."""
    g = torch.Generator().manual_seed(step)
    keys = [torch.randperm(119, generator=g)[:per_feature] + 1 for _ in TABLES]
    indices = torch.cat(keys).to(device)
    offsets = torch.tensor([0, per_feature, 2 * per_feature], device=device)
    return indices, offsets, [set(k.tolist()) for k in keys]


def _stored(m: BatchedDynamicEmbeddingTables, t: int) -> Set[int]:
    return {k for keys, _, _ in m.tables[t].export(0) for k in keys.tolist()}


def _stored_rows(m, t: int, keys: torch.Tensor) -> torch.Tensor:
    return m.tables[t].find(0, keys)[1][:, :DIM]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unplaced_keys_read_zeros_and_counts_match_the_contents(device, kind):
    m = _module(device, **KINDS[kind])
    want: List[Dict[str, int]] = [
        dict.fromkeys(("hits", "misses", "placed", "evicted", "unplaced"), 0) for _ in TABLES
    ]
    saw_unplaced = saw_evicted = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        for step in range(6):
            indices, offsets, batch = _batch(step, device)
            before = [_stored(m, t) for t in range(len(TABLES))]
            out = m(indices, offsets)
            after = [_stored(m, t) for t in range(len(TABLES))]
            for t in range(len(TABLES)):
                c = want[t]
                c["hits"] += len(batch[t] & before[t])
                c["misses"] += len(batch[t] - before[t])
                c["placed"] += len(after[t] - before[t])
                c["evicted"] += len(before[t] - after[t])
                c["unplaced"] += len(batch[t] - after[t])
                saw_unplaced += len(batch[t] - after[t])
                saw_evicted += len(before[t] - after[t])
                # what each index read: its stored row, or zeros when it has no place
                rows = out[t * 40 : (t + 1) * 40].detach()
                keys = indices[t * 40 : (t + 1) * 40]
                placed = torch.tensor([k in after[t] for k in keys.tolist()], device=device)
                assert bool((rows[~placed] == 0).all()), (kind, step, t)
                torch.testing.assert_close(rows[placed], _stored_rows(m, t, keys[placed]))
                new = torch.tensor(
                    [k in after[t] and k not in before[t] for k in keys.tolist()], device=device
                )
                expect_new = (keys[new] % DEBUG_MODULUS).float().unsqueeze(1).expand(-1, DIM)
                torch.testing.assert_close(rows[new], expect_new)
            out.sum().backward()
    assert saw_unplaced > 0 and saw_evicted > 0  # the batches exercise both
    got = m.metrics()
    assert got == {name: want[t] for t, name in enumerate(TABLES)}
    assert table_metrics(m) == {"model": got}
    m.reset_metrics()
    assert all(v == 0 for c in m.metrics().values() for v in c.values())


def test_unplaced_keys_get_no_update(device):
    """A key with no place reads zeros in every batch: no update reached it (nor any row)."""
    m = _module(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        indices, offsets, batch = _batch(0, device)
        for _ in range(3):
            out = m(indices, offsets)
            (out * 3.0).sum().backward()
    stored = _stored(m, 0)
    lost = [i for i, k in enumerate(indices[:40].tolist()) if k not in stored]
    assert lost and bool((out[lost] == 0).all())
    assert m.metrics()["t0"]["unplaced"] == 3 * len(lost)


def test_cache_hits_and_zeros_for_keys_no_tier_holds(device):
    opts = DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=16,
        bucket_capacity=16,
        caching=True,
        local_hbm_for_values=16 * ROW_BYTES,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    )
    m = BatchedDynamicEmbeddingTables(
        [opts], ["t"], [0], DynamicEmbPoolingMode.NONE, EmbOptimType.EXACT_SGD, device
    )
    assert isinstance(m.tables[0], CachedTableView)
    keys = torch.arange(1, 41, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        out = m(keys, torch.tensor([0, 40], device=device))
    # 40 new keys: 16 fit the cache, 16 of the other 24 the host table, 8 fit nowhere
    tier = m.tables[0]
    assert tier.capacity(0) == 16
    stored = set(_cached_keys(tier)) | set(_cache_keys(tier.backing))
    assert len(stored) == 32
    lost = [i for i, k in enumerate(keys.tolist()) if k not in stored]
    assert len(lost) == 8 and bool((out[lost] == 0).all())
    kept = [i for i in range(40) if i not in lost]
    torch.testing.assert_close(
        out[kept, 0], (keys[kept] % DEBUG_MODULUS).float(), msg="stored keys read their rows"
    )
    got = m.metrics()["t"]
    assert got["hits"] == 0 and got["misses"] == 40 and got["unplaced"] == 8
    hits = set(_cached_keys(tier))
    m(keys, torch.tensor([0, 40], device=device))
    assert m.metrics()["t"]["hits"] == len(hits)


def _cached_keys(view: CachedTableView) -> List[int]:
    """Keys in the device cache of a cached table (the group's hash table; no flush)."""
    return view.group.table.export(view.table_id).keys.tolist()


def _cache_keys(tier) -> List[int]:
    """Keys of one tier (a a group: its export reads without flushing anything)."""
    return [k for keys, _, _ in tier.export(0) for k in keys.tolist()]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ignore_warns_once_per_table(device, kind):
    m = _module(device, DynamicEmbCheckMode.IGNORE, **KINDS[kind])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            m(*_batch(step, device)[:2]).sum().backward()
    mine = [w for w in caught if issubclass(w.category, DynamicEmbWarning)]
    assert sorted(str(w.message).split("'")[1] for w in mine) == list(TABLES)
    assert all("bucket_capacity or max_capacity" in str(w.message) for w in mine)
    assert all(c["unplaced"] > 0 for c in m.metrics().values())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_warning_warns_every_batch(device, kind):
    m = _module(device, DynamicEmbCheckMode.WARNING, **KINDS[kind])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            m(*_batch(step, device)[:2])
    mine = [w for w in caught if issubclass(w.category, DynamicEmbWarning)]
    assert len(mine) == 3 * len(TABLES)
    assert all("read as zeros" in str(w.message) for w in mine)


def test_pinned_keys_riding_along_are_not_counted_as_hits(device):
    """A cache carries prefetch-pinned keys in every placing call to protect them; they were not
    looked up, so the forward's hits and misses count its own keys only."""
    opts = DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=256,
        bucket_capacity=16,
        caching=True,
        local_hbm_for_values=64 * ROW_BYTES,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    )
    m = BatchedDynamicEmbeddingTables(
        [opts], ["t"], [0], DynamicEmbPoolingMode.NONE, EmbOptimType.EXACT_SGD, device
    )
    pinned = torch.arange(100, 108, device=device)
    m.prefetch(pinned, torch.tensor([0, 8], device=device))
    m.reset_metrics()
    own = torch.tensor([1, 2, 3, 100], device=device)  # 100 is cached (prefetched): a hit
    m(own, torch.tensor([0, 4], device=device))
    got = m.metrics()["t"]
    assert (got["hits"], got["misses"]) == (1, 3)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("backward", [True, False])
def test_deferred_placement_readback_counts_as_the_immediate_one(
    device, kind, backward, monkeypatch
):
    """IGNORE tables do not wait for the placement's outcome in the forward (it is read when the
    next step, a counter read or the backward needs it); WARNING tables read it at once. Both see
    the same outputs, contents and counters, with or without a backward between forwards.

    The two modules are compared key for key, and these small tables oversubscribe buckets, where
    the key-parallel CUDA engine lets the schedule choose which new keys get in (H200, mode 0:
    the outputs differed between two otherwise equal modules). So both run the deterministic
    engine; the deferral itself does not depend on the engine."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")  # read when the tables are built
    late = _module(device, DynamicEmbCheckMode.IGNORE, **KINDS[kind])
    now = _module(device, DynamicEmbCheckMode.WARNING, **KINDS[kind])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        for step in range(5):
            indices, offsets, _ = _batch(step, device)
            torch.manual_seed(step)
            out_late = late(indices, offsets)
            assert late._group.storage._pending_placement is not None  # not waited for
            torch.manual_seed(step)
            out_now = now(indices, offsets)
            assert now._group.storage._pending_placement is None
            assert torch.equal(out_late, out_now)
            if backward:
                out_late.sum().backward()
                out_now.sum().backward()
                assert late._group.storage._pending_placement is None  # the backward read it
    assert late.metrics() == now.metrics()
    for t in range(len(TABLES)):
        assert _stored(late, t) == _stored(now, t)


def test_host_counts_added_every_step_stay_bounded_and_sum_right():
    """The grouped lookup adds its per-step outcome as host ints; a loop that never reads the
    metrics must not keep every step's outcome (they are summed in batches), and the totals read
    later are the sums of every step."""
    from dynamicemb_core.table.metrics import PlacementCounters

    counters = PlacementCounters(2, torch.device("cpu"))
    steps = 1000
    for s in range(steps):
        counters.add([5, 1 + s % 3], [2, 0], [1, 0], [0, s % 2])
        assert len(counters._pending) < 300
    got = counters.read()
    odd = steps // 2
    assert got[0] == {
        "hits": 3 * steps,
        "misses": 2 * steps,
        "placed": 2 * steps,
        "evicted": steps,
        "unplaced": 0,
    }
    looked_up_1 = sum(1 + s % 3 for s in range(steps))
    assert got[1] == {
        "hits": looked_up_1 - odd,
        "misses": odd,
        "placed": 0,
        "evicted": 0,
        "unplaced": odd,
    }
