"""Storage tiers: hybrid rows, device cache over a host table / a third-party Storage, direct external
storage, prefetch/flush, and last-tier eviction. Each tiered module is checked against the same
training on a plain device table (DEBUG initializer: rows are a function of the key)."""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.storage.table_views import CachedTableView, TableView
from dynamicemb_core.testing.compare import assert_same_stored_rows
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.types import MemoryType, StorageTableSpec
from tests.lookup import oracle

DIM = 4
ROW_BYTES = (DIM + 1) * 4  # EXACT_ROWWISE_ADAGRAD: embedding + one accumulator, float32
NUM_KEYS = 300


def _opts(**kw):
    kw.setdefault("max_capacity", 1024)
    kw.setdefault("bucket_capacity", 128)
    return DynamicEmbTableOptions(
        dim=DIM,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
        **oracle.device_resident(kw),
    )


def _module(device, opts):
    return BatchedDynamicEmbeddingTables(
        [opts],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        device,
        learning_rate=0.1,
        eps=1e-6,
    )


def _batches(device, n=6):
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        keys = torch.randint(0, NUM_KEYS, (160,), generator=g)
        offsets = torch.arange(0, 161, 4)
        yield keys.to(device), offsets.to(device)


def _train_and_compare(device, tiered, prefetch=False):
    plain = _module(device, _opts())
    for keys, offsets in _batches(device):
        if prefetch:
            tiered.prefetch(keys, offsets)
        want = plain(keys, offsets)
        got = tiered(keys, offsets)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        coeff = torch.randn(want.shape, device=device)
        (want * coeff).sum().backward()
        (got * coeff).sum().backward()
    tiered.flush()
    keys = torch.arange(NUM_KEYS, device=device)
    assert_same_stored_rows(plain.tables[0], tiered.tables[0], keys)


def test_hybrid_rows_split_device_and_host_train_like_a_device_table(device):
    tiered = _module(device, _opts(local_hbm_for_values=300 * ROW_BYTES))
    storage = tiered.tables[0]
    assert isinstance(storage, TableView)  # a hybrid table trains in the module's group
    assert 0 < storage.device_rows(0) < storage.capacity(0)
    row_bytes = storage.tables[0].row_width * 4
    assert storage.memory_usage(MemoryType.DEVICE) == storage.device_rows(0) * row_bytes
    host_rows = storage.capacity(0) - storage.device_rows(0)
    assert storage.memory_usage(MemoryType.HOST) == host_rows * row_bytes
    _train_and_compare(device, tiered)
    homes = storage.table.find(torch.arange(NUM_KEYS, device=device), 0)
    slots = homes.slots[homes.found]
    assert bool((slots < storage.device_rows(0)).any()) and bool(
        (slots >= storage.device_rows(0)).any()
    )


@pytest.mark.parametrize("prefetch", [False, True])
def test_cache_over_host_table_trains_like_a_device_table(device, prefetch):
    tiered = _module(
        device, _opts(caching=True, local_hbm_for_values=64 * ROW_BYTES, bucket_capacity=16)
    )
    storage = tiered.tables[0]
    assert isinstance(storage, CachedTableView) and storage.capacity(0) == 64
    _train_and_compare(device, tiered, prefetch=prefetch)
    assert storage.spills(0) > 0  # the cache was too small: rows went to the host table and back


def test_prefetch_makes_the_batch_resident_in_the_cache(device):
    tiered = _module(
        device, _opts(caching=True, local_hbm_for_values=256 * ROW_BYTES, bucket_capacity=16)
    )
    keys = torch.arange(0, 40, device=device)
    tiered.prefetch(keys, torch.tensor([0, 40], device=device))
    assert bool(tiered.tables[0].cached(keys).all())


def _dict_storage():
    return PyDictStorage([StorageTableSpec(name="t", dim=DIM, row_width=DIM + 1)], "cpu")


@pytest.mark.parametrize("cache_rows", [0, 64])
def test_third_party_storage_through_the_abc_trains_like_a_device_table(device, cache_rows):
    external = _dict_storage()
    tiered = _module(
        device,
        _opts(
            external_storage=external,
            local_hbm_for_values=cache_rows * ROW_BYTES,
            bucket_capacity=16,
        ),
    )
    _train_and_compare(device, tiered)
    assert external.sizes()[0] > 0


def test_external_storage_by_registered_name(device):
    tiered = _module(
        device,
        _opts(external_storage="dict", local_hbm_for_values=64 * ROW_BYTES, bucket_capacity=16),
    )
    assert isinstance(tiered.tables[0].backing, PyDictStorage)
    _train_and_compare(device, tiered)


def test_external_storage_with_wrong_row_width_is_rejected():
    bad = PyDictStorage([StorageTableSpec(name="t", dim=DIM, row_width=DIM)], "cpu")
    with pytest.raises(ValueError, match="stores rows of 4 x torch.float32, the lookup needs 5"):
        _module("cpu", _opts(external_storage=bad))


def test_caching_without_hbm_budget_gets_one_bucket_with_a_warning():
    # the seed rounds a cache budget below one bucket up to one bucket instead of refusing it
    with pytest.warns(UserWarning, match="less than one bucket"):
        m = _module("cpu", _opts(caching=True, bucket_capacity=16))
    assert m.tables[0].capacity(0) == 16


def _lfu_warmup(m, device):
    """Keys 0..7 in two batches, 8..15 in one: a full LFU bucket of 16 (keys are deduplicated per
    batch, so a key's count is the number of batches it appeared in)."""
    m(torch.arange(16, device=device), torch.tensor([0, 16], device=device))
    m(torch.arange(8, device=device), torch.tensor([0, 8], device=device))


def test_last_tier_evicts_lowest_lfu_scores_and_retains_them(device):
    opts = _opts(
        max_capacity=16,
        bucket_capacity=16,
        score_strategy=DynamicEmbScoreStrategy.LFU,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,
    )
    m = _module(device, opts)
    _lfu_warmup(m, device)
    m(torch.arange(100, 104, device=device), torch.tensor([0, 4], device=device))
    evicted = m.tables[0].pop_evicted_keys(0).cpu()
    assert evicted.numel() == 4 and bool(((evicted >= 8) & (evicted < 16)).all())
    found = m.tables[0].find(0, torch.arange(8, device=device))[0]
    assert bool(found.all())  # the twice-seen keys survive
    assert m.table_stats()[0]["evictions"] == 4


def test_cache_evictions_spill_and_only_the_host_tier_drops(device):
    opts = _opts(
        max_capacity=16,
        bucket_capacity=16,
        caching=True,
        local_hbm_for_values=16 * ROW_BYTES,
        score_strategy=DynamicEmbScoreStrategy.LFU,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,
    )
    m = _module(device, opts)
    _lfu_warmup(m, device)
    m(torch.arange(100, 104, device=device), torch.tensor([0, 4], device=device))
    storage = m.tables[0]
    assert storage.spills(0) == 4  # the cache made room by writing 4 keys to the host table
    assert storage.pop_evicted_keys(0).numel() == 0  # the host table still holds all 20
    m.flush()
    assert storage.backing.size(0) == 16  # host table full: it dropped 4 keys, and retained them
    assert storage.pop_evicted_keys(0).numel() == 4


def test_step_strategy_evicts_the_keys_of_the_oldest_step(device):
    opts = _opts(
        max_capacity=16,
        bucket_capacity=16,
        score_strategy=DynamicEmbScoreStrategy.STEP,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,
    )
    m = _module(device, opts)
    m(torch.arange(0, 8, device=device), torch.tensor([0, 8], device=device))  # step 1
    m(torch.arange(8, 16, device=device), torch.tensor([0, 8], device=device))  # step 2
    m(torch.arange(100, 103, device=device), torch.tensor([0, 3], device=device))  # step 3
    evicted = m.tables[0].pop_evicted_keys(0).cpu()
    assert evicted.numel() == 3 and bool((evicted < 8).all())
    stats = m.table_stats()[0]
    assert stats == {"name": "t", "size": 16, "capacity": 16, "evictions": 3}


def test_keys_no_tier_can_hold_are_reported_by_safe_check_mode(device):
    from dynamicemb_core.config import DynamicEmbCheckMode
    from dynamicemb_core.types import DynamicEmbError

    opts = _opts(
        max_capacity=16,
        bucket_capacity=16,
        caching=True,
        local_hbm_for_values=16 * ROW_BYTES,
        safe_check_mode=DynamicEmbCheckMode.ERROR,
    )
    m = _module(device, opts)
    # 40 new keys: 16 fit the cache, 16 of the other 24 fit the host table, 8 fit nowhere
    with pytest.raises(DynamicEmbError, match=r"table 't': 8 key\(s\)"):
        m(torch.arange(40, device=device), torch.tensor([0, 40], device=device))


def test_each_view_names_the_group_holding_every_key_of_its_table(device):
    """A checkpoint asks a table's view for its home (no guessing from the storage's type): the
    module's group for a device table, the host group behind the cache of a cached one, and a
    refusal naming the table and the store for an external storage (it has no slots)."""
    from dynamicemb_core.storage.grouped import GroupedDeviceStorage

    plain = _module(device, _opts())
    home = plain.tables[0].home()
    assert home.group is plain.tables[0].group and home.table_id == 0 and home.flush is None
    cached = _module(device, _opts(caching=True, local_hbm_for_values=128 * ROW_BYTES))
    home = cached.tables[0].home()
    assert isinstance(home.group, GroupedDeviceStorage) and home.group.device.type == "cpu"
    assert home.group is not cached.tables[0].group and home.flush is not None
    external = _module(device, _opts(external_storage="dict", local_hbm_for_values=0))
    with pytest.raises(NotImplementedError, match="table 't'.*PyDictStorage.*slot-based"):
        external.tables[0].home()
