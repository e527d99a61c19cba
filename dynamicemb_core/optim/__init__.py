"""Fused optimizers of the dynamic tables: hyper-parameters and row layout.

The updates themselves run in the grouped ops (``lookup_ops.grouped_update`` and
``grouped_reduce_update``)."""

from dynamicemb_core.optim.args import (
    OptimizerArgs,
    OptimizerKind,
    WeightDecayKind,
    optimizer_args_from_kwargs,
    optimizer_args_state,
    optimizer_kind,
)
from dynamicemb_core.optim.layout import initial_state_value, row_width, state_width

__all__ = [
    "OptimizerArgs",
    "OptimizerKind",
    "WeightDecayKind",
    "initial_state_value",
    "optimizer_args_from_kwargs",
    "optimizer_args_state",
    "optimizer_kind",
    "row_width",
    "state_width",
]
