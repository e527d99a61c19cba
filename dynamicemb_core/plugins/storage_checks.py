"""Input checks every :class:`~dynamicemb_core.types.Storage` runs before it writes anything.

One source of truth for the Storage contract's argument rules, so the reference dict storage and
the Redis / RocksDB plugins reject bad input with the same messages (table, argument, expected,
found). Rows and scores may live on any device; a storage moves them where it keeps its data.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dynamicemb_core.types import StorageTableSpec

__all__ = [
    "check_erase",
    "check_export",
    "check_find",
    "check_insert",
    "check_table_id",
    "check_table_specs",
]


def check_table_specs(owner: str, tables: Sequence[StorageTableSpec]) -> None:
    """Reject an empty table list, duplicate names and non-positive widths.

    Args:
        owner: class name for the message (``"RedisStorage"``).
        tables: the specs a storage is built with.
    """
    if len(tables) == 0:
        raise ValueError(f"{owner}: needs at least one StorageTableSpec, got none")
    seen = set()
    for i, spec in enumerate(tables):
        if not isinstance(spec, StorageTableSpec):
            raise TypeError(
                f"{owner}: tables[{i}] must be a StorageTableSpec, got {type(spec).__name__}"
            )
        if spec.name in seen:
            raise ValueError(
                f"{owner}: table name {spec.name!r} appears twice; names must be unique"
            )
        seen.add(spec.name)
        if spec.row_width <= 0 or spec.dim <= 0 or spec.dim > spec.row_width:
            raise ValueError(
                f"{owner}: table {spec.name!r}: need 0 < dim <= row_width, got dim={spec.dim}, "
                f"row_width={spec.row_width}"
            )
        if spec.num_scores not in (1, 2):
            raise ValueError(
                f"{owner}: table {spec.name!r}: num_scores must be 1 or 2, got {spec.num_scores}"
            )


def check_table_id(tables: Sequence[StorageTableSpec], table_id: int) -> StorageTableSpec:
    """The spec of ``table_id``; IndexError naming the valid range otherwise."""
    if isinstance(table_id, bool) or not isinstance(table_id, int):
        raise TypeError(f"table_id must be an int, got {type(table_id).__name__}")
    if not 0 <= table_id < len(tables):
        names = [t.name for t in tables]
        raise IndexError(
            f"table_id {table_id} out of range: this storage holds {len(tables)} tables {names}"
        )
    return tables[table_id]


def _check_keys(spec: StorageTableSpec, keys: torch.Tensor) -> int:
    if not isinstance(keys, torch.Tensor):
        raise TypeError(
            f"table {spec.name!r}: keys must be a torch.Tensor, got {type(keys).__name__}"
        )
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise TypeError(
            f"table {spec.name!r}: keys must be a 1-D int64 tensor, got {keys.dtype} of shape "
            f"{tuple(keys.shape)}"
        )
    return keys.numel()


def check_find(
    tables: Sequence[StorageTableSpec], table_id: int, keys: torch.Tensor
) -> StorageTableSpec:
    """Validate ``find`` arguments; return the table's spec."""
    spec = check_table_id(tables, table_id)
    _check_keys(spec, keys)
    return spec


check_erase = check_find


def check_insert(
    tables: Sequence[StorageTableSpec],
    table_id: int,
    keys: torch.Tensor,
    rows: torch.Tensor,
    scores: torch.Tensor,
) -> StorageTableSpec:
    """Validate ``insert`` arguments (shapes, dtypes) before anything is written; return the spec."""
    spec = check_table_id(tables, table_id)
    n = _check_keys(spec, keys)
    # One rule for both matrices: (n keys x width) of the dtype the storage keeps.
    for name, value, dtype, dtype_text, width, width_name in (
        ("rows", rows, spec.dtype, str(spec.dtype), spec.row_width, "row_width"),
        ("scores", scores, torch.int64, "int64", spec.num_scores, "num_scores"),
    ):
        if (
            isinstance(value, torch.Tensor)
            and value.dtype == dtype
            and tuple(value.shape) == (n, width)
        ):
            continue
        found = (
            f"{value.dtype} {tuple(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(
            f"table {spec.name!r}: {name} must be {dtype_text} of shape ({n}, {width}) "
            f"(n keys x {width_name}), got {found}"
        )
    return spec


def check_export(
    tables: Sequence[StorageTableSpec], table_id: int, batch_size: int
) -> StorageTableSpec:
    """Validate ``export`` arguments (a positive ``batch_size``); return the table's spec."""
    spec = check_table_id(tables, table_id)
    if batch_size <= 0:
        raise ValueError(f"table {spec.name!r}: batch_size must be positive, got {batch_size}")
    return spec
