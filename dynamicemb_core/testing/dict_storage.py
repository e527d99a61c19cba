"""``PyDictStorage``: the reference Storage, a Python dict per table.

It is the simplest thing that satisfies the :class:`~dynamicemb_core.types.Storage` contract, so it
serves as the oracle the conformance suite's behaviour is checked against, as the dict-backed
external storage NVIDIA's docs point users to, and as a template for new backends. Single process,
host memory, a Python loop per key: not for production.
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, List, Sequence, Tuple

import torch

from dynamicemb_core.plugins.storage_checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
    check_table_specs,
)
from dynamicemb_core.types import MemoryType, Storage, StorageTableSpec

__all__ = ["PyDictStorage"]

_Entry = Tuple[torch.Tensor, torch.Tensor]  # (row (row_width,), scores (num_scores,)) on the CPU


class PyDictStorage(Storage):
    """Storage backed by one ``dict[int, (row, scores)]`` per table, in host memory.

    Args:
        tables: the logical tables, in table-id order.
        device: where ``find`` and ``export`` return tensors.
    """

    def __init__(
        self, tables: Sequence[StorageTableSpec], device: torch.device | str = "cpu"
    ) -> None:
        check_table_specs(type(self).__name__, tables)
        super().__init__(tables, torch.device(device))
        self._data: List[Dict[int, _Entry]] = [{} for _ in self.tables]

    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = check_find(self.tables, table_id, keys)
        data = self._data[table_id]
        n = keys.numel()
        found = torch.zeros(n, dtype=torch.bool)
        rows = torch.zeros(n, spec.row_width, dtype=spec.dtype)
        scores = torch.zeros(n, spec.num_scores, dtype=torch.int64)
        for i, key in enumerate(keys.tolist()):
            entry = data.get(key)
            if entry is not None:
                found[i] = True
                rows[i], scores[i] = entry
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        check_insert(self.tables, table_id, keys, rows, scores)
        data = self._data[table_id]
        rows_cpu = rows.detach().to("cpu").clone()
        scores_cpu = scores.detach().to("cpu").clone()
        for i, key in enumerate(keys.tolist()):
            data[key] = (rows_cpu[i], scores_cpu[i])

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        check_erase(self.tables, table_id, keys)
        data = self._data[table_id]
        for key in keys.tolist():
            data.pop(key, None)

    def size(self, table_id: int) -> int:
        check_table_id(self.tables, table_id)
        return len(self._data[table_id])

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        spec = check_table_id(self.tables, table_id)
        if batch_size <= 0:
            raise ValueError(f"table {spec.name!r}: batch_size must be positive, got {batch_size}")
        items = list(self._data[table_id].items())  # a snapshot: later writes do not disturb it
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            keys = torch.tensor([k for k, _ in chunk], dtype=torch.int64)
            rows = torch.stack([r for _, (r, _) in chunk])
            scores = torch.stack([s for _, (_, s) in chunk])
            yield keys.to(self.device), rows.to(self.device), scores.to(self.device)

    def dump(self, path: str) -> None:
        """Write every table to ``path/<table>.pt`` (keys, rows, scores)."""
        os.makedirs(path, exist_ok=True)
        for table_id, spec in enumerate(self.tables):
            parts = list(self.export(table_id)) or [self._empty(spec)]
            keys, rows, scores = (torch.cat([p[i].cpu() for p in parts]) for i in range(3))
            torch.save(
                {"keys": keys, "rows": rows, "scores": scores},
                os.path.join(path, f"{spec.name}.pt"),
            )

    def load(self, path: str) -> None:
        """Replace every table's contents with what :meth:`dump` wrote under ``path``."""
        loaded = []
        for table_id, spec in enumerate(self.tables):
            file = os.path.join(path, f"{spec.name}.pt")
            if not os.path.exists(file):
                raise FileNotFoundError(f"table {spec.name!r}: no dump at {file}")
            blob = torch.load(file, weights_only=True)
            check_insert(self.tables, table_id, blob["keys"], blob["rows"], blob["scores"])
            loaded.append(blob)
        for table_id, blob in enumerate(loaded):  # validated all tables first, now write
            self._data[table_id].clear()
            self.insert(table_id, blob["keys"], blob["rows"], blob["scores"])

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        if mem_type is not MemoryType.HOST:
            return 0
        total = 0
        for spec, data in zip(self.tables, self._data):
            item = torch.empty(0, dtype=spec.dtype).element_size()
            total += len(data) * (8 + spec.row_width * item + 8 * spec.num_scores)
        return total

    @staticmethod
    def _empty(spec: StorageTableSpec) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, spec.row_width, dtype=spec.dtype),
            torch.empty(0, spec.num_scores, dtype=torch.int64),
        )
