"""Where the optimizer state lives inside a value row: ``[embedding (dim) | state (state_width)]``.

One row per key holds everything the fused update needs, so a key's slot addresses both its
embedding and its state (ARCHITECTURE.md principle 1). Widths here are *logical*: float32 columns.
A half-precision table (``embedding_dtype`` float16 / bfloat16) stores the embedding in that dtype
and the state in float32 in the same row; :func:`stored_width` and :func:`row_bytes` say what such a
row takes (the layout of csrc/include/dynamicemb/grouped.h).
"""

from __future__ import annotations

import torch

from dynamicemb_core.optim.args import OptimizerArgs, OptimizerKind

__all__ = [
    "ROW_DTYPES",
    "initial_state_value",
    "row_bytes",
    "row_width",
    "state_width",
    "stored_width",
]

# Embedding dtypes a row can store; the optimizer state is float32 in every one of them.
ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def state_width(kind: OptimizerKind, dim: int) -> int:
    """Elements of optimizer state per row.

    SGD keeps none; Adagrad one accumulator per element; row-wise Adagrad one per row; Adam two
    moments per element (first ``dim`` = m, next ``dim`` = v).
    """
    if kind is OptimizerKind.SGD:
        return 0
    if kind is OptimizerKind.ADAGRAD:
        return dim
    if kind is OptimizerKind.ROWWISE_ADAGRAD:
        return 1
    if kind is OptimizerKind.ADAM:
        return 2 * dim
    raise ValueError(f"no state layout for optimizer {kind!r}")


def row_width(kind: OptimizerKind, dim: int, training: bool) -> int:
    """Whole stored row: the embedding, plus the state when the table trains."""
    return dim + (state_width(kind, dim) if training else 0)


def initial_state_value(kind: OptimizerKind, args: OptimizerArgs) -> float:
    """Value a new row's state starts at: Adagrad accumulators use initial_accumulator_value; Adam 0."""
    if kind in (OptimizerKind.ADAGRAD, OptimizerKind.ROWWISE_ADAGRAD):
        return float(args.initial_accumulator_value)
    return 0.0


def stored_width(width: int, dim: int, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` one stored row takes whose logical row has ``width`` float32 columns,
    the first ``dim`` the embedding: float32 rows are stored as they are; a 2-byte dtype stores the
    embedding padded to an even count (so the state is 4-byte aligned), then each float32 state
    column as two elements."""
    if dtype == torch.float32:
        return int(width)
    if dtype not in ROW_DTYPES:
        raise ValueError(f"rows store embeddings as one of {list(ROW_DTYPES)}, got {dtype}")
    return (int(dim) + 1) // 2 * 2 + 2 * (int(width) - int(dim))


def row_bytes(width: int, dim: int, dtype: torch.dtype) -> int:
    """Bytes of one stored row (see :func:`stored_width`); what budgets and sizing count."""
    if dtype not in ROW_DTYPES:
        return int(width) * torch.empty((), dtype=dtype).element_size()
    return stored_width(width, dim, dtype) * torch.empty((), dtype=dtype).element_size()
