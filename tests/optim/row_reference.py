"""Composed-torch reference of the fused row updates, pooling and gradient reduction, written from
FBGEMM's formulas.

Independent of the C++ kernels: the grouped ops are checked against it table by table
(tests/lookup/test_grouped_ops.py, tests/optim/test_fused_updates.py), and the lookup oracle uses it
for Adam (FBGEMM's CPU build refuses ADAM).
"""

from __future__ import annotations

import torch


def sgd(w: torch.Tensor, g: torch.Tensor, lr: float) -> torch.Tensor:
    return w - lr * g


def adagrad(w: torch.Tensor, m: torch.Tensor, g: torch.Tensor, lr: float, eps: float):
    m = m + g * g
    return w - lr * g / (m.sqrt() + eps), m


def rowwise_adagrad(w, m, g, lr, eps, wd=0.0, mode=0):
    """m: (n,) one accumulator per row."""
    gd = g + wd * w if mode == 1 else g
    m = m + (gd * gd).mean(dim=1)
    mult = (lr / (m.sqrt() + eps)).unsqueeze(1)
    corr = torch.ones_like(mult)
    if mode == 1:
        corr = 1.0 - mult * wd
    elif mode == 2:
        corr = torch.full_like(mult, 1.0 - lr * wd)
    return corr * w - mult * g, m


def adam(w, m, v, g, lr, eps, b1, b2, wd, step):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    bc1 = 1 - b1**step
    bc2 = 1 - b2**step
    w = w - lr * (m / bc1 / ((v / bc2).sqrt() + eps) + wd * w)
    return w, m, v


# Optimizer codes of lookup_ops.OPTIMIZER_CODES, in the order of the formulas above.
SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM = 0, 1, 2, 3


def update_rows(values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor, optimizer: int, a):
    """In place: the optimizer on the rows ``values[slots]`` of one table (capacity, row_width),
    ``[w (D) | state]`` with D = grads.size(1); slots < 0 are skipped. ``a`` maps the
    hyper-parameter names of ``lookup_ops.grouped_update`` (lr, eps, beta1, beta2, weight_decay,
    weight_decay_mode, step) to values. The per-table oracle the grouped update ops are checked
    against."""
    ok = slots >= 0
    s, g = slots[ok], grads[ok].float()
    D = g.size(1)
    w = values[s, :D].float()
    if optimizer == SGD:
        values[s, :D] = sgd(w, g, a["lr"]).to(values.dtype)
    elif optimizer == ADAGRAD:
        w, m = adagrad(w, values[s, D : 2 * D], g, a["lr"], a["eps"])
        values[s, :D], values[s, D : 2 * D] = w, m
    elif optimizer == ROWWISE_ADAGRAD:
        w, m = rowwise_adagrad(
            w, values[s, D], g, a["lr"], a["eps"], a["weight_decay"], a["weight_decay_mode"]
        )
        values[s, :D], values[s, D] = w, m
    elif optimizer == ADAM:
        w, m, v = adam(
            w,
            values[s, D : 2 * D],
            values[s, 2 * D : 3 * D],
            g,
            a["lr"],
            a["eps"],
            a["beta1"],
            a["beta2"],
            a["weight_decay"],
            a["step"],
        )
        values[s, :D], values[s, D : 2 * D], values[s, 2 * D : 3 * D] = w, m, v
    else:
        raise ValueError(f"unknown optimizer code {optimizer}")


def pool(emb, inverse, offsets, weights, mode: int) -> torch.Tensor:
    """Pooled rows of bags (SUM 0, MEAN 1): index_add of each index's (weighted) row into its bag;
    empty bags give zeros. The oracle of the pooled gathers."""
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=emb.device), lengths)
    rows = emb[inverse].float() * (weights.unsqueeze(1) if weights is not None else 1.0)
    out = torch.zeros(lengths.numel(), emb.size(1), device=emb.device).index_add_(0, bag, rows)
    if mode == 1:
        out = out / lengths.clamp(min=1).unsqueeze(1)
    return out


def reduce_grads(grad_bags, inverse, offsets, weights, mode: int, num_unique: int) -> torch.Tensor:
    """(num_unique, D) gradient per unique key: the adjoint of :func:`pool` (each index adds its
    bag's gradient, times its weight, divided by the bag's length for MEAN). The oracle of the
    grouped gradient reductions."""
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=grad_bags.device), lengths)
    scale = torch.ones(inverse.numel(), device=grad_bags.device)
    if weights is not None:
        scale = scale * weights
    if mode == 1:
        scale = scale / lengths[bag].clamp(min=1)
    rows = grad_bags.float()[bag] * scale.unsqueeze(1)
    out = torch.zeros(num_unique, grad_bags.size(1), device=grad_bags.device)
    return out.index_add_(0, inverse, rows)
