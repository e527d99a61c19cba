"""Per-table placement counters of a ScoredHashTable, kept on the table's device.

Every placing call (``find_or_insert``, ``insert_and_evict``, ...) adds to a ``(T, 5)`` int64 tensor
on the device, so counting costs a few small device ops and never a host synchronisation; the
numbers reach the host only when someone reads them (:meth:`PlacementCounters.read`).

Columns (:data:`METRIC_NAMES`), counted per logical table over unique keys:

- ``hits``: keys a lookup (``find_or_insert``) found already stored;
- ``misses``: keys a lookup did not find (``placed`` by it, ``unplaced``, or refused by the table's
  admission strategy), so ``hits + misses`` is the unique keys a training lookup looked up;
- ``placed``: keys a placing call stored for the first time;
- ``evicted``: stored keys a placing call pushed out to make room for new ones;
- ``unplaced``: keys a placing call could not store (their bucket full of keys pinned or written
  by the same call, or a NO_EVICTION table that cannot grow); the lookup reads them as zeros.

``evicted`` is derived on the device as ``placed - (size after - size before)``: a table's size only
changes by keys placed and keys evicted during a placing call.

A caller that reads a call's per-table outcome back anyway (the grouped lookup's one readback per
step) adds it as host ints with :meth:`PlacementCounters.add` instead: no device work at all. Those
counts are kept on the host beside the device ones and summed when read.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["METRIC_NAMES", "PlacementCounters"]

METRIC_NAMES = ("hits", "misses", "placed", "evicted", "unplaced")
HITS, MISSES, PLACED, EVICTED, UNPLACED = range(len(METRIC_NAMES))
# Outcomes PlacementCounters.add keeps before summing them into its host counts.
_MAX_PENDING = 256


class PlacementCounters:
    """``(num_tables, 5)`` int64 counters on ``device`` (columns: :data:`METRIC_NAMES`)."""

    def __init__(self, num_tables: int, device: torch.device) -> None:
        self.counts = torch.zeros(num_tables, len(METRIC_NAMES), dtype=torch.int64, device=device)
        # counts added as host ints (:meth:`add`), summed with ``counts`` when read
        self._host = [[0] * len(METRIC_NAMES) for _ in range(num_tables)]
        self._pending: List[Tuple[Sequence[int], ...]] = []
        # called before the counters are read: an owner whose outcomes arrive late (a deferred
        # placement readback) adds them first
        self.before_read: Optional[Callable[[], None]] = None

    def add(
        self,
        looked_up: Sequence[int],
        placed: Sequence[int],
        evicted: Sequence[int],
        unplaced: Sequence[int],
    ) -> None:
        """Add one lookup's outcome known on the host, per table: the keys looked up (hits are
        the rest after ``placed`` and ``unplaced``), placed new, evicted and left unplaced.

        Kept as given and summed when the counters are read (the lookup calls this once per step
        and its host time is on the step's critical path), or once ``_MAX_PENDING`` have piled up:
        a loop that never reads its metrics keeps a bounded list."""
        self._pending.append((looked_up, placed, evicted, unplaced))
        if len(self._pending) >= _MAX_PENDING:
            self._sum_pending()  # not _fold: an owner's late outcomes wait for a real read

    def _fold(self) -> None:
        """Add the owner's late outcomes, then sum every kept outcome into the host counts."""
        if self.before_read is not None:
            self.before_read()
        self._sum_pending()

    def _sum_pending(self) -> None:
        """Sum the outcomes :meth:`add` kept into the host counts."""
        for looked_up, placed, evicted, unplaced in self._pending:
            for t, mine in enumerate(self._host):
                p, u = int(placed[t]), int(unplaced[t])
                mine[HITS] += int(looked_up[t]) - p - u
                mine[MISSES] += p + u
                mine[PLACED] += p
                mine[EVICTED] += int(evicted[t])
                mine[UNPLACED] += u
        self._pending.clear()

    def add_refused(self, tids: Tensor) -> None:
        """Count keys an admission strategy refused as misses of their tables (device ops only).

        A refused key was looked up and not found; it is neither placed nor unplaced (it was
        never offered to the table), so it counts as a miss and nothing else: ``hits + misses``
        stays the number of unique keys looked up (docs/lookup.md).

        Args:
            tids: (m,) int64 table id of each refused key, on the counters' device.
        """
        if tids.numel():
            self.counts[:, MISSES].index_add_(0, tids, torch.ones_like(tids))

    def record(
        self,
        tids: Tensor,
        slots: Tensor,
        is_new: Optional[Tensor],
        sizes_before: Optional[Tensor],
        sizes_after: Optional[Tensor],
        *,
        lookup: bool,
    ) -> None:
        """Add one placing call's outcome (all tensors on the device; nothing read back).

        Args:
            tids, slots: (n,) the call's table ids and resulting local slots (-1: unplaced).
            is_new: (n,) keys this call stored for the first time; None when the call did not
                report it (then only ``unplaced`` is counted).
            sizes_before, sizes_after: (T,) table sizes around the call (for ``evicted``).
            lookup: the call was a lookup (``find_or_insert``): count hits and misses too.
        """
        if tids.numel() == 0:
            return
        unplaced = slots < 0
        if is_new is None:
            self.counts[:, UNPLACED].index_add_(0, tids, unplaced.to(torch.int64))
            return
        placed = is_new & ~unplaced
        cols = torch.zeros(tids.numel(), len(METRIC_NAMES), dtype=torch.int64, device=tids.device)
        cols[:, PLACED] = placed
        cols[:, UNPLACED] = unplaced
        if lookup:
            cols[:, MISSES] = placed | unplaced
            cols[:, HITS] = ~(placed | unplaced)
        per_table = torch.zeros_like(self.counts).index_add_(0, tids, cols)
        if sizes_before is not None and sizes_after is not None:
            per_table[:, EVICTED] = per_table[:, PLACED] - (sizes_after - sizes_before)
        self.counts += per_table

    def read(self, table_id: Optional[int] = None) -> List[Dict[str, int]]:
        """The counters as ints (one device-to-host copy): every table, or the one given."""
        self._fold()
        tables = range(len(self._host)) if table_id is None else [table_id]
        rows = self.counts if table_id is None else self.counts[table_id : table_id + 1]
        return [
            {name: int(v) + h for name, v, h in zip(METRIC_NAMES, row, self._host[t])}
            for t, row in zip(tables, rows.tolist())
        ]

    def row(self, table_id: int) -> Tensor:
        """(5,) the table's counters, a copy on the device."""
        self._fold()
        host = torch.tensor(self._host[table_id], dtype=torch.int64)
        return self.counts[table_id] + host.to(self.counts.device)

    def reset(self, table_id: Optional[int] = None) -> None:
        """Zero the counters of one table, or of all."""
        self._fold()
        for t in range(len(self._host)) if table_id is None else [table_id]:
            self._host[t] = [0] * len(METRIC_NAMES)
        if table_id is None:
            self.counts.zero_()
        else:
            self.counts[table_id].zero_()
