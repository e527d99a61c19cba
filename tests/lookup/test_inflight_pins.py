"""A backward after a placing call: the forward's slots stay its keys' slots.

In a pipelined loop a prefetch (or the next forward) runs between a forward and its backward. The
forward pins its slots in the hash table until its backward: that call cannot evict them (its new
keys take other slots, or find no room), and when it grows the table the pinned slots move with
their keys. The backward updates each key where it lives, never another key's row. Oracle: the
same steps on a twin table large enough that nothing grows or is evicted.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from tests.lookup import oracle

DIM = 4


def _module(device, **capacity) -> BatchedDynamicEmbeddingTables:
    opts = oracle.debug_options(DIM, bucket_capacity=128, **capacity)
    return oracle.one_table_module(opts, device, EmbOptimType.EXACT_SGD, learning_rate=0.1)


def _bags(keys: torch.Tensor, per_bag: int, device) -> tuple:
    offsets = torch.arange(0, keys.numel() + 1, per_bag, dtype=torch.int64)
    return keys.to(device), offsets.to(device)


def _rows(m: BatchedDynamicEmbeddingTables, keys: torch.Tensor, device):
    found, rows, _ = m.tables[0].find(0, keys.to(device))
    return found.cpu(), rows[:, :DIM].cpu()


def _forward_prefetch_backward(m, a, b, device) -> None:
    out = m(*_bags(a, 10, device))
    m.prefetch(*_bags(b, 10, device))  # between the forward and its backward
    coeff = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape) / 7
    (out * coeff.to(device)).sum().backward()


def test_backward_after_a_prefetch_that_grew_the_table(device):
    a = torch.arange(1000, 1060)  # 60 keys
    b = torch.arange(5000, 5200)  # 200 new keys: 128 slots double twice
    grown = _module(device, init_capacity=128, max_capacity=4096)
    twin = _module(device, init_capacity=4096, max_capacity=4096)
    for m in (grown, twin):
        _forward_prefetch_backward(m, a, b, device)
    assert grown.tables[0].capacity(0) > 128, "the prefetch was meant to grow the table"
    keys = torch.cat([a, b])
    found, rows = _rows(grown, keys, device)
    twin_found, twin_rows = _rows(twin, keys, device)
    # a full bucket may still evict a few keys of a grown table; every stored row must be right
    assert bool(twin_found.all()) and int(found.sum()) > 0.9 * keys.numel()
    torch.testing.assert_close(rows[found], twin_rows[found])


def test_a_prefetch_cannot_evict_the_keys_of_a_forward_in_flight(device):
    a = torch.arange(1000, 1060)  # 60 keys, pinned until their backward
    b = torch.arange(5000, 5100)  # 100 new keys in a 128-slot table: 68 find room
    full = _module(device, init_capacity=128, max_capacity=128)
    twin = _module(device, init_capacity=4096, max_capacity=4096)
    for m in (full, twin):
        _forward_prefetch_backward(m, a, b, device)
    found_a, rows_a = _rows(full, a, device)
    _, twin_a = _rows(twin, a, device)
    assert bool(found_a.all()), "a pinned key was evicted"
    torch.testing.assert_close(rows_a, twin_a)  # every key of a got exactly its update
    found_b, rows_b = _rows(full, b, device)
    _, twin_b = _rows(twin, b, device)
    assert int(found_b.sum()) == 128 - a.numel()  # the rest of b found no unpinned slot
    torch.testing.assert_close(rows_b[found_b], twin_b[found_b])  # initial rows, nothing of a's
    assert int((full.tables[0].table.pin_counts(0) > 0).sum()) == 0  # the backward unpinned a


def test_two_forwards_in_flight_across_a_growth_then_one_backward(device):
    """Gradient accumulation: forward(a), forward(b) (which grows the table: a's pinned slots
    move), then one backward of both losses. Each step updates its own keys where they live now;
    the rows equal the twin's, and no pin is left."""
    a = torch.arange(1000, 1060)
    b = torch.arange(5000, 5200)  # 200 new keys beside a's pinned 60: the 128 slots double twice
    grown = _module(device, init_capacity=128, max_capacity=4096)
    twin = _module(device, init_capacity=4096, max_capacity=4096)
    for m in (grown, twin):
        out_a = m(*_bags(a, 10, device))
        out_b = m(*_bags(b, 10, device))
        ca = torch.arange(out_a.numel(), dtype=torch.float32).reshape(out_a.shape) / 7
        cb = torch.arange(out_b.numel(), dtype=torch.float32).reshape(out_b.shape) / 11
        ((out_a * ca.to(device)).sum() + (out_b * cb.to(device)).sum()).backward()
    assert grown.tables[0].capacity(0) > 128, "the second forward was meant to grow the table"
    keys = torch.cat([a, b])
    found, rows = _rows(grown, keys, device)
    twin_found, twin_rows = _rows(twin, keys, device)
    assert bool(twin_found.all()) and bool(found[: a.numel()].all())  # a was pinned: kept
    torch.testing.assert_close(rows[found], twin_rows[found])
    assert int((grown.tables[0].table.pin_counts(0) > 0).sum()) == 0
