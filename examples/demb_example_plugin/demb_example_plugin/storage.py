"""``ArrayStorage``: rows in one growable host tensor per table, with a dict from key to row index.

An example of the per-table storage contract (``PerTableStorage``: one table id per call), not a
production tier: it shows the validation helpers, the shapes ``find`` must return, and a vectorized
gather/scatter behind a Python index. The core reaches it through its per-table adapter, which
splits each multi-table call by table id; a backend that can serve several tables in one round
trip implements ``Storage`` (``find(keys, table_ids)``) instead, as demb-redis does.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Sequence, Tuple

import torch

from dynamicemb_core.plugins.storage_checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
    check_table_specs,
)
from dynamicemb_core.types import MemoryType, PerTableStorage, StorageTableSpec


class _Table:
    """Rows ``[0, size)`` of ``rows``/``scores`` are live; ``index`` maps key -> row."""

    def __init__(self, spec: StorageTableSpec) -> None:
        self.rows = torch.empty(16, spec.row_width, dtype=spec.dtype)
        self.scores = torch.empty(16, spec.num_scores, dtype=torch.int64)
        self.keys: List[int] = []
        self.index: Dict[int, int] = {}

    def grow_to(self, n: int) -> None:
        if n > self.rows.shape[0]:
            cap = max(n, 2 * self.rows.shape[0])
            self.rows = torch.cat(
                [
                    self.rows,
                    torch.empty(
                        cap - self.rows.shape[0], self.rows.shape[1], dtype=self.rows.dtype
                    ),
                ]
            )
            self.scores = torch.cat(
                [
                    self.scores,
                    torch.empty(
                        cap - self.scores.shape[0], self.scores.shape[1], dtype=torch.int64
                    ),
                ]
            )


class ArrayStorage(PerTableStorage):
    """Host-memory storage with vectorized row copies.

    Args:
        tables: the logical tables, in table-id order.
        device: where ``find`` and ``export`` return tensors.
    """

    def __init__(
        self, tables: Sequence[StorageTableSpec], device: torch.device | str = "cpu"
    ) -> None:
        check_table_specs(type(self).__name__, tables)  # validate before building anything
        super().__init__(tables, torch.device(device))
        self._tables = [_Table(spec) for spec in self.tables]

    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = check_find(self.tables, table_id, keys)
        t = self._tables[table_id]
        idx = torch.tensor([t.index.get(k, -1) for k in keys.tolist()], dtype=torch.int64)
        found = idx >= 0
        rows = torch.zeros(keys.numel(), spec.row_width, dtype=spec.dtype)
        scores = torch.zeros(keys.numel(), spec.num_scores, dtype=torch.int64)
        rows[found], scores[found] = t.rows[idx[found]], t.scores[idx[found]]
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        check_insert(
            self.tables, table_id, keys, rows, scores
        )  # whole batch checked before writing
        t = self._tables[table_id]
        positions = []
        for k in keys.tolist():
            if k not in t.index:
                t.index[k] = len(t.keys)
                t.keys.append(k)
            positions.append(t.index[k])
        t.grow_to(len(t.keys))
        pos = torch.tensor(positions, dtype=torch.int64)
        t.rows[pos], t.scores[pos] = rows.detach().cpu(), scores.detach().cpu()

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        check_erase(self.tables, table_id, keys)
        t = self._tables[table_id]
        for k in keys.tolist():
            i = t.index.pop(k, None)
            if i is None:
                continue
            last = len(t.keys) - 1  # move the last row into the hole
            if i != last:
                moved = t.keys[last]
                t.keys[i], t.index[moved] = moved, i
                t.rows[i], t.scores[i] = t.rows[last], t.scores[last]
            t.keys.pop()

    def size(self, table_id: int) -> int:
        check_table_id(self.tables, table_id)
        return len(self._tables[table_id].keys)

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        check_table_id(self.tables, table_id)
        t = self._tables[table_id]
        n = len(t.keys)
        keys = torch.tensor(t.keys, dtype=torch.int64)
        rows, scores = t.rows[:n].clone(), t.scores[:n].clone()  # snapshot
        for lo in range(0, n, batch_size):
            yield (
                keys[lo : lo + batch_size].to(self.device),
                rows[lo : lo + batch_size].to(self.device),
                scores[lo : lo + batch_size].to(self.device),
            )

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        if mem_type is not MemoryType.HOST:
            return 0
        return sum(t.rows.nbytes + t.scores.nbytes for t in self._tables)
