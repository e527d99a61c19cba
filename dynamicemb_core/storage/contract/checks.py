"""Input checks every storage runs before it writes anything.

One source of truth for the storage contracts' argument rules, so the reference dict storage and
the Redis / RocksDB plugins reject bad input with the same messages (table, argument, expected,
found). The multi-table :class:`~dynamicemb_core.types.Storage` uses :func:`check_pairs`,
:func:`check_insert_pairs`, :func:`check_table_ids` and :func:`check_export_ids`; the per-table
:class:`~dynamicemb_core.types.PerTableStorage` (and the core's tiers) :func:`check_find`,
:func:`check_insert`, :func:`check_erase`, :func:`check_table_id`, :func:`check_export`. A
multi-table call's tensors share the keys' device (any device: a storage moves them where it keeps
its data); a per-table call's rows and scores may live on any device.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from dynamicemb_core.types import StorageTableSpec, common_row_dtype

__all__ = [
    "check_erase",
    "check_export_ids",
    "check_insert_pairs",
    "check_pairs",
    "check_table_ids",
    "common_row_dtype",
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


# ---- the multi-table contract -------------------------------------------------------------------


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} of shape {tuple(value.shape)} on {value.device}"
    return type(value).__name__


def check_pairs(
    tables: Sequence[StorageTableSpec], keys: torch.Tensor, table_ids: torch.Tensor
) -> int:
    """Validate a call's ``(keys, table_ids)``; return n.

    Both must be (n,) int64 tensors on one device, every table id in ``[0, len(tables))`` (one
    min/max read back when n > 0).
    """
    for name, value in (("keys", keys), ("table_ids", table_ids)):
        if not (
            isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.dim() == 1
        ):
            raise TypeError(f"{name} must be a 1-D int64 tensor, got {_describe(value)}")
    if table_ids.numel() != keys.numel():
        raise ValueError(
            f"table_ids must name one table per key: {keys.numel()} keys, "
            f"{table_ids.numel()} table ids"
        )
    if table_ids.device != keys.device:
        raise ValueError(
            f"table_ids must be on the keys' device {keys.device}, got {table_ids.device}"
        )
    n = keys.numel()
    if n:
        lo, hi = torch.aminmax(table_ids)
        lo_i, hi_i = int(lo), int(hi)
        if lo_i < 0 or hi_i >= len(tables):
            bad = lo_i if lo_i < 0 else hi_i
            names = [t.name for t in tables]
            raise IndexError(
                f"table_ids holds {bad}, outside [0, {len(tables)}): this storage holds "
                f"{len(tables)} tables {names}"
            )
    return n


def check_insert_pairs(
    tables: Sequence[StorageTableSpec],
    keys: torch.Tensor,
    table_ids: torch.Tensor,
    rows: torch.Tensor,
    scores: torch.Tensor,
) -> int:
    """Validate a multi-table ``insert`` before anything is written; return n.

    ``rows`` must be (n, widest row_width) of the tables' dtype, ``scores`` (n, most
    num_scores) int64, both on the keys' device.
    """
    n = check_pairs(tables, keys, table_ids)
    widest = max(tables, key=lambda spec: spec.row_width)
    most = max(tables, key=lambda spec: spec.num_scores)
    for name, value, dtype, spec, width, width_name in (
        ("rows", rows, common_row_dtype(tables), widest, widest.row_width, "row_width"),
        ("scores", scores, torch.int64, most, most.num_scores, "num_scores"),
    ):
        if not (
            isinstance(value, torch.Tensor)
            and value.dtype == dtype
            and tuple(value.shape) == (n, width)
        ):
            raise ValueError(
                f"{name} must be {dtype} of shape ({n}, {width}) (n keys x the largest "
                f"{width_name}, table {spec.name!r}'s), got {_describe(value)}"
            )
        if value.device != keys.device:
            raise ValueError(
                f"{name} must be on the keys' device {keys.device}, got {value.device}"
            )
    return n


def check_table_ids(
    tables: Sequence[StorageTableSpec], table_ids: Optional[Sequence[int]]
) -> List[int]:
    """The table ids a ``sizes`` / ``export`` call names (None: every table), each checked."""
    if table_ids is None:
        return list(range(len(tables)))
    if isinstance(table_ids, torch.Tensor):
        table_ids = table_ids.tolist()
    ids = list(table_ids)
    for table_id in ids:
        check_table_id(tables, table_id)
    return ids


def check_export_ids(
    tables: Sequence[StorageTableSpec], table_ids: Optional[Sequence[int]], batch_size: int
) -> List[int]:
    """Validate ``export`` arguments (table ids, a positive ``batch_size``); return the ids."""
    ids = check_table_ids(tables, table_ids)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return ids
