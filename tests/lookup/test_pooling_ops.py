"""pooled_gather (the serving path's per-table pooling) against composed torch, on every device,
plus opcheck; and the reference gradient reduction (tests/optim/row_reference.py, the oracle of the
grouped reductions) against autograd."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from dynamicemb_core.ops import lookup_ops
from tests.optim import row_reference as ref


def _bags(device, weighted, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, 0, 1, 4, 0, 2])  # empty bags included
    n = int(lengths.sum())
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    u = 5
    inverse = torch.randint(0, u, (n,), generator=g)
    emb = torch.randn(u, 6, generator=g)
    weights = torch.rand(n, generator=g) if weighted else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(emb), to(inverse), to(offsets), to(weights), lengths.to(device)


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_gather_matches_composed_torch(device, mode, weighted):
    emb, inverse, offsets, weights, lengths = _bags(device, weighted)
    out = lookup_ops.pooled_gather(emb, inverse, offsets, weights, mode)
    torch.testing.assert_close(out, ref.pool(emb, inverse, offsets, weights, mode))


@pytest.mark.parametrize("mode", [lookup_ops.POOL_SUM, lookup_ops.POOL_MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_reference_reduce_grads_is_the_adjoint_of_pooling(mode, weighted):
    emb, inverse, offsets, weights, lengths = _bags("cpu", weighted)
    leaf = emb.clone().requires_grad_(True)
    grad_bags = torch.randn(lengths.numel(), emb.size(1))
    ref.pool(leaf, inverse, offsets, weights, mode).backward(grad_bags)
    got = ref.reduce_grads(grad_bags, inverse, offsets, weights, mode, emb.size(0))
    torch.testing.assert_close(got, leaf.grad)


def test_pooled_gather_rejects_offsets_not_ending_at_n(device):
    emb, inverse, offsets, weights, _ = _bags(device, False)
    offsets = offsets.clone()
    offsets[-1] += 1
    with pytest.raises(ValueError, match="end at n="):
        lookup_ops.pooled_gather(emb, inverse, offsets, weights, 0)


def test_pooled_gather_rejects_int32_inverse(device):
    emb, inverse, offsets, weights, _ = _bags(device, False)
    with pytest.raises(TypeError, match="inverse must be int64"):
        lookup_ops.pooled_gather(emb, inverse.int(), offsets, weights, 0)


@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_gather_passes_opcheck(device, weighted):
    emb, inverse, offsets, weights, lengths = _bags(device, weighted)
    lookup_ops._ops()
    opcheck(torch.ops.dynamicemb.pooled_gather.default, (emb, inverse, offsets, weights, 1))


def test_pooled_gather_reads_a_column_slice_of_wider_rows(device):
    emb, inverse, offsets, weights, lengths = _bags(device, True)
    wide = torch.cat([emb, torch.randn(emb.size(0), 3, device=device)], dim=1)
    got = lookup_ops.pooled_gather(wide[:, : emb.size(1)], inverse, offsets, weights, 0)
    torch.testing.assert_close(got, lookup_ops.pooled_gather(emb, inverse, offsets, weights, 0))
