"""A counting Bloom filter as an admission :class:`~dynamicemb_core.types.Counter`.

Fixed memory (``num_counters`` int32 cells) whatever the number of distinct keys, at the price of
approximate counts. Each key maps to ``num_hashes`` cells (murmur3 fmix64 of the key xor a per-hash
salt); adding ``f`` adds ``f`` to each of them, and a key's count is the minimum of its cells, so it is
never below the true count and exceeds it only when all its cells collide with other keys' (about
``(1 - exp(-k n / m))^k`` of keys for n distinct keys). Cells saturate at 2^31 - 1 instead of
wrapping.

``erase`` subtracts the key's current estimate from its cells (floored at 0): the key then reads 0,
and a key sharing a cell may lose at most what the erased key was over-counted by.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from dynamicemb_core.table.hashing import hash_keys_tensor
from dynamicemb_core.types import Counter, MemoryType

__all__ = ["CountingBloomCounter"]

_INT32_MAX = 2**31 - 1
_FORMAT = 1  # version of the dump's key_file header
# Odd 64-bit salts (digits of pi); one per hash function, so the k cells of a key are independent.
_SALTS: List[int] = [
    0x243F6A8885A308D3,
    0x13198A2E03707344,
    0x2A4093822299F31D,
    0x082EFA98EC4E6C89,
    0x452821E638D01377,
    0x3E38D4A72F2C7BE5,
    0x0BE5466CF34E90C7,
    0x40D3C9778A5AB6E5,
]


def _as_int64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


class CountingBloomCounter(Counter):
    """Approximate per-key counts in fixed memory.

    Args:
        num_counters: cells in the filter (memory = 4 bytes each).
        num_hashes: cells per key, 1..8.
        device: where the cells live (default CPU); :meth:`create` picks another.
    """

    def __init__(
        self,
        num_counters: int = 1 << 20,
        num_hashes: int = 4,
        device: Optional[torch.device | str] = None,
    ) -> None:
        if int(num_counters) < 1 or not 1 <= int(num_hashes) <= len(_SALTS):
            raise ValueError(
                f"CountingBloomCounter: need num_counters >= 1 and 1 <= num_hashes <= {len(_SALTS)}, "
                f"got num_counters={num_counters}, num_hashes={num_hashes}"
            )
        self.num_counters = int(num_counters)
        self.num_hashes = int(num_hashes)
        self.device = torch.device(device or "cpu")
        self.cells = torch.zeros(self.num_counters, dtype=torch.int32, device=self.device)

    def _cells_of(self, keys: torch.Tensor) -> torch.Tensor:
        """(n, num_hashes) cell indices of each key."""
        keys = keys.to(self.device, torch.int64)
        cols = [hash_keys_tensor(keys ^ _as_int64(salt)) for salt in _SALTS[: self.num_hashes]]
        h = torch.stack(cols, dim=1)
        return (h & ((1 << 63) - 1)) % self.num_counters

    def _estimate(self, idx: torch.Tensor) -> torch.Tensor:
        return (
            self.cells[idx].amin(dim=1).to(torch.int64)
            if idx.numel()
            else torch.zeros(idx.shape[0], dtype=torch.int64, device=self.device)
        )

    def _apply(self, idx: torch.Tensor, delta: torch.Tensor) -> None:
        """cells[idx[i, j]] += delta[i] for every hash j, summed per cell in int64, clamped to int32."""
        flat = idx.reshape(-1)
        if flat.numel() == 0:
            return
        cells, inverse = torch.unique(flat, return_inverse=True)
        total = torch.zeros(cells.numel(), dtype=torch.int64, device=self.device)
        total.index_add_(0, inverse, delta.repeat_interleave(self.num_hashes))
        updated = (self.cells[cells].to(torch.int64) + total).clamp(0, _INT32_MAX)
        self.cells[cells] = updated.to(torch.int32)

    def _check(self, keys: torch.Tensor, frequencies: Optional[torch.Tensor] = None) -> None:
        if keys.dtype != torch.int64 or keys.dim() != 1:
            raise TypeError(
                f"CountingBloomCounter: keys must be 1-D int64, got {keys.dtype} {tuple(keys.shape)}"
            )
        if frequencies is not None and tuple(frequencies.shape) != tuple(keys.shape):
            raise ValueError(
                f"CountingBloomCounter: frequencies must have the keys' shape {tuple(keys.shape)}, "
                f"got {tuple(frequencies.shape)}"
            )

    def add(self, keys: torch.Tensor, frequencies: torch.Tensor, inplace: bool) -> torch.Tensor:
        """Add ``frequencies`` to unique ``keys``; return the (estimated) accumulated counts (n,) int64."""
        self._check(keys, frequencies)
        idx = self._cells_of(keys)
        freq = frequencies.to(self.device, torch.int64)
        if not inplace:
            return (self._estimate(idx) + freq).to(keys.device)
        self._apply(idx, freq)
        return self._estimate(idx).to(keys.device)

    def erase(self, keys: torch.Tensor) -> None:
        """Make ``keys`` read 0 (subtracting their estimate from their cells)."""
        self._check(keys)
        idx = self._cells_of(keys)
        self._apply(idx, -self._estimate(idx))

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of the cell array: DEVICE for a cuda or cpu filter alike (it is the table's device)."""
        return self.cells.numel() * 4 if mem_type is MemoryType.DEVICE else 0

    def dump(self, key_file: str, counter_file: str) -> None:
        """A filter has no key list: ``key_file`` gets its header (format, num_counters, num_hashes)
        as int64, ``counter_file`` the cells as int64."""
        np.array([_FORMAT, self.num_counters, self.num_hashes], dtype="<i8").tofile(key_file)
        self.cells.cpu().numpy().astype("<i8").tofile(counter_file)

    def load(self, key_file: str, counter_file: str) -> None:
        """Read back :meth:`dump`'s files into this filter (same size and hash count required)."""
        header = np.fromfile(key_file, dtype="<i8")
        expected = [_FORMAT, self.num_counters, self.num_hashes]
        if header.tolist() != expected:
            raise ValueError(
                f"CountingBloomCounter.load: {key_file} holds [format, num_counters, num_hashes] = "
                f"{header.tolist()}, this counter is {expected}"
            )
        cells = np.fromfile(counter_file, dtype="<i8")
        if cells.size != self.num_counters or (cells < 0).any() or (cells > _INT32_MAX).any():
            raise ValueError(
                f"CountingBloomCounter.load: {counter_file} must hold {self.num_counters} int64 cells in "
                f"[0, 2^31), got {cells.size} values"
            )
        self.cells = torch.from_numpy(cells.astype(np.int32)).to(self.device)

    def create(self, device: torch.device) -> "CountingBloomCounter":
        """An empty filter of the same size and hash count on ``device``."""
        return CountingBloomCounter(self.num_counters, self.num_hashes, device)
