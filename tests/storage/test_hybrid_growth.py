"""A hybrid table of a group grows from init_capacity to max_capacity like a device table: every row
keeps its value (checked against a group without a device budget, whose hash table makes the same
placements, and against a dict of what was written), and the device block never exceeds the budget.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.storage.grouped import GroupedDeviceStorage
from dynamicemb_core.storage.table_views import TableView
from dynamicemb_core.testing.compare import assert_same_stored_rows
from dynamicemb_core.types import MemoryType, StorageTableSpec
from tests.lookup import oracle

WIDTH = 5
ROW_BYTES = WIDTH * 4  # float32
BUDGET_ROWS = 100


def _options(**kw) -> DynamicEmbTableOptions:
    kw.setdefault("init_capacity", 64)
    kw.setdefault("max_capacity", 1024)
    kw.setdefault("bucket_capacity", 16)
    return DynamicEmbTableOptions(dim=WIDTH - 1, **oracle.device_resident(kw))


def _spec() -> StorageTableSpec:
    return StorageTableSpec(name="t", dim=WIDTH - 1, row_width=WIDTH, capacity=1024)


def test_hybrid_keeps_every_row_while_growing_to_max_capacity(device):
    opts = _options()
    hybrid = GroupedDeviceStorage(
        [_spec()], device, dims=[WIDTH - 1], table_options=[opts], device_rows=[BUDGET_ROWS]
    )
    plain = GroupedDeviceStorage([_spec()], device, dims=[WIDTH - 1], table_options=[opts])
    assert hybrid.capacity(0) == 64 and hybrid.device_rows(0) == 64
    g = torch.Generator().manual_seed(3)
    keys = torch.randperm(1 << 20, generator=g)[:420] - (1 << 19)  # negative keys too
    written = {}
    capacities = set()
    for chunk in keys.split(30):
        rows = torch.randn(chunk.numel(), WIDTH, generator=g)
        scores = torch.zeros(chunk.numel(), 1, dtype=torch.int64)
        for store in (hybrid, plain):
            store.insert(0, chunk.to(device), rows.to(device), scores.to(device))
        written.update({int(k): r for k, r in zip(chunk.tolist(), rows)})
        capacities.add(hybrid.capacity(0))
        assert hybrid.capacity(0) == plain.capacity(0)
        assert hybrid.device_rows(0) == min(hybrid.capacity(0), BUDGET_ROWS)
        assert hybrid.memory_usage(MemoryType.DEVICE) <= BUDGET_ROWS * ROW_BYTES
        probe = torch.tensor(list(written), device=device)
        found_h, rows_h, _ = hybrid.find(0, probe)
        found_p, rows_p, _ = plain.find(0, probe)
        assert torch.equal(found_h, found_p)
        assert torch.equal(rows_h[found_h], rows_p[found_p])
        want = torch.stack([written[k] for k in probe[found_h].tolist()])
        assert torch.equal(rows_h[found_h].cpu(), want)
    assert capacities >= {128, 256, 512, 1024}, capacities  # it doubled all the way to the cap
    assert hybrid.evictions(0) == plain.evictions(0)
    # the last capacity holds (nearly) every key, a good share of them in host rows
    assert hybrid.size(0) >= 400
    slots = hybrid.table.find(keys.to(device), 0).slots
    assert bool((slots >= BUDGET_ROWS).any()) and bool(((slots >= 0) & (slots < BUDGET_ROWS)).any())
    assert hybrid.memory_usage(MemoryType.HOST) == (1024 - BUDGET_ROWS) * ROW_BYTES


def _module(device, **kw) -> BatchedDynamicEmbeddingTables:
    opts = _options(
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG), **kw
    )
    return BatchedDynamicEmbeddingTables(
        [opts],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,  # row = embedding (4) + one accumulator
        device,
        learning_rate=0.1,
        eps=1e-6,
    )


def test_hybrid_module_trains_like_a_device_table_while_growing(device, monkeypatch):
    # Both modules must place the same keys when a bucket overflows (some keys go unplaced here),
    # so the CUDA insert engine runs in its deterministic mode; the key-parallel one chooses the
    # unplaced keys by its schedule, differently in each module.
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")
    hybrid = _module(device, local_hbm_for_values=BUDGET_ROWS * ROW_BYTES)
    plain = _module(device)
    storage = hybrid.tables[0]
    # both modules group their tables; the hybrid one keeps rows past its budget in host memory
    assert isinstance(storage, TableView) and storage.capacity(0) == 64
    assert isinstance(plain.tables[0], TableView)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        keys = torch.randint(0, 350, (160,), generator=g).to(device)
        offsets = torch.arange(0, 161, 4).to(device)
        want, got = plain(keys, offsets), hybrid(keys, offsets)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        coeff = torch.randn(want.shape, generator=g).to(device)
        (want * coeff).sum().backward()
        (got * coeff).sum().backward()
        assert storage.device_rows(0) <= BUDGET_ROWS
        assert storage.memory_usage(MemoryType.DEVICE) <= BUDGET_ROWS * ROW_BYTES
    assert storage.capacity(0) > 256  # grew under load
    assert storage.capacity(0) == plain.tables[0].capacity(0)
    probe = torch.arange(350, device=device)
    assert_same_stored_rows(plain.tables[0], storage, probe)
