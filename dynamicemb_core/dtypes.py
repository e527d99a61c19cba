"""Data-type names and converters with the seed API's names (``data_type_to_dtype`` and friends).

``DynamicEmbDataType`` names the element types a table's keys, values and scores can have; NVIDIA's
DynamicEmb takes it from its C++ extension, here it is a plain Python enum. The converters map between
it, TorchRec's ``DataType`` and ``torch.dtype``; each raises ValueError naming a value it cannot map.
"""

from __future__ import annotations

import enum
from typing import Any, Dict

import torch

__all__ = [
    "DynamicEmbDataType",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "dtype_to_bytes",
    "dyn_emb_to_torch",
    "torch_to_dyn_emb",
]


class DynamicEmbDataType(enum.Enum):
    """Element types of keys, values and scores."""

    Float32 = "float32"
    BFloat16 = "bfloat16"
    Float16 = "float16"
    Int64 = "int64"
    UInt64 = "uint64"
    Int32 = "int32"
    UInt32 = "uint32"
    Int8 = "int8"
    UInt8 = "uint8"
    Size_t = "size_t"  # an unsigned machine word; stored as int64 by torch


_TORCH: Dict[DynamicEmbDataType, torch.dtype] = {
    DynamicEmbDataType.Float32: torch.float32,
    DynamicEmbDataType.BFloat16: torch.bfloat16,
    DynamicEmbDataType.Float16: torch.float16,
    DynamicEmbDataType.Int64: torch.int64,
    DynamicEmbDataType.UInt64: torch.uint64,
    DynamicEmbDataType.Int32: torch.int32,
    DynamicEmbDataType.UInt32: torch.uint32,
    DynamicEmbDataType.Int8: torch.int8,
    DynamicEmbDataType.UInt8: torch.uint8,
    DynamicEmbDataType.Size_t: torch.int64,
}
# TorchRec DataType names that have a table element type
_FROM_DATA_TYPE: Dict[str, DynamicEmbDataType] = {
    "FP32": DynamicEmbDataType.Float32,
    "FP16": DynamicEmbDataType.Float16,
    "BF16": DynamicEmbDataType.BFloat16,
    "INT64": DynamicEmbDataType.Int64,
    "INT32": DynamicEmbDataType.Int32,
    "INT8": DynamicEmbDataType.Int8,
    "UINT8": DynamicEmbDataType.UInt8,
}


def dyn_emb_to_torch(data_type: DynamicEmbDataType) -> torch.dtype:
    """The torch dtype of a :class:`DynamicEmbDataType` (``Size_t`` -> int64)."""
    if not isinstance(data_type, DynamicEmbDataType):
        raise ValueError(f"dyn_emb_to_torch: expected a DynamicEmbDataType, got {data_type!r}")
    return _TORCH[data_type]


def torch_to_dyn_emb(dtype: torch.dtype) -> DynamicEmbDataType:
    """The :class:`DynamicEmbDataType` of a torch dtype (int64 -> ``Int64``)."""
    for member, torch_dtype in _TORCH.items():
        if torch_dtype == dtype and member is not DynamicEmbDataType.Size_t:
            return member
    raise ValueError(f"torch_to_dyn_emb: no DynamicEmbDataType for {dtype!r}")


def _data_type_name(data_type: Any) -> str:
    return str(getattr(data_type, "name", data_type)).upper()


def data_type_to_dyn_emb(data_type: Any) -> DynamicEmbDataType:
    """The :class:`DynamicEmbDataType` of a TorchRec ``DataType``."""
    member = _FROM_DATA_TYPE.get(_data_type_name(data_type))
    if member is None:
        raise ValueError(f"DataType {data_type!r} cannot be converted to DynamicEmbDataType")
    return member


def data_type_to_dtype(data_type: Any) -> torch.dtype:
    """The torch dtype of a TorchRec ``DataType``."""
    try:
        return _TORCH[data_type_to_dyn_emb(data_type)]
    except ValueError:
        raise ValueError(f"DataType {data_type!r} cannot be converted to torch.dtype") from None


def dtype_to_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of a torch dtype."""
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype_to_bytes: expected a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()
