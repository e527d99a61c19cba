"""HybridStorage: one hash table whose value rows are split between device and host memory.

The first ``local_hbm_for_values // row_bytes`` slots of a table keep their rows in a device buffer,
the rest in a host buffer (pinned when the device is CUDA). Where a key's row lives follows from its
slot, i.e. from its hash, as DynamicEmb's ``caching=False`` hybrid table does. Keys and scores stay
on the device. The table is allocated at its maximum capacity (no expansion), because expansion
moves only the table's own buffers.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbTableOptions, EvictedItemMode
from dynamicemb_core.storage.device import DeviceStorage, slots_by_block, table_spec_for
from dynamicemb_core.types import MemoryType, StorageTableSpec

__all__ = ["HybridStorage"]


class HybridStorage(DeviceStorage):
    """Device + host rows for each table, sized by ``local_hbm_for_values`` (bytes per table).

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
        self._blocks: Dict[int, List[Tuple[torch.Tensor, int]]] = {}
        host = torch.device("cpu")
        pin = self.device.type == "cuda"
        for t, spec in enumerate(self.tables):
            cap = self.table.capacity(t)
            row_bytes = max(1, spec.row_width * torch.empty(0, dtype=spec.dtype).element_size())
            dev_rows = min(cap, self._hbm_bytes[t] // row_bytes)
            dev_buf = torch.zeros((dev_rows, spec.row_width), dtype=spec.dtype, device=self.device)
            host_buf = torch.zeros((cap - dev_rows, spec.row_width), dtype=spec.dtype, device=host)
            if pin and host_buf.numel():
                host_buf = host_buf.pin_memory()
            self._blocks[t] = [(dev_buf, 0), (host_buf, dev_rows)]

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
            fixed_capacity=True,
        )

    def device_rows(self, table_id: int) -> int:
        """Slots whose rows live in device memory."""
        return self._blocks[table_id][1][1]

    def row_blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
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
