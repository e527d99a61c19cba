"""Fake (meta) kernels of the lookup and optimizer ops.

:mod:`dynamicemb_core.ops.fake` imports this module and registers ``FAKE_KERNELS`` itself (torch
requires the registering module to be the one named by ``m.set_python_module`` in csrc/ops.cpp).
Shapes only: no kernel reads tensor data. The in-place optimizer updates return nothing.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["FAKE_KERNELS"]


def _unique_fake(keys: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    torch._check(keys.dim() == 1, lambda: "unique: keys must be 1-D")
    u = torch.library.get_ctx().new_dynamic_size()
    return keys.new_empty(u), keys.new_empty(keys.shape[0]), keys.new_empty(u)


def _pooled_gather_fake(
    embeddings: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    mode: int,
    check: bool = True,
) -> Tensor:
    torch._check(embeddings.dim() == 2, lambda: "pooled_gather: embeddings must be (u, D)")
    torch._check(offsets.dim() == 1 and offsets.shape[0] >= 1, lambda: "offsets must be (b+1,)")
    return embeddings.new_empty(offsets.shape[0] - 1, embeddings.shape[1])


def _reduce_grads_fake(
    grad_bags: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    mode: int,
    num_unique: int,
    check: bool = True,
) -> Tensor:
    torch._check(grad_bags.dim() == 2, lambda: "reduce_grads: grad_bags must be (b, D)")
    return grad_bags.new_empty(num_unique, grad_bags.shape[1], dtype=torch.float32)


def _check_update(values: Tensor, slots: Tensor, grads: Tensor) -> None:
    torch._check(values.dim() == 2, lambda: "values must be (capacity, row_width)")
    torch._check(grads.dim() == 2 and slots.dim() == 1, lambda: "grads (n, D), slots (n,)")
    torch._check(grads.shape[0] == slots.shape[0], lambda: "grads and slots differ in length")


def _sgd_update_fake(
    values: Tensor, slots: Tensor, grads: Tensor, lr: float, check: bool = True
) -> None:
    _check_update(values, slots, grads)


def _sgd_reduce_update_fake(
    values: Tensor,
    slots: Tensor,
    grad_bags: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    pool_mode: int,
    lr: float,
    check: bool = True,
) -> None:
    torch._check(values.dim() == 2, lambda: "values must be (capacity, row_width)")
    torch._check(slots.dim() == 1, lambda: "sgd_reduce_update: slots must be (u,)")
    torch._check(grad_bags.dim() == 2, lambda: "sgd_reduce_update: grad_bags must be (b, D)")
    torch._check(
        offsets.dim() == 1 and offsets.shape[0] == grad_bags.shape[0] + 1,
        lambda: "sgd_reduce_update: offsets must be (b+1,)",
    )


def _adagrad_update_fake(
    values: Tensor, slots: Tensor, grads: Tensor, lr: float, eps: float, check: bool = True
) -> None:
    _check_update(values, slots, grads)


def _rowwise_adagrad_update_fake(
    values: Tensor,
    slots: Tensor,
    grads: Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    weight_decay_mode: int,
    check: bool = True,
) -> None:
    _check_update(values, slots, grads)


def _adam_update_fake(
    values: Tensor,
    slots: Tensor,
    grads: Tensor,
    lr: float,
    eps: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    step: int,
    check: bool = True,
) -> None:
    _check_update(values, slots, grads)


FAKE_KERNELS = {
    "unique": _unique_fake,
    "pooled_gather": _pooled_gather_fake,
    "reduce_grads": _reduce_grads_fake,
    "sgd_update": _sgd_update_fake,
    "sgd_reduce_update": _sgd_reduce_update_fake,
    "adagrad_update": _adagrad_update_fake,
    "rowwise_adagrad_update": _rowwise_adagrad_update_fake,
    "adam_update": _adam_update_fake,
}
