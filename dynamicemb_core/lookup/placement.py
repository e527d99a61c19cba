"""Pick each table's storage kind from its options (the one place this choice is made).

- ``external_storage`` set: a device cache (``local_hbm_for_values`` bytes; none when 0) over that
  storage, resolved by name through the plugin registry, or used as given.
- ``caching=True``: a device cache of ``local_hbm_for_values`` bytes over a host table of
  ``max_capacity`` rows; the host table is the last tier and applies ``evicted_item_mode``.
- ``local_hbm_for_values`` below the rows' bytes: a hybrid table (rows split device / host). The
  seed's default budget, 0, means no rows in device memory: every value row in host memory.
- otherwise (the budget holds every row): the whole table on the device.

Every table lives in the lookup module's one group (``storage/grouped.py``): :func:`table_place`
gives its device rows (hybrid) or cache rows (cached), :func:`cached_backings` the backing store of
each cached table (one host table for all ``caching=True`` tables of the module).

A nonzero budget (for the cache, or the hybrid table's device part) smaller than one bucket of rows
is rounded up to one bucket with a warning, as the seed does. On a CPU table device memory is host
memory, so a zero budget there builds a plain CPU table (a nonzero one still splits the rows, which
is how the hybrid path is exercised without a GPU).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.optim.layout import ROW_DTYPES, row_bytes
from dynamicemb_core.types import DynamicEmbWarning, PerTableStorage, Storage, StorageTableSpec

__all__ = [
    "TablePlace",
    "device_split",
    "warn_zero_budget",
    "zero_budget_message",
    "cached_backings",
    "check_row_dtypes",
    "device_budget_bytes",
    "rows_in_budget",
    "table_place",
    "tier_kind",
]


def rows_in_budget(spec: StorageTableSpec, budget_bytes: int) -> int:
    """How many whole rows of ``spec`` fit in ``budget_bytes``."""
    return int(budget_bytes) // max(1, _row_bytes(spec))


def _row_bytes(spec: StorageTableSpec) -> int:
    """Bytes of one stored row (half-precision embeddings beside float32 state: optim/layout.py)."""
    return row_bytes(spec.row_width, spec.dim, spec.dtype)


def check_row_dtypes(
    names: Sequence[str],
    specs: Sequence[StorageTableSpec],
    kinds: Sequence[str],
) -> None:
    """Raise unless every table's row dtype is one its storage kind stores.

    Half-precision tables (``embedding_dtype`` float16 / bfloat16) are device or hybrid tables;
    cached tables and external storages keep float32 rows, and the tables of one module (one group,
    one value buffer) share one dtype (TorchRec groups tables by ``data_type`` too).
    """
    for name, spec, kind in zip(names, specs, kinds):
        if spec.dtype not in ROW_DTYPES:
            raise ValueError(
                f"table {name!r}: embedding_dtype must be one of {list(ROW_DTYPES)}, got {spec.dtype}"
            )
        if spec.dtype != torch.float32 and kind not in ("device", "hybrid"):
            raise ValueError(
                f"table {name!r}: embedding_dtype {spec.dtype} is supported for device and hybrid "
                "tables only; a cached table (caching=True) or an external_storage keeps float32 "
                "rows: leave embedding_dtype unset (or float32) for it"
            )
    dtypes = {spec.dtype for spec in specs}
    if len(dtypes) > 1:
        found = {n: s.dtype for n, s in zip(names, specs)}
        raise ValueError(
            "BatchedDynamicEmbeddingTables: the tables of one module share one embedding_dtype "
            f"(their rows live in one buffer), got {found}; put tables of another dtype in "
            "another module"
        )


def device_budget_bytes(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, *, at_least_one_bucket: bool = False
) -> int:
    """``local_hbm_for_values``, rounded up to one bucket of rows (with a warning) when below it.

    A zero budget stays zero (no rows in device memory) unless ``at_least_one_bucket`` (a cache,
    which cannot be empty). One bucket is ``bucket_capacity`` rows, at most the table's
    ``max_capacity`` (``MAX_BUCKET_CAPACITY``: the whole shard).
    """
    hbm = int(options.local_hbm_for_values)
    capacity = int(options.max_capacity or 0)
    bucket = int(options.bucket_capacity)
    if capacity and (bucket == MAX_BUCKET_CAPACITY or bucket > capacity):
        bucket = capacity
    one_bucket = bucket * _row_bytes(spec)
    if hbm < one_bucket and (hbm > 0 or at_least_one_bucket):
        warnings.warn(
            f"table {spec.name!r}: local_hbm_for_values={hbm} bytes is less than one bucket "
            f"({bucket} rows x {_row_bytes(spec)} bytes = {one_bucket} bytes); rounded up to one "
            f"bucket",
            UserWarning,
            stacklevel=3,
        )
        return one_bucket
    return hbm


def _external(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device
) -> tuple:
    """The external storage and the table's id in it."""
    value = options.external_storage
    storage: Optional[Storage | PerTableStorage]
    if isinstance(value, (Storage, PerTableStorage)):
        storage = value  # the cache reaches a per-table one through the adapter
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


def tier_kind(options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device) -> str:
    """Which kind of table of the group: ``"cached"``, ``"hybrid"`` or ``"device"``.

    The rule of the module docstring, kept apart from the building so that it can be checked for
    any device without allocating.
    """
    if options.external_storage is not None or options.caching:
        return "cached"
    capacity = int(options.max_capacity or 0)
    if not capacity or (device.type == "cpu" and int(options.local_hbm_for_values) == 0):
        return "device"  # unsized table; or a CPU table, whose "device" memory is host memory
    if device_budget_bytes(options, spec) < capacity * _row_bytes(spec):
        return "hybrid"
    return "device"


@dataclass
class TablePlace:
    """Where a table's rows live in the group.

    Attributes:
        device_rows: a hybrid table's rows in device memory (None: all of them).
        cache_rows: a cached table's cache rows (0: no cache; None: not a cached table).
    """

    device_rows: Optional[int] = None
    cache_rows: Optional[int] = None


def table_place(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, kind: str, device: torch.device
) -> TablePlace:
    """The :class:`TablePlace` of a table of :func:`tier_kind` ``kind``."""
    capacity = int(options.max_capacity or 0)
    if kind == "hybrid":
        return TablePlace(device_rows=rows_in_budget(spec, device_budget_bytes(options, spec)))
    if kind != "cached":
        return TablePlace()
    if options.external_storage is not None:
        hbm = int(options.local_hbm_for_values)  # 0: no cache in front of the external storage
    else:
        hbm = device_budget_bytes(options, spec, at_least_one_bucket=True)
    rows = rows_in_budget(spec, hbm)
    return TablePlace(cache_rows=min(rows, capacity) if capacity else rows)


def cached_backings(
    options: Sequence[DynamicEmbTableOptions],
    specs: Sequence[StorageTableSpec],
    kinds: Sequence[str],
    device: torch.device,
) -> List[Optional[Tuple[Any, int]]]:
    """Per table, ``(backing store, the table's id in it)`` for a cached table, else None.

    ``caching=True`` tables share one host table (table ids in the order of the module); an
    ``external_storage`` is resolved by name through the plugin registry (or used as given)."""
    out: List[Optional[Tuple[Any, int]]] = [None] * len(specs)
    hosted = [
        t for t, k in enumerate(kinds) if k == "cached" and options[t].external_storage is None
    ]
    if hosted:
        from dynamicemb_core.storage.grouped import GroupedDeviceStorage

        host = GroupedDeviceStorage(
            [specs[t] for t in hosted],
            torch.device("cpu"),
            dims=[specs[t].dim for t in hosted],
            table_options=[options[t] for t in hosted],
        )
        for i, t in enumerate(hosted):
            out[t] = (host, i)
    for t, kind in enumerate(kinds):
        if kind == "cached" and options[t].external_storage is not None:
            out[t] = _external(options[t], specs[t], device)
    return out


def device_split(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device
) -> Tuple[str, int, int]:
    """``(kind, device rows, host rows)`` of a table's ``max_capacity`` rows on this rank.

    A cached table's device rows are its cache; its host rows, the backing store's capacity (an
    external storage: 0, it sizes itself). On a CPU module every row is in host memory, whatever
    the kind says (its "device" is the host): ``(kind, 0, rows)``. Reads the options only (no
    allocation), so the planner's printout and the lookup's warning use the same rule.
    """
    kind = tier_kind(options, spec, device)
    capacity = int(options.max_capacity or 0)
    if device.type == "cpu":
        return kind, 0, capacity
    if kind == "device":
        return kind, capacity, 0
    place = table_place(options, spec, kind, device)
    if kind == "hybrid":
        on_device = min(capacity, int(place.device_rows or 0))
        return kind, on_device, capacity - on_device
    backing = 0 if options.external_storage is not None else capacity
    return kind, int(place.cache_rows or 0), backing


def zero_budget_message(
    options: DynamicEmbTableOptions, spec: StorageTableSpec, device: torch.device
) -> Optional[str]:
    """The warning for a CUDA table that gets no device rows from a zero budget, else None.

    ``global_hbm_for_values`` (hence ``local_hbm_for_values``) 0, the seed's default, keeps every
    value row of a table on a CUDA module in host memory: documented, but a user who forgets the
    option trains several times slower without a word. Cached tables and external storages are
    not concerned (a zero budget there is a deliberate "no cache")."""
    if device.type != "cuda" or options.caching or options.external_storage is not None:
        return None
    capacity = int(options.max_capacity or 0)
    if int(options.local_hbm_for_values) != 0 or not capacity:
        return None
    return (
        f"table {spec.name!r} is on {device} but global_hbm_for_values=0 (the default; "
        f"local_hbm_for_values=0 per rank) keeps all of its {capacity} value rows "
        "per rank in host memory, read over the bus every step. Set "
        "DynamicEmbTableOptions(global_hbm_for_values=<bytes over all ranks>) to keep rows in "
        "device memory (planner.capacity.get_table_value_bytes gives the bytes for all rows)."
    )


_WARNED_ZERO_BUDGET: set = set()


def warn_zero_budget(
    options: Sequence[DynamicEmbTableOptions],
    specs: Sequence[StorageTableSpec],
    device: torch.device,
) -> None:
    """Warn (:class:`DynamicEmbWarning`) once per table name per process for
    :func:`zero_budget_message`'s tables."""
    for opts, spec in zip(options, specs):
        message = zero_budget_message(opts, spec, device)
        if message is not None and spec.name not in _WARNED_ZERO_BUDGET:
            _WARNED_ZERO_BUDGET.add(spec.name)
            warnings.warn(message, DynamicEmbWarning, stacklevel=4)
