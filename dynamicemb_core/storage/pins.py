"""Per-key pin counts of one cached table: how many prefetched batches still need each key.

A prefetch adds one to each of the keys it pinned and is remembered as an outstanding batch. The
forward that consumes a batch releases the pins of that batch: the oldest outstanding prefetch whose
pinned keys all appear among the forward's keys (TorchRec's pipeline consumes prefetched batches in
order). A forward that matches no outstanding prefetch was not prefetched and releases nothing, so
it cannot end the protection that later batches hold on shared keys. A key whose count reaches zero
is dropped. The keys are kept sorted in one int64 tensor on the table's device, so membership is a
``searchsorted`` and the whole set is one tensor the cache can hand to the hash table (see
:class:`~dynamicemb_core.storage.CachedStorage`).
"""

from __future__ import annotations

from collections import deque
from typing import Deque

import torch

__all__ = ["PinCounts"]


class PinCounts:
    """Sorted pinned keys with counts > 0, on ``device``.

    Attributes:
        keys: (p,) int64, sorted, distinct.
        counts: (p,) int64, all > 0.
        outstanding: the keys each prefetch not yet consumed pinned, oldest first.
    """

    def __init__(self, device: torch.device) -> None:
        self.keys = torch.empty(0, dtype=torch.int64, device=device)
        self.counts = torch.empty(0, dtype=torch.int64, device=device)
        self.outstanding: Deque[torch.Tensor] = deque()

    def __len__(self) -> int:
        return int(self.keys.numel())

    def _positions(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each key, its index in ``self.keys`` and whether it is there."""
        if len(self) == 0:
            zeros = torch.zeros_like(keys)
            return zeros, torch.zeros_like(keys, dtype=torch.bool)
        pos = torch.searchsorted(self.keys, keys).clamp_(max=len(self) - 1)
        return pos, self.keys[pos] == keys

    def is_pinned(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) bool: the key's count is above zero."""
        return self._positions(keys)[1]

    def count(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64 counts (0 for keys that are not pinned)."""
        pos, hit = self._positions(keys)
        if len(self) == 0:
            return torch.zeros_like(keys)
        return torch.where(hit, self.counts[pos], 0)

    def add(self, keys: torch.Tensor) -> None:
        """One prefetched batch more: one more pin on each key (``keys`` distinct, maybe none)."""
        self.outstanding.append(keys)
        if keys.numel() == 0:
            return
        merged, inverse = torch.unique(torch.cat([self.keys, keys]), return_inverse=True)
        counts = torch.zeros_like(merged)
        counts.index_add_(0, inverse, torch.cat([self.counts, torch.ones_like(keys)]))
        self.keys, self.counts = merged, counts

    def consume(self, forward_keys: torch.Tensor) -> None:
        """A forward of ``forward_keys`` ran: release the batch it consumed, if it was prefetched.

        That batch is the oldest outstanding prefetch whose pinned keys are all among
        ``forward_keys``; with none, nothing is released (see the module docstring).
        """
        for i, pinned in enumerate(self.outstanding):
            if bool(torch.isin(pinned, forward_keys).all()):
                del self.outstanding[i]
                self.release(pinned)
                return

    def release(self, keys: torch.Tensor) -> None:
        """One pin less on each pinned key among ``keys`` (distinct); zeros are dropped."""
        if len(self) == 0:
            return
        pos, hit = self._positions(keys)
        if not bool(hit.any()):
            return
        self.counts = self.counts.index_add(0, pos[hit], torch.full_like(pos[hit], -1))
        self._keep(self.counts > 0)

    def drop(self, keys: torch.Tensor) -> None:
        """Unpin ``keys`` whatever their counts (the key left the cache another way)."""
        if len(self) and keys.numel():
            self._keep(~torch.isin(self.keys, keys))
            self.outstanding = deque(b[~torch.isin(b, keys)] for b in self.outstanding)

    def clear(self) -> None:
        self._keep(torch.zeros_like(self.keys, dtype=torch.bool))
        self.outstanding.clear()

    def _keep(self, mask: torch.Tensor) -> None:
        self.keys, self.counts = self.keys[mask], self.counts[mask]
