"""KVCounter: key -> frequency counts in a bucketed ScoredHashTable, evicting the lowest count.

The count is the table's LFU score word itself, so a full bucket evicts the key with the smallest
frequency (lowest slot first on ties), which is what the seed API describes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from dynamicemb_core.config import BUCKET_ALIGNMENT, DynamicEmbScoreStrategy
from dynamicemb_core.devices import normalize_device
from dynamicemb_core.table import ScoredHashTable, TableSpec
from dynamicemb_core.types import Counter, MemoryType

__all__ = ["KVCounter"]

# Per slot: key (8 B), digest (1 B), two score words (16 B); see docs/table_design.md.
_BYTES_PER_SLOT = 8 + 1 + 16


class KVCounter(Counter):
    """A bounded frequency counter.

    Args:
        capacity: slots (rounded up to whole buckets).
        bucket_capacity: slots per bucket; a new key evicts the lowest count of its bucket when full.
        key_type: must be torch.int64.
        device: where the counter lives (``create`` makes copies on other devices).
    """

    def __init__(
        self,
        capacity: int,
        bucket_capacity: int = 1024,
        key_type: torch.dtype = torch.int64,
        device: Optional[torch.device | str] = None,
    ) -> None:
        if key_type != torch.int64:
            raise ValueError(f"KVCounter: key_type must be torch.int64, got {key_type}")
        if capacity <= 0:
            raise ValueError(f"KVCounter: capacity must be positive, got {capacity}")
        if bucket_capacity <= 0 or bucket_capacity % BUCKET_ALIGNMENT:
            raise ValueError(
                f"KVCounter: bucket_capacity must be a positive multiple of {BUCKET_ALIGNMENT}, "
                f"got {bucket_capacity}"
            )
        bucket = min(bucket_capacity, -(-capacity // BUCKET_ALIGNMENT) * BUCKET_ALIGNMENT)
        capacity = -(-capacity // bucket) * bucket
        self.capacity = capacity
        self.bucket_capacity = bucket
        self.device = normalize_device(device if device is not None else "cpu")
        spec = TableSpec(
            name="kv_counter",
            row_width=0,
            init_capacity=capacity,
            max_capacity=capacity,
            bucket_capacity=bucket,
            score_strategy=DynamicEmbScoreStrategy.LFU,
        )
        self.table = ScoredHashTable([spec], device=self.device)

    def add(self, keys: torch.Tensor, frequencies: torch.Tensor, inplace: bool) -> torch.Tensor:
        """Accumulate ``frequencies`` (n,) for unique ``keys`` (n,); return the sums (n,) int64."""
        if keys.shape != frequencies.shape:
            raise ValueError(
                f"KVCounter.add: keys and frequencies must have the same shape, got "
                f"{tuple(keys.shape)} and {tuple(frequencies.shape)}"
            )
        keys = keys.to(self.device)
        freqs = frequencies.to(self.device, torch.int64)
        found = self.table.find(keys)
        acc = freqs + torch.where(found.found, found.scores[:, 0], torch.zeros_like(freqs))
        if inplace and keys.numel():
            self.table.insert(keys, scores=acc.unsqueeze(1))
        return acc

    def erase(self, keys: torch.Tensor) -> None:
        """Forget keys (admitted keys no longer need counting)."""
        if keys.numel():
            self.table.erase(keys.to(self.device))

    def size(self) -> int:
        """Keys currently counted."""
        return self.table.size(0)

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        want = MemoryType.HOST if self.device.type == "cpu" else MemoryType.DEVICE
        return self.table.capacity(0) * _BYTES_PER_SLOT if mem_type is want else 0

    def dump(self, key_file: str, counter_file: str) -> None:
        """Write keys and counts as little-endian int64 arrays."""
        res = self.table.export(0)
        res.keys.cpu().numpy().astype("<i8").tofile(key_file)
        res.scores[:, 0].cpu().numpy().astype("<i8").tofile(counter_file)

    def load(self, key_file: str, counter_file: str) -> None:
        """Read what :meth:`dump` wrote and set those counts (validated before anything is written)."""
        keys = np.fromfile(key_file, dtype="<i8")
        counts = np.fromfile(counter_file, dtype="<i8")
        if keys.shape != counts.shape:
            raise ValueError(
                f"KVCounter.load: {key_file} holds {keys.size} keys but {counter_file} holds "
                f"{counts.size} counts"
            )
        if keys.size:
            self.table.insert(
                torch.from_numpy(keys.copy()).to(self.device),
                scores=torch.from_numpy(counts.copy()).to(self.device).unsqueeze(1),
            )

    def create(self, device: torch.device) -> "KVCounter":
        return KVCounter(self.capacity, self.bucket_capacity, device=device)
