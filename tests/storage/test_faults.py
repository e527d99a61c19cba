"""A store that fails under the cache (issue 17): every tier transition is failure-atomic.

``FaultInjectionSuite`` trains a cached module over ``FaultyStorage`` next to a fault-free twin and
checks, after each injected failure, that the step raised ``StorageTierError``, that no acknowledged
row was lost or replaced by another key's, and that training goes on once the store is back. It runs
here over the reference dict storage, a host table, a hybrid (device + host rows) table, the store
used directly (no cache), and the ``caching=True`` stack (device cache over the host table); the
Redis and RocksDB plugins run it over their stores.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import pytest
import torch

from dynamicemb_core.storage import StorageTierError
from dynamicemb_core.storage.grouped import GroupedDeviceStorage
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.testing.fault_suite import (
    ROW_BYTES,
    FaultInjectionSuite,
    make_module,
    table_spec,
)
from dynamicemb_core.testing.faults import FaultyStorage, InjectedStorageFault
from dynamicemb_core.types import Storage, StorageTableSpec


class TestCacheOverDictStorage(FaultInjectionSuite):
    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        return PyDictStorage([spec])


class TestCacheOverHostTable(FaultInjectionSuite):
    """``caching=True``: the module's own host table, wrapped after construction."""

    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        raise AssertionError("unused: build() wraps the module's host table")

    def build(self, cache_rows: Optional[int] = None) -> Tuple[Any, FaultyStorage]:
        rows = self.cache_rows if cache_rows is None else cache_rows
        module = make_module(self.device, caching=True, local_hbm_for_values=rows * ROW_BYTES)
        tier = module.tables[0]
        assert isinstance(tier.backing, GroupedDeviceStorage)
        tier.backing = FaultyStorage(tier.backing)  # the host table, through the adapter
        return module, tier.backing


class TestCacheOverHybridTable(FaultInjectionSuite):
    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        return GroupedDeviceStorage([spec], "cpu", dims=[spec.dim], device_rows=[200])


class TestStoreWithoutCache(FaultInjectionSuite):
    cache_rows = 0

    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        return PyDictStorage([spec])


def test_faulty_storage_fails_the_nth_call_and_passes_the_rest() -> None:
    spec = table_spec()
    store = FaultyStorage(PyDictStorage([spec]), fail_nth={"insert": 2})
    rows, scores = torch.ones(3, spec.row_width), torch.zeros(3, 1, dtype=torch.int64)
    t0 = torch.zeros(3, dtype=torch.int64)
    store.insert(torch.arange(3), t0, rows, scores)
    with pytest.raises(InjectedStorageFault, match="insert call 2 .* refused"):
        store.insert(torch.arange(3, 6), t0, rows, scores)
    assert store.sizes() == [3]  # refused: nothing written
    store.insert(torch.arange(3, 6), t0, rows, scores)
    assert store.sizes() == [6] and store.injected == [("insert", 2)]
    store.arm(when="after", fail_nth={"erase": 1})
    with pytest.raises(InjectedStorageFault, match="took effect"):
        store.erase(torch.arange(2), t0[:2])
    assert store.sizes() == [4]  # the write happened; its acknowledgement was lost
    store.down()
    with pytest.raises(InjectedStorageFault):
        store.find(torch.arange(2), t0[:2])
    store.up()
    assert not bool(store.find(torch.arange(2), t0[:2])[0].any())


def test_faulty_storage_wraps_a_per_table_storage_through_the_adapter() -> None:
    """A host table (the per-table contract) under FaultyStorage speaks the multi-table one."""
    spec = table_spec()
    host = GroupedDeviceStorage([spec], "cpu", dims=[spec.dim])
    store = FaultyStorage(host, fail_nth={"find": 2})
    assert store.inner.inner is host and store.table is host.table  # extras pass through
    keys = torch.arange(4)
    rows = torch.arange(4 * spec.row_width, dtype=torch.float32).view(4, -1)
    store.insert(keys, torch.zeros_like(keys), rows, torch.zeros(4, 1, dtype=torch.int64))
    found, got, _ = store.find(keys, torch.zeros_like(keys))
    assert bool(found.all()) and torch.equal(got, rows) and host.size(0) == 4
    with pytest.raises(InjectedStorageFault, match="find call 2"):
        store.find(keys, torch.zeros_like(keys))


def test_faulty_storage_random_failures_follow_the_seed() -> None:
    def pattern(seed: int) -> list:
        store = FaultyStorage(PyDictStorage([table_spec()]), rate=0.5, seed=seed)
        out = []
        for _ in range(20):
            try:
                store.sizes()
                out.append(False)
            except InjectedStorageFault:
                out.append(True)
        return out

    assert pattern(3) == pattern(3) and any(pattern(3)) and not all(pattern(3))
    with pytest.raises(ValueError, match="no faultable method"):
        FaultyStorage(PyDictStorage([table_spec()]), fail_nth={"fnd": 1})


def test_a_failed_spill_leaves_no_key_pointing_at_another_keys_row() -> None:
    """The issue's scenario, reduced: one forward whose spill fails, then a look at every key."""
    store = FaultyStorage(PyDictStorage([table_spec()]))
    module = make_module(
        torch.device("cpu"), external_storage=store, local_hbm_for_values=32 * ROW_BYTES
    )
    first = torch.arange(0, 32)
    module(first, torch.arange(0, 33)).sum().backward()
    tier = module.tables[0]
    before_found, before_rows, _ = tier.find(0, torch.arange(64))
    store.arm({"insert": 1})
    with pytest.raises(StorageTierError, match="failed to write the evicted rows") as info:
        module(torch.arange(32, 64), torch.arange(0, 33))
    assert isinstance(info.value.__cause__, InjectedStorageFault)
    store.disarm()
    found, rows, _ = tier.find(0, torch.arange(64))
    assert torch.equal(found, before_found)
    torch.testing.assert_close(rows[found], before_rows[before_found])


def test_checkpoint_dump_and_load_through_a_failing_store(tmp_path) -> None:
    """DynamicEmbDump flushes the cache through the store: a failure leaves no checkpoint that
    DynamicEmbLoad would take, and nothing lost; once the store is back both work."""
    from dynamicemb_core.checkpoint import CheckpointCorruptError, DynamicEmbDump, DynamicEmbLoad
    from dynamicemb_core.testing.fault_suite import NUM_KEYS, batches

    module, store = TestCacheOverHostTable().build()
    tier = module.tables[0]
    for keys, offsets, coeff in batches(torch.device("cpu"), 4):
        (module(keys, offsets) * coeff).sum().backward()
    all_keys = torch.arange(NUM_KEYS)
    found, rows, _ = tier.find(0, all_keys)
    path = str(tmp_path / "ckpt")
    store.down()
    with pytest.raises(StorageTierError, match="failed to write back the cached rows"):
        DynamicEmbDump(path, module, optim=True)
    store.up()
    with pytest.raises(CheckpointCorruptError):
        DynamicEmbLoad(path, module, optim=True)
    now_found, now_rows, _ = tier.find(0, all_keys)
    assert torch.equal(now_found, found) and torch.equal(now_rows, rows)
    DynamicEmbDump(path, module, optim=True)
    for keys, offsets, coeff in batches(torch.device("cpu"), 2, seed=5):  # move on from the dump
        (module(keys, offsets) * coeff).sum().backward()
    store.down()  # the load writes the host table and drops stale cache copies: no store call
    DynamicEmbLoad(path, module, optim=True)
    store.up()
    got_found, got_rows, _ = tier.find(0, all_keys)
    assert bool(got_found[found].all())
    torch.testing.assert_close(got_rows[found], rows[found])
