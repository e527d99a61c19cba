"""The autograd function of the batched module: pooling forward, fused optimizer backward.

The lookup itself (dedup, table access, initialization) runs before this function, without
autograd. The function receives each table's unique embeddings and the mapping of indices to them;
its backward reduces the output gradient to one row per unique key and hands it to the table's
storage, which applies the fused optimizer in place. No dense weight tensor exists, so the function
returns no gradient for any input: the dummy input only makes autograd call the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from dynamicemb_core.ops import lookup_ops

__all__ = ["LookupFunction", "TableLookup"]


@dataclass
class TableLookup:
    """One table's part of a forward, kept for the backward.

    Attributes:
        table: table index.
        embeddings: (u, D) float32 embedding of each unique key.
        inverse: (n_t,) int64 unique row of each index.
        offsets: (k*B+1,) int64 bag boundaries (pooled) or None (sequence).
        weights: (n_t,) float32 per-sample weights or None.
        positions: (n_t,) int64 rows of the sequence output (NONE pooling) or None.
        columns: per feature of the table, its first output column (pooled).
        apply_grads: ``apply_grads(grads (u, D))`` updates the table; None when nothing trains.
    """

    table: int
    embeddings: torch.Tensor
    inverse: torch.Tensor
    offsets: Optional[torch.Tensor]
    weights: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]
    columns: List[int]
    apply_grads: Optional[Callable[[torch.Tensor], None]]


def pooled_forward(part: TableLookup, mode: int, out: torch.Tensor, batch_size: int) -> None:
    """Pool one table's bags and write each feature's block of columns of ``out`` (B, total_D)."""
    pooled = lookup_ops.pooled_gather(part.embeddings, part.inverse, part.offsets, part.weights, mode)
    dim = part.embeddings.size(1)
    for j, col in enumerate(part.columns):
        out[:, col : col + dim] = pooled[j * batch_size : (j + 1) * batch_size]


def pooled_grads(part: TableLookup, mode: int, grad_out: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Gradient per unique key of one table from the output gradient (B, total_D)."""
    dim = part.embeddings.size(1)
    grad_bags = torch.cat([grad_out[:, c : c + dim] for c in part.columns]) if part.columns else (
        grad_out.new_zeros((0, dim))
    )
    return lookup_ops.reduce_grads(
        grad_bags.float().contiguous(), part.inverse, part.offsets, part.weights, mode,
        part.embeddings.size(0),
    )


def sequence_grads(part: TableLookup, grad_out: torch.Tensor) -> torch.Tensor:
    """Gradient per unique key of one table from the sequence output gradient (N, D)."""
    n = part.inverse.numel()
    bags = torch.arange(n + 1, dtype=torch.int64, device=part.inverse.device)
    grad_rows = grad_out[part.positions].float().contiguous()
    return lookup_ops.reduce_grads(
        grad_rows, part.inverse, bags, None, lookup_ops.POOL_SUM, part.embeddings.size(0)
    )


class LookupFunction(torch.autograd.Function):
    """Forward: pooled (B, total_D) or sequence (N, D) output. Backward: fused optimizer step."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,  # noqa: ANN001
        dummy: torch.Tensor,
        parts: List[TableLookup],
        mode: Optional[int],
        out_shape: Tuple[int, int],
        batch_size: int,
    ) -> torch.Tensor:
        out = torch.zeros(out_shape, dtype=torch.float32, device=dummy.device)
        for part in parts:
            if mode is None:
                if part.inverse.numel():
                    out[part.positions] = part.embeddings[part.inverse]
            else:
                pooled_forward(part, mode, out, batch_size)
        ctx.parts = parts
        ctx.mode = mode
        ctx.batch_size = batch_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]  # noqa: ANN001, ANN205
        for part in [p for p in ctx.parts if p.apply_grads is not None]:
            if ctx.mode is None:
                grads = sequence_grads(part, grad_out)
            else:
                grads = pooled_grads(part, ctx.mode, grad_out, ctx.batch_size)
            part.apply_grads(grads)
        ctx.parts = None
        return None, None, None, None, None
