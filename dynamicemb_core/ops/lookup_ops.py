"""Typed wrappers over the lookup ops (``torch.ops.dynamicemb.*``, "lookup" section of csrc/ops.cpp).

Each wrapper documents shapes, dtypes and devices and calls the registered op. The ops are:

- ``unique``: per-table key deduplication (unique keys, inverse, counts).
- ``pooled_gather``: bags of unique embeddings -> pooled rows (forward of SUM/MEAN; NONE uses a plain
  index gather).
- ``reduce_grads``: gradients of bags -> one gradient row per unique key (the backward's reduction).
- ``sgd_reduce_update``: ``reduce_grads`` and ``sgd_update`` fused (the CPU backward's SGD path).
- ``sgd_update``, ``adagrad_update``, ``rowwise_adagrad_update``, ``adam_update``: fused in-place
  optimizer steps on value rows addressed by slot.

``check`` (keyword-only, all but ``unique``): True, the default, checks the data before writing
(offsets start at 0, end at n and never decrease; inverse in [0, u); slots below capacity) and
raises. On CUDA that costs a device synchronisation per call, so the batched module, whose offsets
are validated once per batch and whose inverse and slots come from its own unique op and table,
passes False. The input must then be valid: the update kernels still skip out-of-range slots, the
bag kernels do not bound inverse or offsets. CPU kernels always check (it costs them no sync).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

__all__ = [
    "POOL_MEAN",
    "POOL_SUM",
    "adagrad_update",
    "adam_update",
    "pooled_gather",
    "reduce_grads",
    "rowwise_adagrad_update",
    "sgd_reduce_update",
    "sgd_update",
    "unique",
]

# Pooling codes passed to the ops (DynamicEmbPoolingMode values).
POOL_SUM = 0
POOL_MEAN = 1


def _ops() -> Any:
    from dynamicemb_core.ops import loader

    loader.ensure_loaded()
    return torch.ops.dynamicemb


def unique(keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deduplicate keys.

    Args:
        keys: (n,) int64.

    Returns:
        ``(unique_keys (u,), inverse (n,), counts (u,))``, int64 on ``keys.device``, with
        ``unique_keys[inverse] == keys``. Order of unique keys: first occurrence on CPU, ascending on
        CUDA; deterministic on both.
    """
    return _ops().unique.default(keys)


def pooled_gather(
    embeddings: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    mode: int,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Pool bags of rows of ``embeddings``.

    Args:
        embeddings: (u, D) float, one row per unique key.
        inverse: (n,) int64, the unique row of each index (values in [0, u)).
        offsets: (b+1,) int64, bag ``i`` covers ``inverse[offsets[i]:offsets[i+1]]``.
        weights: optional (n,) float per-sample weights (SUM only).
        mode: POOL_SUM or POOL_MEAN (MEAN divides by the bag length; empty bags give zeros).

    Returns:
        (b, D) float32 on the inputs' device.
    """
    return _ops().pooled_gather.default(embeddings, inverse, offsets, weights, mode, check)


def reduce_grads(
    grad_bags: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    mode: int,
    num_unique: int,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Sum the gradient reaching each unique key (the adjoint of :func:`pooled_gather`).

    Args:
        grad_bags: (b, D) float, gradient of each bag's pooled row.
        inverse, offsets, weights, mode: as in :func:`pooled_gather`.
        num_unique: u, the number of unique keys.

    Returns:
        (u, D) float32: for key k, ``sum over indices i with inverse[i] == k`` of
        ``grad_bags[bag(i)] * weight_i`` (``/ len(bag)`` for MEAN). Deterministic.
    """
    return _ops().reduce_grads.default(
        grad_bags, inverse, offsets, weights, mode, num_unique, check
    )


def sgd_update(
    values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor, lr: float, *, check: bool = True
) -> None:
    """In place: ``values[s, :D] -= lr * g`` for each slot ``s >= 0`` (D = grads.size(1))."""
    _ops().sgd_update.default(values, slots, grads, lr, check)


def sgd_reduce_update(
    values: torch.Tensor,
    slots: torch.Tensor,
    grad_bags: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    mode: int,
    lr: float,
    *,
    check: bool = True,
) -> None:
    """:func:`reduce_grads` then :func:`sgd_update` in one op (the training backward's SGD path).

    On CPU the per-key gradient is applied as soon as it is summed, so the (u, D) gradient tensor
    is never allocated, written or read back; the rows come out bit-identical to the two ops.

    Args:
        values: (capacity, row_width) float32, updated in place.
        slots: (u,) int64 slot of each unique key (entries < 0 are skipped).
        grad_bags, inverse, offsets, weights, mode: as in :func:`reduce_grads`, with
            ``num_unique = slots.numel()``.
        lr: the learning rate.
    """
    _ops().sgd_reduce_update.default(
        values, slots, grad_bags, inverse, offsets, weights, mode, lr, check
    )


def adagrad_update(
    values: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    eps: float,
    *,
    check: bool = True,
) -> None:
    """In place EXACT_ADAGRAD on rows ``[w (D) | m (D)]`` at ``slots`` (-1 skipped)."""
    _ops().adagrad_update.default(values, slots, grads, lr, eps, check)


def rowwise_adagrad_update(
    values: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    weight_decay_mode: int,
    *,
    check: bool = True,
) -> None:
    """In place EXACT_ROWWISE_ADAGRAD on rows ``[w (D) | m (1)]`` at ``slots`` (-1 skipped)."""
    _ops().rowwise_adagrad_update.default(
        values, slots, grads, lr, eps, weight_decay, weight_decay_mode, check
    )


def adam_update(
    values: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    eps: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    step: int,
    *,
    check: bool = True,
) -> None:
    """In place FBGEMM ADAM on rows ``[w (D) | m (D) | v (D)]`` at ``slots``; ``step`` >= 1."""
    _ops().adam_update.default(
        values, slots, grads, lr, eps, beta1, beta2, weight_decay, step, check
    )
