"""sgd_reduce_update (the fused SGD backward) against reduce_grads then sgd_update, plus opcheck."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from dynamicemb_core.ops import lookup_ops

D = 16


def _case(device, weighted: bool, seed: int = 0):
    """Random bags over u unique keys (some repeated in a bag), slots with a -1, a value buffer."""
    g = torch.Generator().manual_seed(seed)
    n, b, u, cap = 200, 37, 60, 256
    inverse = torch.randint(0, u, (n,), generator=g)
    cuts = torch.sort(torch.randint(0, n + 1, (b - 1,), generator=g)).values
    offsets = torch.cat([torch.tensor([0]), cuts, torch.tensor([n])])  # some bags are empty
    weights = torch.rand(n, generator=g) if weighted else None
    grad_bags = torch.randn(b, D, generator=g)
    slots = torch.randperm(cap, generator=g)[:u]
    slots[[2, 17]] = -1  # keys without a home: skipped
    values = torch.randn(cap, D + 3, generator=g)  # wider rows: the update touches D columns only
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return tuple(move(t) for t in (values, slots, grad_bags, inverse, offsets, weights))


# Per-sample weights are a SUM-only input of the module: no (MEAN, weighted) case.
@pytest.mark.parametrize(
    "mode,weighted",
    [(lookup_ops.POOL_SUM, False), (lookup_ops.POOL_SUM, True), (lookup_ops.POOL_MEAN, False)],
)
def test_fused_is_bit_identical_to_reduce_then_update(device, mode, weighted):
    values, slots, grad_bags, inverse, offsets, weights = _case(device, weighted)
    expected = values.clone()
    grads = lookup_ops.reduce_grads(grad_bags, inverse, offsets, weights, mode, slots.numel())
    lookup_ops.sgd_update(expected, slots, grads, 0.05)
    lookup_ops.sgd_reduce_update(values, slots, grad_bags, inverse, offsets, weights, mode, 0.05)
    torch.testing.assert_close(values, expected, rtol=0, atol=0)
    assert not torch.equal(values, _case(device, weighted)[0])  # the update did something


def test_fused_rejects_bad_input_before_writing(device):
    values, slots, grad_bags, inverse, offsets, weights = _case(device, False)
    before = values.clone()
    bad = inverse.clone()
    bad[-1] = slots.numel()  # a unique index past num_unique = slots.numel()
    with pytest.raises(IndexError, match="inverse"):
        lookup_ops.sgd_reduce_update(values, slots, grad_bags, bad, offsets, None, 0, 0.1)
    with pytest.raises(ValueError, match="grad_bags"):
        lookup_ops.sgd_reduce_update(values, slots, grad_bags[1:], inverse, offsets, None, 0, 0.1)
    torch.testing.assert_close(values, before, rtol=0, atol=0)


def test_fused_passes_opcheck(device):
    values, slots, grad_bags, inverse, offsets, weights = _case(device, True)
    lookup_ops._ops()  # load the library
    opcheck(
        torch.ops.dynamicemb.sgd_reduce_update.default,
        (values, slots, grad_bags, inverse, offsets, weights, lookup_ops.POOL_SUM, 0.1),
    )
