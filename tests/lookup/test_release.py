"""A lookup module frees its tables on ``del``, with no help from Python's cycle collector.

Each module once handed its group a bound method of itself, and each storage handed its hash table
bound methods of the storage (growth listener, counters' ``before_read``): reference cycles, so the
rows (the GPU memory of a model) stayed allocated after ``del`` until ``gc.collect()`` ran; building
a second model then ran out of memory. Checked with the collector disabled, after a training step
(forward, backward) and a prefetch, for the three kinds of table.
"""

from __future__ import annotations

import gc
import weakref
from typing import Iterator

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core import DynamicEmbPoolingMode
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from tests.lookup import oracle

KINDS = {
    "device": {},
    "hybrid": dict(local_hbm_for_values=512),
    "cached": dict(caching=True, local_hbm_for_values=512),
}


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _trained(device: torch.device, kind: str) -> BatchedDynamicEmbeddingTables:
    module = BatchedDynamicEmbeddingTables(
        [oracle.options(8, **KINDS[kind]), oracle.options(4, **KINDS[kind])],
        ["a", "b"],
        [0, 1],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.ADAM,
        device,
        learning_rate=0.1,
    )
    indices = torch.arange(40, device=device)
    offsets = torch.tensor([0, 10, 20, 30, 40], device=device)
    module.prefetch(indices, offsets)
    module(indices, offsets).sum().backward()
    module.metrics()  # reads the counters (their before_read callback)
    return module


@pytest.mark.parametrize("kind", list(KINDS))
def test_module_is_freed_on_del_without_gc(device: torch.device, kind: str, no_gc: None) -> None:
    module = _trained(device, kind)
    storage = module._group.storage
    refs = {
        "module": weakref.ref(module),
        "group": weakref.ref(module._group),
        "storage": weakref.ref(storage),
        "hash table": weakref.ref(storage.table),
        "rows": weakref.ref(storage.rows.values),
    }
    del module, storage
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert not alive, f"still alive after del (gc disabled): {alive}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_memory_is_returned_on_del(no_gc: None) -> None:
    device = torch.device("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    module = BatchedDynamicEmbeddingTables(
        [oracle.options(64, max_capacity=1 << 16) for _ in range(2)],
        ["a", "b"],
        [0, 1],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.ADAM,
        device,
        learning_rate=0.1,
    )
    indices = torch.arange(1000, device=device)
    offsets = torch.tensor([0, 500, 1000], device=device)
    module(indices, offsets).sum().backward()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(device) - before
    assert held >= 2 * (1 << 16) * 64 * 4, held  # the rows are on the device
    del module
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated(device) - before
    # (a tenth: room for any workspace an op keeps; the cycle kept all of it)
    assert left < held // 10, f"{left} of {held} bytes still allocated after del (gc disabled)"
