"""HybridStorage: one hash table whose value rows are split between device and host memory.

The first ``local_hbm_for_values // row_bytes`` slots of a table keep their rows in a device buffer,
the rest in a host buffer (pinned when the device is CUDA). Where a key's row lives follows from its
slot, i.e. from its hash, as DynamicEmb's ``caching=False`` hybrid table does. Keys and scores stay
on the device.

The table grows like a device table (``init_capacity`` doubling up to ``max_capacity`` under load,
NO_EVICTION past it while memory allows):
the hash table calls back after each doubling (``ScoredHashTable.add_growth_listener``) and the
storage moves every row from its old slot to its new one. The device block is sized
``min(capacity, budget rows)``, so slots added beyond the budget are host rows.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core._weak import weak_method
from dynamicemb_core.config import DynamicEmbTableOptions, EvictedItemMode
from dynamicemb_core.storage.device import DeviceStorage, slots_by_block, table_spec_for
from dynamicemb_core.types import MemoryType, StorageTableSpec

__all__ = ["HybridStorage"]

RowBlocks = List[Tuple[torch.Tensor, int]]


class HybridStorage(DeviceStorage):
    """Device + host rows for each table, sized by ``local_hbm_for_values`` (bytes per table).

    On growth the device part is never above the budget, not even while rows move: the live
    device rows are staged in host memory and the old device block is released before the new
    one is allocated (a doubling copies the table's live rows once through the host).

    Args:
        tables, device, table_options, evicted_item_mode: as :class:`DeviceStorage`.
        hbm_bytes: per table, bytes of device memory for rows; default: each table's
            ``local_hbm_for_values`` from ``table_options``.
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str,
        *,
        table_options: Optional[Sequence[Optional[DynamicEmbTableOptions]]] = None,
        evicted_item_mode: Optional[EvictedItemMode] = None,
        hbm_bytes: Optional[Sequence[int]] = None,
    ) -> None:
        opts = list(table_options) if table_options is not None else [None] * len(tables)
        if hbm_bytes is None:
            hbm_bytes = [int(o.local_hbm_for_values) if o is not None else 0 for o in opts]
        self._hbm_bytes = list(hbm_bytes)
        super().__init__(tables, device, table_options=opts, evicted_item_mode=evicted_item_mode)
        self._blocks: Dict[int, RowBlocks] = {
            t: self._new_blocks(t, self.table.capacity(t)) for t in range(len(self.tables))
        }
        self.table.add_growth_listener(weak_method(self._move_rows))

    def budget_rows(self, table_id: int) -> int:
        """Rows of table ``table_id`` that fit in its device budget (``hbm_bytes``)."""
        spec = self.tables[table_id]
        row_bytes = max(1, spec.row_width * torch.empty(0, dtype=spec.dtype).element_size())
        return int(self._hbm_bytes[table_id]) // row_bytes

    def _new_blocks(self, table_id: int, capacity: int) -> RowBlocks:
        """Zeroed ``[(device block, 0), (host block, device rows)]`` for ``capacity`` slots."""
        spec = self.tables[table_id]
        dev_rows = min(capacity, self.budget_rows(table_id))
        shape = (capacity - dev_rows, spec.row_width)
        dev_buf = torch.zeros((dev_rows, spec.row_width), dtype=spec.dtype, device=self.device)
        host_buf = torch.zeros(shape, dtype=spec.dtype, device="cpu")
        if self.device.type == "cuda" and host_buf.numel():
            host_buf = host_buf.pin_memory()
        return [(dev_buf, 0), (host_buf, dev_rows)]

    def _stage_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        """(m, row_width) host copy of the rows at ``slots`` (any block)."""
        spec = self.tables[table_id]
        staged = torch.empty((slots.numel(), spec.row_width), dtype=spec.dtype, device="cpu")
        for buffer, idx, local in slots_by_block(self._blocks[table_id], slots):
            staged[idx.cpu()] = buffer[local].cpu()
        return staged

    def _move_rows(self, table_id: int, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
        """Growth listener: rebuild the blocks at the new capacity, each row at its new slot."""
        staged = self._stage_rows(table_id, old_slots)
        # The old blocks are dropped here, so the new device block never coexists with the old.
        del self._blocks[table_id]
        blocks = self._new_blocks(table_id, self.table.capacity(table_id))
        for buffer, idx, local in slots_by_block(blocks, new_slots):
            buffer[local] = staged[idx.cpu()].to(buffer.device)
        self._blocks[table_id] = blocks

    def _table_spec(
        self,
        spec: StorageTableSpec,
        options: Optional[DynamicEmbTableOptions],
        capacity: Optional[int],
        evicted_item_mode: Optional[EvictedItemMode],
    ) -> Any:
        return table_spec_for(
            spec,
            options,
            row_width=0,
            capacity=capacity,
            evicted_item_mode=evicted_item_mode,
        )

    def device_rows(self, table_id: int) -> int:
        """Slots whose rows live in device memory."""
        return self._blocks[table_id][1][1]

    def row_blocks(self, table_id: int) -> RowBlocks:
        """``[(device block, 0), (host block, device rows)]``; replaced when the table grows."""
        return self._blocks[table_id]

    def read_rows(self, table_id: int, slots: torch.Tensor) -> torch.Tensor:
        spec = self.tables[table_id]
        out = torch.zeros((slots.numel(), spec.row_width), dtype=spec.dtype, device=self.device)
        for buffer, idx, local in slots_by_block(self._blocks[table_id], slots):
            out[idx] = buffer[local].to(self.device)
        return out

    def write_rows(self, table_id: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        for buffer, idx, local in slots_by_block(self._blocks[table_id], slots):
            buffer[local] = rows[idx].to(buffer.device, buffer.dtype)

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        total = 0
        for blocks in self._blocks.values():
            for buffer, _ in blocks:
                on_host = buffer.device.type == "cpu"
                kind = MemoryType.HOST if on_host else MemoryType.DEVICE
                if self.device.type == "cpu":
                    # On a CPU table both halves are host memory, but keep the split visible: the
                    # first block counts as DEVICE, as it would on an accelerator.
                    kind = MemoryType.DEVICE if buffer is blocks[0][0] else MemoryType.HOST
                if kind is mem_type:
                    total += buffer.numel() * buffer.element_size()
        return total
