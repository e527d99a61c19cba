"""Input checks of the batched module: FBGEMM TBE's (indices, offsets), TorchRec's KJT.

``offsets`` is feature-major, as TorchRec's KeyedJaggedTensor values/offsets: bag ``f * B + b`` is
sample ``b`` of feature ``f``. The module's one pass derives each index's table from them (see
:mod:`dynamicemb_core.lookup.grouped`); this module only validates them.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "OffsetsCheck",
    "check_bag_lengths",
    "check_kjt",
    "check_kjt_shape",
    "validate_batch",
    "validate_inputs",
]


def validate_inputs(
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    num_features: int,
    device: torch.device,
    weights_allowed: bool,
) -> int:
    """Check the batch and return B (samples per feature).

    Raises:
        TypeError: wrong dtype.
        ValueError: wrong device, shape, or offsets that do not describe ``indices``.
    """
    batch, check = validate_batch(
        indices, offsets, per_sample_weights, num_features, device, weights_allowed
    )
    check.verify()
    return batch


def validate_batch(
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    num_features: int,
    device: torch.device,
    weights_allowed: bool,
) -> Tuple[int, "OffsetsCheck"]:
    """:func:`validate_inputs` with the offsets' data check left pending: ``(B, check)``.

    Everything known on the host (types, devices, shapes, weights) is checked now; the offsets'
    values (start, end, order) are checked by ``check.verify()``. The grouped lookup counts
    them in its ``bag_unique`` op and reads them back with the unique's counts, so it spends
    no synchronisation of its own on them; it must write nothing before verifying.

    Raises:
        TypeError, ValueError: as :func:`validate_inputs` (the offsets' values: at ``verify``).
    """
    for name, t in (("indices", indices), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"BatchedDynamicEmbeddingTables: {name} must be a tensor, got {type(t)}"
            )
        if t.dtype != torch.int64:
            raise TypeError(
                f"BatchedDynamicEmbeddingTables: {name} must be int64 on {device}, got {t.dtype} "
                f"on {t.device}"
            )
        if t.device != device:
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: {name} must be on {device}, got {t.device}"
            )
        if t.dim() != 1:
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: {name} must be 1-D, got {tuple(t.shape)}"
            )
    bags = offsets.numel() - 1
    if bags < 0 or bags % num_features != 0:
        raise ValueError(
            f"BatchedDynamicEmbeddingTables: offsets must have F*B+1 elements with F={num_features} "
            f"features, got {offsets.numel()}"
        )
    if per_sample_weights is not None:
        if not weights_allowed:
            raise ValueError(
                "BatchedDynamicEmbeddingTables: per_sample_weights are only supported with "
                "DynamicEmbPoolingMode.SUM"
            )
        if per_sample_weights.shape != indices.shape or not per_sample_weights.is_floating_point():
            raise ValueError(
                "BatchedDynamicEmbeddingTables: per_sample_weights must be a float tensor shaped like "
                f"indices {tuple(indices.shape)}, got {per_sample_weights.dtype} "
                f"{tuple(per_sample_weights.shape)}"
            )
        if per_sample_weights.device != device:
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: per_sample_weights must be on {device}, got "
                f"{per_sample_weights.device}"
            )
    check = OffsetsCheck(offsets, indices.numel(), num_features)
    return bags // num_features, check


class OffsetsCheck:
    """The offsets' data check of one batch: they start at 0, end at ``n`` and never decrease.

    The three numbers it needs (first, last, decreasing bags) are counted on the offsets' device
    by the grouped step's ``bag_unique`` op and come back in the unique's readback
    (:meth:`give`), so the check costs no synchronisation of its own. A check verified with
    nothing given computes its numbers itself.
    """

    def __init__(self, offsets: torch.Tensor, n: int, num_features: int) -> None:
        self.offsets, self.n, self.num_features = offsets, n, num_features
        self._given: Optional[List[int]] = None  # the numbers as host ints (give)
        self._done = False

    def give(self, numbers: Sequence[int]) -> None:
        """The batch's three numbers ``[offsets[0], offsets[-1], decreasing bags]`` as host
        ints, read back by the caller with its own readback (the grouped lookup: with the
        unique's counts)."""
        if self._done:
            return
        self._given = [int(x) for x in numbers]

    def _own_numbers(self) -> List[int]:
        offsets = self.offsets
        decreasing = (offsets[1:] < offsets[:-1]).sum()
        return torch.stack([offsets[0], offsets[-1], decreasing]).tolist()

    def verify(self) -> None:
        """Raise ValueError when the offsets do not describe the batch (once; later calls return).

        Raises:
            ValueError: offsets not starting at 0, not ending at n, or decreasing (naming the
                first decreasing bag).
        """
        if self._done:
            return
        first, last, num_decreasing = (
            self._given if self._given is not None else self._own_numbers()
        )
        self._done = True
        offsets, n = self.offsets, self.n
        if first != 0 or last != n:
            raise ValueError(
                "BatchedDynamicEmbeddingTables: offsets must start at 0 and end at len(indices)="
                f"{n}, got first={first}, last={last}"
            )
        if num_decreasing:
            b = int((offsets[1:] < offsets[:-1]).nonzero()[0])
            bags = offsets.numel() - 1
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: offsets must be non-decreasing, got offsets[{b}]="
                f"{int(offsets[b])} > offsets[{b + 1}]={int(offsets[b + 1])} "
                f"({_bag_name(b, bags // self.num_features, None)})"
            )


def _bag_name(bag: int, batch: int, names: Optional[Sequence[str]]) -> str:
    """``feature 'name' sample s`` of flat bag ``bag`` (feature-major, ``batch`` bags each)."""
    f, b = (bag // batch, bag % batch) if batch > 0 else (0, bag)
    label = repr(names[f]) if names is not None and f < len(names) else str(f)
    return f"feature {label} sample {b}"


def check_bag_lengths(
    lengths: torch.Tensor,
    num_values: int,
    batch: int,
    where: str,
    names: Optional[Sequence[str]] = None,
) -> None:
    """Bag lengths (feature-major, ``batch`` bags per feature) must be >= 0 and sum to
    ``num_values``; otherwise raise ``ValueError`` naming the first bad feature (one readback).
    """
    lengths = lengths.reshape(-1)
    if lengths.numel() == 0:
        if num_values:
            raise ValueError(f"{where}: no bags but {num_values} values")
        return
    low, total = torch.stack([lengths.min(), lengths.sum()]).tolist()
    if low < 0:
        bag = int((lengths < 0).nonzero()[0])
        raise ValueError(
            f"{where}: {_bag_name(bag, batch, names)} has length {int(lengths[bag])}; lengths "
            "must be >= 0 (offsets must not decrease)"
        )
    if total != num_values:
        per = lengths.reshape(-1, batch).sum(dim=1).tolist() if batch > 0 else [total]
        detail = ", ".join(
            f"{names[f]!r}: {n}" if names is not None and f < len(names) else f"{f}: {n}"
            for f, n in enumerate(per)
        )
        raise ValueError(
            f"{where}: lengths sum to {total} but there are {num_values} values (values per "
            f"feature from lengths: {detail})"
        )


def check_kjt_shape(kjt: Any, where: str) -> None:
    """A KeyedJaggedTensor's lengths must hold one entry per (feature, sample): ``len(keys) *
    stride`` of them (with variable strides, the sum of the features' strides).

    Shapes only (no readback, free on the GPU path): called where a KJT enters a lookup, before
    TorchRec's own code reshapes the lengths (which fails with a bare ``shape '[F, B]' is invalid``).

    Raises:
        ValueError: naming the features, the batch size and the number of lengths.
    """
    names = list(kjt.keys())
    lengths = kjt.lengths()
    got = lengths.numel()
    if kjt.variable_stride_per_key():
        strides = list(kjt.stride_per_key())
        if len(strides) != len(names) or sum(strides) != got:
            raise ValueError(
                f"{where}: KeyedJaggedTensor has {got} lengths, but its {len(names)} features "
                f"{names} with per-feature batch sizes {strides} need {sum(strides)} (one length "
                "per feature and sample)"
            )
        return
    stride = int(kjt.stride())
    want = len(names) * stride
    if got != want:
        raise ValueError(
            f"{where}: KeyedJaggedTensor has {got} lengths, but its {len(names)} features "
            f"{names} x batch size {stride} need {want} (one length per feature and sample; "
            "build the KJT with lengths laid out feature after feature, or pass stride=)"
        )


def check_kjt(kjt: Any, where: str) -> None:
    """A KeyedJaggedTensor of ids: integer values, lengths that describe them, per feature.

    TorchRec's own tables refuse float ids; casting them would silently look up other keys. Checked
    with one readback, before anything is routed or written.

    Raises:
        TypeError: values are not int64 / int32.
        ValueError: lengths that are not one per feature and sample (:func:`check_kjt_shape`),
            negative lengths (decreasing offsets) or lengths not summing to the values, naming
            the first bad feature.
    """
    check_kjt_shape(kjt, where)
    values = kjt.values()
    names = list(kjt.keys())
    if values.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{where}: KeyedJaggedTensor values must be integer ids (int64 or int32), got "
            f"{values.dtype} for features {names}; build the KJT from integer ids (a cast of "
            "float ids would look up other keys)"
        )
    batch = kjt.stride() if not kjt.variable_stride_per_key() else 0
    check_bag_lengths(kjt.lengths(), values.numel(), batch, where, names)
    weights = kjt.weights_or_none()
    if weights is not None and weights.numel() != values.numel():
        raise ValueError(
            f"{where}: KeyedJaggedTensor has {weights.numel()} weights for {values.numel()} values"
        )
