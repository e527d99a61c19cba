"""The grouped value ops against plain torch, on every device, plus opcheck.

A group here is three tables of mixed dims (4, 8, 4) whose rows sit in one flat buffer; every
grouped op must give what the composed-torch reference (tests/optim/row_reference.py) gives table
by table.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch
from torch.library import opcheck

from dynamicemb_core.ops import lookup_ops
from tests.optim import row_reference as ref

DIMS = [4, 8, 4]
CAPS = [16, 8, 12]
STATE = {0: lambda d: 0, 1: lambda d: d, 2: lambda d: 1, 3: lambda d: 2 * d}
ARGS = {
    "lr": 0.3,
    "eps": 1e-3,
    "beta1": 0.8,
    "beta2": 0.9,
    "weight_decay": 0.01,
    "weight_decay_mode": 1,
    "step": 3,
}


def _group(device, optimizer: int = 0, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(flat values, meta) of three tables with random positive rows."""
    g = torch.Generator().manual_seed(seed)
    rows, meta, offset = [], [], 0
    for dim, cap in zip(DIMS, CAPS):
        width = dim + STATE[optimizer](dim)
        rows.append(torch.rand(cap * width, generator=g) + 0.1)
        meta.append([offset, width, cap, dim])
        offset += cap * width
    return torch.cat(rows).to(device), torch.tensor(meta, dtype=torch.int64, device=device)


def _table(values: torch.Tensor, meta: torch.Tensor, t: int) -> torch.Tensor:
    """Table t's (capacity, row_width) view of the flat buffer."""
    off, width, cap, _ = meta[t].tolist()
    return values[off : off + cap * width].view(cap, width)


def _batch(device, seed=0, batch=5, feature_tables=(0, 1, 2, 0)):
    """A feature-major batch over the group: keys' slots, inverse, offsets, weights."""
    g = torch.Generator().manual_seed(seed)
    F = len(feature_tables)
    lengths = torch.randint(0, 4, (F * batch,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    tids = torch.tensor(feature_tables).repeat_interleave(lengths.view(F, batch).sum(1))
    keys = torch.randint(0, 6, (n,), generator=g)
    # unique (table, key) pairs; each gets a distinct slot of its table (-1 for one of them)
    pairs = sorted(set(zip(tids.tolist(), keys.tolist())))
    index = {p: k for k, p in enumerate(pairs)}
    inverse = torch.tensor([index[p] for p in zip(tids.tolist(), keys.tolist())], dtype=torch.int64)
    utids = torch.tensor([t for t, _ in pairs], dtype=torch.int64)
    slots = torch.empty(len(pairs), dtype=torch.int64)
    for t in range(len(DIMS)):
        mine = (utids == t).nonzero().squeeze(1)
        slots[mine] = torch.randperm(CAPS[t], generator=g)[: mine.numel()]
    if len(pairs) > 2:
        slots[2] = -1
    weights = torch.rand(n, generator=g)
    d_offsets = torch.tensor([0] + [DIMS[t] for t in feature_tables]).cumsum(0)
    to = lambda x: x.to(device)  # noqa: E731
    return (
        to(slots),
        to(utids),
        to(inverse),
        to(offsets),
        to(weights),
        to(torch.tensor(feature_tables)),
        to(d_offsets),
        batch,
    )


def _feature_parts(inverse, offsets, weights, f, batch):
    """One feature's bags: (its indices' inverse, offsets from 0, weights)."""
    lo, hi = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
    off = offsets[f * batch : (f + 1) * batch + 1] - lo
    return inverse[lo:hi], off, weights[lo:hi]


def test_segmented_unique_matches_python(device):
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(0, 20, (200,), generator=g)
    tids = torch.randint(0, 3, (200,), generator=g)
    uk, ut, inv, counts, per_table = lookup_ops.segmented_unique(
        keys.to(device), tids.to(device), 3
    )
    assert per_table.device.type == "cpu"
    pairs = list(zip(ut.cpu().tolist(), uk.cpu().tolist()))
    assert len(set(pairs)) == len(pairs) == len(set(zip(tids.tolist(), keys.tolist())))
    assert torch.equal(uk.cpu()[inv.cpu()], keys) and torch.equal(ut.cpu()[inv.cpu()], tids)
    expected = torch.bincount(inv.cpu(), minlength=len(pairs))
    assert torch.equal(counts.cpu(), expected)
    assert per_table.tolist() == [sum(1 for t, _ in pairs if t == i) for i in range(3)]


def test_segmented_unique_keeps_pairs_whose_sort_words_clash(device):
    """The CUDA kernel sorts one word per pair (the key with its table id mixed in); two pairs of
    different tables can share that word, and must still come out as two pairs."""
    mix = 0x9E3779B97F4A7C15
    clash = (5 ^ mix) - (1 << 64) if (5 ^ mix) >= 1 << 63 else 5 ^ mix  # table 1's word = 5
    keys = torch.tensor([5, clash, 5, clash, 7], device=device)
    tids = torch.tensor([0, 1, 0, 1, 1], device=device)
    uk, ut, inv, counts, per_table = lookup_ops.segmented_unique(keys, tids, 2)
    pairs = sorted(zip(ut.cpu().tolist(), uk.cpu().tolist()))
    assert pairs == sorted([(0, 5), (1, clash), (1, 7)])
    assert torch.equal(uk[inv].cpu(), keys.cpu()) and torch.equal(ut[inv].cpu(), tids.cpu())
    assert per_table.tolist() == [1, 2]
    assert sorted(counts.cpu().tolist()) == [1, 2, 2]


def test_segmented_unique_cpu_keeps_first_occurrence_order():
    keys = torch.tensor([5, 3, 5, 7, 3, 5])
    tids = torch.tensor([0, 0, 1, 1, 0, 0])
    uk, ut, inv, counts, per_table = lookup_ops.segmented_unique(keys, tids, 2)
    assert uk.tolist() == [5, 3, 5, 7] and ut.tolist() == [0, 0, 1, 1]
    assert inv.tolist() == [0, 1, 2, 3, 1, 0] and counts.tolist() == [2, 2, 1, 1]
    assert per_table.tolist() == [2, 2]


def _first_occurrence_unique(keys: torch.Tensor, tids: torch.Tensor, num_tables: int):
    """segmented_unique's CPU answer, written out in Python: pairs in order of first occurrence."""
    ids: dict = {}
    inverse, counts = [], []
    for pair in zip(tids.tolist(), keys.tolist()):
        if pair not in ids:
            ids[pair] = len(ids)
            counts.append(0)
        inverse.append(ids[pair])
        counts[ids[pair]] += 1
    pairs = list(ids)
    per_table = [sum(1 for t, _ in pairs if t == i) for i in range(num_tables)]
    return [k for _, k in pairs], [t for t, _ in pairs], inverse, counts, per_table


def test_segmented_unique_cpu_same_answer_after_any_batch():
    """The CPU dedup sizes its probe array from the previous batch's pairs and doubles it when a
    batch has more: the answer never depends on what came before (all pairs distinct right after
    a tiny batch, a tiny batch after a large one, hot keys)."""
    g = torch.Generator().manual_seed(3)
    shapes = [(8, 4, 2), (6000, 10**9, 3), (40, 5, 1), (5000, 300, 4), (3000, 10**9, 2), (1, 1, 1)]
    for n, key_space, num_tables in shapes:
        keys = torch.randint(0, key_space, (n,), generator=g) - key_space // 2
        tids = torch.randint(0, num_tables, (n,), generator=g)
        uk, ut, inv, counts, per_table = lookup_ops.segmented_unique(keys, tids, num_tables)
        want = _first_occurrence_unique(keys, tids, num_tables)
        got = (uk.tolist(), ut.tolist(), inv.tolist(), counts.tolist(), per_table.tolist())
        assert got == tuple(want), (n, key_space, num_tables)


def test_segmented_unique_cpu_rejects_table_ids_out_of_range():
    keys = torch.arange(6)
    for bad in (-1, 2):
        tids = torch.tensor([0, 1, 0, bad, 1, 0])
        with pytest.raises(IndexError, match=r"table_ids\[3\]"):
            lookup_ops.segmented_unique(keys, tids, 2)
    # one table: its ids are checked in a pass of their own (the dedup then reads none)
    for bad in (-1, 1):
        tids = torch.tensor([0, 0, 0, bad, 0, 0])
        with pytest.raises(IndexError, match=r"table_ids\[3\]=-?1 out of range \[0, 1\)"):
            lookup_ops.segmented_unique(keys, tids, 1)


def test_segmented_unique_empty_and_bad_ids(device):
    empty = torch.empty(0, dtype=torch.int64, device=device)
    uk, ut, inv, counts, per_table = lookup_ops.segmented_unique(empty, empty, 2)
    assert uk.numel() == inv.numel() == 0 and per_table.tolist() == [0, 0]
    with pytest.raises(ValueError, match="one length"):
        lookup_ops.segmented_unique(torch.zeros(3, dtype=torch.int64, device=device), empty, 2)


def test_segmented_unique_ordered_groups_positions_by_pair(device):
    """``order`` is the stable argsort of the inverse: each pair's positions together, pairs in
    unique order, each pair's positions in input order (hot keys included)."""
    g = torch.Generator().manual_seed(7)
    keys = torch.cat([torch.randint(0, 400, (300,), generator=g), torch.full((150,), 3)])
    keys = keys[torch.randperm(keys.numel(), generator=g)]
    tids = torch.randint(0, 3, (keys.numel(),), generator=g)
    plain = lookup_ops.segmented_unique(keys.to(device), tids.to(device), 3)
    *same, order = lookup_ops.segmented_unique_ordered(keys.to(device), tids.to(device), 3)
    for a, b in zip(plain, same):
        assert torch.equal(a, b)
    inv = same[2].cpu()
    assert torch.equal(order.cpu(), torch.sort(inv, stable=True).indices)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    assert lookup_ops.segmented_unique_ordered(empty, empty, 2)[5].numel() == 0


def _feature_batch(feature_tables: torch.Tensor, batch: int, seed: int, key_space: int = 30):
    """A feature-major batch with empty features (the second and the last) and hot keys:
    ``(keys, offsets, the table of each index)``."""
    g = torch.Generator().manual_seed(seed)
    F = feature_tables.numel()
    lengths = torch.randint(0, 4, (F * batch,), generator=g)
    lengths.view(F, batch)[1] = 0  # a feature with no index
    lengths.view(F, batch)[-1] = 0  # the last one too
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    keys = torch.randint(0, key_space, (n,), generator=g)
    tids = torch.repeat_interleave(feature_tables, lengths.view(F, batch).sum(1))
    return keys, offsets, tids


@pytest.mark.parametrize("batch", [1, 4, 200])
def test_bag_unique_is_segmented_unique_of_the_batch_tables(device, batch):
    """bag_unique takes each index's table from the offsets (as repeat_interleave of the feature
    tables by the features' lengths) and answers as segmented_unique over those ids, ordered or
    not; the counts come back followed by the offsets check's numbers."""
    feature_tables = torch.tensor([0, 2, 1, 0, 2])
    keys, offsets, tids = _feature_batch(feature_tables, batch, batch)
    n = keys.numel()
    ft = feature_tables.to(device)
    for ordered in (False, True):
        unique = lookup_ops.segmented_unique_ordered if ordered else lookup_ops.segmented_unique
        want = unique(keys.to(device), tids.to(device), 3)
        got = lookup_ops.bag_unique(keys.to(device), offsets.to(device), ft, batch, 3, ordered)
        assert len(got) == len(want)
        assert got[4].device.type == "cpu"
        assert got[4].tolist() == want[4].tolist() + [0, n, 0]
        for a, b in zip(want[:4] + want[5:], got[:4] + got[5:]):
            assert a.device == b.device and torch.equal(a, b)
        uk, ut, inv = got[0].cpu(), got[1].cpu(), got[2].cpu()
        assert torch.equal(ut[inv], tids) and torch.equal(uk[inv], keys)
    # an empty batch: no pair, the numbers all the same
    none = torch.zeros(feature_tables.numel() * batch + 1, dtype=torch.int64, device=device)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    got = lookup_ops.bag_unique(empty, none, ft, batch, 3, True)
    assert got[0].numel() == got[2].numel() == got[5].numel() == 0
    assert got[4].tolist() == [0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="F\\*B\\+1"):
        lookup_ops.bag_unique(keys.to(device), offsets[:-1].to(device), ft, batch, 3)
    with pytest.raises(ValueError, match="no bag"):
        lookup_ops.bag_unique(keys[:2].to(device), none[:1], ft[:0], batch, 3)


def test_bag_unique_keeps_pairs_whose_sort_words_clash(device):
    """Table 1's sort word of ``clash`` is table 0's key 5: bag_unique falls back to its exact
    sort as segmented_unique does, and still reads back the offsets check's numbers."""
    mix = 0x9E3779B97F4A7C15
    clash = (5 ^ mix) - (1 << 64) if (5 ^ mix) >= 1 << 63 else 5 ^ mix
    keys = torch.tensor([5, 5, clash, clash, 7], device=device)
    offsets = torch.tensor([0, 2, 5], device=device)  # F=2 (tables 0, 1), B=1
    ft = torch.tensor([0, 1], device=device)
    uk, ut, inv, counts, numbers, order = lookup_ops.bag_unique(keys, offsets, ft, 1, 2, True)
    pairs = sorted(zip(ut.cpu().tolist(), uk.cpu().tolist()))
    assert pairs == sorted([(0, 5), (1, clash), (1, 7)])
    assert torch.equal(uk[inv].cpu(), keys.cpu())
    assert ut[inv].cpu().tolist() == [0, 0, 1, 1, 1]
    assert numbers.tolist() == [1, 2, 0, 5, 0]
    assert sorted(counts.cpu().tolist()) == [1, 2, 2]
    assert torch.equal(order.cpu(), torch.sort(inv.cpu(), stable=True).indices)


def test_bag_unique_counts_the_offsets_check_numbers(device):
    """The numbers after the counts: offsets[0], offsets[-1] and how many bags' offsets decrease
    (the batch's offsets check reads them; the table ids of bad offsets are still in range)."""
    feature_tables = torch.tensor([1, 0], device=device)
    offsets = torch.tensor([2, 5, 3, 4, 1], device=device)  # F=2, B=2: two decreases
    keys = torch.arange(6, device=device)
    uk, ut, inv, counts, numbers = lookup_ops.bag_unique(keys, offsets, feature_tables, 2, 2)
    assert numbers.tolist()[2:] == [2, 1, 2]
    assert bool(((ut == 0) | (ut == 1)).all())  # in range, whatever the offsets
    # many more bags than indices: every bag is checked
    offsets = torch.zeros(2 * 300 + 1, dtype=torch.int64, device=device)
    offsets[-1] = 3
    offsets[-2] = 5
    got = lookup_ops.bag_unique(keys[:3], offsets, feature_tables, 300, 2)
    assert got[4].tolist()[2:] == [0, 3, 1]


def test_placement_counts_match_python(device):
    g = torch.Generator().manual_seed(3)
    n, T = 3000, 5
    tids = torch.randint(0, T, (n,), generator=g)
    slots = torch.randint(-1, 9, (n,), generator=g)
    is_new = torch.rand(n, generator=g) < 0.4
    sizes = torch.randint(0, 100, (T,), generator=g)
    got = lookup_ops.placement_counts(
        tids.to(device), slots.to(device), is_new.to(device), sizes.to(device)
    )
    placed = torch.bincount(tids[is_new & (slots >= 0)], minlength=T)
    unplaced = torch.bincount(tids[slots < 0], minlength=T)
    assert got.device.type == torch.device(device).type
    assert torch.equal(got.cpu(), torch.stack([placed, unplaced, sizes], 1))
    # more tables than the CUDA kernel counts in shared memory; and no pair at all
    many = torch.arange(300)
    wide = lookup_ops.placement_counts(
        tids.to(device), slots.to(device), is_new.to(device), many.to(device)
    )
    assert torch.equal(wide.cpu()[:T, :2], got.cpu()[:, :2])
    assert torch.equal(wide.cpu()[:, 2], many)
    assert bool((wide.cpu()[T:, :2] == 0).all())
    none = lookup_ops.placement_counts(
        tids[:0].to(device), slots[:0].to(device), is_new[:0].to(device), sizes.to(device)
    )
    assert torch.equal(none.cpu(), torch.stack([sizes * 0, sizes * 0, sizes], 1))
    with pytest.raises(TypeError, match="is_new"):
        lookup_ops.placement_counts(tids, slots, slots, sizes)
    with pytest.raises(TypeError, match="sizes must be int64"):
        lookup_ops.placement_counts(tids, slots, is_new, sizes.float())


def _hot_batch(device, seed, batch=8, feature_tables=(0, 1, 2, 0)):
    """A batch whose bags are long and one key per table is hot (more positions than one chunk of
    the CUDA reduction holds), beside keys seen once: (slots, utids, inverse, offsets, weights,
    feature_tables, d_offsets, B, key_counts, order)."""
    g = torch.Generator().manual_seed(seed)
    F = len(feature_tables)
    lengths = torch.randint(20, 60, (F * batch,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    tids = torch.tensor(feature_tables).repeat_interleave(lengths.view(F, batch).sum(1))
    hot = torch.rand(n, generator=g) < 0.5
    keys = torch.where(
        hot, torch.zeros(n, dtype=torch.int64), torch.randint(1, 400, (n,), generator=g)
    )
    uk, ut, inv, counts, _, order = lookup_ops.segmented_unique_ordered(keys, tids, len(DIMS))
    slots = torch.empty(uk.numel(), dtype=torch.int64)
    for t in range(len(DIMS)):
        mine = (ut == t).nonzero().squeeze(1)
        # more keys than a table has slots: the rest get -1 (no update), as unplaced keys do
        slots[mine] = torch.cat([torch.randperm(CAPS[t], generator=g), torch.full((400,), -1)])[
            : mine.numel()
        ]
    weights = torch.rand(n, generator=g)
    d_offsets = torch.tensor([0] + [DIMS[t] for t in feature_tables]).cumsum(0)
    to = lambda x: x.to(device)  # noqa: E731
    return (
        to(slots),
        to(ut),
        to(inv),
        to(offsets),
        to(weights),
        to(torch.tensor(feature_tables)),
        to(d_offsets),
        batch,
        to(counts),
        to(order),
    )


def _reduce_bags(mode, inverse, offsets, weights, ft, d_offsets, B):
    """The output gradient's shape for ``mode`` (a row per index with POOL_NONE, per bag
    otherwise; sequence rows of dim 8) and the bag arguments of the reduce ops (no per-sample
    weights without pooling)."""
    none = mode == lookup_ops.POOL_NONE
    shape = (inverse.numel(), 8) if none else (B, int(d_offsets[-1]))
    return shape, (inverse, offsets, None if none else weights, ft, d_offsets, mode, B)


@pytest.mark.parametrize("optimizer", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN, lookup_ops.POOL_NONE])
def test_grouped_reduce_update_with_key_order_and_strided_grads(device, optimizer, mode):
    """Hot keys (several chunks) and keys seen once (their row updated inside the chunk pass on
    CUDA): the fused op equals reduce + update bit for bit, given the dedup's key order or not,
    and with the output gradient contiguous, transposed in memory, expanded from a scalar or a row,
    or a column slice of a wider one (the CPU kernel reads the last three without a full copy)."""
    slots, utids, inverse, offsets, weights, ft, d_offsets, B, counts, order = _hot_batch(
        device, seed=11 + optimizer
    )
    u = slots.numel()
    (rows, cols), bags = _reduce_bags(mode, inverse, offsets, weights, ft, d_offsets, B)
    dense = torch.randn(rows, cols, device=device)
    grads_of = {
        "contiguous": dense,
        "transposed": dense.t().contiguous().t(),
        "expanded": torch.full((1, 1), 0.25, device=device).expand(rows, cols),
        "one row expanded": dense[:1].expand(rows, cols),
        "column slice": torch.randn(rows, cols + 5, device=device)[:, 2 : 2 + cols],
    }
    base, meta = _group(device, optimizer, seed=2)
    for name, grad_out in grads_of.items():
        expected = base.clone()
        g = lookup_ops.grouped_reduce_grads(grad_out.contiguous(), meta, *bags, u, 8)
        lookup_ops.grouped_update(expected, meta, utids, slots, g, optimizer, **ARGS)
        for key_order in (None, (order, counts)):
            values = base.clone()
            extra = {} if key_order is None else {"order": order, "key_counts": counts}
            lookup_ops.grouped_reduce_update(
                values, meta, utids, slots, grad_out, *bags, 8, optimizer, **ARGS, **extra
            )
            assert torch.equal(values, expected), (name, key_order is None)
    with pytest.raises(ValueError, match="order comes with key_counts"):
        lookup_ops.grouped_reduce_update(
            base, meta, utids, slots, dense, *bags, 8, optimizer, **ARGS, order=order
        )


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN, lookup_ops.POOL_NONE])
def test_grouped_reduce_update_one_table_with_key_counts(device, mode):
    """A one-table group's fused update given the dedup's per-key counts alone (what a CPU
    training forward keeps: the CPU kernel then skips its counting pass; the CUDA kernels read
    the counts only with ``order``) equals reduce + update bit for bit. On the CPU, counts that
    do not fit the inverse raise before any row is written."""
    slots, utids, inverse, offsets, weights, ft, d_offsets, B, counts, _ = _hot_batch(
        device, seed=5, feature_tables=(0, 0)
    )
    base, meta = _group(device, 3, seed=4)
    meta = meta[:1].contiguous()  # table 0 alone: a one-table group
    u = slots.numel()
    (rows, cols), bags = _reduce_bags(mode, inverse, offsets, weights, ft, d_offsets, B)
    grad_out = torch.randn(rows, cols, device=device)
    expected = base.clone()
    g = lookup_ops.grouped_reduce_grads(grad_out, meta, *bags, u, 8)
    lookup_ops.grouped_update(expected, meta, utids, slots, g, 3, **ARGS)
    values = base.clone()
    lookup_ops.grouped_reduce_update(
        values, meta, utids, slots, grad_out, *bags, 8, 3, **ARGS, key_counts=counts
    )
    assert torch.equal(values, expected)
    if device.type != "cpu":
        return
    hot = int(counts.argmax())
    shifted = counts.clone()  # the same total, one key short and another over
    shifted[hot] -= 1
    shifted[(hot + 1) % u] += 1
    extra = counts.clone()
    extra[hot] += 1
    negative = counts.clone()
    negative[hot] = -1
    for bad, match in (
        (shifted, "positions in inverse"),
        (extra, "sum to"),
        (negative, "negative"),
    ):
        values = base.clone()
        with pytest.raises(ValueError, match=match):
            lookup_ops.grouped_reduce_update(
                values, meta, utids, slots, grad_out, *bags, 8, 3, **ARGS, key_counts=bad
            )
        assert torch.equal(values, base)


def test_grouped_gather_and_scatter_match_per_table(device):
    values, meta = _group(device, optimizer=1)
    tids = torch.tensor([0, 1, 2, 1, 0], device=device)
    slots = torch.tensor([3, 7, -1, 0, 15], device=device)
    out = lookup_ops.grouped_gather(values, meta, tids, slots, 10)
    for i, (t, s) in enumerate(zip(tids.tolist(), slots.tolist())):
        row = torch.zeros(10, device=device)
        if s >= 0:
            full = _table(values, meta, t)[s]
            row[: min(10, full.numel())] = full[:10]
        assert torch.equal(out[i], row), (i, t, s)
    rows = torch.randn(5, 16, device=device)
    before = values.clone()
    lookup_ops.grouped_scatter(values, meta, tids, slots, rows)
    expected = before.clone()
    for i, (t, s) in enumerate(zip(tids.tolist(), slots.tolist())):
        if s >= 0:
            view = _table(expected, meta, t)
            view[s] = rows[i, : view.size(1)]
    assert torch.equal(values, expected)


def test_grouped_gather_through_inverse_matches_expanded_ids(device):
    """A sequence output read from the unique pairs: the rows of ``inverse``'s pairs, the same as
    gathering with the ids expanded first; an inverse outside the pairs raises (check=True)."""
    values, meta = _group(device, optimizer=1)
    tids = torch.tensor([0, 1, 2, 1, 0], device=device)
    slots = torch.tensor([3, 7, -1, 0, 15], device=device)
    inverse = torch.tensor([4, 0, 0, 2, 3, 1, 4, 4], device=device)
    out = lookup_ops.grouped_gather(values, meta, tids, slots, 6, inverse=inverse)
    assert torch.equal(
        out, lookup_ops.grouped_gather(values, meta, tids[inverse], slots[inverse], 6)
    )
    empty = lookup_ops.grouped_gather(values, meta, tids, slots, 6, inverse=inverse[:0])
    assert empty.shape == (0, 6)
    with pytest.raises(IndexError, match="inverse"):
        lookup_ops.grouped_gather(values, meta, tids, slots, 6, inverse=inverse + 1)


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_grouped_pooled_gather_matches_per_table(device, mode, weighted):
    values, meta = _group(device)
    slots, utids, inverse, offsets, weights, ft, d_offsets, B = _batch(device)
    w = weights if weighted else None
    out = lookup_ops.grouped_pooled_gather(
        values, meta, slots, inverse, offsets, w, ft, d_offsets, mode, B, int(d_offsets[-1])
    )
    for f, t in enumerate(ft.tolist()):
        inv_f, off_f, w_f = _feature_parts(inverse, offsets, weights, f, B)
        rows = _table(values, meta, t)[:, : DIMS[t]]
        mine = ((slots >= 0) & (utids == t)).unsqueeze(1)
        emb = torch.where(mine, rows[slots.clamp(0, CAPS[t] - 1)], 0.0)
        expected = ref.pool(emb, inv_f, off_f, w_f if weighted else None, mode)
        c = int(d_offsets[f])
        torch.testing.assert_close(out[:, c : c + DIMS[t]], expected)


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
def test_grouped_reduce_grads_matches_per_table(device, mode):
    _, meta = _group(device)
    slots, utids, inverse, offsets, weights, ft, d_offsets, B = _batch(device, seed=3)
    u = slots.numel()
    grad_out = torch.randn(B, int(d_offsets[-1]), device=device)
    out = lookup_ops.grouped_reduce_grads(
        grad_out, meta, inverse, offsets, weights, ft, d_offsets, mode, B, u, 8
    )
    expected = torch.zeros(u, 8, device=device)
    for f, t in enumerate(ft.tolist()):
        inv_f, off_f, w_f = _feature_parts(inverse, offsets, weights, f, B)
        c = int(d_offsets[f])
        g = grad_out[:, c : c + DIMS[t]].contiguous()
        expected[:, : DIMS[t]] += ref.reduce_grads(g, inv_f, off_f, w_f, mode, u)
    torch.testing.assert_close(out, expected)


def test_grouped_reduce_grads_sequence_rows(device):
    _, meta = _group(device)
    slots, utids, inverse, offsets, _, ft, d_offsets, B = _batch(device, seed=4)
    n, u = inverse.numel(), slots.numel()
    grad_out = torch.randn(n, 8, device=device)
    out = lookup_ops.grouped_reduce_grads(
        grad_out, meta, inverse, offsets, None, ft, d_offsets, lookup_ops.POOL_NONE, B, u, 8
    )
    expected = torch.zeros(u, 8, device=device).index_add_(0, inverse, grad_out)
    dims = meta[utids, 3]
    expected[torch.arange(8, device=device).unsqueeze(0) >= dims.unsqueeze(1)] = 0
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("optimizer", [0, 1, 2, 3])
def test_grouped_update_matches_per_table(device, optimizer):
    values, meta = _group(device, optimizer)
    expected = values.clone()
    tids = torch.tensor([0, 1, 2, 1, 0, 2], device=device)
    slots = torch.tensor([3, 7, -1, 0, 15, 11], device=device)
    grads = torch.randn(6, 8, device=device)
    lookup_ops.grouped_update(values, meta, tids, slots, grads, optimizer, **ARGS)
    for t in range(len(DIMS)):
        mine = tids == t
        ref.update_rows(
            _table(expected, meta, t), slots[mine], grads[mine, : DIMS[t]], optimizer, ARGS
        )
    torch.testing.assert_close(values, expected)


@pytest.mark.parametrize("optimizer", [0, 3])
@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
def test_grouped_reduce_update_matches_two_ops(device, optimizer, mode):
    values, meta = _group(device, optimizer)
    expected = values.clone()
    slots, utids, inverse, offsets, weights, ft, d_offsets, B = _batch(device, seed=5)
    grad_out = torch.randn(B, int(d_offsets[-1]), device=device)
    bags = (inverse, offsets, weights, ft, d_offsets, mode, B)
    lookup_ops.grouped_reduce_update(
        values, meta, utids, slots, grad_out, *bags, 8, optimizer, **ARGS
    )
    grads = lookup_ops.grouped_reduce_grads(grad_out, meta, *bags, slots.numel(), 8)
    lookup_ops.grouped_update(expected, meta, utids, slots, grads, optimizer, **ARGS)
    torch.testing.assert_close(values, expected)


def test_bad_slot_raises_and_writes_nothing(device):
    values, meta = _group(device)
    before = values.clone()
    tids = torch.tensor([0, 1], device=device)
    slots = torch.tensor([2, CAPS[1]], device=device)  # one past table 1's capacity
    with pytest.raises(IndexError, match="slots"):
        lookup_ops.grouped_update(
            values, meta, tids, slots, torch.ones(2, 8, device=device), 0, 1.0
        )
    with pytest.raises(IndexError, match="table_ids"):
        lookup_ops.grouped_scatter(
            values,
            meta,
            torch.tensor([0, 3], device=device),
            slots,
            torch.ones(2, 8, device=device),
        )
    assert torch.equal(values, before)


def test_bad_meta_and_bags_raise(device):
    values, meta = _group(device)
    with pytest.raises(ValueError, match="meta"):
        lookup_ops.grouped_gather(values, meta[:, :3].contiguous(), meta[:0, 0], meta[:0, 0], 4)
    slots, utids, inverse, offsets, weights, ft, d_offsets, B = _batch(device)
    with pytest.raises(ValueError, match="offsets"):
        lookup_ops.grouped_pooled_gather(
            values, meta, slots, inverse, offsets[:-1], None, ft, d_offsets, 0, B, 20
        )


def _opcheck_cases(device) -> List[Tuple[object, tuple]]:
    ops = torch.ops.dynamicemb
    values, meta = _group(device, optimizer=3)
    slots, utids, inverse, offsets, weights, ft, d_offsets, B = _batch(device)
    total = int(d_offsets[-1])
    grad_out = torch.randn(B, total, device=device)
    bags = (inverse, offsets, weights, ft, d_offsets)
    keys = torch.arange(slots.numel(), device=device) * 7 + 3
    return [
        (ops.segmented_unique.default, (utids.clone(), utids, 3)),
        (ops.segmented_unique.default, (utids.clone(), utids, 3, True)),
        (ops.bag_unique.default, (inverse * 5 + 1, offsets, ft, B, 3)),
        (ops.bag_unique.default, (inverse * 5 + 1, offsets, ft, B, 3, True)),
        (ops.placement_counts.default, (utids, slots, slots >= 1, utids[:3].clone())),
        (ops.grouped_gather.default, (values, meta, utids, slots, 6)),
        (ops.grouped_gather.default, (values, meta, utids, slots, 6, True, inverse)),
        (
            ops.grouped_scatter.default,
            (values, meta, utids, slots, torch.randn(slots.numel(), 24, device=device)),
        ),
        (ops.grouped_pooled_gather.default, (values, meta, slots, *bags, 0, B, total)),
        (
            ops.grouped_reduce_grads.default,
            (grad_out, *([meta] + list(bags)), 1, B, slots.numel(), 8),
        ),
        (
            ops.grouped_update.default,
            (values, meta, utids, slots, torch.randn(slots.numel(), 8, device=device), 3)
            + (0.1, 1e-3, 0.9, 0.99, 0.0, 0, 2),
        ),
        (
            ops.grouped_reduce_update.default,
            (values, meta, utids, slots, grad_out, *bags, 0, B, 8, 3)
            + (0.1, 1e-3, 0.9, 0.99, 0.0, 0, 2),
        ),
        # a rounding seed with the rows' keys (the stochastic rounding's schema; float32 rows
        # are never rounded, the keys are checked all the same)
        (
            ops.grouped_update.default,
            (values, meta, utids, slots, torch.randn(slots.numel(), 8, device=device), 3)
            + (0.1, 1e-3, 0.9, 0.99, 0.0, 0, 2, True, 5, keys),
        ),
        (
            ops.grouped_reduce_update.default,
            (values, meta, utids, slots, grad_out, *bags, 0, B, 8, 3)
            + (0.1, 1e-3, 0.9, 0.99, 0.0, 0, 2, True, None, None, 5, keys),
        ),
    ]


def test_grouped_ops_pass_opcheck(device):
    lookup_ops._ops()
    for op, args in _opcheck_cases(device):
        opcheck(op, args)
