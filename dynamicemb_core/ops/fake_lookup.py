"""Fake (meta) kernels of the lookup and grouped ops.

:mod:`dynamicemb_core.ops.fake` imports this module and registers ``FAKE_KERNELS`` itself (torch
requires the registering module to be the one named by ``m.set_python_module`` in csrc/ops.cpp).
Shapes only: no kernel reads tensor data. The in-place ops return nothing.
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


def _unique_outputs(
    keys: Tensor, num_counts: int, with_order: bool
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The unique ops' outputs: u data-dependent, the counts (and numbers) on the CPU."""
    u = torch.library.get_ctx().new_dynamic_size()
    counts = torch.empty(num_counts, dtype=torch.int64, device="cpu")
    return (
        keys.new_empty(u),
        keys.new_empty(u),
        keys.new_empty(keys.shape[0]),
        keys.new_empty(u),
        counts,
        keys.new_empty(keys.shape[0] if with_order else 0),
    )


def _segmented_unique_fake(
    keys: Tensor,
    table_ids: Tensor,
    num_tables: int,
    with_order: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    torch._check(keys.dim() == 1, lambda: "segmented_unique: keys must be 1-D")
    return _unique_outputs(keys, num_tables, with_order)


def _bag_unique_fake(
    keys: Tensor,
    offsets: Tensor,
    feature_tables: Tensor,
    batch_size: int,
    num_tables: int,
    with_order: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    torch._check(keys.dim() == 1, lambda: "bag_unique: keys must be 1-D")
    torch._check(offsets.dim() == 1, lambda: "bag_unique: offsets must be 1-D")
    return _unique_outputs(keys, num_tables + 3, with_order)


def _placement_counts_fake(
    table_ids: Tensor, slots: Tensor, is_new: Tensor, sizes: Tensor
) -> Tensor:
    torch._check(table_ids.dim() == 1, lambda: "placement_counts: table_ids must be 1-D")
    return table_ids.new_empty(sizes.shape[0], 3)


def _grouped_gather_fake(
    values: Tensor,
    meta: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    width: int,
    check: bool = True,
    inverse: Optional[Tensor] = None,
) -> Tensor:
    torch._check(values.dim() == 1, lambda: "grouped_gather: values must be 1-D")
    rows = slots.shape[0] if inverse is None else inverse.shape[0]
    return values.new_empty(rows, width)


def _grouped_scatter_fake(
    values: Tensor,
    meta: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    rows: Tensor,
    check: bool = True,
) -> None:
    torch._check(rows.dim() == 2, lambda: "grouped_scatter: rows must be (n, k)")


def _grouped_init_rows_fake(
    values: Tensor,
    meta: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    keys: Tensor,
    init: Tensor,
    seed: int,
    check: bool = True,
    only: Optional[Tensor] = None,
) -> None:
    torch._check(init.dim() == 2, lambda: "grouped_init_rows: init must be (T, 8)")


def _grouped_pooled_gather_fake(
    values: Tensor,
    meta: Tensor,
    slots: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    feature_tables: Tensor,
    d_offsets: Tensor,
    mode: int,
    batch_size: int,
    total_dim: int,
    check: bool = True,
) -> Tensor:
    torch._check(values.dim() == 1, lambda: "grouped_pooled_gather: values must be 1-D")
    return values.new_empty(batch_size, total_dim)


def _grouped_reduce_grads_fake(
    grad_out: Tensor,
    meta: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    feature_tables: Tensor,
    d_offsets: Tensor,
    mode: int,
    batch_size: int,
    num_unique: int,
    width: int,
    check: bool = True,
) -> Tensor:
    torch._check(grad_out.dim() == 2, lambda: "grouped_reduce_grads: grad_out must be 2-D")
    return grad_out.new_empty(num_unique, width, dtype=torch.float32)


def _check_update_keys(keys: Optional[Tensor], rounding_seed: int, op: str) -> None:
    """The update ops' ``keys``: required for stochastic rounding (rounding_seed >= 0), 1-D."""
    torch._check(
        keys is not None or rounding_seed < 0,
        lambda: f"{op}: rounding_seed {rounding_seed} (stochastic rounding) needs the rows' keys",
    )
    torch._check(keys is None or keys.dim() == 1, lambda: f"{op}: keys must be (n,)")


def _grouped_update_fake(
    values: Tensor,
    meta: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    grads: Tensor,
    optimizer: int,
    lr: float,
    eps: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    weight_decay_mode: int,
    step: int,
    check: bool = True,
    rounding_seed: int = -1,
    keys: Optional[Tensor] = None,
) -> None:
    torch._check(grads.dim() == 2, lambda: "grouped_update: grads must be (n, k)")
    _check_update_keys(keys, rounding_seed, "grouped_update")


def _grouped_reduce_update_fake(
    values: Tensor,
    meta: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    grad_out: Tensor,
    inverse: Tensor,
    offsets: Tensor,
    weights: Optional[Tensor],
    feature_tables: Tensor,
    d_offsets: Tensor,
    pool_mode: int,
    batch_size: int,
    max_dim: int,
    optimizer: int,
    lr: float,
    eps: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    weight_decay_mode: int,
    step: int,
    check: bool = True,
    order: Optional[Tensor] = None,
    key_counts: Optional[Tensor] = None,
    rounding_seed: int = -1,
    keys: Optional[Tensor] = None,
) -> None:
    torch._check(grad_out.dim() == 2, lambda: "grouped_reduce_update: grad_out must be 2-D")
    _check_update_keys(keys, rounding_seed, "grouped_reduce_update")


FAKE_KERNELS = {
    "unique": _unique_fake,
    "pooled_gather": _pooled_gather_fake,
    "segmented_unique": _segmented_unique_fake,
    "bag_unique": _bag_unique_fake,
    "placement_counts": _placement_counts_fake,
    "grouped_gather": _grouped_gather_fake,
    "grouped_scatter": _grouped_scatter_fake,
    "grouped_init_rows": _grouped_init_rows_fake,
    "grouped_pooled_gather": _grouped_pooled_gather_fake,
    "grouped_reduce_grads": _grouped_reduce_grads_fake,
    "grouped_update": _grouped_update_fake,
    "grouped_reduce_update": _grouped_reduce_update_fake,
}
