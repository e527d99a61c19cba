"""The CPU row loops of the grouped ops at the dims they compile (16, 32, 64, 128) and others.

csrc/cpu/grouped.cpp pools and reduces rows of those dims with the dim known at compile time, and
runs each loop in an AVX2 clone where the CPU has AVX2 (csrc/include/dynamicemb/cpu_isa.h). Here:
a group of tables of those dims and of two dims that take the general loop (24, 7) gives what a
float64 reference gives, and the AVX2 clones give the same bits as the baseline ones
(``DYNAMICEMB_CPU_ISA=baseline`` in a second process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

from dynamicemb_core.ops import lookup_ops

DIMS = [16, 32, 64, 128, 24, 7]
CAP = 64
FEATURE_TABLES = [0, 1, 2, 3, 4, 5, 2]
B = 6
ARGS = {"lr": 0.05, "eps": 1e-3, "beta1": 0.8, "beta2": 0.9, "weight_decay": 0.0, "step": 2}
STATE = {0: 0, 3: 2}  # optimizer code -> state columns per embedding column (SGD, ADAM)
ROOT = Path(__file__).resolve().parents[2]


def _group(optimizer: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """(flat values, meta) of the tables of DIMS, CAP rows each (float32 rows, or a
    half-precision buffer: the embedding in ``dtype``, the state as float32 pairs of it)."""
    g = torch.Generator().manual_seed(seed)
    parts, meta, offset = [], [], 0
    for dim in DIMS:
        width = dim + STATE[optimizer] * dim
        rows = torch.rand(CAP, width, generator=g) + 0.1
        if dtype != torch.float32:
            emb = (dim + 1) // 2 * 2
            packed = torch.zeros(CAP, emb, dtype=dtype)
            packed[:, :dim] = rows[:, :dim].to(dtype)
            state = rows[:, dim:].contiguous().view(dtype).reshape(CAP, -1)
            rows = torch.cat([packed, state], 1)
            width = rows.size(1)
        parts.append(rows.reshape(-1))
        meta.append([offset, width, CAP, dim])
        offset += CAP * width
    return torch.cat(parts), torch.tensor(meta, dtype=torch.int64)


def _batch(seed: int = 0):
    """A feature-major batch with hot keys: (slots, utids, inverse, offsets, weights, ft,
    d_offsets); some keys get slot -1 (unplaced)."""
    g = torch.Generator().manual_seed(seed)
    F = len(FEATURE_TABLES)
    lengths = torch.randint(0, 40, (F * B,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    tids = torch.tensor(FEATURE_TABLES).repeat_interleave(lengths.view(F, B).sum(1))
    keys = torch.randint(0, 50, (n,), generator=g) ** 2 % 97  # skewed: some keys are hot
    uk, ut, inv, _, _ = lookup_ops.segmented_unique(keys, tids, len(DIMS))
    slots = torch.empty(uk.numel(), dtype=torch.int64)
    for t in range(len(DIMS)):
        mine = (ut == t).nonzero().squeeze(1)
        slots[mine] = torch.randperm(CAP, generator=g)[: mine.numel()]
    slots[::7] = -1
    weights = torch.rand(n, generator=g)
    d_offsets = torch.tensor([0] + [DIMS[t] for t in FEATURE_TABLES]).cumsum(0)
    return slots, ut, inv, offsets, weights, torch.tensor(FEATURE_TABLES), d_offsets


def _rows64(values: torch.Tensor, meta: torch.Tensor, t: int) -> torch.Tensor:
    off, width, cap, dim = meta[t].tolist()
    return values[off : off + cap * width].view(cap, width)[:, :dim].double()


def _pooled_reference(values, meta, slots, utids, inverse, offsets, weights, ft, d_offsets, mode):
    """float64 pooling of every bag, bag by bag."""
    out = torch.zeros(B, int(d_offsets[-1]), dtype=torch.float64)
    for bag in range(offsets.numel() - 1):
        f, s = divmod(bag, B)
        t = int(ft[f])
        rows = _rows64(values, meta, t)
        lo, hi = int(offsets[bag]), int(offsets[bag + 1])
        acc = torch.zeros(DIMS[t], dtype=torch.float64)
        for i in range(lo, hi):
            slot = int(slots[inverse[i]])
            if slot >= 0:
                acc += (float(weights[i]) if weights is not None else 1.0) * rows[slot]
        if mode == lookup_ops.POOL_MEAN and hi > lo:
            acc /= hi - lo
        c = int(d_offsets[f])
        out[s, c : c + DIMS[t]] = acc
    return out


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
def test_pooled_gather_matches_float64_at_compiled_and_other_dims(mode, weighted):
    values, meta = _group(0)
    slots, utids, inverse, offsets, weights, ft, d_offsets = _batch(seed=1)
    w = weights if weighted else None
    out = lookup_ops.grouped_pooled_gather(
        values, meta, slots, inverse, offsets, w, ft, d_offsets, mode, B, int(d_offsets[-1])
    )
    expected = _pooled_reference(
        values, meta, slots, utids, inverse, offsets, w, ft, d_offsets, mode
    )
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_reduce_grads_matches_float64_at_compiled_and_other_dims(weighted):
    _, meta = _group(0)
    slots, utids, inverse, offsets, weights, ft, d_offsets = _batch(seed=2)
    u = slots.numel()
    grad_out = torch.randn(B, int(d_offsets[-1]), generator=torch.Generator().manual_seed(3))
    w = weights if weighted else None
    out = lookup_ops.grouped_reduce_grads(
        grad_out, meta, inverse, offsets, w, ft, d_offsets, lookup_ops.POOL_SUM, B, u, max(DIMS)
    )
    expected = torch.zeros(u, max(DIMS), dtype=torch.float64)
    for bag in range(offsets.numel() - 1):
        f, s = divmod(bag, B)
        t, c = int(ft[f]), int(d_offsets[f])
        for i in range(int(offsets[bag]), int(offsets[bag + 1])):
            scale = float(weights[i]) if weighted else 1.0
            expected[inverse[i], : DIMS[t]] += scale * grad_out[s, c : c + DIMS[t]].double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("optimizer", [0, 3])
def test_reduce_update_equals_reduce_then_update_at_compiled_dims(optimizer):
    values, meta = _group(optimizer)
    expected = values.clone()
    slots, utids, inverse, offsets, weights, ft, d_offsets = _batch(seed=4)
    grad_out = torch.randn(B, int(d_offsets[-1]), generator=torch.Generator().manual_seed(5))
    bags = (inverse, offsets, None, ft, d_offsets, lookup_ops.POOL_SUM, B)
    lookup_ops.grouped_reduce_update(
        values, meta, utids, slots, grad_out, *bags, max(DIMS), optimizer, **ARGS
    )
    grads = lookup_ops.grouped_reduce_grads(grad_out, meta, *bags, slots.numel(), max(DIMS))
    lookup_ops.grouped_update(expected, meta, utids, slots, grads, optimizer, **ARGS)
    assert torch.equal(values, expected)


def compute() -> Dict[str, torch.Tensor]:
    """Every grouped CPU row loop on fixed inputs (what the ISA comparison compares)."""
    slots, utids, inverse, offsets, weights, ft, d_offsets = _batch(seed=6)
    grad_out = torch.randn(B, int(d_offsets[-1]), generator=torch.Generator().manual_seed(7))
    u, total = slots.numel(), int(d_offsets[-1])
    results: Dict[str, torch.Tensor] = {}
    values, meta = _group(0)
    for mode in (lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN):
        for w in (None, weights):
            results[f"pool{mode}{w is None}"] = lookup_ops.grouped_pooled_gather(
                values, meta, slots, inverse, offsets, w, ft, d_offsets, mode, B, total
            )
            results[f"reduce{mode}{w is None}"] = lookup_ops.grouped_reduce_grads(
                grad_out, meta, inverse, offsets, w, ft, d_offsets, mode, B, u, max(DIMS)
            )
    for optimizer in (0, 3):
        # float32 rows; bfloat16 rows rounded to nearest (-1) and stochastically (seed 11)
        for dtype, seed in ((torch.float32, -1), (torch.bfloat16, -1), (torch.bfloat16, 11)):
            values, meta = _group(optimizer, dtype)
            bags = (inverse, offsets, weights, ft, d_offsets, lookup_ops.POOL_SUM, B)
            lookup_ops.grouped_reduce_update(
                values,
                meta,
                utids,
                slots,
                grad_out,
                *bags,
                max(DIMS),
                optimizer,
                **ARGS,
                rounding_seed=seed,
                keys=torch.arange(u) * 1000003 - 7,  # the rows' keys (they key the rounding)
            )
            results[f"update{optimizer}{dtype}{seed}"] = values
    return results


def test_avx2_and_baseline_clones_give_the_same_bits(tmp_path):
    """The loops as this process runs them (AVX2 where the CPU has it) and as a process told to
    run the baseline clones runs them: bit for bit the same."""
    here = compute()
    path = tmp_path / "baseline.pt"
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[2]); "
        "from tests.lookup.test_cpu_row_loops import compute; torch.save(compute(), sys.argv[1])"
    )
    env = dict(os.environ, DYNAMICEMB_CPU_ISA="baseline")
    subprocess.run([sys.executable, "-c", script, str(path), str(ROOT)], env=env, check=True)
    there = torch.load(path)
    assert here.keys() == there.keys()
    bits = {4: torch.int32, 2: torch.int16}  # raw bits: a state word read as bf16 may be a NaN
    for name in here:
        a, b = (x.view(bits[x.element_size()]) for x in (here[name], there[name]))
        assert torch.equal(a, b), name
