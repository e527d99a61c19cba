"""Per-key pin counts of one cached table: how many prefetched batches still need each key.

A prefetch adds one to each of its (unique) keys, the forward that consumes a batch takes one off
each of its keys, and a key whose count reaches zero is dropped. The keys are kept sorted in one
int64 tensor on the table's device, so membership is a ``searchsorted`` and the whole set is one
tensor the cache can hand to the hash table (see :class:`~dynamicemb_core.storage.CachedStorage`).
"""

from __future__ import annotations

import torch

__all__ = ["PinCounts"]


class PinCounts:
    """Sorted pinned keys with counts > 0, on ``device``.

    Attributes:
        keys: (p,) int64, sorted, distinct.
        counts: (p,) int64, all > 0.
    """

    def __init__(self, device: torch.device) -> None:
        self.keys = torch.empty(0, dtype=torch.int64, device=device)
        self.counts = torch.empty(0, dtype=torch.int64, device=device)

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
        """One more pin on each key (``keys`` distinct)."""
        if keys.numel() == 0:
            return
        merged, inverse = torch.unique(torch.cat([self.keys, keys]), return_inverse=True)
        counts = torch.zeros_like(merged)
        counts.index_add_(0, inverse, torch.cat([self.counts, torch.ones_like(keys)]))
        self.keys, self.counts = merged, counts

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

    def clear(self) -> None:
        self._keep(torch.zeros_like(self.keys, dtype=torch.bool))

    def _keep(self, mask: torch.Tensor) -> None:
        self.keys, self.counts = self.keys[mask], self.counts[mask]
