"""What the lookup needs from a table's storage, beyond the plugin ``Storage`` ABC.

The batched module talks to each table's storage through :class:`LookupTier`: it resolves unique keys
to *homes* and full rows, and later applies the fused optimizer at those homes. A home is:

- ``>= 0``: a slot of the device-resident hash table (rows updated in place by the fused op);
- ``HOME_BACKING`` (-2): the key lives only in the next tier (a cache that had no room for it, or an
  external storage without a cache); it is updated by read-modify-write through the ``Storage`` ABC;
- ``HOME_NONE`` (-1): not stored (not admitted, or nowhere to put it); it gets no update.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from dynamicemb_core.types import PerTableStorage

__all__ = ["HOME_BACKING", "HOME_NONE", "LookupTier", "RowUpdate", "TierRows"]


HOME_NONE = -1
HOME_BACKING = -2

# update(values (k, row_width), slots (k,), grads (k, dim)) applies the optimizer in place.
RowUpdate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
# init(keys (k,)) -> (k, row_width) rows of new keys: embedding from the initializer, fresh state.
RowInit = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class TierRows:
    """Result of a tier lookup for n unique keys.

    Attributes:
        homes: (n,) int64 on the device: slot, HOME_BACKING or HOME_NONE (see module docstring).
        found: (n,) bool, the key was already stored somewhere (False: new or missing).
        rows: (n, row_width) full rows on the device; rows of keys neither found nor initialized are
            unspecified (the caller fills them).
        unplaced: how many homes are HOME_NONE, when the tier already counted them (each count is
            a device-to-host sync on CUDA, so it is read once); None: not counted.
    """

    homes: torch.Tensor
    found: torch.Tensor
    rows: Optional[torch.Tensor]
    unplaced: Optional[int] = None

    def count_unplaced(self) -> int:
        """Keys that got no home (HOME_NONE): the tier's count, or counted now."""
        if self.unplaced is None:
            self.unplaced = int((self.homes == HOME_NONE).sum())
        return self.unplaced

    def full_rows(self) -> torch.Tensor:
        """``rows``, which lookups always fill (only ``acquire(with_rows=False)`` may leave None)."""
        if self.rows is None:
            raise RuntimeError("TierRows.rows was not read (acquire with with_rows=False)")
        return self.rows


class LookupTier(PerTableStorage, metaclass=abc.ABCMeta):
    """A storage the batched module can train through (device table, hybrid, cache).

    Its find / insert / erase / size / export address one table per call (the
    :class:`~dynamicemb_core.types.PerTableStorage` contract); where a multi-table
    :class:`~dynamicemb_core.types.Storage` is needed (a host table behind a cache, the
    conformance suite) it is wrapped by ``dynamicemb_core.plugins.as_storage``.
    """

    @abc.abstractmethod
    def lookup(self, table_id: int, keys: torch.Tensor, *, touch: bool) -> TierRows:
        """Find unique keys in every tier without inserting; ``touch`` updates their scores."""

    @abc.abstractmethod
    def acquire(
        self, table_id: int, keys: torch.Tensor, init: RowInit, *, with_rows: bool = True
    ) -> TierRows:
        """Make unique keys resident (training): found keys keep their rows, new keys get ``init``.

        All keys of one call are placed in one table call, so no key of the call can evict another
        key of the same call (table_design.md, rule 4). With ``with_rows=False`` a tier may leave
        ``rows`` None when every key got a slot (the caller then reads :meth:`embedding_rows`).
        """

    def embedding_rows(self, table_id: int, dim: int) -> Optional[torch.Tensor]:
        """A (capacity, dim) view of the embedding columns of the device rows, indexed by slot.

        None when rows are not one device buffer (hybrid), so the caller gathers them instead.
        """
        return None

    @abc.abstractmethod
    def update(
        self,
        table_id: int,
        keys: torch.Tensor,
        homes: torch.Tensor,
        grads: torch.Tensor,
        apply: RowUpdate,
    ) -> None:
        """Apply ``apply`` to the rows of ``keys`` at ``homes`` (HOME_NONE entries skipped)."""

    def placement_epoch(self, table_id: int) -> Optional[int]:
        """A number that changes whenever homes handed out earlier may have gone stale (keys
        moved by growth, evicted, erased), or None when this tier's homes never go stale (it
        finds keys by key in :meth:`update`). The batched module keeps a forward's homes for its
        backward and looks the keys up again only when this changed in between (a prefetch or
        another forward ran)."""
        return None

    def prefetch(self, table_id: int, keys: torch.Tensor, init: RowInit) -> None:
        """Bring keys close to the device ahead of a forward; default: same as :meth:`acquire`."""
        self.acquire(table_id, keys, init)

    def evictions(self, table_id: int) -> int:
        """Keys this storage's last tier has dropped so far (for counters and the demo)."""
        return 0

    def metrics(self, table_id: int) -> Optional[torch.Tensor]:
        """(5,) int64 placement counters of the table on the device, in the order of
        :data:`dynamicemb_core.table.metrics.METRIC_NAMES`; None when this storage keeps none."""
        return None

    def reset_metrics(self, table_id: int) -> None:
        """Zero the table's placement counters."""

    def capacity(self, table_id: int) -> int:
        """Slots of the device-resident table (0 when there is none)."""
        return 0

    def pop_evicted_keys(self, table_id: int) -> torch.Tensor:
        """Keys dropped by the last tier under RETAIN_KEY, read and cleared (empty by default)."""
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def device_table(self) -> Optional[object]:
        """The device-resident ScoredHashTable, if any (checkpoints and incremental dumps use it)."""
        return None
