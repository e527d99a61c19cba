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

It is also a plain multi-table :class:`~dynamicemb_core.storage.DeviceStorage` (find / insert /
export by table id, ``read_rows`` / ``write_rows`` / ``row_blocks``), which is what the checkpoint
code and the per-table views (:class:`TableView`) use.

Host synchronisations: :meth:`acquire_all` decides growth from host-side sizes (exact after each
of its own calls, read again only after another call changed the table) and the caller's per-table
unique counts, inserts with no readback, and reads one small tensor back (new and unplaced counts,
sizes after the insert) so that new rows are initialised and evictions counted without more syncs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbTableOptions, EvictedItemMode
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.storage.device import DeviceStorage, table_spec_for
from dynamicemb_core.storage.grouped_rows import ROW_DTYPES, GroupedRows
from dynamicemb_core.storage.tier import LookupTier, RowInit, RowUpdate, TierRows
from dynamicemb_core.types import MemoryType, StorageTableSpec

__all__ = ["GroupAcquire", "GroupedDeviceStorage", "GroupInit", "TableView"]

# init(keys (m,), table_ids (m,)) -> (m, max row_width) rows of new keys (embedding, fresh state).
GroupInit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class GroupAcquire:
    """What :meth:`GroupedDeviceStorage.acquire_all` did for u unique keys.

    Attributes:
        slots: (u,) int64 table-local slot of each key, -1 where the key found no room.
        unplaced: how many slots are -1 (those keys read as zeros and get no update).
        fresh_index: (m,) int64 positions of the keys that got initial rows (new and placed).
        fresh_rows: (m, max row_width) those rows, already written to the buffer.
        unplaced_per_table: per table, how many of its keys have slot -1 (None when none has).
    """

    slots: torch.Tensor
    unplaced: int
    fresh_index: torch.Tensor
    fresh_rows: Optional[torch.Tensor]
    unplaced_per_table: Optional[List[int]] = None


class GroupedDeviceStorage(DeviceStorage):
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
    ) -> None:
        dtypes = {spec.dtype for spec in tables}
        if len(dtypes) != 1 or not dtypes <= set(ROW_DTYPES):
            raise ValueError(
                "GroupedDeviceStorage: the tables of a group share one row dtype out of "
                f"{list(ROW_DTYPES)}, got {dict((s.name, s.dtype) for s in tables)}"
            )
        # What the embeddings are stored in. The rows this storage takes and returns (insert, find,
        # export, read_rows, write_rows) are logical float32 rows whatever the dtype, so the
        # tables' specs say float32; a half-precision table's optimizer state stays float32.
        self.dtype: torch.dtype = next(iter(dtypes))
        tables = [dataclasses.replace(spec, dtype=torch.float32) for spec in tables]
        super().__init__(tables, device, table_options=table_options)
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
        self.table.add_growth_listener(self._move_rows)
        self._retain = any(
            o is not None and o.evicted_item_mode == EvictedItemMode.RETAIN_KEY
            for o in self.table_options
        )
        self._sizes: List[int] = [0] * len(self.tables)
        self._sizes_epoch = self.table.placement_epoch

    def _table_spec(
        self,
        spec: StorageTableSpec,
        options: Optional[DynamicEmbTableOptions],
        capacity: Optional[int],
        evicted_item_mode: Optional[EvictedItemMode],
    ) -> Any:
        # Keys only: the rows live in the flat buffer, not in the hash table.
        return table_spec_for(
            spec, options, row_width=0, capacity=capacity, evicted_item_mode=evicted_item_mode
        )

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

    def device_rows(self, table_id: int) -> int:
        """Slots of table ``table_id`` whose rows live in device memory."""
        return self.rows.device_rows[table_id]

    def table_rows(self, table_id: int) -> torch.Tensor:
        """Table ``table_id``'s (device rows, row_width) device rows, a view (replaced on growth)."""
        return self.rows.blocks(table_id)[0][0]

    # ---- DeviceStorage rows ---------------------------------------------------------------------
    def read_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        tids = torch.full_like(slots, table_id)
        # Unchecked: a slot outside the table reads as zeros, as slot -1 does.
        return self.rows.gather(tids, slots, self.widths[table_id])

    def write_rows(self, table_id: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        tids = torch.full_like(slots, table_id)
        self.rows.scatter(tids, slots, rows.to(self.device, torch.float32), check=True)

    def row_blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
        return self.rows.blocks(table_id)

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
        if self.table.placement_epoch != self._sizes_epoch:
            self._sizes = [int(s) for s in self.table.state.sizes.tolist()]
            self._sizes_epoch = self.table.placement_epoch
        return self._sizes

    def acquire_all(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        table_counts: Sequence[int],
        init: GroupInit,
    ) -> GroupAcquire:
        """Make unique ``(table id, key)`` pairs resident; new keys get ``init`` rows.

        Args:
            keys, table_ids: (u,) int64 on the device, distinct pairs (segmented_unique's).
            table_counts: per table, how many of the pairs are its (host ints).
            init: the rows of new keys.
        """
        T = len(self.tables)
        sizes = self._known_sizes()
        res = self.table.find_or_insert_counted(
            keys, table_ids, table_counts, sizes, report_evicted=self._retain
        )
        slots, is_new = res.slots, res.is_new
        # The one readback of the step's table work: per table the keys placed new and the keys
        # left unplaced (counted without hot atomics), and the sizes after the insert.
        per_table = lookup_ops.placement_counts(table_ids, slots, is_new, T)
        host = torch.cat([per_table.reshape(-1), self.table.state.sizes]).tolist()
        placed, unplaced_by_table, after = host[0 : 2 * T : 2], host[1 : 2 * T : 2], host[2 * T :]
        num_missing, unplaced = sum(placed), sum(unplaced_by_table)
        # A table's size moves only by keys placed and keys evicted during the call.
        evicted = [sizes[t] + placed[t] - after[t] for t in range(T)]
        self.table.counters.add(
            [
                [int(table_counts[t]) - placed[t] - unplaced_by_table[t]]
                + [placed[t] + unplaced_by_table[t], placed[t], evicted[t], unplaced_by_table[t]]
                for t in range(T)
            ]
        )
        if self._retain:
            self._count_evicted_by_table(res)
        else:
            for t in range(T):
                self._evicted_counts[t] += evicted[t]
        self._sizes = [int(s) for s in after]
        self._sizes_epoch = self.table.placement_epoch
        by_table = unplaced_by_table if unplaced else None
        if num_missing == 0:
            return GroupAcquire(slots, unplaced, slots[:0], None, by_table)
        # Only keys that got a slot get initial rows: an unplaced key (slot -1) reads as zeros.
        missing = is_new & (slots >= 0)
        if self.device.type == "cuda":
            idx = torch.nonzero_static(missing, size=num_missing).squeeze(1)
        else:
            idx = missing.nonzero().squeeze(1)
        fresh = init(keys[idx], table_ids[idx])
        self.rows.scatter(table_ids[idx], slots[idx], fresh)
        return GroupAcquire(slots, unplaced, idx, fresh, by_table)

    def _count_evicted_by_table(self, result: Any) -> None:
        ev = result.evicted
        if ev is not None and ev.keys is not None and ev.keys.numel():
            per = torch.bincount(ev.table_ids, minlength=len(self.tables)).tolist()
            for t, c in enumerate(per):
                self._evicted_counts[t] += int(c)

    def find_all(
        self, keys: torch.Tensor, table_ids: torch.Tensor, *, touch: bool = False
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(slots, found)`` of unique pairs without inserting (eval; stale-slot refresh)."""
        res = self.table.find(keys, table_ids, update_score=touch)
        return torch.where(res.found, res.slots, -1), res.found


class TableView(LookupTier):
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

    # ---- LookupTier (per-table access; the module's step goes through the group) ------------
    def lookup(self, table_id: int, keys: torch.Tensor, *, touch: bool) -> TierRows:
        return self.group.lookup(self._id(table_id), keys, touch=touch)

    def acquire(
        self, table_id: int, keys: torch.Tensor, init: RowInit, *, with_rows: bool = True
    ) -> TierRows:
        return self.group.acquire(self._id(table_id), keys, init, with_rows=with_rows)

    def update(
        self,
        table_id: int,
        keys: torch.Tensor,
        homes: torch.Tensor,
        grads: torch.Tensor,
        apply: RowUpdate,
    ) -> None:
        self.group.update(self._id(table_id), keys, homes, grads, apply)

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
