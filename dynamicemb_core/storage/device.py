"""The hash table's TableSpec of a group's table (:func:`table_spec_for`)."""

from __future__ import annotations

from typing import Any, Optional

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.types import StorageTableSpec

__all__ = ["table_spec_for"]


def table_spec_for(
    spec: StorageTableSpec,
    options: Optional[DynamicEmbTableOptions],
    *,
    row_width: Optional[int] = None,
    capacity: Optional[int] = None,
    evicted_item_mode: Optional[EvictedItemMode] = None,
) -> Any:
    """The hash table's TableSpec for one logical table.

    Args:
        spec: the storage-level description (name, row width, dtype, capacity hint).
        options: the table's options (bucket layout, score strategy); None uses TableSpec defaults.
        row_width: override of ``spec.row_width`` (0 for a keys-only table).
        capacity: override of the capacity (a cache's size); else options' / spec's.
        evicted_item_mode: override (intermediate tiers always DISCARD: they spill instead).

    The table never applies ``safe_check_mode`` itself: the lookup does, once, for keys that found
    no home in any tier.
    """
    from dynamicemb_core.table import TableSpec

    kwargs: dict = {
        "name": spec.name,
        "row_width": spec.row_width if row_width is None else row_width,
        "dtype": spec.dtype,
        "safe_check_mode": DynamicEmbCheckMode.IGNORE,
    }
    max_cap = capacity or (options.max_capacity if options is not None else None) or spec.capacity
    if max_cap:
        init_cap = max_cap
        if capacity is None and options is not None and options.init_capacity:
            init_cap = min(options.init_capacity, max_cap)
        kwargs["max_capacity"] = int(max_cap)
        kwargs["init_capacity"] = int(init_cap)
        # a cache's size is its device budget: it never grows past it (NO_EVICTION included)
        kwargs["fixed_capacity"] = capacity is not None
    if options is not None:
        bucket = options.bucket_capacity
        if max_cap and bucket > max_cap:
            bucket = _fit_bucket(int(max_cap))
        kwargs.update(
            bucket_capacity=bucket,
            max_load_factor=options.max_load_factor,
            score_strategy=options.score_strategy,
            evicted_item_mode=options.evicted_item_mode,
        )
        if options.score_function is not None and callable(options.score_function):
            kwargs["score_function"] = options.score_function
    elif max_cap and max_cap < _DEFAULT_BUCKET:
        kwargs["bucket_capacity"] = _fit_bucket(int(max_cap))
        if spec.num_scores == 2:
            kwargs["score_strategy"] = (
                DynamicEmbScoreStrategy.TIMESTAMP,
                DynamicEmbScoreStrategy.LFU,
            )
    elif spec.num_scores == 2:
        # A bare two-score table (no options) keeps both words: the compound strategy.
        kwargs["score_strategy"] = (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)
    if evicted_item_mode is not None:
        kwargs["evicted_item_mode"] = evicted_item_mode
    return TableSpec(**kwargs)


# TableSpec's default bucket width (docs/table_design.md).
_DEFAULT_BUCKET = 128


def _fit_bucket(capacity: int) -> int:
    """Largest multiple of 16 not above ``capacity`` (a small cache still gets whole buckets)."""
    from dynamicemb_core.config import BUCKET_ALIGNMENT

    return max(BUCKET_ALIGNMENT, (capacity // BUCKET_ALIGNMENT) * BUCKET_ALIGNMENT)
