"""Between the two storage contracts: the per-table adapter and one-table calls on a Storage.

:class:`PerTableAdapter` presents a :class:`~dynamicemb_core.types.PerTableStorage` (a plugin written
against the per-table contract, or one of the core's tiers) as a multi-table
:class:`~dynamicemb_core.types.Storage`: it validates the whole call, groups the pairs by table id
(one stable sort), makes one per-table call for each table present, in table-id order, and scatters
the results back into the call's order (rows converted to the common row dtype and padded).

:func:`as_storage` is the one place that choice is made: plugin resolution, the device cache and
the conformance suites all call it. :func:`find_in_table`, :func:`insert_in_table`,
:func:`erase_in_table`, :func:`size_of_table` and :func:`export_table` are the other direction: one
table's call on a multi-table storage, with that table's own row width, dtype and score words.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from dynamicemb_core.storage.contract.checks import (
    check_erase,
    check_export,
    check_export_ids,
    check_find,
    check_insert,
    check_insert_pairs,
    check_pairs,
    check_table_id,
    check_table_ids,
    common_row_dtype,
)
from dynamicemb_core.types import MemoryType, PerTableStorage, Storage

__all__ = [
    "AnyStorage",
    "PerTableAdapter",
    "TableGroups",
    "as_storage",
    "erase_in_table",
    "export_table",
    "find_in_table",
    "insert_in_table",
    "size_of_table",
    "split_by_table",
]

AnyStorage = Union[Storage, PerTableStorage]

Rows = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class TableGroups:
    """A call's pairs grouped by table id: one stable sort, one read back of the per-table counts.

    Attributes:
        order: (n,) int64 positions of the call, sorted by table id (stable: the call's order
            within each table).
        parts: ``[(table id, positions)]`` for each table present, ascending by id; each
            ``positions`` is a slice of ``order``.
        spans: ``[(table id, start, end)]``: the same tables' ranges in ``order``, so that
            ``sort(x)[start:end]`` (a view of one gather, ``x[order]``) is the table's share.
    """

    def __init__(self, table_ids: torch.Tensor) -> None:
        self.n = table_ids.numel()
        self.order = torch.argsort(table_ids, stable=True)
        self.parts: List[Tuple[int, torch.Tensor]] = []
        self.spans: List[Tuple[int, int, int]] = []
        if self.n:
            present, counts = torch.unique_consecutive(table_ids[self.order], return_counts=True)
            sizes = counts.tolist()
            ids = [int(t) for t in present.tolist()]
            self.parts = list(zip(ids, torch.split(self.order, sizes)))
            start = 0
            for t, size in zip(ids, sizes):
                self.spans.append((t, start, start + size))
                start += size

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (n, ...) in table order (one gather; no copy when one table is present)."""
        return x if len(self.spans) <= 1 else x[self.order]

    def merge(
        self,
        storage: Storage,
        results: Sequence[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Find results covering the call in table order (one per table present, or fewer that
        cover several tables each) -> one find result in the call's order, padded to
        ``storage``'s widths, on the results' device (one scatter per output)."""
        width, words = storage.max_row_width, storage.max_num_scores
        if not results:
            dev = storage.device
            return (
                torch.zeros(0, dtype=torch.bool, device=dev),
                torch.zeros(0, width, dtype=storage.row_dtype, device=dev),
                torch.zeros(0, words, dtype=torch.int64, device=dev),
            )
        dev = results[0][1].device

        def pad(t: torch.Tensor, w: int) -> torch.Tensor:
            t = t.to(dev)
            return t if t.shape[1] == w else torch.nn.functional.pad(t, (0, w - t.shape[1]))

        def joined(parts: List[torch.Tensor]) -> torch.Tensor:
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        found = joined([f.to(dev) for f, _, _ in results])
        rows = joined([pad(r.to(storage.row_dtype), width) for _, r, _ in results])
        scores = joined([pad(s, words) for _, _, s in results])
        if len(self.spans) <= 1:  # one table: the order is the identity
            return found, rows, scores
        order = self.order.to(dev)
        return tuple(  # type: ignore[return-value]
            torch.empty_like(x).index_copy_(0, order, x) for x in (found, rows, scores)
        )


def split_by_table(table_ids: torch.Tensor) -> List[Tuple[int, torch.Tensor]]:
    """``[(table id, positions)]`` for each table present in ``table_ids``, ascending by id
    (see :class:`TableGroups`)."""
    return TableGroups(table_ids).parts


class PerTableAdapter(Storage):
    """A :class:`PerTableStorage` seen through the multi-table :class:`Storage` contract.

    Each call is validated whole before the first per-table call, so bad input in any table writes
    nothing. A failure of the k-th per-table call leaves the earlier tables' writes in place (the
    wrapped storage has no transaction across tables); callers that need failure atomicity (the
    device cache) keep it at their level. Attributes outside the contract (a host table's
    ``table``, ``evictions`` ...) are read from the wrapped storage.

    Args:
        inner: the per-table storage; its tables and device are the adapter's.
    """

    def __init__(self, inner: PerTableStorage) -> None:
        super().__init__(inner.tables, inner.device)
        common_row_dtype(self.tables)  # one rows matrix: tables of one dtype (raises otherwise)
        self.inner = inner

    def find(self, keys: torch.Tensor, table_ids: torch.Tensor) -> Rows:
        check_pairs(self.tables, keys, table_ids)
        groups = TableGroups(table_ids)
        results = [self.inner.find(t, keys[pos]) for t, pos in groups.parts]
        found, rows, scores = groups.merge(self, results)
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        check_insert_pairs(self.tables, keys, table_ids, rows, scores)
        for t, pos in split_by_table(table_ids):
            spec = self.tables[t]
            self.inner.insert(
                t,
                keys[pos],
                rows[pos, : spec.row_width].to(spec.dtype),
                scores[pos, : spec.num_scores].contiguous(),
            )

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        check_pairs(self.tables, keys, table_ids)
        for t, pos in split_by_table(table_ids):
            self.inner.erase(t, keys[pos])

    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        return [int(self.inner.size(t)) for t in check_table_ids(self.tables, table_ids)]

    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        for t in check_export_ids(self.tables, table_ids, batch_size):
            spec = self.tables[t]
            for keys, rows, scores in self.inner.export(t, batch_size):
                n = keys.numel()
                wide = torch.zeros(n, self.max_row_width, dtype=self.row_dtype, device=rows.device)
                wide[:, : spec.row_width] = rows.to(self.row_dtype)
                words = torch.zeros(n, self.max_num_scores, dtype=torch.int64, device=scores.device)
                words[:, : spec.num_scores] = scores
                yield keys, torch.full_like(keys, t), wide, words

    def dump(self, path: str) -> None:
        self.inner.dump(path)

    def load(self, path: str) -> None:
        self.inner.load(path)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        return self.inner.memory_usage(mem_type)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class lacks: the wrapped storage's own extras.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def as_storage(storage: AnyStorage) -> Storage:
    """``storage`` as a multi-table :class:`Storage`: itself, or a :class:`PerTableAdapter` over it
    (a :class:`PerTableStorage`, or a ``Storage`` subclass still written with the 0.1 per-table
    signatures, see ``Storage.__init_subclass__``).

    Raises:
        TypeError: for anything that implements neither contract.
    """
    if isinstance(storage, Storage) and not type(storage)._per_table_contract:
        return storage
    if isinstance(storage, (PerTableStorage, Storage)):  # the latter: a 0.1-style Storage
        return PerTableAdapter(storage)  # type: ignore[arg-type]
    raise TypeError(
        f"expected a Storage or a PerTableStorage, got {type(storage).__name__}: {storage!r}"
    )


# ---- one table of a multi-table storage ------------------------------------------------------


def _ids(keys: torch.Tensor, table_id: int) -> torch.Tensor:
    return torch.full_like(keys, int(table_id))


def find_in_table(storage: AnyStorage, table_id: int, keys: torch.Tensor) -> Rows:
    """``(found, rows, scores)`` of ``keys`` in one table, at the table's width, dtype and words."""
    store = as_storage(storage)
    spec = check_find(store.tables, table_id, keys)
    found, rows, scores = store.find(keys, _ids(keys, table_id))
    return found, rows[:, : spec.row_width].to(spec.dtype), scores[:, : spec.num_scores]


def insert_in_table(
    storage: AnyStorage,
    table_id: int,
    keys: torch.Tensor,
    rows: torch.Tensor,
    scores: torch.Tensor,
) -> None:
    """Insert one table's rows (its own width and dtype) and scores into a multi-table storage.

    Raises the contract's ValueError, naming the table, when the rows or scores do not match it.
    """
    store = as_storage(storage)
    spec = check_insert(store.tables, table_id, keys, rows, scores)
    dev, n = keys.device, keys.numel()
    wide = torch.zeros(n, store.max_row_width, dtype=store.row_dtype, device=dev)
    wide[:, : spec.row_width] = rows.to(dev, store.row_dtype)
    words = torch.zeros(n, store.max_num_scores, dtype=torch.int64, device=dev)
    words[:, : spec.num_scores] = scores.to(dev)
    store.insert(keys, _ids(keys, table_id), wide, words)


def erase_in_table(storage: AnyStorage, table_id: int, keys: torch.Tensor) -> None:
    """Erase keys of one table."""
    store = as_storage(storage)
    check_erase(store.tables, table_id, keys)
    store.erase(keys, _ids(keys, table_id))


def size_of_table(storage: AnyStorage, table_id: int) -> int:
    """Keys stored in one table."""
    store = as_storage(storage)
    check_table_id(store.tables, table_id)
    return int(store.sizes([table_id])[0])


def export_table(storage: AnyStorage, table_id: int, batch_size: int = 65536) -> Iterator[Rows]:
    """One table's ``(keys, rows, scores)`` batches, at the table's width, dtype and words."""
    store = as_storage(storage)
    spec = check_export(store.tables, table_id, batch_size)
    for keys, _, rows, scores in store.export([table_id], batch_size):
        yield keys, rows[:, : spec.row_width].to(spec.dtype), scores[:, : spec.num_scores]
