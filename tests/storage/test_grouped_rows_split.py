"""GroupedRows with a host part against its all-device twin, op by op, on both paths.

A group whose tables keep part of their rows (or all of them) in host memory must read, pool,
write and update exactly as the same rows held in the device buffer. On the mapped path (the
group's kernels address the host part: a CPU group, or CUDA with the pinned buffer mapped) the
host part's ops run on the group's device over the unique pairs, the other part's as -1; on the
copy path the host part's kernels see only its own pairs, compacted. Neither ever sees the
sequence output's expanded ids.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch

from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.storage.grouped_rows import GroupedRows

DIMS = [4, 8, 8]
CAPS = [64, 64, 32]
DEVICE_ROWS = [64, 16, 0]  # all device, a quarter on the device, all on the host
ADAM = (lookup_ops.OPTIMIZER_CODES["adam"], 0.05, 1e-8, 0.9, 0.999, 0.0, 0, 3, -1)
SGD = (lookup_ops.OPTIMIZER_CODES["exact_sgd"], 0.1, 0.0, 0.0, 0.0, 0.0, 0, 1, -1)


def _pair(
    device: torch.device, widths: List[int], dims: List[int] = DIMS, copy_host: bool = False
) -> Tuple[GroupedRows, GroupedRows]:
    """(split, twin): the same random rows, split between device and host, and all on device."""
    split = GroupedRows(device, widths, dims, CAPS, DEVICE_ROWS, copy_host=copy_host)
    assert (split._host_ops is None) == copy_host
    if not copy_host:  # the kernels of the group's device address the host part (CUDA: mapped)
        view = split._host_ops[0]
        assert view.device.type == device.type and view.data_ptr() == split.host_values.data_ptr()
    twin = GroupedRows(device, widths, dims, CAPS)
    assert split.has_host and not twin.has_host
    g = torch.Generator().manual_seed(3)
    for t in range(len(DIMS)):
        whole = torch.rand(CAPS[t], twin.stored[t], generator=g)  # ADAM state >= 0
        twin.blocks(t)[0][0].copy_(whole)
        for rows, start in split.blocks(t):
            rows.copy_(whole[start : start + rows.shape[0]])
    return split, twin


def _contents(rows: GroupedRows, t: int) -> torch.Tensor:
    return torch.cat([r.cpu() for r, _ in rows.blocks(t)])


def _assert_same_rows(split: GroupedRows, twin: GroupedRows) -> None:
    for t in range(len(DIMS)):
        torch.testing.assert_close(_contents(split, t), _contents(twin, t), rtol=1e-6, atol=1e-6)


def _unique_pairs(device: torch.device, host_pairs: bool = True) -> Tuple[torch.Tensor, ...]:
    """(table_ids, slots) of distinct pairs of every table, shuffled, some slots -1 (unplaced);
    without ``host_pairs`` only slots of the device part."""
    g = torch.Generator().manual_seed(11)
    tids, slots = [], []
    for t, cap in enumerate(CAPS):
        limit = cap if host_pairs else DEVICE_ROWS[t]
        if limit == 0:
            continue
        picked = torch.randperm(limit, generator=g)[: max(1, limit // 2)]
        tids.append(torch.full_like(picked, t))
        slots.append(picked)
    tid, slot = torch.cat(tids), torch.cat(slots)
    slot[torch.randperm(slot.numel(), generator=g)[:3]] = -1
    order = torch.randperm(slot.numel(), generator=g)
    return tid[order].to(device), slot[order].to(device)


def _bags(device: torch.device, table_ids: torch.Tensor, dims: List[int] = DIMS, batch: int = 4):
    """A feature-major batch over the unique pairs: feature f reads table f's pairs only, each
    of them at least once."""
    g = torch.Generator().manual_seed(7)
    tids = table_ids.cpu()
    inverse, lengths = [], []
    for f in range(len(DIMS)):
        mine = (tids == f).nonzero().squeeze(1)
        for b in range(batch):
            n = int(torch.randint(0, 6, (1,), generator=g))
            if mine.numel() == 0:
                n = 0
            picks = mine[torch.randint(0, max(1, mine.numel()), (n,), generator=g)]
            if b == 0:  # every pair is read (a dedup's unique keys all occur in the batch)
                picks = torch.cat([mine, picks])
            inverse.append(picks)
            lengths.append(picks.numel())
    inv = torch.cat(inverse)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(lengths).cumsum(0)])
    feature_tables = torch.arange(len(DIMS))
    d_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(dims).cumsum(0)])
    return tuple(x.to(device) for x in (inv, offsets, feature_tables, d_offsets)) + (batch,)


@pytest.fixture(params=[False, True], ids=["mapped", "copy"])
def copy_host(request) -> bool:
    return request.param


@pytest.fixture
def host_calls(monkeypatch):
    """Per row op on a host part (by op name): (pairs it got, whether all were its own, the
    device its pairs were on)."""
    seen: dict = {}

    def wrap(name):
        real = getattr(lookup_ops, name)

        def spy(values, meta, table_ids, slots, *args, **kwargs):
            if getattr(values, "_host_part", False):
                own = bool((slots >= 0).all())
                seen.setdefault(name, []).append((int(slots.numel()), own, slots.device.type))
            return real(values, meta, table_ids, slots, *args, **kwargs)

        monkeypatch.setattr(lookup_ops, name, spy)

    for name in ("grouped_gather", "grouped_scatter", "grouped_update"):
        wrap(name)
    return seen


def _mark_host(rows: GroupedRows) -> None:
    """Tag the tensor the host part's ops run on (the pinned buffer, or its mapped view)."""
    target = rows.host_values if rows._host_ops is None else rows._host_ops[0]
    target._host_part = True  # type: ignore[attr-defined]


def _expect(rows: GroupedRows, n: int, h: int, calls: int = 1) -> list:
    """What the host part's ops get: the copy path its h own pairs on the host, the mapped path
    the n unique pairs on the group's device (the others' slots -1)."""
    if rows._host_ops is None:
        return [(h, True, "cpu")] * calls if h else []
    return [(n, h == n, rows.device.type)] * calls


def _num_host(split: GroupedRows, table_ids: torch.Tensor, slots: torch.Tensor) -> int:
    limits = torch.tensor(DEVICE_ROWS, device=slots.device)[table_ids]
    return int((slots >= limits).sum())


def test_gather_and_sequence_output_match_the_device_twin(device, copy_host, host_calls):
    split, twin = _pair(device, DIMS, copy_host=copy_host)
    _mark_host(split)
    tids, slots = _unique_pairs(device)
    h = _num_host(split, tids, slots)
    assert h > 0
    torch.testing.assert_close(split.gather(tids, slots, 8), twin.gather(tids, slots, 8))
    inverse = torch.randint(0, tids.numel(), (500,)).to(device)
    got = split.gather(tids, slots, 8, inverse=inverse)
    assert got.shape == (500, 8)
    torch.testing.assert_close(got, twin.gather(tids, slots, 8, inverse=inverse))
    # the host part gathered the unique pairs, not the 500 expanded ids
    assert host_calls["grouped_gather"] == _expect(split, tids.numel(), h, calls=2)


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
@pytest.mark.parametrize("host_pairs", [True, False])
def test_pooled_output_matches_the_device_twin(device, copy_host, host_calls, mode, host_pairs):
    split, twin = _pair(device, DIMS, copy_host=copy_host)
    _mark_host(split)
    tids, slots = _unique_pairs(device, host_pairs)
    inverse, offsets, ft, d_off, B = _bags(device, tids)
    args = (tids, slots, inverse, offsets, None, ft, d_off, mode, B, sum(DIMS))
    torch.testing.assert_close(split.pooled_gather(*args), twin.pooled_gather(*args))
    want = _expect(split, tids.numel(), _num_host(split, tids, slots))
    assert host_calls.get("grouped_gather", []) == want


def test_scatter_writes_each_row_in_its_own_part(device, copy_host, host_calls):
    split, twin = _pair(device, DIMS, copy_host=copy_host)
    _mark_host(split)
    tids, slots = _unique_pairs(device)
    rows = torch.randn(tids.numel(), 8).to(device)
    split.scatter(tids, slots, rows)
    twin.scatter(tids, slots, rows)
    _assert_same_rows(split, twin)
    assert host_calls["grouped_scatter"] == _expect(
        split, tids.numel(), _num_host(split, tids, slots)
    )


def _backward_dims(pooling: str) -> List[int]:
    """The tables' dims of a backward batch: one dim for a sequence output (POOL_NONE)."""
    return [8, 8, 8] if pooling == "none" else DIMS


def _backward_batch(
    device: torch.device, dims: List[int], pooling: str, optimizer: Tuple
) -> Tuple[Tuple[torch.Tensor, ...], Tuple]:
    """A batch for ``reduce_update``: ``(keys, table ids, slots)`` of the unique pairs, and the
    arguments after them (the output gradient, the bags, the pooling mode, ``optimizer``)."""
    tids, slots = _unique_pairs(device)
    inverse, offsets, ft, d_off, B = _bags(device, tids, dims)
    g = torch.Generator().manual_seed(1)
    if pooling == "none":
        mode = lookup_ops.POOL_NONE
        grad_out = torch.randn(inverse.numel(), 8, generator=g).to(device)
    else:
        mode = lookup_ops.POOL_SUM
        grad_out = torch.randn(B, sum(dims), generator=g).to(device)
    keys = torch.arange(tids.numel(), device=device) * 31 + 5
    bags = (grad_out, inverse, offsets, None, ft, d_off, mode, B, max(dims), optimizer)
    return (keys, tids, slots), bags


@pytest.mark.parametrize("seed", [-1, 7], ids=["nearest", "seeded"])
@pytest.mark.parametrize("pooling", ["none", "sum"])
def test_reduce_update_matches_the_device_twin(device, copy_host, host_calls, pooling, seed):
    """ADAM (rows carry state) through the backward's reduce_update: each part updates its own
    keys' rows, the host part with only its own keys' gradients. A sequence output has one dim.
    With a rounding seed each part gets its pairs' keys (the op checks them: one per slot, on
    its device; float32 rows are not rounded, so the rows stay the twin's)."""
    dims = _backward_dims(pooling)
    split, twin = _pair(device, [3 * d for d in dims], dims, copy_host)
    _mark_host(split)
    (keys, tids, slots), bags = _backward_batch(device, dims, pooling, ADAM[:-1] + (seed,))
    for rows in (split, twin):
        rows.reduce_update(keys, tids, slots, *bags)
    _assert_same_rows(split, twin)
    assert host_calls["grouped_update"] == _expect(
        split, tids.numel(), _num_host(split, tids, slots)
    )


def test_update_with_no_host_pairs_leaves_the_host_part_alone(device, copy_host, host_calls):
    split, twin = _pair(device, DIMS, copy_host=copy_host)
    _mark_host(split)
    tids, slots = _unique_pairs(device, host_pairs=False)
    grads = torch.randn(tids.numel(), max(DIMS)).to(device)
    keys = torch.arange(tids.numel(), device=device)
    split.update(keys, tids, slots, grads, SGD)
    twin.update(keys, tids, slots, grads, SGD)
    _assert_same_rows(split, twin)
    assert host_calls.get("grouped_update", []) == _expect(split, tids.numel(), 0)


# ---- staged host rows: a training step reads each host row once, then writes it back ----------


def test_staging_is_for_mapped_float32_host_parts_on_cuda(device, copy_host):
    split, twin = _pair(device, DIMS, copy_host=copy_host)
    assert split.stages == (device.type == "cuda" and not copy_host)
    assert not twin.stages  # no host part
    half = GroupedRows(device, DIMS, DIMS, CAPS, DEVICE_ROWS, torch.float16, copy_host=copy_host)
    assert not half.stages  # a float32 buffer would not round the update into float16
    adam = GroupedRows(device, [3 * d for d in DIMS], DIMS, CAPS, DEVICE_ROWS, copy_host=copy_host)
    assert not adam.stages  # the forward would read the state too: more bytes than it saves
    if not split.stages:
        tids, slots = _unique_pairs(device)
        assert split.stage(tids, slots) is None


def _staged_pair(device, pooling):
    """A mapped split group that stages (forced: the policy stages SGD rows on CUDA only; the
    mechanism is the same for rows with state, which these ADAM rows check) and its twin, a
    batch."""
    dims = _backward_dims(pooling)
    split, twin = _pair(device, [3 * d for d in dims], dims)
    split.stages = True
    pairs, bags = _backward_batch(device, dims, pooling, ADAM)
    return split, twin, dims, pairs, bags


@pytest.mark.parametrize("pooling", ["none", "sum"])
def test_staged_step_reads_each_host_row_once_and_matches_the_twin(device, host_calls, pooling):
    """Forward: the host part is read once, at full width (embedding and ADAM state), and the
    output comes from the staged rows; backward: the host part's rows are updated on the device
    and written back (no update over the host part itself); rows and outputs are the twin's."""
    split, twin, dims, (keys, tids, slots), bags = _staged_pair(device, pooling)
    _mark_host(split)
    n, h = tids.numel(), _num_host(split, tids, slots)
    staged = split.stage(tids, slots)
    assert staged is not None and staged.rows.shape == (n, 3 * max(dims))
    assert staged.rows.device.type == device.type
    inverse, offsets, ft, d_off = bags[1], bags[2], bags[4], bags[5]
    if pooling == "none":
        got = split.gather(tids, slots, 8, inverse=inverse, staged=staged)
        want = twin.gather(tids, slots, 8, inverse=inverse)
    else:
        args = (tids, slots, inverse, offsets, None, ft, d_off, bags[6], bags[7], sum(dims))
        got, want = split.pooled_gather(*args, staged=staged), twin.pooled_gather(*args)
    torch.testing.assert_close(got, want)
    assert host_calls["grouped_gather"] == [(n, h == n, device.type)]  # the stage's one read
    split.reduce_update(keys, tids, slots, *bags, staged=staged)
    twin.reduce_update(keys, tids, slots, *bags)
    _assert_same_rows(split, twin)
    assert "grouped_update" not in host_calls  # updated in the staged rows, on the device
    assert host_calls["grouped_scatter"] == [(n, h == n, device.type)]  # written back once


@pytest.mark.parametrize("write", ["scatter", "blocks", "update", "growth"])
def test_staged_rows_are_not_used_after_the_rows_were_written(device, host_calls, write):
    """Anything that writes the rows between a stage and its update (a scatter, a caller holding
    the blocks, another update, a regrown rows object) makes the update run in place on the
    current rows: still the twin's result."""
    split, twin, dims, (keys, tids, slots), bags = _staged_pair(device, "sum")
    staged = split.stage(tids, slots)
    if write == "scatter":
        rows = torch.rand(tids.numel(), 3 * max(dims)).to(device)  # ADAM state >= 0
        for r in (split, twin):
            r.scatter(tids, slots, rows)
    elif write == "blocks":
        for r in (split, twin):
            for t in range(len(dims)):
                for block, _ in r.blocks(t):
                    block.mul_(0.5)
    elif write == "update":
        grads = torch.randn(tids.numel(), max(dims)).to(device)
        for r in (split, twin):
            r.update(keys, tids, slots, grads, SGD)
    else:  # growth replaces the rows object: a stage of the old one names another object
        old = split
        split = GroupedRows(device, old.widths, dims, CAPS, DEVICE_ROWS)
        for t in range(len(dims)):
            for (dst, _), (src, _) in zip(split.blocks(t), old.blocks(t)):
                dst.copy_(src)
        split.stages = True
    _mark_host(split)
    split.reduce_update(keys, tids, slots, *bags, staged=staged)
    twin.reduce_update(keys, tids, slots, *bags)
    _assert_same_rows(split, twin)
    assert host_calls["grouped_update"] == _expect(
        split, tids.numel(), _num_host(split, tids, slots)
    )


def test_new_rows_between_a_stage_and_its_update_keep_the_staging(device, host_calls):
    """New rows (a prefetch or a later forward placing new keys) go to slots the staged pairs do
    not hold: the update still uses the staged rows, and the new rows stay as written."""
    split, twin, dims, (keys, tids, slots), bags = _staged_pair(device, "sum")
    staged = split.stage(tids, slots)
    taken = set(zip(tids.tolist(), slots.tolist()))
    free = [(t, s) for t in range(len(dims)) for s in range(CAPS[t]) if (t, s) not in taken]
    new_t = torch.tensor([t for t, _ in free[::5]], device=device)
    new_s = torch.tensor([s for _, s in free[::5]], device=device)
    assert int((new_s >= torch.tensor(DEVICE_ROWS, device=device)[new_t]).sum()) > 0
    init = torch.zeros(len(dims), 8, dtype=torch.float64)
    init[:, 0] = 0  # the constant initializer (mode column), its value in column 1
    init[:, 1] = 0.25
    init = init.to(device)
    new_keys = torch.arange(new_t.numel(), device=device) + 1000
    for r in (split, twin):
        r.init(new_t, new_s, new_keys, init, 3)
    _mark_host(split)
    split.reduce_update(keys, tids, slots, *bags, staged=staged)
    twin.reduce_update(keys, tids, slots, *bags)
    _assert_same_rows(split, twin)
    assert "grouped_update" not in host_calls
