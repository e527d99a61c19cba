"""Optimizer choice and hyper-parameters, named as FBGEMM's TBE names them.

The batched module takes ``optimizer`` (an ``fbgemm_gpu`` ``EmbOptimType``) and keyword arguments with
FBGEMM's names (``learning_rate``, ``eps``, ``beta1``, ``beta2``, ``weight_decay``,
``weight_decay_mode``) plus DynamicEmb's ``initial_accumulator_value``. :func:`optimizer_args_from_kwargs`
is the one place they are validated, so TorchRec's ``fused_params`` and direct construction agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Tuple

import torch

from dynamicemb_core.optim.constants import ADAGRAD_DEFAULTS, ADAM_DEFAULTS

__all__ = [
    "OptimizerArgs",
    "OptimizerKind",
    "WeightDecayKind",
    "optimizer_args_from_kwargs",
    "optimizer_args_state",
    "optimizer_kind",
    "output_dtype_from",
    "split_fused_params",
]


class OptimizerKind(enum.Enum):
    """The fused optimizers the dynamic tables implement (FBGEMM's exact variants)."""

    SGD = "exact_sgd"  # w -= lr * g
    ADAGRAD = "exact_adagrad"  # per-element accumulator
    ROWWISE_ADAGRAD = "exact_row_wise_adagrad"  # one accumulator per row: mean of g^2
    ADAM = "adam"  # row-sparse Adam, bias correction by the global step


class WeightDecayKind(enum.IntEnum):
    """FBGEMM's ``WeightDecayMode`` values that row-wise Adagrad honours (same integers)."""

    NONE = 0
    L2 = 1  # g += wd * w before the accumulator
    DECOUPLE = 2  # w *= 1 - lr * wd


# FBGEMM EmbOptimType value -> our kind. FBGEMM's non-exact aliases map to the exact ones, as its
# own CPU path does.
_BY_FBGEMM_VALUE: Dict[str, OptimizerKind] = {
    "exact_sgd": OptimizerKind.SGD,
    "sgd": OptimizerKind.SGD,
    "exact_adagrad": OptimizerKind.ADAGRAD,
    "exact_row_wise_adagrad": OptimizerKind.ROWWISE_ADAGRAD,
    "row_wise_adagrad": OptimizerKind.ROWWISE_ADAGRAD,
    "adam": OptimizerKind.ADAM,
}


def optimizer_kind(optimizer: Any) -> OptimizerKind:
    """Map an FBGEMM ``EmbOptimType`` (or its string value, or an OptimizerKind) to ours.

    Raises:
        ValueError: for an optimizer the dynamic tables keep no state for.
    """
    if isinstance(optimizer, OptimizerKind):
        return optimizer
    value = getattr(optimizer, "value", optimizer)
    kind = _BY_FBGEMM_VALUE.get(str(value).lower())
    if kind is None:
        supported = ", ".join(sorted({k.name for k in OptimizerKind}))
        raise ValueError(
            f"optimizer: dynamic tables support EmbOptimType {{{supported}}} "
            f"(EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD, ADAM), got {optimizer!r}"
        )
    return kind


@dataclass
class OptimizerArgs:
    """Hyper-parameters of the fused optimizer, with FBGEMM's names and defaults.

    Attributes:
        learning_rate: step size; change it between steps with ``set_learning_rate``.
        eps: added to the denominator (Adagrad variants, Adam).
        beta1: Adam first-moment decay.
        beta2: Adam second-moment decay.
        weight_decay: Adam: ``w -= lr * wd * w`` inside the update (FBGEMM's Adam);
            row-wise Adagrad: see ``weight_decay_mode``.
        weight_decay_mode: row-wise Adagrad only, FBGEMM's ``WeightDecayMode`` (NONE, L2, DECOUPLE).
        initial_accumulator_value: value the Adagrad accumulators of a new row start at.
    """

    learning_rate: float = 0.01
    eps: float = ADAGRAD_DEFAULTS["eps"]
    beta1: float = ADAM_DEFAULTS["beta1"]
    beta2: float = ADAM_DEFAULTS["beta2"]
    weight_decay: float = 0.0
    weight_decay_mode: WeightDecayKind = WeightDecayKind.NONE
    initial_accumulator_value: float = 0.0


# FBGEMM parameters whose meaning is settled here rather than by an OptimizerArgs field. Each is either
# exactly what FBGEMM does for the supported configuration, or refused (never dropped silently):
# - gradient_clipping: FBGEMM clips every gradient element to +-max_gradient; not implemented, so
#   True is refused. False (FBGEMM's default) is the update the tables do.
# - max_gradient: read by FBGEMM only with gradient_clipping=True; validated, then unused as there.
# - stochastic_rounding: FBGEMM rounds only fp16/bf16 weights; float32 rows are not rounded.
#   Half-precision rows round their updates stochastically when it is True (the lookup module's
#   stochastic_rounding_seed), to nearest even when it is False or absent.
# - momentum, eta: read only by FBGEMM's LARS/LAMB optimizers, which the tables do not offer.
# - output_dtype: the lookup output's dtype (see :func:`output_dtype_from`), handled by the caller.
_FBGEMM_ONLY_KWARGS = frozenset(
    {"stochastic_rounding", "gradient_clipping", "max_gradient", "momentum", "eta", "output_dtype"}
)


def _check_fbgemm_only(kind: OptimizerKind, name: str, value: Any) -> None:
    if name in ("gradient_clipping", "stochastic_rounding") and not isinstance(value, bool):
        raise ValueError(f"optimizer {kind.name}: {name} must be a bool, got {value!r}")
    if name == "gradient_clipping" and value:
        raise ValueError(
            f"optimizer {kind.name}: gradient_clipping=True is not supported by dynamic tables "
            f"(FBGEMM clips each gradient element to +-max_gradient; this project does not "
            f"implement it); remove it or pass gradient_clipping=False"
        )
    if name == "max_gradient" and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    ):
        raise ValueError(
            f"optimizer {kind.name}: max_gradient must be a positive number, got {value!r}"
        )
    if name == "output_dtype":
        output_dtype_from(value)


_OUTPUT_DTYPES = {
    "FP32": torch.float32,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
}


def output_dtype_from(value: Any) -> torch.dtype:
    """The lookup output dtype FBGEMM's ``output_dtype`` (a ``SparseType``, its name, or a torch dtype)
    asks for: float32, float16 or bfloat16 (computation stays float32; the output is cast).

    Raises:
        ValueError: for any other value (e.g. INT8), naming it.
    """
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        if value in _OUTPUT_DTYPES.values():
            return value
    else:
        name = str(getattr(value, "name", value)).upper()
        if name in _OUTPUT_DTYPES:
            return _OUTPUT_DTYPES[name]
    raise ValueError(
        f"output_dtype: dynamic tables produce FP32, FP16 or BF16 outputs (SparseType or torch "
        f"dtype), got {value!r}"
    )


def split_fused_params(fused_params: Mapping[str, Any]) -> Tuple[Any, Dict[str, Any], torch.dtype]:
    """``(optimizer, optimizer kwargs, output dtype)`` from a TorchRec/FBGEMM ``fused_params`` dict.

    Optimizer hyper-parameters and the FBGEMM-only parameters above go to the optimizer (where
    they are validated or refused); ``output_dtype`` becomes the output dtype. Other keys are
    TorchRec's placement settings for its own TBE (cache sizes, prefetch, bounds checks), which
    do not apply to hash tables.
    """
    optimizer = fused_params.get("optimizer")
    known = {f.name for f in fields(OptimizerArgs)} | (_FBGEMM_ONLY_KWARGS - {"output_dtype"})
    kwargs = {k: v for k, v in fused_params.items() if k in known}
    return optimizer, kwargs, output_dtype_from(fused_params.get("output_dtype"))


def optimizer_args_from_kwargs(optimizer: Any, kwargs: Mapping[str, Any]) -> OptimizerArgs:
    """Build validated :class:`OptimizerArgs` from FBGEMM-named keyword arguments.

    Raises:
        ValueError: unknown name, a negative rate/eps, betas outside [0, 1), or a weight decay the
            chosen optimizer does not apply in FBGEMM.
    """
    kind = optimizer_kind(optimizer)
    known = {f.name for f in fields(OptimizerArgs)}
    values: Dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in _FBGEMM_ONLY_KWARGS:
            _check_fbgemm_only(kind, name, value)
            continue
        if name not in known:
            raise ValueError(
                f"optimizer {kind.name}: unknown hyper-parameter {name!r}; expected one of "
                f"{sorted(known)}"
            )
        values[name] = value
    args = OptimizerArgs(**values)
    args.weight_decay_mode = WeightDecayKind(
        int(getattr(args.weight_decay_mode, "value", args.weight_decay_mode))
    )
    _validate(kind, args)
    return args


def optimizer_args_state(args: OptimizerArgs) -> Dict[str, Any]:
    """The hyper-parameters as plain JSON values, keyed by FBGEMM's names (what a checkpoint keeps).

    :func:`optimizer_args_from_kwargs` turns the result back into validated arguments.
    """
    state: Dict[str, Any] = {}
    for f in fields(OptimizerArgs):
        value = getattr(args, f.name)
        if isinstance(value, enum.Enum):
            value = int(value.value)
        elif not isinstance(value, (bool, int, float)):
            raise TypeError(f"OptimizerArgs.{f.name}: {value!r} has no JSON form")
        state[f.name] = value
    return state


def _validate(kind: OptimizerKind, args: OptimizerArgs) -> None:
    if args.learning_rate < 0:
        raise ValueError(
            f"optimizer {kind.name}: learning_rate must be >= 0, got {args.learning_rate}"
        )
    if args.eps < 0:
        raise ValueError(f"optimizer {kind.name}: eps must be >= 0, got {args.eps}")
    for name in ("beta1", "beta2"):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"optimizer {kind.name}: {name} must be in [0, 1), got {value}")
    if args.initial_accumulator_value < 0:
        raise ValueError(
            f"optimizer {kind.name}: initial_accumulator_value must be >= 0, "
            f"got {args.initial_accumulator_value}"
        )
    decays = args.weight_decay != 0.0
    if kind in (OptimizerKind.SGD, OptimizerKind.ADAGRAD) and decays:
        raise ValueError(
            f"optimizer {kind.name}: FBGEMM applies no weight_decay with this optimizer; "
            f"got weight_decay={args.weight_decay} (use EXACT_ROWWISE_ADAGRAD or ADAM)"
        )
    if (
        kind is OptimizerKind.ROWWISE_ADAGRAD
        and decays
        and args.weight_decay_mode == WeightDecayKind.NONE
    ):
        raise ValueError(
            "optimizer ROWWISE_ADAGRAD: weight_decay is set but weight_decay_mode is NONE; "
            "pass weight_decay_mode=WeightDecayMode.L2 or DECOUPLE"
        )
