"""Per-table views of a grouped storage: one table of a module's group, as a storage of one table.

``BatchedDynamicEmbeddingTables.tables[t]`` is a :class:`TableView` (device-resident or hybrid
table) or a :class:`CachedTableView` (a cache in front of a backing store), so code written against
one storage per table (checkpoints, tests, demos, TorchRec-side helpers) keeps working while the
step itself runs over the whole group (:mod:`~dynamicemb_core.storage.grouped`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

import torch

from dynamicemb_core.storage.contract.checks import check_erase, check_find, check_insert
from dynamicemb_core.storage.grouped import GroupedDeviceStorage
from dynamicemb_core.storage.grouped_cache import CacheTier
from dynamicemb_core.types import MemoryType, PerTableStorage

__all__ = ["CachedTableView", "SlotHome", "TableView"]


class SlotHome(NamedTuple):
    """Where every key of one table lives, for the slot-based checkpoints (:meth:`TableView.home`).

    Attributes:
        group: the group holding the keys in its hash table and the rows by slot.
        table_id: the table's id in ``group``.
        flush: writes a cache's rows back into ``group`` first (None: no cache in front).
        drop: removes keys from that cache after they were written to ``group`` (None: no cache).
    """

    group: GroupedDeviceStorage
    table_id: int
    flush: Optional[Callable[[], None]] = None
    drop: Optional[Callable[[torch.Tensor], None]] = None


class TableView(PerTableStorage):
    """One table of a :class:`GroupedDeviceStorage`, presented as a storage holding it as table 0.

    ``BatchedDynamicEmbeddingTables.tables[t]`` is this for a grouped table, so code written
    against one storage per table (tests, demos, TorchRec-side helpers) keeps working.
    """

    def __init__(self, group: GroupedDeviceStorage, table_id: int) -> None:
        super().__init__([group.tables[table_id]], group.device)
        self.group = group
        self.table_id = table_id

    def _id(self, table_id: int) -> int:
        if table_id != 0:
            raise ValueError(f"TableView holds one table (id 0), got table_id={table_id!r}")
        return self.table_id

    @property
    def table(self) -> Any:
        """The group's ScoredHashTable (all tables of the group; this one is ``table_id``)."""
        return self.group.table

    @property
    def row_dtype(self) -> torch.dtype:
        """What the group stores embeddings in (the rows it moves are float32)."""
        return self.group.dtype

    # ---- Storage --------------------------------------------------------------------------------
    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.group.find(self._id(table_id), keys)

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        self.group.insert(self._id(table_id), keys, rows, scores)

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        self.group.erase(self._id(table_id), keys)

    def size(self, table_id: int) -> int:
        return self.group.size(self._id(table_id))

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return self.group.export(self._id(table_id), batch_size)

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        return self.group.memory_usage(mem_type, self.table_id)

    def device_rows(self, table_id: int) -> int:
        """Slots of this table whose rows live in device memory (the rest: host memory)."""
        return self.group.device_rows(self._id(table_id))

    # ---- per-table state (the module's step goes through the group) -------------------------
    def read_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        return self.group.read_rows(self._id(table_id), slots)

    def write_rows(self, table_id: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        self.group.write_rows(self._id(table_id), slots, rows)

    def row_blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
        return self.group.row_blocks(self._id(table_id))

    def evictions(self, table_id: int) -> int:
        return self.group.evictions(self._id(table_id))

    def metrics(self, table_id: int) -> Optional[torch.Tensor]:
        return self.group.metrics(self._id(table_id))

    def reset_metrics(self, table_id: int) -> None:
        self.group.reset_metrics(self._id(table_id))

    def capacity(self, table_id: int) -> int:
        return self.group.capacity(self._id(table_id))

    def pop_evicted_keys(self, table_id: int) -> torch.Tensor:
        return self.group.pop_evicted_keys(self._id(table_id))

    def device_table(self) -> Any:
        return self.group.table

    def home(self) -> SlotHome:
        """The group holding every key of this table: the module's own."""
        return SlotHome(self.group, self.table_id)


class CachedTableView(TableView):
    """One cached table of a group as a storage holding it as table 0: the union of its cache (the
    fresher rows) and its backing store.

    Its find / insert / erase / size / export / dump / load are the plugin ``Storage`` contract
    over both tiers, each failure-atomic as the module docstring of
    :mod:`~dynamicemb_core.storage.grouped_cache` describes: writes go to the backing store first
    and drop the cache's copy only after it acknowledged.
    """

    @property
    def _cache(self) -> CacheTier:
        cache = self.group.cache
        assert cache is not None
        return cache

    @property
    def backing(self) -> Any:
        """The table's backing store as given (a host table, or the plugin storage)."""
        return self._cache.backing.store(self.table_id)

    @backing.setter
    def backing(self, store: Any) -> None:
        self._cache.backing.replace(self.table_id, store)

    @property
    def backing_ids(self) -> List[int]:
        """The table's id in :attr:`backing` (one entry: this view holds one table)."""
        return [self._cache.backing.backing_ids[self.table_id]]

    @property
    def strict_prefetch(self) -> bool:
        """Raise (``DynamicEmbError``, before writing) instead of warning when a prefetch's keys
        cannot all be pinned in their cache buckets (shared by the group's cached tables)."""
        return self._cache.strict_prefetch

    @strict_prefetch.setter
    def strict_prefetch(self, value: bool) -> None:
        self._cache.strict_prefetch = bool(value)

    def _ids(self, keys: torch.Tensor) -> torch.Tensor:
        return torch.full_like(keys, self.table_id)

    def home(self) -> SlotHome:
        """The host table behind the cache, with the cache's flush and invalidation.

        Raises:
            NotImplementedError: the backing store is an external storage (no slots).
        """
        backing = self._cache.backing.built(self.table_id)
        if not isinstance(backing, GroupedDeviceStorage):
            raise NotImplementedError(
                f"table '{self.tables[0].name}': its keys live in external storage "
                f"{type(backing).__name__}; slot-based checkpoints (DynamicEmbDump, "
                "incremental_dump, replay_increment) need a hash-table storage. Use the "
                "storage's own dump()/load() for it."
            )
        return SlotHome(backing, self.backing_ids[0], self.flush, self.drop_from_cache)

    def cached(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) bool: the key is in the device cache now."""
        keys = keys.to(self.device)
        return self.group.find_all(keys, self._ids(keys))[1]

    # ---- Storage (both tiers) -------------------------------------------------------------------
    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self._id(table_id)
        check_find(self.tables, 0, keys)
        keys = keys.to(self.device)
        spec = self.tables[0]
        tids = self._ids(keys)
        res = self.group.table.find(keys, tids)
        slots = torch.where(res.found, res.slots, -1)
        rows = self.group.rows.gather(tids, slots, spec.row_width)
        bfound, brows, bscores = self._cache.backing.find(keys, tids)
        use = bfound & ~res.found
        rows = torch.where(use.unsqueeze(1), brows[:, : spec.row_width], rows)
        scores = bscores[:, : spec.num_scores].clone()
        scores[res.found] = res.scores[res.found][:, : spec.num_scores]
        return res.found | bfound, rows, scores

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        self._id(table_id)
        check_insert(self.tables, 0, keys, rows, scores)
        keys = keys.to(self.device)
        # The backing store first: when it fails, the cache still holds its (fresher) copies.
        self._cache.backing.insert(
            keys, self._ids(keys), rows.to(self.device).float(), scores.to(self.device)
        )
        self._drop_from_cache(keys)

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        self._id(table_id)
        check_erase(self.tables, 0, keys)
        keys = keys.to(self.device)
        # The backing store first: a key erased from the cache only could read a stale row.
        self._cache.backing.erase(keys, self._ids(keys))
        self._drop_from_cache(keys)

    def _drop_from_cache(self, keys: torch.Tensor) -> None:
        """Remove keys from the cache (after the backing store holds what it must), unpinning
        their slots."""
        if keys.numel() == 0 or self._cache.direct[self.table_id]:
            return
        tids = self._ids(keys)
        slots, found = self.group.find_all(keys, tids)
        self._cache.drop_pins(self.table_id, slots[found])
        self.group.table.erase(keys, tids)

    def drop_from_cache(self, keys: torch.Tensor) -> None:
        """Invalidate cached copies of ``keys`` (the checkpoint code wrote the backing store)."""
        self._drop_from_cache(torch.unique(keys.to(self.device)))

    def size(self, table_id: int) -> int:
        """Distinct keys over both tiers (writes the cached rows back first)."""
        t = self._id(table_id)
        self.group.flush()
        return self._cache.backing.size(t)

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        t = self._id(table_id)
        self.group.flush()
        return self._cache.backing.export(t, batch_size)

    def flush(self) -> None:
        """Write the cached rows back to the backing stores, then flush them."""
        self.group.flush()

    def dump(self, path: str) -> None:
        """Write the cached rows back, then let the backing store dump itself."""
        self.group.flush()
        backing = self._cache.backing
        backing.call(self.table_id, "dump", backing.multi(self.table_id).dump, path)

    def load(self, path: str) -> None:
        """Load the backing store; the cache starts empty (only once the store has loaded: a
        failed load keeps the possibly fresher cached rows)."""
        backing = self._cache.backing
        backing.call(self.table_id, "load", backing.multi(self.table_id).load, path)
        self.release_pins()
        self.group.table.clear(self.table_id)

    def close(self) -> None:
        self._cache.backing.multi(self.table_id).close()

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        mine = self.group.memory_usage(mem_type, self.table_id)
        return mine + self._cache.backing.multi(self.table_id).memory_usage(mem_type)

    # ---- cache state ----------------------------------------------------------------------------
    def capacity(self, table_id: int) -> int:
        """Rows of the device cache (0: no cache, every key in the backing store)."""
        t = self._id(table_id)
        return 0 if self._cache.direct[t] else self.group.capacity(t)

    def spills(self, table_id: int) -> int:
        """Keys the cache has written to the backing store to make room."""
        return self._cache.spills[self._id(table_id)]

    def metrics(self, table_id: int) -> Optional[torch.Tensor]:
        """Hits and misses of the cache; placed / evicted / unplaced of the backing store when it
        keeps counters (a host table), else of the cache."""
        from dynamicemb_core.table.metrics import EVICTED, PLACED, UNPLACED

        t = self._id(table_id)
        own = None if self._cache.direct[t] else self.group.metrics(t)
        reader = getattr(self.backing, "metrics", None)
        last = reader(self.backing_ids[0]) if callable(reader) else None
        if own is None:
            return last
        if last is not None:
            cols = [PLACED, EVICTED, UNPLACED]
            own = own.clone()
            own[cols] = last[cols].to(own.device)
        return own

    def reset_metrics(self, table_id: int) -> None:
        t = self._id(table_id)
        self.group.reset_metrics(t)
        reset = getattr(self.backing, "reset_metrics", None)
        if callable(reset):
            reset(self.backing_ids[0])

    def pop_evicted_keys(self, table_id: int) -> torch.Tensor:
        self._id(table_id)
        pop = getattr(self.backing, "pop_evicted_keys", None)
        if callable(pop):
            return pop(self.backing_ids[0]).to(self.device)
        return torch.empty(0, dtype=torch.int64, device=self.device)

    # ---- prefetch pins --------------------------------------------------------------------------
    def pin_counts(self, table_id: int, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64: outstanding prefetches holding each key (0: not pinned)."""
        return self._cache.pin_counts(self._id(table_id), keys.to(self.device))

    def pinned(self, table_id: int) -> int:
        """Keys of the table pinned by outstanding prefetches now."""
        return self._cache.pinned(self._id(table_id))

    def release_pins(self, table_id: Optional[int] = None) -> None:
        """Drop the outstanding prefetches' pins on this table: its keys stay cached but may be
        evicted."""
        if table_id is not None:
            self._id(table_id)
        self._cache.release_pins(self.table_id)

    def prefetch_skipped(self, table_id: int) -> int:
        """Prefetched keys left unpinned so far because their cache bucket was full of pins."""
        return self._cache.prefetch_skipped[self._id(table_id)]
