"""The fused optimizer ops against the composed reference, on every device, plus opcheck."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from dynamicemb_core.ops import lookup_ops
from tests.optim import row_reference as ref

D = 8


def _case(device, state_width, n_rows=32, n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n_rows, D + state_width, generator=g).abs().to(device)
    slots = torch.randperm(n_rows, generator=g)[:n].to(device)
    slots[3] = -1  # skipped
    grads = torch.randn(n, D, generator=g).to(device)
    return values, slots, grads


def _untouched_equal(before, after, slots):
    keep = torch.ones(before.size(0), dtype=torch.bool, device=before.device)
    keep[slots[slots >= 0]] = False
    torch.testing.assert_close(after[keep], before[keep], rtol=0, atol=0)


def test_sgd_update_matches_reference(device):
    values, slots, grads = _case(device, 0)
    before = values.clone()
    lookup_ops.sgd_update(values, slots, grads, 0.3)
    ok = slots >= 0
    s = slots[ok]
    torch.testing.assert_close(values[s], ref.sgd(before[s], grads[ok], 0.3))
    _untouched_equal(before, values, slots)


def test_adagrad_update_matches_reference(device):
    values, slots, grads = _case(device, D)
    before = values.clone()
    lookup_ops.adagrad_update(values, slots, grads, 0.1, 1e-6)
    ok = slots >= 0
    s = slots[ok]
    w, m = ref.adagrad(before[s, :D], before[s, D:], grads[ok], 0.1, 1e-6)
    torch.testing.assert_close(values[s, :D], w)
    torch.testing.assert_close(values[s, D:], m)
    _untouched_equal(before, values, slots)


@pytest.mark.parametrize("mode,wd", [(0, 0.0), (1, 0.05), (2, 0.05)])
def test_rowwise_adagrad_update_matches_reference(device, mode, wd):
    values, slots, grads = _case(device, 1)
    before = values.clone()
    lookup_ops.rowwise_adagrad_update(values, slots, grads, 0.1, 1e-6, wd, mode)
    ok = slots >= 0
    s = slots[ok]
    w, m = ref.rowwise_adagrad(before[s, :D], before[s, D], grads[ok], 0.1, 1e-6, wd, mode)
    torch.testing.assert_close(values[s, :D], w)
    torch.testing.assert_close(values[s, D], m)
    _untouched_equal(before, values, slots)


@pytest.mark.parametrize("step", [1, 7])
def test_adam_update_matches_reference(device, step):
    values, slots, grads = _case(device, 2 * D)
    before = values.clone()
    lookup_ops.adam_update(values, slots, grads, 0.01, 1e-8, 0.9, 0.999, 0.01, step)
    ok = slots >= 0
    s = slots[ok]
    w, m, v = ref.adam(
        before[s, :D],
        before[s, D : 2 * D],
        before[s, 2 * D :],
        grads[ok],
        0.01,
        1e-8,
        0.9,
        0.999,
        0.01,
        step,
    )
    torch.testing.assert_close(values[s, :D], w)
    torch.testing.assert_close(values[s, D : 2 * D], m)
    torch.testing.assert_close(values[s, 2 * D :], v)
    _untouched_equal(before, values, slots)


def test_update_rejects_row_too_narrow_for_state(device):
    values, slots, grads = _case(device, 1)
    with pytest.raises(ValueError, match="row_width 9 is too small"):
        lookup_ops.adam_update(values, slots, grads, 0.01, 1e-8, 0.9, 0.999, 0.0, 1)


def test_update_rejects_slot_out_of_range(device):
    values, slots, grads = _case(device, 0)
    slots[0] = values.size(0)
    with pytest.raises(IndexError, match="out of range"):
        lookup_ops.sgd_update(values, slots, grads, 0.1)


def test_adam_rejects_step_zero(device):
    values, slots, grads = _case(device, 2 * D)
    with pytest.raises(ValueError, match="step must be >= 1"):
        lookup_ops.adam_update(values, slots, grads, 0.01, 1e-8, 0.9, 0.999, 0.0, 0)


@pytest.mark.parametrize(
    "op,state,extra",
    [
        ("sgd_update", 0, (0.1,)),
        ("adagrad_update", D, (0.1, 1e-6)),
        ("rowwise_adagrad_update", 1, (0.1, 1e-6, 0.01, 1)),
        ("adam_update", 2 * D, (0.01, 1e-8, 0.9, 0.999, 0.0, 3)),
    ],
)
def test_update_ops_pass_opcheck(device, op, state, extra):
    values, slots, grads = _case(device, state)
    lookup_ops._ops()  # load the library
    opcheck(getattr(torch.ops.dynamicemb, op).default, (values, slots, grads, *extra))
