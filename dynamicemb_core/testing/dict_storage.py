"""``PyDictStorage``: the reference Storage, a Python dict per table.

It is the simplest thing that satisfies the multi-table :class:`~dynamicemb_core.types.Storage`
contract (one call may mix tables: each pair goes to its table's dict), so it
serves as the oracle the conformance suite's behaviour is checked against, as the dict-backed
external storage NVIDIA's docs point users to, and as a template for new backends. Single process,
host memory, a Python loop per key: not for production.
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.storage.contract.checks import (
    check_export_ids,
    check_insert,
    check_insert_pairs,
    check_pairs,
    check_table_ids,
    check_table_specs,
    common_row_dtype,
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
        common_row_dtype(tables)
        super().__init__(tables, torch.device(device))
        self._data: List[Dict[int, _Entry]] = [{} for _ in self.tables]

    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = check_pairs(self.tables, keys, table_ids)
        found = torch.zeros(n, dtype=torch.bool)
        rows = torch.zeros(n, self.max_row_width, dtype=self.row_dtype)
        scores = torch.zeros(n, self.max_num_scores, dtype=torch.int64)
        for i, (key, t) in enumerate(zip(keys.tolist(), table_ids.tolist())):
            entry = self._data[t].get(key)
            if entry is not None:
                spec = self.tables[t]
                found[i] = True
                rows[i, : spec.row_width] = entry[0].to(self.row_dtype)
                scores[i, : spec.num_scores] = entry[1]
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        check_insert_pairs(self.tables, keys, table_ids, rows, scores)
        rows_cpu = rows.detach().to("cpu")
        scores_cpu = scores.detach().to("cpu")
        for i, (key, t) in enumerate(zip(keys.tolist(), table_ids.tolist())):
            spec = self.tables[t]
            self._data[t][key] = (
                rows_cpu[i, : spec.row_width].to(spec.dtype).clone(),
                scores_cpu[i, : spec.num_scores].clone(),
            )

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        check_pairs(self.tables, keys, table_ids)
        for key, t in zip(keys.tolist(), table_ids.tolist()):
            self._data[t].pop(key, None)

    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        return [len(self._data[t]) for t in check_table_ids(self.tables, table_ids)]

    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        ids = check_export_ids(self.tables, table_ids, batch_size)
        # a snapshot: later writes do not disturb the export
        items = [(t, k, entry) for t in ids for k, entry in list(self._data[t].items())]
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            n = len(chunk)
            tids = torch.tensor([t for t, _, _ in chunk], dtype=torch.int64)
            keys = torch.tensor([k for _, k, _ in chunk], dtype=torch.int64)
            rows = torch.zeros(n, self.max_row_width, dtype=self.row_dtype)
            scores = torch.zeros(n, self.max_num_scores, dtype=torch.int64)
            for i, (_, _, (row, words)) in enumerate(chunk):
                rows[i, : row.numel()] = row.to(self.row_dtype)
                scores[i, : words.numel()] = words
            yield (
                keys.to(self.device),
                tids.to(self.device),
                rows.to(self.device),
                scores.to(self.device),
            )

    def dump(self, path: str) -> None:
        """Write every table to ``path/<table>.pt`` (keys, rows, scores at the table's own width)."""
        os.makedirs(path, exist_ok=True)
        for table_id, spec in enumerate(self.tables):
            data = self._data[table_id]
            keys = torch.tensor(list(data), dtype=torch.int64)
            rows, scores = self._empty(spec)[1:]
            if data:
                rows = torch.stack([r for r, _ in data.values()])
                scores = torch.stack([s for _, s in data.values()])
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
            data = self._data[table_id]
            data.clear()
            for i, key in enumerate(blob["keys"].tolist()):
                data[key] = (blob["rows"][i].clone(), blob["scores"][i].clone())

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
