"""A table's layout as a delta records it, and the one check that a delta fits a target table.

A slot means the same thing in two tables only if both hash a key to the same bucket (same capacity, hence
the same number of buckets, and the same bucket width) and have the same rows behind the slots. The value
buffer's row count is compared on its own: for NO_EVICTION the key map is larger than the value buffer,
and two buffers of different sizes can share a key-map capacity (a source row past the end of a smaller
target buffer would be a write out of bounds, not a wrong answer).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from dynamicemb_core.checkpoint.errors import IncompatibleDeltaError
from dynamicemb_core.checkpoint.types import TableHandle
from dynamicemb_core.config import DynamicEmbTableOptions

__all__ = ["bucket_capacity", "check_layout", "layout_meta"]


def bucket_capacity(handle: TableHandle) -> int:
    """Slots per bucket of the handle's table as laid out now (a single bucket grows with the table)."""
    return int(handle.table.bucket_capacity(handle.table_id))


def layout_meta(handle: TableHandle) -> Dict[str, Any]:
    """The layout fields of ``DeltaDumpResult.meta`` for one table (everything but score and slots)."""
    return {
        "current_capacity": int(handle.table.capacity(handle.table_id)),
        "row_capacity": handle.row_capacity,
        "bucket_capacity": bucket_capacity(handle),
        "num_scores": int(handle.options.num_scores),
        "world_size": int(handle.world_size),
        "table_options": handle.options,
    }


def _physical_order(options: DynamicEmbTableOptions) -> Tuple[int, ...]:
    # (TIMESTAMP, LFU) and (LFU, TIMESTAMP) share one on-device layout: compare as a sorted tuple.
    return tuple(sorted(int(s) for s in options.score_strategies))


def layout_mismatches(handle: TableHandle, meta: Dict[str, Any]) -> List[str]:
    """Every field on which ``meta`` (from a delta) and the target table disagree, as messages."""
    mine = layout_meta(handle)
    problems = []
    for field in (
        "current_capacity",
        "row_capacity",
        "bucket_capacity",
        "num_scores",
        "world_size",
    ):
        if field not in meta:
            problems.append(f"meta['{field}'] is missing")
        elif int(meta[field]) != mine[field]:
            problems.append(f"{field} expected {mine[field]}, delta has {meta[field]}")
    source = meta.get("table_options")
    if not isinstance(source, DynamicEmbTableOptions):
        problems.append("meta['table_options'] is missing or not a DynamicEmbTableOptions")
        return problems
    if _physical_order(source) != _physical_order(handle.options):
        problems.append(
            f"score_strategy expected {tuple(s.name for s in handle.options.score_strategies)}, "
            f"delta has {tuple(s.name for s in source.score_strategies)}"
        )
    if source.dim is not None and source.dim != handle.dim:
        problems.append(f"dim expected {handle.dim}, delta has {source.dim}")
    if source.dist_type != handle.dist_type:
        problems.append(f"dist_type expected {handle.dist_type!r}, delta has {source.dist_type!r}")
    return problems


def check_layout(handle: TableHandle, meta: Dict[str, Any]) -> None:
    """Raise IncompatibleDeltaError listing every mismatch between a delta's meta and the target."""
    problems = layout_mismatches(handle, meta)
    if problems:
        raise IncompatibleDeltaError(
            f"replay_increment: delta for table '{handle.qualified_name}' does not fit it (nothing was "
            f"written to any table): " + "; ".join(problems)
        )
