"""DeviceStorage: one ScoredHashTable whose keys and value rows all live on the table's device.

Built on the CPU, it is the host table behind the device cache of ``caching=True`` tables; it is
also a plain per-table storage (find / insert / erase / export by table id, the plugin
``PerTableStorage`` contract), with its rows readable by slot (``read_rows`` / ``row_blocks``) for
the checkpoint code. The lookup module's own tables live in
:class:`~dynamicemb_core.storage.grouped.GroupedDeviceStorage`, a subclass.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.plugins.storage_checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
    check_table_specs,
)
from dynamicemb_core.types import MemoryType, PerTableStorage, StorageTableSpec

__all__ = ["DeviceStorage", "table_spec_for"]


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


class DeviceStorage(PerTableStorage):
    """Keys, scores and value rows of several logical tables in one ScoredHashTable on ``device``.

    Args:
        tables: the logical tables, in table-id order.
        device: where keys and rows live.
        table_options: per table, the options giving bucket layout, capacities and score strategy
            (None: the capacity hint of each spec and TableSpec's defaults).
        evicted_item_mode: override for every table (a cache passes DISCARD).
        capacities: per table, a fixed capacity overriding the options (a cache's size).
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str,
        *,
        table_options: Optional[Sequence[Optional[DynamicEmbTableOptions]]] = None,
        evicted_item_mode: Optional[EvictedItemMode] = None,
        capacities: Optional[Sequence[Optional[int]]] = None,
    ) -> None:
        check_table_specs(type(self).__name__, tables)
        super().__init__(tables, device)  # Storage names the device
        from dynamicemb_core.table import ScoredHashTable

        n = len(self.tables)
        opts = list(table_options) if table_options is not None else [None] * n
        caps = list(capacities) if capacities is not None else [None] * n
        if len(opts) != n or len(caps) != n:
            raise ValueError(
                f"DeviceStorage: table_options ({len(opts)}) and capacities ({len(caps)}) must have "
                f"one entry per table ({n})"
            )
        self.table_options = opts
        specs = [
            self._table_spec(spec, o, c, evicted_item_mode)
            for spec, o, c in zip(self.tables, opts, caps)
        ]
        self.table = ScoredHashTable(specs, device=self.device)
        self._evicted_counts: List[int] = [0] * n

    def _table_spec(
        self,
        spec: StorageTableSpec,
        options: Optional[DynamicEmbTableOptions],
        capacity: Optional[int],
        evicted_item_mode: Optional[EvictedItemMode],
    ) -> Any:
        return table_spec_for(spec, options, capacity=capacity, evicted_item_mode=evicted_item_mode)

    # ---- rows (overridden by HybridStorage) -------------------------------------------------
    def read_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        """(n, row_width) rows at local slots; slot -1 gives zeros."""
        return self.table.read_rows(table_id, slots)

    def write_rows(self, table_id: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write rows at local slots; slot -1 skipped."""
        self.table.write_rows(table_id, slots, rows)

    def row_blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
        """The value buffers holding the rows, as ``(buffer, first_slot)`` pairs."""
        return [(self.table.values(table_id), 0)]

    def _count_evictions(self, table_id: int, result: Any) -> None:
        ev = getattr(result, "evicted", None)
        if ev is not None and ev.keys is not None:
            self._evicted_counts[table_id] += int(ev.keys.numel())

    def evictions(self, table_id: int) -> int:
        return self._evicted_counts[table_id]

    def metrics(self, table_id: int) -> Optional[torch.Tensor]:
        return self.table.counters.row(table_id)

    def reset_metrics(self, table_id: int) -> None:
        self.table.counters.reset(table_id)

    def capacity(self, table_id: int) -> int:
        return self.table.capacity(table_id)

    def pop_evicted_keys(self, table_id: int) -> torch.Tensor:
        return self.table.pop_evicted_keys(table_id)

    def device_table(self) -> Any:
        """The ScoredHashTable holding the keys (checkpoints and incremental dumps use it)."""
        return self.table

    # ---- Storage ABC --------------------------------------------------------------------------
    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_find(self.tables, table_id, keys)
        res = self.table.find(keys.to(self.device), table_id)
        return res.found, self.read_rows(table_id, res.slots), res.scores

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        check_insert(self.tables, table_id, keys, rows, scores)
        self.insert_evicting(
            table_id, keys.to(self.device), rows.to(self.device), scores.to(self.device)
        )

    def insert_evicting(
        self,
        table_id: int,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: Optional[torch.Tensor],
    ) -> Any:
        """Insert-or-assign rows with given scores; return the table's InsertResult (evictions)."""
        if keys.numel() == 0:
            return None
        res = self.table.insert_and_evict(keys, table_id, rows=None, scores=scores)
        self._count_evictions(table_id, res)
        self.write_rows(table_id, res.slots, rows)
        return res

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        check_erase(self.tables, table_id, keys)
        if keys.numel():
            self.table.erase(keys.to(self.device), table_id)

    def size(self, table_id: int) -> int:
        check_table_id(self.tables, table_id)
        return self.table.size(table_id)

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        check_table_id(self.tables, table_id)
        res = self.table.export(table_id)
        for start in range(0, res.keys.numel(), batch_size):
            sl = slice(start, start + batch_size)
            yield res.keys[sl], self.read_rows(table_id, res.slots[sl]), res.scores[sl]

    def dump(self, path: str) -> None:
        """Snapshot every table as ``<path>/<table name>.pt`` (keys, rows, scores in user order).

        The storage's own snapshot, for moving a tier between processes; model checkpoints use
        :mod:`dynamicemb_core.checkpoint`, whose format is versioned and checksummed.
        """
        os.makedirs(path, exist_ok=True)
        for t, spec in enumerate(self.tables):
            res = self.table.export(t)
            torch.save(
                {
                    "keys": res.keys.cpu(),
                    "rows": self.read_rows(t, res.slots).cpu(),
                    "scores": res.scores.cpu(),
                    "row_width": spec.row_width,
                },
                os.path.join(path, f"{spec.name}.pt"),
            )

    def load(self, path: str) -> None:
        """Insert what :meth:`dump` wrote (every file is checked before any table is written)."""
        snapshots = []
        for spec in self.tables:
            file = os.path.join(path, f"{spec.name}.pt")
            if not os.path.isfile(file):
                raise FileNotFoundError(f"table {spec.name!r}: no snapshot at {file}")
            snap = torch.load(file, weights_only=True)
            if snap["row_width"] != spec.row_width:
                raise ValueError(
                    f"table {spec.name!r}: snapshot {file} has row_width {snap['row_width']}, "
                    f"the table {spec.row_width}"
                )
            snapshots.append(snap)
        for t, snap in enumerate(snapshots):
            self.insert_evicting(
                t,
                snap["keys"].to(self.device),
                snap["rows"].to(self.device),
                snap["scores"].to(self.device),
            )

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        want = MemoryType.HOST if self.device.type == "cpu" else MemoryType.DEVICE
        if mem_type is not want:
            return 0
        return sum(
            buf.numel() * buf.element_size()
            for t in range(len(self.tables))
            for buf, _ in self.row_blocks(t)
        )
