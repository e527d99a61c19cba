"""GroupedDeviceStorage: the device-resident and hybrid tables of a lookup module as one table state.

Keys and scores of every table live in one :class:`~dynamicemb_core.table.ScoredHashTable` (table
ids = positions, table-local slots); the value rows of every table live in a
:class:`~dynamicemb_core.storage.grouped_rows.GroupedRows`: one flat device buffer (float32, or
float16 / bfloat16 embeddings beside float32 optimizer state) described
by a (T, 4) ``meta`` tensor ``[value_offset, row_width, capacity, dim]`` (the layout of
csrc/include/dynamicemb/grouped.h) and, for tables whose rows exceed their device budget
(``local_hbm_for_values``), one host buffer holding each such table's slots past its budget. The
grouped value ops address rows by ``(table id, slot)``, so the batched module touches all its tables
with one op per step phase (per memory part) instead of one per table.

It is also a plain storage of several tables (the plugin ``PerTableStorage`` contract: find /
insert / export by table id) with its rows readable by slot (``read_rows`` / ``write_rows`` /
``row_blocks``), which is what the checkpoint code and the per-table views
(:mod:`~dynamicemb_core.storage.table_views`) use; on the CPU, with no dims beyond the rows, it is
the host table behind the cache of ``caching=True`` tables.

Host synchronisations: :meth:`acquire_all` decides growth from host-side sizes (exact after each
of its own calls, read again only after another call changed the table) and the caller's per-table
unique counts (an upper bound of the keys each table gains), inserts with no readback, initialises
the new rows in place on the device (one launch masked by the insert's ``is_new``), and copies
one small tensor back (new and unplaced counts, sizes after the insert) for the counters, the
eviction counts and the next call's sizes. A plain step (``defer=True``) does not wait for that
copy: :meth:`settle` reads it when the next step needs the sizes, after that step's own unique
readback has synchronised, so the step's table work adds no synchronisation. Groups with cached
tables, or host rows the device cannot address, still read it at once (their rows are made
before they are placed in the backing store or copied to the host).
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core._weak import weak_method
from dynamicemb_core.config import (
    BUCKET_ALIGNMENT,
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.nvtx import ranged
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim.layout import ROW_DTYPES
from dynamicemb_core.storage.backing import BackingStores, fit_columns
from dynamicemb_core.storage.contract.checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
    check_table_specs,
)
from dynamicemb_core.storage.grouped_cache import CacheTier, PinnedPairs, Placement
from dynamicemb_core.storage.grouped_rows import GroupedRows
from dynamicemb_core.types import MemoryType, PerTableStorage, StorageTableSpec

__all__ = ["GroupAcquire", "GroupedDeviceStorage", "GroupInit"]

# hash-table slots of a cached table with no cache (external storage, local_hbm_for_values=0)
_NO_CACHE_SLOTS = 16
# rows of a table built without options nor a capacity hint (TableSpec's default)
_DEFAULT_ROWS = 1024


@dataclass
class GroupInit:
    """How a placing call makes the rows of new keys.

    Attributes:
        table: (T, 8) float64 on the device: each table's initializer and optimizer-state value
            (:func:`~dynamicemb_core.lookup.initializers.initializer_table`).
        seed: this call's random stream (:func:`~dynamicemb_core.lookup.initializers.draw_seed`).
    """

    table: torch.Tensor
    seed: int


@dataclass
class _PendingPlacement:
    """A deferred placement readback: the insert's per-table outcome and sizes on their way to
    pinned host memory, read when the next step synchronises anyway (:meth:`settle`)."""

    host: torch.Tensor  # (T, 3) per table [placed, unplaced, size after the insert]
    event: Optional[Any]  # the CUDA event after the copy (None on CPU)
    table_counts: List[int]
    sizes_before: List[int]
    write_count: int


@dataclass
class GroupAcquire:
    """What :meth:`GroupedDeviceStorage.acquire_all` did for u unique keys.

    Attributes:
        slots: (u,) int64 table-local slot of each key, -1 where the key found no room.
        unplaced: how many slots are -1 (those keys read as zeros and get no update).
        fresh_index: (m,) int64 positions of the keys that got initial rows (new and placed).
        fresh_rows: (m, max row_width) those rows, already written to the buffer.
        unplaced_per_table: per table, how many of its keys have no home at all (None when none
            has): slot -1, and for a cached table not in its backing store either.
        backed: (b,) int64 positions of the keys of cached tables whose home for this step is the
            backing store (no cache slot), or None; ``backed_rows`` (b, max row_width) their rows.
    """

    slots: torch.Tensor
    unplaced: int
    fresh_index: torch.Tensor
    fresh_rows: Optional[torch.Tensor]
    unplaced_per_table: Optional[List[int]] = None
    backed: Optional[torch.Tensor] = None
    backed_rows: Optional[torch.Tensor] = None


class GroupedDeviceStorage(PerTableStorage):
    """Several tables' keys in one hash table and their rows in one flat device buffer.

    Args:
        tables: the logical tables (row widths include the optimizer state), in table-id order.
        device: where keys and rows live.
        dims: each table's embedding dim (the first ``dim`` elements of its rows).
        table_options: per table, bucket layout, capacities and score strategy.
        device_rows: per table, how many rows may live in device memory (its budget in rows;
            None: all of them); slots past it keep their rows in host memory (a hybrid table).
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str,
        *,
        dims: Sequence[int],
        table_options: Optional[Sequence[Optional[DynamicEmbTableOptions]]] = None,
        device_rows: Optional[Sequence[Optional[int]]] = None,
        cache_rows: Optional[Sequence[Optional[int]]] = None,
        backing: Optional[Sequence[Optional[Tuple[Any, int]]]] = None,
        strict_prefetch: bool = False,
    ) -> None:
        check_table_specs(type(self).__name__, tables)
        dtypes = {spec.dtype for spec in tables}
        if len(dtypes) != 1 or not dtypes <= set(ROW_DTYPES):
            raise ValueError(
                "GroupedDeviceStorage: the tables of a group share one dtype, one of "
                f"{list(ROW_DTYPES)}, got {dict((s.name, s.dtype) for s in tables)}"
            )
        # What the embeddings are stored in. The rows this storage takes and returns (insert, find,
        # export, read_rows, write_rows) are logical float32 rows whatever the dtype, so the
        # tables' specs say float32; a half-precision table's optimizer state stays float32.
        self.dtype: torch.dtype = next(iter(dtypes))
        tables = [dataclasses.replace(spec, dtype=torch.float32) for spec in tables]
        T = len(tables)
        caches = list(cache_rows) if cache_rows is not None else [None] * T
        stores = list(backing) if backing is not None else [None] * T
        if len(caches) != T or len(stores) != T:
            raise ValueError(
                f"GroupedDeviceStorage: cache_rows ({len(caches)}) and backing ({len(stores)}) "
                f"need one entry per table ({T})"
            )
        for t, (rows, store) in enumerate(zip(caches, stores)):
            if (rows is None) != (store is None):
                raise ValueError(
                    f"GroupedDeviceStorage: table {t}: a cached table needs both cache_rows and "
                    f"backing, got {rows!r} and {store!r}"
                )
        if self.dtype != torch.float32 and any(c is not None for c in caches):
            raise ValueError(
                f"GroupedDeviceStorage: cached tables keep float32 rows, the group stores "
                f"{self.dtype}"
            )
        self._cached = [c is not None for c in caches]
        # tables whose evictions drop keys (a cached table's go to its backing store)
        self._dropping = [t for t, cached in enumerate(self._cached) if not cached]
        self._direct = [c == 0 for c in caches]
        # a table with no cache keeps one small bucket in the hash table, never used
        capacities = [None if c is None else (int(c) or _NO_CACHE_SLOTS) for c in caches]
        super().__init__(tables, device)  # Storage names the device
        from dynamicemb_core.table import ScoredHashTable

        opts = list(table_options) if table_options is not None else [None] * T
        if len(opts) != T:
            raise ValueError(
                f"GroupedDeviceStorage: table_options ({len(opts)}) need one entry per table ({T})"
            )
        self.table_options = opts
        self.table = ScoredHashTable(
            [self._table_spec(*args) for args in zip(self.tables, opts, capacities)],
            device=self.device,
        )
        self._evicted_counts: List[int] = [0] * T
        if len(dims) != len(self.tables):
            raise ValueError(
                f"GroupedDeviceStorage: dims ({len(dims)}) must have one entry per table "
                f"({len(self.tables)})"
            )
        self.dims = [int(d) for d in dims]
        self.widths = [int(s.row_width) for s in self.tables]
        self.max_dim = max(self.dims)
        self.max_width = max(self.widths)
        self._device_limits = (
            list(device_rows) if device_rows is not None else [None] * len(self.tables)
        )
        self.rows = self._allocate([self.table.capacity(t) for t in range(len(self.tables))])
        self.table.add_growth_listener(weak_method(self._move_rows))
        self.table.outside_growth_bytes = weak_method(self._growth_row_bytes)
        self._retain = any(
            o is not None and o.evicted_item_mode == EvictedItemMode.RETAIN_KEY and not cached
            for o, cached in zip(self.table_options, self._cached)
        )
        self._sizes: List[int] = [0] * len(self.tables)
        self._sizes_at = self.table.write_count
        # the last deferred placement readback (acquire_all(defer=True)), and the unplaced keys
        # per table of the settled ones, for the caller's safe check (take_unplaced)
        self._pending_placement: Optional[_PendingPlacement] = None
        # the deferred readback's pinned buffer and event, made by the first one (see _defer)
        self._readback_host: Optional[torch.Tensor] = None
        self._readback_event: Optional[Any] = None
        # a deferred placement whose outcome is not counted yet (see send_placement)
        self._unsent: Optional[Tuple[Any, ...]] = None
        self._late_unplaced: Optional[List[int]] = None
        self.table.counters.before_read = weak_method(self.settle)
        # pinned (table id, slot) pairs alive now: forwards in flight, outstanding prefetches
        self._live: "weakref.WeakSet[PinnedPairs]" = weakref.WeakSet()
        # forwards in flight whose slots the next placing call pins (see hold)
        self._pending: "weakref.WeakSet[PinnedPairs]" = weakref.WeakSet()
        self.cache: Optional[CacheTier] = None
        if any(self._cached):
            backing_stores = BackingStores(self.tables, self.device, stores)
            self.cache = CacheTier(
                self, backing_stores, self._cached, self._direct, strict_prefetch
            )

    @staticmethod
    def _table_spec(
        spec: StorageTableSpec,
        options: Optional[DynamicEmbTableOptions],
        capacity: Optional[int],
    ) -> Any:
        """The hash table's spec of one table: :meth:`TableSpec.from_options`, holding keys only
        (the rows live in the flat buffer) and never applying ``safe_check_mode`` (the lookup
        does, once, for keys that found no home in any tier). A cache (``capacity``: its rows)
        is fixed at its size and drops no key itself (its victims go to the backing store,
        which applies ``evicted_item_mode``). Without options (a group built as a plain
        storage), the spec's capacity hint and the options' defaults, both score words kept for
        a two-score table."""
        from dynamicemb_core.table import TableSpec

        sized = capacity or (options and options.max_capacity) or spec.capacity
        if options is None:
            two = (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)
            options = DynamicEmbTableOptions(
                max_capacity=sized or _DEFAULT_ROWS,
                score_strategy=two if spec.num_scores == 2 else DynamicEmbScoreStrategy.TIMESTAMP,
            )
        elif options.max_capacity is None:  # the spec's capacity hint, else TableSpec's default
            init = options.init_capacity if sized else None
            options = dataclasses.replace(
                options, max_capacity=sized or _DEFAULT_ROWS, init_capacity=init
            )
        keys_only = TableSpec.from_options(spec.name, options, row_width=0)
        changes: dict = {"dtype": torch.float32, "safe_check_mode": DynamicEmbCheckMode.IGNORE}
        if capacity is not None:
            changes.update(
                init_capacity=capacity,
                max_capacity=capacity,
                fixed_capacity=True,
                evicted_item_mode=EvictedItemMode.DISCARD,
            )
        rows = changes.get("max_capacity", keys_only.max_capacity)
        if sized and keys_only.bucket_capacity > rows:  # a small table still gets whole buckets
            changes["bucket_capacity"] = max(
                BUCKET_ALIGNMENT, rows // BUCKET_ALIGNMENT * BUCKET_ALIGNMENT
            )
        return dataclasses.replace(keys_only, **changes)

    # ---- the rows ---------------------------------------------------------------------------
    def _allocate(self, capacities: Sequence[int]) -> GroupedRows:
        """Zeroed rows for ``capacities`` (each table's device part within its budget)."""
        return GroupedRows(
            self.device, self.widths, self.dims, capacities, self._device_limits, self.dtype
        )

    @property
    def row_dtype(self) -> torch.dtype:
        """What the embeddings are stored in (the rows this storage moves are float32)."""
        return self.dtype

    @property
    def values(self) -> torch.Tensor:
        """The flat device buffer (replaced on growth)."""
        return self.rows.values

    @property
    def meta(self) -> torch.Tensor:
        """The device buffer's (T, 4) meta."""
        return self.rows.meta

    def _growth_row_bytes(self, table_id: int) -> int:
        """Bytes of the new rows buffer a doubling of ``table_id`` allocates while the old one
        is alive (:meth:`_move_rows`): every table's rows, that table's twice; float32 columns,
        an upper bound for half-precision rows. The hash table's growth check adds them."""
        caps = [self.table.capacity(t) for t in range(len(self.tables))]
        caps[table_id] *= 2
        return 4 * sum(c * w for c, w in zip(caps, self.widths))

    def _move_rows(self, table_id: int, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
        """Growth listener: new rows with table ``table_id`` at its new capacity.

        With hybrid tables (a device budget), the old device rows are staged in host memory and
        released before the new device buffer is allocated, so the device part stays within the
        budgets while rows move (one copy of the device part each way per growth).
        """
        old = self.rows
        if any(limit is not None for limit in self._device_limits):
            old = old.to_host()
            del self.rows  # the old device buffer goes before the new one comes
        new = self._allocate([self.table.capacity(t) for t in range(len(self.tables))])
        for t in range(len(self.tables)):
            if t == table_id:
                tids = torch.full_like(old_slots, t)
                moved = old.gather(tids.to(old.device), old_slots.to(old.device), self.widths[t])
                new.scatter(torch.full_like(new_slots, t), new_slots, moved.to(self.device))
            else:
                for (dst, _), (src, _) in zip(new.blocks(t), old.blocks(t)):
                    dst.copy_(src)
        self.rows = new
        self._move_pinned(table_id, old_slots, new_slots)

    # ---- pins -----------------------------------------------------------------------------------
    def pin(self, table_ids: torch.Tensor, slots: torch.Tensor) -> PinnedPairs:
        """One pin on each ``(table id, slot)`` pair (slot -1 skipped) until :meth:`unpin`: an
        inserting call never evicts a pinned slot. Growth moves the pairs' slots with their keys."""
        pairs = PinnedPairs(table_ids, slots)
        self.table.adjust_pins(table_ids, slots, 1)
        self.track(pairs)
        return pairs

    def hold(self, table_ids: torch.Tensor, slots: torch.Tensor) -> PinnedPairs:
        """The slots of a forward in flight: pinned (as :meth:`pin`) by the next call that places
        keys, before it places any, so that nothing can evict or move them unseen; a loop with
        no placing call between a forward and its backward pins nothing."""
        pairs = PinnedPairs(table_ids, slots, pinned=False)
        self._pending.add(pairs)
        return pairs

    def pin_pending(self) -> None:
        """Pin the held slots of every forward in flight (called first by each placing call)."""
        if not self._pending:  # the usual case: the last step's backward gave its slots back
            return
        for pairs in list(self._pending):
            if not pairs.released and not pairs.pinned:
                self.table.adjust_pins(pairs.table_ids, pairs.slots, 1)
                pairs.pinned = True
                self.track(pairs)
        self._pending.clear()

    def track(self, pairs: PinnedPairs) -> None:
        """Keep ``pairs``' slots current through growth (while the caller holds ``pairs``)."""
        self._live.add(pairs)

    def unpin(self, pairs: PinnedPairs) -> None:
        """Give back the pins of :meth:`pin` or :meth:`hold` (once; later calls do nothing)."""
        if pairs.released:
            return
        pairs.released = True
        self._pending.discard(pairs)
        self._live.discard(pairs)
        if pairs.pinned:
            self.table.adjust_pins(pairs.table_ids, pairs.slots, -1)

    def _move_pinned(self, table_id: int, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
        """Growth of table ``table_id``: the pinned pairs' slots follow their keys (the table moved
        the pin counts with them)."""
        live = [p for p in self._live if not p.released]
        if not live:
            return
        size = int(old_slots.max()) + 1 if old_slots.numel() else 0
        where = torch.full((size + 1,), -1, dtype=torch.int64, device=self.device)
        where[old_slots] = new_slots
        for p in live:
            mine = (p.table_ids == table_id) & (p.slots >= 0)
            moved = where[torch.where(mine, p.slots, size).clamp(max=size)]
            p.slots.copy_(torch.where(mine, moved, p.slots))  # in place: a step shares it

    def device_rows(self, table_id: int) -> int:
        """Slots of table ``table_id`` whose rows live in device memory."""
        return self.rows.device_rows[table_id]

    # ---- rows by slot, per table --------------------------------------------------------------
    def read_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        """(n, row_width) float32 rows at local slots; slot -1 gives zeros."""
        tids = torch.full_like(slots, table_id)
        # Unchecked: a slot outside the table reads as zeros, as slot -1 does.
        return self.rows.gather(tids, slots, self.widths[table_id])

    def write_rows(self, table_id: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write rows at local slots; slot -1 skipped."""
        tids = torch.full_like(slots, table_id)
        self.rows.scatter(tids, slots, rows.to(self.device, torch.float32), check=True)

    def row_blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
        """The buffers holding the table's rows, as ``(buffer, first_slot)`` pairs."""
        return self.rows.blocks(table_id)

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

    # ---- the per-table Storage contract ----------------------------------------------------------
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
        """Insert-or-assign rows with given scores, after pinning the forwards in flight; return
        the table's InsertResult (evictions)."""
        self.pin_pending()
        if keys.numel() == 0:
            return None
        res = self.table.insert_and_evict(keys, table_id, rows=None, scores=scores)
        ev = res.evicted
        if ev is not None and ev.keys is not None:
            self._evicted_counts[table_id] += int(ev.keys.numel())
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

    def memory_usage(
        self, mem_type: MemoryType = MemoryType.DEVICE, table_id: Optional[int] = None
    ) -> int:
        """Bytes of rows in ``mem_type``: on a CPU group with no host part, all of them are HOST."""
        if self.device.type == "cpu" and not self.rows.has_host:
            if mem_type is not MemoryType.HOST:
                return 0
            return self.rows.memory_usage(MemoryType.DEVICE, table_id)
        return self.rows.memory_usage(mem_type, table_id)

    # ---- the grouped step -------------------------------------------------------------------
    def _known_sizes(self) -> List[int]:
        """Exact sizes: kept from the last acquire_all, read again after any other call."""
        self.settle()
        if self.table.write_count != self._sizes_at:
            self._sizes = [int(s) for s in self.table.state.sizes.tolist()]
            self._sizes_at = self.table.write_count
        return self._sizes

    @ranged("dynamicemb::find_or_insert")
    def acquire_all(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        table_counts: Sequence[int],
        init: GroupInit,
        *,
        defer: bool = False,
        key_counts: Optional[torch.Tensor] = None,
    ) -> GroupAcquire:
        """Make unique ``(table id, key)`` pairs resident; new keys get ``init`` rows (keys of a
        cached table: their rows from the backing store when it holds them).

        Args:
            keys, table_ids: (u,) int64 on the device, distinct pairs (segmented_unique's).
            table_counts: per table, how many of the pairs are its (host ints).
            init: the rows of new keys.
            defer: where the rows are initialised in place (no cached tables, rows the device
                addresses), do not wait for the placement's outcome: it is copied to the host
                without waiting and read by :meth:`settle` (the next call that needs sizes or
                counters, when the caller's next unique has synchronised anyway); the result's
                ``unplaced`` is then 0 and ``unplaced_per_table`` None, and the unplaced counts
                come later through :meth:`take_unplaced`. No host synchronisation.
            key_counts: (u,) int64, each pair's occurrences in the batch (the dedup's counts):
                LFU counts grow by them (:meth:`ScoredHashTable.find_or_insert_counted`).

        Raises:
            StorageTierError: a backing store failed; the cache placement was undone.
        """
        self.pin_pending()
        if self.cache is not None and self.cache.any_direct:
            return self._acquire_with_direct(keys, table_ids, table_counts, init, key_counts)
        return self._acquire_placed(keys, table_ids, table_counts, init, defer, key_counts)

    def _fresh(self, init: GroupInit, keys: torch.Tensor, table_ids: torch.Tensor) -> torch.Tensor:
        """(m, max row_width) rows of new keys (embedding, fresh optimizer state) in a buffer."""
        return lookup_ops.initial_rows(
            init.table, keys, table_ids, self.max_width, self.dims, init.seed
        )

    def settle(self) -> None:
        """Read the deferred placement readback, if any (waits for its copy: by the time a
        caller needs it, its next unique's readback has synchronised, so this does not block)."""
        self.send_placement()
        p = self._pending_placement
        if p is None:
            return
        self._pending_placement = None
        if p.event is not None:
            p.event.synchronize()
        unplaced = self._account(p.host.tolist(), p.table_counts, p.sizes_before, p.write_count)
        if any(unplaced):
            late = self._late_unplaced or [0] * len(self.tables)
            self._late_unplaced = [a + b for a, b in zip(late, unplaced)]

    def take_unplaced(self, settle: bool = True) -> Optional[List[int]]:
        """Per table, the unplaced keys of the settled deferred placements not yet taken (None
        when there were none); the caller applies its safe check to them. ``settle=False``: only
        those already settled (a forward must not wait for its own placement's copy)."""
        if settle:
            self.settle()
        late, self._late_unplaced = self._late_unplaced, None
        return late

    def _account(
        self,
        host: List[List[int]],
        table_counts: Sequence[int],
        sizes: Sequence[int],
        write_count: int,
    ) -> List[int]:
        """Count one insert's outcome from its readback ``host`` (``[placed, unplaced, size
        after]`` per table, :meth:`_outcome`'s): counters, evictions, and the sizes when nothing
        has written the table since. Returns the unplaced keys per table."""
        placed = [row[0] for row in host]
        unplaced_by_table = [row[1] for row in host]
        after = [row[2] for row in host]
        # A table's size moves only by keys placed and keys evicted during the call.
        evicted = [b + p - a for b, p, a in zip(sizes, placed, after)]
        self.table.counters.add(table_counts, placed, evicted, unplaced_by_table)
        for t in self._dropping:  # a cache's evictions are spills, not drops
            self._evicted_counts[t] += evicted[t]
        if self.table.write_count == write_count:
            self._sizes = after
            self._sizes_at = write_count
        return unplaced_by_table

    def _acquire_placed(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        table_counts: Sequence[int],
        init: GroupInit,
        defer: bool = False,
        key_counts: Optional[torch.Tensor] = None,
    ) -> GroupAcquire:
        """``acquire_all`` of pairs that all go through the hash table."""
        cache = self.cache
        sizes = self._known_sizes()
        res = self.table.find_or_insert_counted(
            keys,
            table_ids,
            table_counts,
            sizes,
            report_evicted=self._retain or cache is not None,
            counts=key_counts if self.table.counts_accesses else None,
        )
        slots, is_new = res.slots, res.is_new
        write_count = self.table.write_count
        if cache is None and self.rows.init_in_place:
            # new rows made in place on the device, masked by is_new: no count needed first (on
            # the host, where reading is_new costs no sync, skipped when no key is new: the
            # steady state of a warm table)
            if self.device.type == "cuda" or bool(is_new.any()):
                self.rows.init(table_ids, slots, keys, init.table, init.seed, only=is_new)
            if defer:
                # the outcome's count and copy wait for send_placement (the caller's output
                # launches first); nothing writes the table in between
                self._unsent = (table_ids, slots, is_new, list(table_counts), sizes, write_count)
                return GroupAcquire(slots, 0, slots[:0], None, None)
            readback = self._outcome(table_ids, slots, is_new)
            counted = self._account(readback.tolist(), table_counts, sizes, write_count)
            unplaced = sum(counted)
            return GroupAcquire(slots, unplaced, slots[:0], None, counted if unplaced else None)
        host = self._outcome(table_ids, slots, is_new).tolist()
        unplaced_by_table = self._account(host, table_counts, sizes, write_count)
        num_missing, unplaced = sum(row[0] for row in host), sum(unplaced_by_table)
        by_table = unplaced_by_table if unplaced else None
        # Keys that got a slot get initial rows (an unplaced key, slot -1, reads as zeros); so do
        # keys of cached tables without a slot (they live in the backing store for this step).
        num_fill = num_missing
        if cache is not None:
            num_fill += sum(c for t, c in enumerate(unplaced_by_table) if self._cached[t])
        if num_fill == 0:
            return GroupAcquire(slots, unplaced, slots[:0], None, by_table)
        fill = is_new & (slots >= 0)
        if cache is not None:
            fill = fill | ((slots < 0) & cache.cached_dev[table_ids])
        if self.device.type == "cuda":
            idx = torch.nonzero_static(fill, size=num_fill).squeeze(1)
        else:
            idx = fill.nonzero().squeeze(1)
        fresh_tids = table_ids[idx]
        fresh = self._fresh(init, keys[idx], fresh_tids)
        if cache is None:
            self.rows.scatter(fresh_tids, slots[idx], fresh)
            return GroupAcquire(slots, unplaced, idx, fresh, by_table)
        place = Placement(keys, table_ids, slots, is_new, res.evicted)
        try:
            fresh, backed, homeless = cache.complete(place, idx, fresh)
        except BaseException:
            # the device tables keep their placement: their new keys get their rows
            mine = (~cache.cached_dev[table_ids[idx]]).nonzero().squeeze(1)
            self.rows.scatter(table_ids[idx[mine]], slots[idx[mine]], fresh[mine])
            raise
        self.rows.scatter(fresh_tids, slots[idx], fresh)
        return self._cached_result(table_ids, slots, backed, homeless, idx, fresh)

    def _outcome(
        self, table_ids: torch.Tensor, slots: torch.Tensor, is_new: torch.Tensor
    ) -> torch.Tensor:
        """(T, 3) int64 on the device: the placing call's outcome, per table the keys placed new,
        the keys left unplaced (counted without hot atomics) and the size after it."""
        return lookup_ops.placement_counts(table_ids, slots, is_new, self.table.state.sizes)

    def send_placement(self) -> None:
        """Count the last deferred placement's outcome and start its copy to the host (no
        wait; :meth:`settle` reads it). ``acquire_all(defer=True)`` leaves this to its caller,
        to call once its next launches (the step's output) are queued; a later call that needs
        the outcome sends it first."""
        unsent, self._unsent = self._unsent, None
        if unsent is None:
            return
        table_ids, slots, is_new, table_counts, sizes, write_count = unsent
        self._defer(self._outcome(table_ids, slots, is_new), table_counts, sizes, write_count)

    def _defer(
        self,
        readback: torch.Tensor,
        table_counts: Sequence[int],
        sizes: Sequence[int],
        write_count: int,
    ) -> None:
        """Start the placement readback's copy to pinned memory without waiting (:meth:`settle`
        reads it)."""
        self.settle()  # at most one in flight (there is none: acquire read the sizes first)
        event: Optional[Any] = None
        host = readback
        if readback.device.type == "cuda":
            # one pinned buffer and one event, kept: the last copy into them was read (settled)
            if self._readback_host is None:
                self._readback_host = torch.empty(
                    readback.shape, dtype=readback.dtype, pin_memory=True
                )
                self._readback_event = torch.cuda.Event()
            host, event = self._readback_host, self._readback_event
            assert event is not None
            host.copy_(readback, non_blocking=True)
            event.record(torch.cuda.current_stream(readback.device))
        self._pending_placement = _PendingPlacement(
            host, event, list(table_counts), list(sizes), write_count
        )

    def _cached_result(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        backed: torch.Tensor,
        homeless: torch.Tensor,
        idx: torch.Tensor,
        fresh: torch.Tensor,
    ) -> GroupAcquire:
        """The acquire of a group with cached tables: backed pairs' rows from ``fresh``, the
        keys with no home counted per table."""
        by_table = torch.bincount(table_ids[homeless], minlength=len(self.tables)).tolist()
        unplaced = sum(by_table)
        rows = None
        if backed.numel():
            where = torch.full_like(slots, -1)
            where[idx] = torch.arange(idx.numel(), device=self.device)
            rows = fresh[where[backed]]
        return GroupAcquire(
            slots,
            unplaced,
            idx,
            fresh,
            by_table if unplaced else None,
            backed if backed.numel() else None,
            rows,
        )

    def _acquire_with_direct(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        table_counts: Sequence[int],
        init: GroupInit,
        key_counts: Optional[torch.Tensor] = None,
    ) -> GroupAcquire:
        """``acquire_all`` when some cached tables have no cache: their pairs skip the hash table
        (found in the backing store, or new keys written there with ``init`` rows)."""
        cache = self.cache
        assert cache is not None
        direct = cache.direct_dev[table_ids]
        inside = (~direct).nonzero().squeeze(1)
        outside = direct.nonzero().squeeze(1)
        counts = [0 if cache.direct[t] else c for t, c in enumerate(table_counts)]
        slots = torch.full_like(keys, -1)
        by_table = [0] * len(self.tables)
        backed_parts, rows_parts = [], []
        if inside.numel():
            inside_counts = None if key_counts is None else key_counts[inside]
            got = self._acquire_placed(
                keys[inside], table_ids[inside], counts, init, key_counts=inside_counts
            )
            slots[inside] = got.slots
            if got.unplaced_per_table is not None:
                by_table = list(got.unplaced_per_table)
            if got.backed is not None:
                assert got.backed_rows is not None
                backed_parts.append(inside[got.backed])
                rows_parts.append(got.backed_rows)
        if outside.numel():
            okeys, otids = keys[outside], table_ids[outside]
            found, rows, _ = cache.backing.find(okeys, otids)
            new = (~found).nonzero().squeeze(1)
            if new.numel():
                fresh = self._fresh(init, okeys[new], otids[new])
                rows[new] = fresh[:, : rows.shape[1]]
                cache.backing.insert(
                    okeys[new],
                    otids[new],
                    rows[new],
                    cache.now_scores(otids[new]),
                    "write new keys",
                )
            backed_parts.append(outside)
            rows_parts.append(rows)
        unplaced = sum(by_table)
        return GroupAcquire(
            slots,
            unplaced,
            slots[:0],
            None,
            by_table if unplaced else None,
            torch.cat(backed_parts) if backed_parts else None,
            torch.cat(rows_parts) if rows_parts else None,
        )

    @ranged("dynamicemb::find")
    def find_all(
        self, keys: torch.Tensor, table_ids: torch.Tensor, *, touch: bool = False
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(slots, found)`` of unique pairs without inserting (eval, admission, frozen tables)."""
        res = self.table.find(keys, table_ids, update_score=touch)
        return torch.where(res.found, res.slots, -1), res.found

    # ---- the cached tables ----------------------------------------------------------------------
    @property
    def has_cache(self) -> bool:
        """Whether some table of the group is a cache over a backing store."""
        return self.cache is not None

    @property
    def counts_accesses(self) -> bool:
        """Whether some table's scores count accesses (LFU words)."""
        return bool(self.table.counts_accesses)

    def count_refused(self, table_ids: torch.Tensor) -> None:
        """Count pairs admission refused as looked up and missed (hits + misses = unique keys)."""
        self.table.counters.add_refused(table_ids)

    def _cache_tier(self) -> CacheTier:
        assert self.cache is not None, "the group has no cached table"
        return self.cache

    def read_through(
        self, keys: torch.Tensor, table_ids: torch.Tensor, found: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pairs of cached tables not in the cache, read from their backing stores: ``(found in
        either, positions found in a backing store, their rows)`` (:attr:`has_cache` only)."""
        return self._cache_tier().read_through(keys, table_ids, found)

    def pinnable(self, keys: torch.Tensor, table_ids: torch.Tensor) -> torch.Tensor:
        """(u,) bool: the pairs of a prefetch that fit beside the pinned slots of their cache
        buckets (:meth:`CacheTier.pinnable`: warns or raises for the others)."""
        found = self.find_all(keys, table_ids)[1]
        return self._cache_tier().pinnable(keys, table_ids, found)

    def pin_prefetch(self, table_ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Pin a prefetch's placed pairs of cached tables until the forward that consumes it."""
        cache = self._cache_tier()
        pairs = (cache.cached_dev[table_ids] & (slots >= 0)).nonzero().squeeze(1)
        cache.add_prefetch(self.pin(table_ids[pairs], slots[pairs]))

    def consume_prefetch(self, table_ids: torch.Tensor, slots: torch.Tensor) -> None:
        """A training forward holds these pairs now: release the prefetch pins it consumes."""
        self._cache_tier().consume(table_ids, slots)

    def update_backed(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        grads: torch.Tensor,
        hyper: Any,
        dims: Sequence[int],
    ) -> None:
        """The optimizer update of pairs whose home this step was a backing store, written
        there (:meth:`CacheTier.update_backed`)."""
        self._cache_tier().update_backed(keys, table_ids, grads, hyper, dims)

    def is_cached(self, table_id: int) -> bool:
        """Whether table ``table_id`` is a cache over a backing store."""
        return self._cached[table_id]

    def flush(self) -> None:
        """Write every cached row (pinned ones included) back to its backing store in one call
        per store, then flush the stores."""
        cache = self.cache
        if cache is None:
            return
        keys, tids, slots, scores = [], [], [], []
        for t in range(len(self.tables)):
            if not self._cached[t] or self._direct[t]:
                continue
            res = self.table.export(t)
            if res.keys.numel():
                keys.append(res.keys)
                tids.append(torch.full_like(res.keys, t))
                slots.append(res.slots)
                scores.append(fit_columns(res.scores, cache.backing.max_scores))
        if keys:
            k, t_ = torch.cat(keys), torch.cat(tids)
            rows = self.rows.gather(t_, torch.cat(slots), self.max_width)
            cache.backing.insert(k, t_, rows, torch.cat(scores), "write back the cached rows")
        cache.backing.for_each_store("flush", "flush")

    def evictions(self, table_id: int) -> int:
        """Keys dropped by the table's last tier (a cached table's: its backing store's)."""
        if not self._cached[table_id]:
            self.settle()
            return self._evicted_counts[table_id]
        assert self.cache is not None
        counter = getattr(self.cache.backing.store(table_id), "evictions", None)
        bid = self.cache.backing.backing_ids[table_id]
        return int(counter(bid)) if callable(counter) else 0
