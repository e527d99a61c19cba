"""The backing stores of a group's cached tables: one call per store over ``(keys, table_ids)``.

A cached table keeps a device cache in the group's hash table and its full contents in a next tier:
a host table (``caching=True``; one host table holds every such table of the module) or a plugin
:class:`~dynamicemb_core.types.Storage` (``external_storage``; tables naming the same storage object
share it). :class:`BackingStores` maps the group's table ids to ``(store, id in that store)`` and
turns a call over any mix of the group's cached tables into one call per store (usually one), each
failure raised as :class:`StorageTierError` naming the table.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

import torch

from dynamicemb_core.storage.contract.adapter import AnyStorage, as_storage
from dynamicemb_core.types import DynamicEmbError, StorageTableSpec

__all__ = ["BackingStores", "StorageTierError", "fit_columns"]


class StorageTierError(DynamicEmbError):
    """A call to a cache's next tier failed; the cache was left as it was before the call.

    The next tier's own exception is the ``__cause__``. Once the store is back, the same call can be
    repeated (the module keeps working); rows acknowledged before the failure are intact.
    """


class BackingStores:
    """The next tiers of a group's cached tables.

    Args:
        tables: the group's tables (table id = position).
        device: the group's device (results come back there).
        stores: per group table, ``(storage, id in it)``, or None for a table without a next tier.
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device,
        stores: Sequence[Any],
    ) -> None:
        self.tables = list(tables)
        self.device = device
        self.given: List[AnyStorage] = []  # each store as given, once
        self._stores: List[Any] = []  # the same through the multi-table contract
        index: Dict[int, int] = {}
        T = len(self.tables)
        store_of = [-1] * T
        bid = [0] * T
        for t, entry in enumerate(stores):
            if entry is None:
                continue
            store, table_id = entry
            if id(store) not in index:
                index[id(store)] = len(self.given)
                self.given.append(store)
                self._stores.append(as_storage(store))
            store_of[t], bid[t] = index[id(store)], int(table_id)
        self.store_of = store_of
        self.backing_ids = bid
        self._built = list(self.given)  # as built: replace() puts wrappers of the same data
        self._store_of = torch.tensor(store_of, dtype=torch.int64, device=device)
        self._bid = torch.tensor(bid, dtype=torch.int64, device=device)
        self.max_width = max(s.row_width for s in self.tables)
        self.max_scores = max(s.num_scores for s in self.tables)

    def __bool__(self) -> bool:
        return bool(self._stores)

    def store(self, table_id: int) -> AnyStorage:
        """Table ``table_id``'s next tier as given."""
        return self.given[self.store_of[table_id]]

    def replace(self, table_id: int, store: AnyStorage) -> None:
        """Put ``store`` (holding the same tables, e.g. a wrapper) in place of table
        ``table_id``'s store, for every table that shares it."""
        s = self.store_of[table_id]
        self.given[s] = store
        self._stores[s] = as_storage(store)

    def built(self, table_id: int) -> AnyStorage:
        """Table ``table_id``'s next tier as the group was built with it (:meth:`replace` keeps
        the data, so this is where its rows are, whatever wraps it now)."""
        return self._built[self.store_of[table_id]]

    def multi(self, table_id: int) -> Any:
        """Table ``table_id``'s next tier through the multi-table contract."""
        return self._stores[self.store_of[table_id]]

    # ---- errors ----------------------------------------------------------------------------
    def error(self, table_id: int, what: str, exc: BaseException) -> StorageTierError:
        name = self.tables[table_id].name
        store = type(self.store(table_id)).__name__
        return StorageTierError(
            f"table {name!r}: the next tier ({store}) failed to {what}: "
            f"{type(exc).__name__}: {exc}. The cache and the rows acknowledged before this call "
            "are unchanged; retry once the store is back"
        )

    def call(self, table_id: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a failure raised as :class:`StorageTierError` naming ``table_id``."""
        try:
            return fn(*args)
        except StorageTierError:
            raise
        except Exception as exc:
            raise self.error(table_id, what, exc) from exc

    def _by_store(self, table_ids: torch.Tensor) -> List[Tuple[int, torch.Tensor, int]]:
        """``[(store index, positions, a table id of it)]`` for each store the pairs reach."""
        if len(self._stores) == 1:
            first = int(table_ids[0]) if table_ids.numel() else 0
            pos = torch.arange(table_ids.numel(), device=table_ids.device)
            return [(0, pos, first)]
        which = self._store_of[table_ids]
        out = []
        for s in torch.unique(which).tolist():
            pos = (which == s).nonzero().squeeze(1)
            out.append((int(s), pos, int(table_ids[pos[0]])))
        return out

    # ---- data calls --------------------------------------------------------------------------
    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor, what: str = "find keys"
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(found, rows (n, max row width), scores (n, max words))`` on the group's device."""
        n = keys.numel()
        found = torch.zeros(n, dtype=torch.bool, device=self.device)
        rows = torch.zeros(n, self.max_width, dtype=torch.float32, device=self.device)
        scores = torch.zeros(n, self.max_scores, dtype=torch.int64, device=self.device)
        if n == 0:
            return found, rows, scores
        for s, pos, t in self._by_store(table_ids):
            store = self._stores[s]
            dev = store.device
            f, r, w = self.call(
                t, what, store.find, keys[pos].to(dev), self._bid[table_ids[pos]].to(dev)
            )
            width, words = min(r.shape[1], self.max_width), min(w.shape[1], self.max_scores)
            found[pos] = f.to(self.device)
            rows[pos, :width] = r[:, :width].to(self.device, torch.float32)
            scores[pos, :words] = w[:, :words].to(self.device)
        return found, rows, scores

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        what: str = "write rows",
    ) -> None:
        """Insert or overwrite pairs (unique) with their rows and user-order score words."""
        if keys.numel() == 0:
            return
        for s, pos, t in self._by_store(table_ids):
            store = self._stores[s]
            dev = store.device
            width, words = store.max_row_width, store.max_num_scores
            r = fit_columns(rows[pos], width).to(dev, store.row_dtype)
            w = fit_columns(scores[pos], words).to(dev)
            tids = self._bid[table_ids[pos]].to(dev)
            self.call(
                t, f"{what} ({pos.numel()} keys)", store.insert, keys[pos].to(dev), tids, r, w
            )

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        if keys.numel() == 0:
            return
        for s, pos, t in self._by_store(table_ids):
            store = self._stores[s]
            dev = store.device
            tids = self._bid[table_ids[pos]].to(dev)
            self.call(t, "erase keys", store.erase, keys[pos].to(dev), tids)

    def size(self, table_id: int) -> int:
        store = self.multi(table_id)
        sizes = self.call(table_id, "count keys", store.sizes, [self.backing_ids[table_id]])
        return int(sizes[0])

    def export(
        self, table_id: int, batch_size: int
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Table ``table_id``'s ``(keys, rows, scores)`` at its own width and words."""
        spec = self.tables[table_id]
        store = self.multi(table_id)
        try:
            for keys, _, rows, scores in store.export([self.backing_ids[table_id]], batch_size):
                yield keys, rows[:, : spec.row_width].to(spec.dtype), scores[:, : spec.num_scores]
        except StorageTierError:
            raise
        except Exception as exc:
            raise self.error(table_id, "export rows", exc) from exc

    def for_each_store(self, what: str, method: str, *args: Any) -> None:
        """Call ``method(*args)`` on every store (flush, dump, load, close)."""
        for s, store in enumerate(self._stores):
            t = self.store_of.index(s)
            self.call(t, what, getattr(store, method), *args)


def fit_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` with exactly ``width`` columns (cut, or padded with zeros)."""
    if x.shape[1] == width:
        return x
    if x.shape[1] > width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
