"""The fused optimizer updates (``grouped_update`` on a one-table group) against the composed
reference (tests/optim/row_reference.py), on every device, and their argument checks."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.ops import lookup_ops
from tests.optim import row_reference as ref

D = 8
STATE = {ref.SGD: 0, ref.ADAGRAD: D, ref.ROWWISE_ADAGRAD: 1, ref.ADAM: 2 * D}
ARGS = {
    "lr": 0.1,
    "eps": 1e-6,
    "beta1": 0.9,
    "beta2": 0.999,
    "weight_decay": 0.0,
    "weight_decay_mode": 0,
    "step": 1,
}


def _case(device, state_width, n_rows=32, n=10, seed=0):
    """(values (n_rows, D + state), meta of the one table, table ids, slots (one -1), grads)."""
    g = torch.Generator().manual_seed(seed)
    width = D + state_width
    values = torch.randn(n_rows, width, generator=g).abs().to(device)
    meta = torch.tensor([[0, width, n_rows, D]], dtype=torch.int64, device=device)
    slots = torch.randperm(n_rows, generator=g)[:n].to(device)
    slots[3] = -1  # skipped
    grads = torch.randn(n, D, generator=g).to(device)
    return values, meta, torch.zeros_like(slots), slots, grads


def _update(values, meta, tids, slots, grads, optimizer, args):
    lookup_ops.grouped_update(values.view(-1), meta, tids, slots, grads, optimizer, **args)


@pytest.mark.parametrize(
    "optimizer,extra",
    [
        (ref.SGD, {"lr": 0.3}),
        (ref.ADAGRAD, {}),
        (ref.ROWWISE_ADAGRAD, {"weight_decay": 0.0, "weight_decay_mode": 0}),
        (ref.ROWWISE_ADAGRAD, {"weight_decay": 0.05, "weight_decay_mode": 1}),
        (ref.ROWWISE_ADAGRAD, {"weight_decay": 0.05, "weight_decay_mode": 2}),
        (ref.ADAM, {"lr": 0.01, "eps": 1e-8, "weight_decay": 0.01, "step": 1}),
        (ref.ADAM, {"lr": 0.01, "eps": 1e-8, "weight_decay": 0.01, "step": 7}),
    ],
)
def test_update_matches_reference(device, optimizer, extra):
    values, meta, tids, slots, grads = _case(device, STATE[optimizer])
    args = {**ARGS, **extra}
    expected = values.clone()
    _update(values, meta, tids, slots, grads, optimizer, args)
    ref.update_rows(expected, slots, grads, optimizer, args)
    torch.testing.assert_close(values, expected)  # rows at -1 and untouched slots included


def test_update_rejects_row_too_narrow_for_state(device):
    values, meta, tids, slots, grads = _case(device, 1)
    with pytest.raises(ValueError, match="row_width 9 is too small"):
        _update(values, meta, tids, slots, grads, ref.ADAM, ARGS)


def test_update_rejects_slot_out_of_range(device):
    values, meta, tids, slots, grads = _case(device, 0)
    before = values.clone()
    slots[0] = values.size(0)
    with pytest.raises(IndexError, match="out of range"):
        _update(values, meta, tids, slots, grads, ref.SGD, ARGS)
    assert torch.equal(values, before)


def test_adam_rejects_step_zero(device):
    values, meta, tids, slots, grads = _case(device, 2 * D)
    with pytest.raises(ValueError, match="step must be >= 1"):
        _update(values, meta, tids, slots, grads, ref.ADAM, {**ARGS, "step": 0})
