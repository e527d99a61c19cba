"""Composed-torch reference of the fused row updates, written from FBGEMM's formulas.

Independent of the C++ kernels: used to check them row by row, and by the lookup oracle for Adam
(FBGEMM's CPU build refuses ADAM).
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
