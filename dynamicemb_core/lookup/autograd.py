"""The autograd function of the batched module: pooling forward, fused optimizer backward.

The lookup itself (dedup, table access, initialization) runs before this function, without
autograd. The function receives each table's unique embeddings and the mapping of indices to them;
its backward reduces the output gradient to one row per unique key and hands it to the table's
storage, which applies the fused optimizer in place. No dense weight tensor exists, so the
embeddings get no gradient: the dummy input only makes autograd call the backward.

The one input that does get a gradient is ``per_sample_weights`` (SUM pooling), passed only when
it requires grad. A pooled row is ``sum_i w_i * row(i)``, so ``d out[bag(i)] / d w_i = row(i)`` and
``grad_w[i] = <row(i), grad_bag(bag(i))>``. The rows are the ones the forward read: the forward keeps
one copy per unique key (the backward's optimizer step changes the table in place, and the table may
grow before the backward runs), and only when the weights want a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

from dynamicemb_core.ops import lookup_ops

__all__ = ["LookupFunction", "TableLookup"]


@dataclass
class TableLookup:
    """One table's part of a forward, kept for the backward.

    Attributes:
        table: table index.
        rows: (r, D) float32 rows the forward reads: the unique keys' embeddings, or a column view
            of the table's own value buffer (then ``row_index`` holds slots).
        row_index: (n_t,) int64 row of ``rows`` for each index.
        inverse: (n_t,) int64 unique key of each index (the backward reduces onto these).
        num_unique: u, the number of unique keys.
        offsets: (k*B+1,) int64 bag boundaries (pooled) or None (sequence).
        weights: (n_t,) float32 per-sample weights or None.
        positions: (n_t,) int64 rows of the sequence output (NONE pooling) or None.
        columns: per feature of the table, its first output column (pooled).
        apply_grads: ``apply_grads(grads (u, D))`` updates the table; None when nothing trains.
        dim: D, kept for the backward once ``rows`` is released.
        weight_rows: (u, D) float32 copy of the unique keys' rows as the forward read them, kept
            only when the per-sample weights need a gradient (see :func:`weight_grads`).
    """

    table: int
    rows: Optional[torch.Tensor]
    row_index: torch.Tensor
    inverse: torch.Tensor
    num_unique: int
    offsets: Optional[torch.Tensor]
    weights: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]
    columns: List[int]
    apply_grads: Optional[Callable[[torch.Tensor], None]]
    dim: int = 0
    weight_rows: Optional[torch.Tensor] = None


def pooled_forward(part: TableLookup, mode: int, out: torch.Tensor, batch_size: int) -> None:
    """Pool one table's bags and write each feature's block of columns of ``out`` (B, total_D)."""
    assert part.rows is not None and part.offsets is not None, "pooled part without rows/offsets"
    pooled = lookup_ops.pooled_gather(
        part.rows, part.row_index, part.offsets, part.weights, mode, check=False
    )
    dim = part.rows.size(1)
    for j, col in enumerate(part.columns):
        out[:, col : col + dim] = pooled[j * batch_size : (j + 1) * batch_size]


def bag_grads(part: TableLookup, grad_out: torch.Tensor) -> torch.Tensor:
    """(k*B, D) float32 gradient of each of one table's bags, from the output gradient (B, total_D)."""
    dim = part.dim
    grad_bags = (
        torch.cat([grad_out[:, c : c + dim] for c in part.columns])
        if part.columns
        else (grad_out.new_zeros((0, dim)))
    )
    return grad_bags.float().contiguous()


def pooled_grads(part: TableLookup, mode: int, grad_bags: torch.Tensor) -> torch.Tensor:
    """Gradient per unique key of one table from its bag gradients (see :func:`bag_grads`)."""
    assert part.offsets is not None, "pooled part without offsets"
    return lookup_ops.reduce_grads(
        grad_bags,
        part.inverse,
        part.offsets,
        part.weights,
        mode,
        part.num_unique,
        check=False,
    )


def keep_weight_rows(part: TableLookup) -> None:
    """Copy the rows the forward reads, one per unique key, for :func:`weight_grads`.

    Indices of one key share one row of ``rows``, so scattering ``row_index`` by ``inverse`` picks
    each key's row whichever duplicate wins; u rows are copied, not one per index.
    """
    assert part.rows is not None, "a part's rows are read once, in the forward"
    unique_row = part.row_index.new_empty(part.num_unique)
    unique_row[part.inverse] = part.row_index
    part.weight_rows = part.rows.index_select(0, unique_row).float()


def weight_grads(part: TableLookup, grad_bags: torch.Tensor) -> torch.Tensor:
    """(n_t,) float32 gradient of one table's per-sample weights (SUM pooling).

    ``grad_w[i] = <row(i), grad_bag(bag(i))>``: the rows kept by :func:`keep_weight_rows`, gathered
    by ``inverse``, dotted with the bag gradients (see :func:`bag_grads`) gathered by each index's
    bag. ``output_size`` spares CUDA a host sync in ``repeat_interleave``.
    """
    assert part.weight_rows is not None and part.offsets is not None, "no rows kept for weights"
    n = part.inverse.numel()
    bags = torch.arange(part.offsets.numel() - 1, device=part.offsets.device)
    bag_of_index = torch.repeat_interleave(bags, part.offsets.diff(), output_size=n)
    return (part.weight_rows[part.inverse] * grad_bags[bag_of_index]).sum(1)


def sequence_grads(part: TableLookup, grad_out: torch.Tensor) -> torch.Tensor:
    """Gradient per unique key of one table from the sequence output gradient (N, D)."""
    n = part.inverse.numel()
    bags = torch.arange(n + 1, dtype=torch.int64, device=part.inverse.device)
    grad_rows = grad_out[part.positions].float().contiguous()
    return lookup_ops.reduce_grads(
        grad_rows, part.inverse, bags, None, lookup_ops.POOL_SUM, part.num_unique, check=False
    )


class LookupFunction(torch.autograd.Function):
    """Forward: pooled (B, total_D) or sequence (N, D) output. Backward: fused optimizer step.

    ``weights`` is the module's (N,) ``per_sample_weights`` when it needs a gradient, else None
    (then nothing is kept for it). Each part's ``positions`` must then give its indices' places in
    ``weights``: the backward scatters each table's weight gradient there.
    """

    @staticmethod
    def forward(
        ctx: Any,
        dummy: torch.Tensor,
        weights: Optional[torch.Tensor],
        parts: List[TableLookup],
        mode: Optional[int],
        out_shape: Tuple[int, int],
        batch_size: int,
        num_tables: int,
    ) -> torch.Tensor:
        # Each output element belongs to exactly one table's part; zero-fill only if a table had
        # no index in this batch (its columns / rows are then not written).
        covered = len(parts) == num_tables
        alloc = torch.empty if covered else torch.zeros
        out = alloc(out_shape, dtype=torch.float32, device=dummy.device)
        for part in parts:
            assert part.rows is not None, "a part's rows are read once, in the forward"
            if mode is None:
                if part.row_index.numel():
                    out[part.positions] = part.rows[part.row_index]
            else:
                pooled_forward(part, mode, out, batch_size)
        if weights is not None:
            assert mode == lookup_ops.POOL_SUM, "per-sample weights need SUM pooling"
            for part in parts:
                keep_weight_rows(part)
        for part in parts:
            # The backward needs only the index maps: do not keep a view of a table buffer alive
            # (the table may grow and replace it before the backward runs).
            part.dim = part.rows.size(1) if part.rows is not None else part.dim
            part.rows = None
        ctx.parts = parts
        ctx.mode = mode
        ctx.weights_meta = None if weights is None else (weights.numel(), weights.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        grad_w = None
        if ctx.weights_meta is not None:
            grad_w = grad_out.new_zeros(ctx.weights_meta[0], dtype=torch.float32)
        for part in ctx.parts:
            if grad_w is None and part.apply_grads is None:
                continue  # nothing to learn from this table's part
            grad_bags = bag_grads(part, grad_out) if ctx.mode is not None else None
            if grad_w is not None:
                # Before the step below: it reads the kept rows, never the rows the step updates.
                assert part.positions is not None and grad_bags is not None, "unweighted part"
                grad_w[part.positions] = weight_grads(part, grad_bags)
                part.weight_rows = None
            if part.apply_grads is None:
                continue
            if grad_bags is None:
                grads = sequence_grads(part, grad_out)
            else:
                grads = pooled_grads(part, ctx.mode, grad_bags)
            part.apply_grads(grads)
        ctx.parts = None
        grad_w = None if grad_w is None else grad_w.to(ctx.weights_meta[1])
        return None, grad_w, None, None, None, None, None
