"""Fused optimizer updates applied in place to the value rows of a table.

``apply_update`` is the one entry point the backward pass calls: for each unique key with a home in
the table it reads the row at its slot, applies the optimizer with the key's reduced gradient and
writes the row back, in one op per call (``torch.ops.dynamicemb.<optimizer>_update``). The formulas
are FBGEMM's (fbgemm_gpu/codegen/genscript/optimizers.py), restated in docs of each op:

- EXACT_SGD: ``w -= lr * g``
- EXACT_ADAGRAD: ``m += g^2; w -= lr * g / (sqrt(m) + eps)``
- EXACT_ROWWISE_ADAGRAD: ``g' = g + wd*w`` (L2 only); ``m += mean(g'^2)``;
  ``mult = lr / (sqrt(m) + eps)``; ``w = c * w - mult * g`` with ``c = 1 - mult*wd`` (L2),
  ``1 - lr*wd`` (DECOUPLE) or 1.
- ADAM: ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2``;
  ``w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * w)`` with ``t`` the global step.
"""

from __future__ import annotations

import torch

from dynamicemb_core.optim.args import OptimizerArgs, OptimizerKind

__all__ = ["apply_update"]


def apply_update(
    kind: OptimizerKind,
    args: OptimizerArgs,
    step: int,
    values: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
) -> None:
    """Update rows ``values[slots]`` in place with ``grads``.

    Args:
        kind: the optimizer.
        args: its hyper-parameters (learning rate read now, so it can change between steps).
        step: the global step, starting at 1 for the first update (Adam's bias correction).
        values: (capacity, row_width) float tensor, rows ``[embedding | state]``.
        slots: (n,) int64 unique local slots on ``values``' device; -1 entries are skipped. They
            come from the table (a tier's homes), so the ops run unchecked (``check=False``: no
            device synchronisation on CUDA; slots beyond the buffer are skipped, never written).
        grads: (n, dim) float32 gradients reduced per key, same device.
    """
    from dynamicemb_core.ops import lookup_ops

    if slots.numel() == 0:
        return
    lr = float(args.learning_rate)
    if kind is OptimizerKind.SGD:
        lookup_ops.sgd_update(values, slots, grads, lr, check=False)
    elif kind is OptimizerKind.ADAGRAD:
        lookup_ops.adagrad_update(values, slots, grads, lr, float(args.eps), check=False)
    elif kind is OptimizerKind.ROWWISE_ADAGRAD:
        lookup_ops.rowwise_adagrad_update(
            values,
            slots,
            grads,
            lr,
            float(args.eps),
            float(args.weight_decay),
            int(args.weight_decay_mode),
            check=False,
        )
    elif kind is OptimizerKind.ADAM:
        lookup_ops.adam_update(
            values,
            slots,
            grads,
            lr,
            float(args.eps),
            float(args.beta1),
            float(args.beta2),
            float(args.weight_decay),
            int(step),
            check=False,
        )
    else:  # pragma: no cover - OptimizerKind is closed
        raise ValueError(f"no fused update for {kind!r}")
