"""Checks for slot-exact placement (ScoredHashTable.insert_at): which key of a batch cannot go to
its slot, and the message that says why."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["check_insert_at", "failing_index"]


def _disagrees_with_first(group_by: Tensor, other: Tensor) -> Tensor:
    """True at i when an earlier entry has the same ``group_by`` value but a different ``other``."""
    n = group_by.numel()
    order = torch.argsort(group_by, stable=True)
    sorted_by, sorted_other = group_by[order], other[order]
    starts = torch.ones(n, dtype=torch.bool, device=group_by.device)
    starts[1:] = sorted_by[1:] != sorted_by[:-1]
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    first_other = sorted_other[starts.nonzero().squeeze(1)][group]
    bad = torch.empty_like(starts)
    bad[order] = sorted_other != first_other
    return bad


def failing_index(placed: Tensor, keys: Tensor, slots: Tensor) -> Optional[int]:
    """First i that cannot be placed: the kernel's dry run said no (``placed[i]`` false), or the
    batch gives its slot to an earlier, different key, or its key to an earlier, different slot."""
    if keys.numel() == 0:
        return None
    bad = ~placed | _disagrees_with_first(slots, keys) | _disagrees_with_first(keys, slots)
    hits = bad.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def check_insert_at(where: str, key: int, slot: int, capacity: int, bucket_cap: int) -> str:
    """The DynamicEmbError message for a key that cannot go to its slot."""
    return (
        f"{where}: insert_at cannot put key {key} at slot {slot}: the slot must lie in the key's "
        f"home bucket (capacity {capacity}, buckets of {bucket_cap}) and be empty or already hold "
        "the key, and no other key of the batch may claim it; nothing was written. Replay needs the "
        "source and target tables to share capacity and bucket_capacity"
    )
