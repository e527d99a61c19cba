"""Pick and build each table's storage from its options (the one place this choice is made).

- ``external_storage`` set: a device cache (``local_hbm_for_values`` bytes; none when 0) over that
  storage, resolved by name through the plugin registry, or used as given.
- ``caching=True``: a device cache of ``local_hbm_for_values`` bytes over a host table of
  ``max_capacity`` rows; the host table is the last tier and applies ``evicted_item_mode``.
- ``0 < local_hbm_for_values <`` the rows' bytes: a hybrid table (rows split device / host).
- otherwise: the whole table on the device. ``local_hbm_for_values == 0`` means "not budgeted" here
  (a module built without the planner), not "all rows on the host".
"""

from __future__ import annotations

from typing import Optional

import torch

from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.storage import CachedStorage, DeviceStorage, HybridStorage, LookupTier
from dynamicemb_core.types import Storage, StorageTableSpec

__all__ = ["build_tier", "rows_in_budget"]


def rows_in_budget(spec: StorageTableSpec, budget_bytes: int) -> int:
    """How many whole rows of ``spec`` fit in ``budget_bytes``."""
    row_bytes = spec.row_width * torch.empty(0, dtype=spec.dtype).element_size()
    return int(budget_bytes) // max(1, row_bytes)


def _external(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device
) -> tuple:
    """The external storage and the table's id in it."""
    value = options.external_storage
    storage: Optional[Storage]
    if isinstance(value, Storage):
        storage = value
    else:
        from dynamicemb_core.plugins import resolve_storage

        storage = resolve_storage(options, [spec], device)
    if storage is None:
        raise ValueError(f"table {spec.name!r}: external_storage {value!r} resolved to no storage")
    names = [t.name for t in storage.tables]
    if spec.name in names:
        table_id = names.index(spec.name)
    elif len(names) == 1:
        table_id = 0
    else:
        raise ValueError(
            f"table {spec.name!r}: external_storage holds tables {names}, none named {spec.name!r}"
        )
    held = storage.tables[table_id]
    if held.row_width != spec.row_width or held.dtype != spec.dtype:
        raise ValueError(
            f"table {spec.name!r}: external_storage table {held.name!r} stores rows of "
            f"{held.row_width} x {held.dtype}, the lookup needs {spec.row_width} x {spec.dtype} "
            "(embedding dim plus optimizer state)"
        )
    return storage, table_id


def build_tier(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device
) -> LookupTier:
    """The storage of one table, built from its options (see the module docstring)."""
    capacity = int(options.max_capacity or 0)
    hbm = int(options.local_hbm_for_values)
    if options.external_storage is not None:
        backing, table_id = _external(options, spec, device)
        cache_rows = (
            min(rows_in_budget(spec, hbm), capacity) if capacity else rows_in_budget(spec, hbm)
        )
        return CachedStorage(
            [spec], device, backing, [cache_rows], table_options=[options], backing_ids=[table_id]
        )
    if options.caching:
        cache_rows = rows_in_budget(spec, hbm)
        if cache_rows <= 0:
            raise ValueError(
                f"table {spec.name!r}: caching=True needs local_hbm_for_values of at least one row "
                f"({spec.row_width * torch.empty(0, dtype=spec.dtype).element_size()} bytes), "
                f"got {hbm}"
            )
        host = DeviceStorage([spec], torch.device("cpu"), table_options=[options])
        return CachedStorage(
            [spec], device, host, [min(cache_rows, capacity)], table_options=[options]
        )
    if 0 < hbm < capacity * spec.row_width * torch.empty(0, dtype=spec.dtype).element_size():
        return HybridStorage([spec], device, table_options=[options])
    return DeviceStorage([spec], device, table_options=[options])
