"""Fused optimizers of the dynamic tables: hyper-parameters, row layout, in-place row updates."""

from dynamicemb_core.optim.args import (
    OptimizerArgs,
    OptimizerKind,
    WeightDecayKind,
    optimizer_args_from_kwargs,
    optimizer_args_state,
    optimizer_kind,
)
from dynamicemb_core.optim.fused import apply_update
from dynamicemb_core.optim.layout import initial_state_value, row_width, state_width

__all__ = [
    "OptimizerArgs",
    "OptimizerKind",
    "WeightDecayKind",
    "apply_update",
    "initial_state_value",
    "optimizer_args_from_kwargs",
    "optimizer_args_state",
    "optimizer_kind",
    "row_width",
    "state_width",
]
