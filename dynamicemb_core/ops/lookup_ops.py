"""Typed wrappers over the lookup ops (``torch.ops.dynamicemb.*``, "lookup" section of csrc/ops.cpp).

Each wrapper documents shapes, dtypes and devices and calls the registered op. The ops are:

- ``unique``: per-table key deduplication (unique keys, inverse, counts).
- ``pooled_gather``: bags of unique embeddings -> pooled rows (SUM/MEAN; the serving path's).
- the grouped ops (``segmented_unique``, ``bag_unique``, ``grouped_*``): the training step's dedup,
  gather, pooling, gradient reduction and fused optimizer updates for all tables of a group in one
  call, rows addressed by ``(table id, slot)`` in one flat buffer described by a (T, 4) ``meta``.

``check`` (keyword-only, all but ``unique``): True, the default, checks the data before writing
(offsets start at 0, end at n and never decrease; inverse in [0, u); slots below capacity) and
raises. On CUDA that costs a device synchronisation per call, so the batched module, whose offsets
are validated once per batch and whose inverse and slots come from its own unique op and table,
passes False. The input must then be valid: the update kernels still skip out-of-range slots, the
bag kernels do not bound inverse or offsets. CPU kernels always check (it costs them no sync).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch

__all__ = [
    "OPTIMIZER_CODES",
    "POOL_MEAN",
    "POOL_NONE",
    "POOL_SUM",
    "bag_unique",
    "grouped_gather",
    "grouped_init_rows",
    "initial_rows",
    "grouped_pooled_gather",
    "grouped_reduce_grads",
    "grouped_reduce_update",
    "grouped_scatter",
    "grouped_update",
    "placement_counts",
    "pooled_gather",
    "segmented_unique",
    "segmented_unique_ordered",
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


# ---- grouped value ops (one call for all tables of a group; csrc/include/dynamicemb/grouped.h) ----

# Pooling code of the grouped reduction for a sequence output (one gradient row per index).
POOL_NONE = 2

# grouped_update's optimizer codes, by OptimizerKind value.
OPTIMIZER_CODES = {
    "exact_sgd": 0,
    "exact_adagrad": 1,
    "exact_row_wise_adagrad": 2,
    "adam": 3,
}


def segmented_unique(
    keys: torch.Tensor, table_ids: torch.Tensor, num_tables: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deduplicate ``(table id, key)`` pairs of all tables at once.

    Args:
        keys, table_ids: (n,) int64 on one device; ids in ``[0, num_tables)``.

    Returns:
        ``(unique_keys (u,), unique_table_ids (u,), inverse (n,), counts (u,), table_counts (T,))``:
        int64; the first four on ``keys.device`` with ``unique_keys[inverse] == keys`` and
        ``unique_table_ids[inverse] == table_ids``; ``table_counts`` (unique keys per table) on the
        CPU, read back with u in one copy (one device sync on CUDA for the whole batch). Order:
        first occurrence on CPU; on CUDA, by one 64-bit sort word per pair (the key XOR the table id
        times an odd constant), or by (table id, key) in the rare batch where two pairs share a word.
        Deterministic on both.
    """
    return _ops().segmented_unique.default(keys, table_ids, num_tables, False)[:5]


def segmented_unique_ordered(
    keys: torch.Tensor, table_ids: torch.Tensor, num_tables: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`segmented_unique` and ``order`` (n,) int64: the positions grouped by unique pair
    (pair 0's first), each pair's in input order, i.e. ``argsort(inverse, stable=True)``.

    The backward's reduction needs exactly this grouping; on CUDA the dedup's sort already made it
    (no extra work), and :func:`grouped_reduce_update` given ``order`` and the counts skips its own
    sort of the inverse. On CPU it costs one counting pass.
    """
    return _ops().segmented_unique.default(keys, table_ids, num_tables, True)


def bag_unique(
    keys: torch.Tensor,
    offsets: torch.Tensor,
    feature_tables: torch.Tensor,
    batch_size: int,
    num_tables: int,
    ordered: bool = False,
) -> Tuple[torch.Tensor, ...]:
    """:func:`segmented_unique` (``ordered``: :func:`segmented_unique_ordered`) of a feature-major
    batch, each key's table taken from the batch in the same op (no table-id tensor of the
    caller's, one launch on CUDA before the sort).

    Index ``i`` of feature ``f``'s bags ``[offsets[f*B], offsets[(f+1)*B])`` belongs to table
    ``feature_tables[f]``. ``offsets`` (F*B+1,) are not trusted to be valid (every id is one of
    ``feature_tables`` whatever they hold); the fifth output, (T + 3,) on the CPU, is the per-table
    counts and then ``[offsets[0], offsets[-1], number of bags whose end is below their start]``,
    read back in the unique's one copy: the numbers
    :class:`~dynamicemb_core.lookup.features.OffsetsCheck` needs, at no synchronisation of their own.
    """
    out = _ops().bag_unique.default(keys, offsets, feature_tables, batch_size, num_tables, ordered)
    return out if ordered else out[:5]


def placement_counts(
    table_ids: torch.Tensor, slots: torch.Tensor, is_new: torch.Tensor, sizes: torch.Tensor
) -> torch.Tensor:
    """(T, 3) int64 on the ids' device, T = ``sizes.numel()``: per table, the keys a placing call
    stored new (``is_new & slot >= 0``), the keys it left unplaced (``slot < 0``) and
    ``sizes[t]`` (the hash table's sizes after the call): a placing call's whole outcome in one
    tensor, one launch, for one copy to the host. Counted per block in shared memory on CUDA, so
    a few tables' counters take no hot global atomics."""
    return _ops().placement_counts.default(table_ids, slots, is_new, sizes)


def grouped_gather(
    values: torch.Tensor,
    meta: torch.Tensor,
    table_ids: torch.Tensor,
    slots: torch.Tensor,
    width: int,
    *,
    check: bool = True,
    inverse: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(n, width) float32: row ``(table_ids[i], slots[i])``'s first ``min(width, row_width)``
    elements, zeros after them and for slots < 0. With ``inverse`` (m,): (m, width), row ``i``
    the one of pair ``inverse[i]`` (``table_ids``/``slots`` are per unique pair): what
    ``grouped_gather(values, meta, table_ids[inverse], slots[inverse], width)`` gives, without
    expanding the ids first."""
    return _ops().grouped_gather.default(values, meta, table_ids, slots, width, check, inverse)


def grouped_init_rows(
    values: torch.Tensor,
    meta: torch.Tensor,
    table_ids: torch.Tensor,
    slots: torch.Tensor,
    keys: torch.Tensor,
    init: torch.Tensor,
    seed: int,
    *,
    check: bool = True,
    only: Optional[torch.Tensor] = None,
) -> None:
    """In place: new rows at ``(table_ids[i], slots[i])`` (slot -1 skipped), one launch; with
    ``only`` (n,) bool, only the pairs where it is true (an insert's ``is_new``, no mask op first).

    Row ``i``'s embedding is its table's initializer (``init`` (T, 8) float64 on the values'
    device, :func:`dynamicemb_core.lookup.initializers.initializer_table`'s layout) drawn from a
    counter-based random stream of ``(seed, table id, keys[i], element)``: the same values on CPU
    and CUDA, at any slot and in any batch; its optimizer-state columns get ``init[t, 7]``.
    """
    _ops().grouped_init_rows.default(values, meta, table_ids, slots, keys, init, seed, check, only)


def initial_rows(
    init: torch.Tensor,
    keys: torch.Tensor,
    table_ids: torch.Tensor,
    width: int,
    dims: Sequence[int],
    seed: int,
) -> torch.Tensor:
    """(n, width) float32 new rows of ``keys`` of tables ``table_ids`` (int64 on ``keys.device``):
    table ``t``'s first ``dims[t]`` columns its initializer's (``init``, as for
    :func:`grouped_init_rows`), the others the state value. The values grouped_init_rows writes
    into a group's rows in place, written here into a fresh buffer (one launch). It lives beside
    the op because both the storage and the lookup layers need it."""
    n = keys.numel()
    out = torch.zeros(n * width, dtype=torch.float32, device=keys.device)
    if n == 0:
        return out.view(0, width)
    meta = torch.tensor([[0, width, n, int(d)] for d in dims], dtype=torch.int64)
    slots = torch.arange(n, device=keys.device)
    grouped_init_rows(out, meta.to(keys.device), table_ids, slots, keys, init, seed, check=False)
    return out.view(n, width)


def grouped_scatter(
    values: torch.Tensor,
    meta: torch.Tensor,
    table_ids: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    *,
    check: bool = True,
) -> None:
    """In place: write ``rows[i, :row_width(t)]`` at ``(table_ids[i], slots[i])`` (slot < 0 skipped)."""
    _ops().grouped_scatter.default(values, meta, table_ids, slots, rows, check)


def grouped_pooled_gather(
    values: torch.Tensor,
    meta: torch.Tensor,
    slots: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    feature_tables: torch.Tensor,
    d_offsets: torch.Tensor,
    mode: int,
    batch_size: int,
    total_dim: int,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Pool every feature's bags from the group's rows into one (B, total_dim) float32 output.

    Args:
        values, meta: the group (see module docs of csrc/include/dynamicemb/grouped.h).
        slots: (u,) int64 slot of each unique key (in its table; < 0 reads as zeros).
        inverse: (n,) int64 unique key of each index.
        offsets: (F*B+1,) int64 feature-major bag boundaries.
        weights: optional (n,) float32 per-sample weights.
        feature_tables: (F,) int64 table of each feature; d_offsets: (F+1,) int64 first output
            column of each feature (steps by the feature's table dim); total_dim = d_offsets[-1].
        mode: POOL_SUM or POOL_MEAN.
    """
    return _ops().grouped_pooled_gather.default(
        values,
        meta,
        slots,
        inverse,
        offsets,
        weights,
        feature_tables,
        d_offsets,
        mode,
        batch_size,
        total_dim,
        check,
    )


def grouped_reduce_grads(
    grad_out: torch.Tensor,
    meta: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    feature_tables: torch.Tensor,
    d_offsets: torch.Tensor,
    mode: int,
    batch_size: int,
    num_unique: int,
    width: int,
    *,
    check: bool = True,
) -> torch.Tensor:
    """(num_unique, width) float32 gradient per unique key, zero beyond its table's dim.

    The adjoint of :func:`grouped_pooled_gather` for POOL_SUM / POOL_MEAN (``grad_out`` (B,
    total_dim)); with POOL_NONE, ``grad_out`` is the (n, D) sequence gradient and index ``i``
    contributes its own row ``i``.
    """
    return _ops().grouped_reduce_grads.default(
        grad_out,
        meta,
        inverse,
        offsets,
        weights,
        feature_tables,
        d_offsets,
        mode,
        batch_size,
        num_unique,
        width,
        check,
    )


def grouped_update(
    values: torch.Tensor,
    meta: torch.Tensor,
    table_ids: torch.Tensor,
    slots: torch.Tensor,
    grads: torch.Tensor,
    optimizer: int,
    lr: float,
    eps: float = 0.0,
    beta1: float = 0.0,
    beta2: float = 0.0,
    weight_decay: float = 0.0,
    weight_decay_mode: int = 0,
    step: int = 1,
    rounding_seed: int = -1,
    *,
    check: bool = True,
    keys: Optional[torch.Tensor] = None,
) -> None:
    """In place: the optimizer (OPTIMIZER_CODES) on the rows at ``(table_ids, slots)`` with
    ``grads`` (n, >= dim); slots < 0 skipped. The formulas are FBGEMM's exact optimizers
    (csrc/include/dynamicemb/grouped.h defines them once for both backends):

    - EXACT_SGD: ``w -= lr * g``
    - EXACT_ADAGRAD: ``m += g^2; w -= lr * g / (sqrt(m) + eps)``
    - EXACT_ROWWISE_ADAGRAD: ``g' = g + wd*w`` (L2 only); ``m += mean(g'^2)``;
      ``mult = lr / (sqrt(m) + eps)``; ``w = c * w - mult * g`` with ``c = 1 - mult*wd`` (L2),
      ``1 - lr*wd`` (DECOUPLE) or 1.
    - ADAM: ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2``;
      ``w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * w)``, ``t`` the global step.

    ``rounding_seed`` >= 0: half-precision rows round their new embeddings stochastically, from a
    hash of (seed, step, table, key, element), with ``keys`` (n,) the rows' keys (required then);
    < 0: to nearest even (float32 rows: never rounded). The key, not the slot, picks the random
    bits: a key rounds the same wherever the table placed it (engine, capacity, insertion order)."""
    _ops().grouped_update.default(
        values,
        meta,
        table_ids,
        slots,
        grads,
        optimizer,
        lr,
        eps,
        beta1,
        beta2,
        weight_decay,
        weight_decay_mode,
        step,
        check,
        rounding_seed,
        keys,
    )


def grouped_reduce_update(
    values: torch.Tensor,
    meta: torch.Tensor,
    table_ids: torch.Tensor,
    slots: torch.Tensor,
    grad_out: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    feature_tables: torch.Tensor,
    d_offsets: torch.Tensor,
    mode: int,
    batch_size: int,
    max_dim: int,
    optimizer: int,
    lr: float,
    eps: float = 0.0,
    beta1: float = 0.0,
    beta2: float = 0.0,
    weight_decay: float = 0.0,
    weight_decay_mode: int = 0,
    step: int = 1,
    rounding_seed: int = -1,
    *,
    check: bool = True,
    order: Optional[torch.Tensor] = None,
    key_counts: Optional[torch.Tensor] = None,
    keys: Optional[torch.Tensor] = None,
) -> None:
    """:func:`grouped_reduce_grads` then :func:`grouped_update` on the unique keys in one op (the
    training backward): the CPU kernel applies each key's sum as soon as it is formed. ``max_dim``:
    the group's widest embedding dim (the width of the reduction on CUDA). ``order`` and
    ``key_counts`` (from :func:`segmented_unique_ordered`; ``order`` needs ``key_counts``): the
    positions grouped by key, so the CUDA kernels skip their sort of ``inverse``; ``key_counts``
    alone (:func:`segmented_unique`'s counts) spares the CPU kernel its counting pass for a
    one-table group. The rows come out the same without them.
    ``rounding_seed`` and ``keys`` (u,): as :func:`grouped_update`'s."""
    _ops().grouped_reduce_update.default(
        values,
        meta,
        table_ids,
        slots,
        grad_out,
        inverse,
        offsets,
        weights,
        feature_tables,
        d_offsets,
        mode,
        batch_size,
        max_dim,
        optimizer,
        lr,
        eps,
        beta1,
        beta2,
        weight_decay,
        weight_decay_mode,
        step,
        check,
        order,
        key_counts,
        rounding_seed,
        keys,
    )
