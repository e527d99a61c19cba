"""Where the optimizer state lives inside a value row: ``[embedding (dim) | state (state_width)]``.

One row per key holds everything the fused update needs, so a key's slot addresses both its
embedding and its state (ARCHITECTURE.md principle 1).
"""

from __future__ import annotations

from dynamicemb_core.optim.args import OptimizerArgs, OptimizerKind

__all__ = ["initial_state_value", "row_width", "state_width"]


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
