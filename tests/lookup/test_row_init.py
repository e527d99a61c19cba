"""New rows made on the device by one op (grouped_init_rows, csrc/include/dynamicemb/row_init.h).

A row's values are a function of (seed, table, key, element) and the table's initializer only:
the same on the CPU and on CUDA, at any slot, in any batch; the op writes them in place into a
group's rows (float32 or half-precision, the optimizer state after the embedding) and skips slot
-1. The grouped step uses it to initialise new rows without counting them first (no readback).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.library import opcheck

from dynamicemb_core.config import DynamicEmbInitializerArgs, DynamicEmbInitializerMode
from dynamicemb_core.lookup.initializers import (
    DEBUG_MODULUS,
    INIT_COLUMNS,
    initial_rows,
    initializer_table,
)
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim.layout import stored_width

MODES = {
    "constant": DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-0.5),
    "debug": DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    "uniform": DynamicEmbInitializerArgs(
        mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.2, upper=0.6
    ),
    "normal": DynamicEmbInitializerArgs(
        mode=DynamicEmbInitializerMode.NORMAL, mean=1.0, std_dev=0.5
    ),
    "truncated": DynamicEmbInitializerArgs(
        mode=DynamicEmbInitializerMode.TRUNCATED_NORMAL,
        mean=1.0,
        std_dev=0.5,
        lower=-0.2,
        upper=0.6,
    ),
}
DIMS = [4, 3, 6]


def _table(device, state: float = 0.0) -> torch.Tensor:
    return initializer_table(
        [MODES["uniform"], MODES["normal"], MODES["debug"]], torch.device(device), state
    )


def _pairs(device, n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-(2**40), 2**40, (n,), generator=g)
    tids = torch.randint(0, len(DIMS), (n,), generator=g)
    return keys.to(device), tids.to(device)


@pytest.mark.parametrize("name", sorted(MODES))
def test_each_mode_follows_its_rule(device, name):
    args = MODES[name]
    keys = torch.arange(-5000, 15000, device=device)
    init = initializer_table([args], torch.device(device))
    rows = initial_rows(init, keys, torch.zeros_like(keys), 8, [8], 1234).cpu()
    if name == "constant":
        assert bool((rows == -0.5).all())
    elif name == "debug":
        want = torch.remainder(keys.cpu(), DEBUG_MODULUS).float().unsqueeze(1).expand(-1, 8)
        assert torch.equal(rows, want)
    elif name == "uniform":
        assert rows.min() >= -0.2 and rows.max() < 0.6
        assert abs(rows.mean().item() - 0.2) < 0.01
        assert abs(rows.var().item() - 0.8**2 / 12) < 0.002
    elif name == "normal":
        assert abs(rows.mean().item() - 1.0) < 0.01 and abs(rows.std().item() - 0.5) < 0.01
    else:
        assert rows.min() >= -0.2 and rows.max() <= 0.6
        # the mean of N(1, 0.5) restricted to [-0.2, 0.6]: mu + sigma (phi(a) - phi(b)) / Z
        a, b = (-0.2 - 1.0) / 0.5, (0.6 - 1.0) / 0.5
        pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
        cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
        mean = 1.0 + 0.5 * (pdf(a) - pdf(b)) / (cdf(b) - cdf(a))
        assert abs(rows.mean().item() - mean) < 0.01


def test_rows_are_keyed_by_seed_table_and_key_not_position(device):
    keys, tids = _pairs(device)
    init = _table(device, state=0.25)
    rows = initial_rows(init, keys, tids, 8, DIMS, 7)
    perm = torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(1)).to(device)
    again = initial_rows(init, keys[perm], tids[perm], 8, DIMS, 7)
    assert torch.equal(again, rows[perm])
    assert not torch.equal(initial_rows(init, keys, tids, 8, DIMS, 8), rows)
    # each table's dim: its initializer's columns, then the state value
    for t, d in enumerate(DIMS):
        mine = rows[tids == t]
        assert bool((mine[:, d:] == 0.25).all())
    # one key in two tables with one initializer: two streams
    both = initializer_table([MODES["uniform"]] * 2, torch.device(device))
    two = initial_rows(
        both, keys[:2].repeat(2), torch.tensor([0, 0, 1, 1], device=device), 4, [4, 4], 3
    )
    assert not torch.equal(two[:2], two[2:])


@pytest.mark.gpu
def test_cuda_rows_match_the_cpu_rows():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    keys, tids = _pairs("cpu", n=2000)
    got = initial_rows(_table("cuda", 0.5), keys.cuda(), tids.cuda(), 8, DIMS, 99).cpu()
    want = initial_rows(_table("cpu", 0.5), keys, tids, 8, DIMS, 99)
    # one formula; the device's log / cos / erfc may differ from the host's in the last bits
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_in_place_rows_equal_the_buffer_rows_and_skip_slot_minus_one(device, dtype):
    widths = [d + 2 * d for d in DIMS]  # ADAM: the embedding, then two moments
    stored = [stored_width(w, d, dtype) for w, d in zip(widths, DIMS)]
    caps = [8, 8, 8]
    meta, off = [], 0
    for w, c, d in zip(stored, caps, DIMS):
        meta.append([off, w, c, d])
        off += w * c
    values = torch.full((off,), 3.0, dtype=dtype, device=device)
    meta_t = torch.tensor(meta, dtype=torch.int64, device=device)
    keys = torch.tensor([11, 12, 13, 14, 15], device=device)
    tids = torch.tensor([0, 1, 2, 0, 2], device=device)
    slots = torch.tensor([2, 5, 0, -1, 7], device=device)
    init = _table(device, state=0.125)
    before = values.clone()
    lookup_ops.grouped_init_rows(values, meta_t, tids, slots, keys, init, 5)
    want = initial_rows(init, keys, tids, max(widths), DIMS, 5)
    got = lookup_ops.grouped_gather(values, meta_t, tids, slots.clamp(min=0), max(widths))
    for i in (0, 1, 2, 4):
        t = int(tids[i])
        d, w = DIMS[t], widths[t]
        emb = want[i, :d].to(dtype).float()
        torch.testing.assert_close(got[i, :d], emb, rtol=0, atol=0)
        assert bool((got[i, d:w] == 0.125).all())
    # key 14 had slot -1: table 0's slot 0 (never written) keeps its old contents
    assert torch.equal(values[: stored[0]], before[: stored[0]])


def test_only_mask_writes_the_pairs_it_marks_as_the_masked_slots_do(device):
    """``only`` (an insert's is_new) gives the same rows as the slots masked to -1 first, over
    more pairs than one warp looks at; a bad mask is refused before anything is written."""
    g = torch.Generator().manual_seed(4)
    n, cap = 300, 512
    meta = torch.tensor([[0, 4, cap, 4], [4 * cap, 4, cap, 4]], device=device)
    keys = (torch.randperm(10_000, generator=g)[:n] + 1).to(device)
    tids = torch.randint(0, 2, (n,), generator=g).to(device)
    slots = torch.randperm(cap, generator=g)[:n].to(device)
    slots[::7] = -1
    only = (torch.rand(n, generator=g) < 0.3).to(device)
    init = initializer_table([MODES["uniform"], MODES["normal"]], torch.device(device), 0.25)
    masked = torch.full((8 * cap,), 5.0, device=device)
    lookup_ops.grouped_init_rows(masked, meta, tids, torch.where(only, slots, -1), keys, init, 9)
    got = torch.full((8 * cap,), 5.0, device=device)
    lookup_ops.grouped_init_rows(got, meta, tids, slots, keys, init, 9, only=only)
    assert torch.equal(got, masked) and not torch.equal(got, torch.full_like(got, 5.0))
    with pytest.raises(TypeError, match="only must be bool"):
        lookup_ops.grouped_init_rows(got, meta, tids, slots, keys, init, 9, only=only.long())
    with pytest.raises(ValueError, match="only must be"):
        lookup_ops.grouped_init_rows(got, meta, tids, slots, keys, init, 9, only=only[:5])
    assert torch.equal(got, masked)


def test_bad_initializer_table_is_refused_before_writing(device):
    values = torch.zeros(16, device=device)
    meta = torch.tensor([[0, 4, 4, 4]], device=device)
    keys = torch.tensor([1], device=device)
    tids = torch.tensor([0], device=device)
    slots = torch.tensor([1], device=device)
    init = initializer_table([MODES["uniform"]], torch.device(device))
    with pytest.raises(ValueError, match="init must be"):
        lookup_ops.grouped_init_rows(values, meta, tids, slots, keys, init[:, :5], 0)
    with pytest.raises(TypeError, match="init must be float64"):
        lookup_ops.grouped_init_rows(values, meta, tids, slots, keys, init.float(), 0)
    bad = init.clone()
    bad[0, 0] = 9
    with pytest.raises(ValueError, match="no initializer mode"):
        lookup_ops.grouped_init_rows(values, meta, tids, slots, keys, bad, 0)
    with pytest.raises(ValueError, match="keys must be"):
        lookup_ops.grouped_init_rows(values, meta, tids, slots, keys.repeat(2), init, 0)
    assert bool((values == 0).all())
    assert init.shape == (1, INIT_COLUMNS)


def test_opcheck(device):
    values = torch.zeros(64, device=device)
    meta = torch.tensor([[0, 4, 8, 2], [32, 4, 8, 4]], device=device)
    keys, tids = torch.tensor([5, 6, 7], device=device), torch.tensor([0, 1, 1], device=device)
    slots = torch.tensor([3, -1, 7], device=device)
    init = initializer_table([MODES["normal"], MODES["uniform"]], torch.device(device), 0.5)
    lookup_ops._ops()
    opcheck(
        torch.ops.dynamicemb.grouped_init_rows.default, (values, meta, tids, slots, keys, init, 3)
    )
    opcheck(
        torch.ops.dynamicemb.grouped_init_rows.default,
        (values, meta, tids, slots, keys, init, 3, False, slots > 3),
    )
