"""Checks for slot-exact placement (ScoredHashTable.insert_at): which key of a batch cannot go to
its slot, and the message that says why.

The batch check runs on every replayed chunk (millions of rows when a checkpoint is loaded), so it
is O(n): "the first earlier entry with the same key / slot" is found by scattering entry indices
into a hashed array with ``scatter_reduce(amin)`` (no sort)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["check_insert_at", "failing_index", "first_occurrence"]

# Hash cells per still-unresolved entry in each round of first_occurrence (rounded up to a power of
# two): with at least 4, at most about 1 entry in 9 shares its cell with a smaller, different value
# and goes on to the next round.
_CELLS_PER_ENTRY = 4
_MASK64 = (1 << 64) - 1
_GOLDEN = (
    0x9E3779B97F4A7C15  # round r multiplies by 1 + 2 * r * _GOLDEN (odd): a new hash per round
)


def _as_int64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def first_occurrence(values: Tensor) -> Tensor:
    """For each i, the smallest j with ``values[j] == values[i]`` (so j <= i), in expected O(n).

    Each round hashes the unresolved entries (multiply-shift with a new odd multiplier, so a
    collision does not repeat) into a cell array and keeps the smallest entry index per cell
    (``scatter_reduce`` amin). Entry i whose cell's smallest index holds the same value is
    resolved: every occurrence of that value lies in the same cell and is still unresolved (values
    resolve together), so that index is the value's first occurrence. The rest share a cell with a
    smaller, different value and try again; every non-empty cell resolves at least one value, so
    the rounds end, and they shrink geometrically.

    Args:
        values: (n,) int64, any values.

    Returns:
        (n,) int64 indices on ``values``' device.
    """
    n = values.numel()
    device = values.device
    first = torch.empty(n, dtype=torch.int64, device=device)
    pending = torch.arange(n, dtype=torch.int64, device=device)
    pending_values = values
    rounds = 0
    while pending.numel():
        rounds += 1
        bits = max(1, (_CELLS_PER_ENTRY * pending.numel() - 1).bit_length())
        multiplier = _as_int64((1 + 2 * rounds * _GOLDEN) & _MASK64)
        # The top `bits` bits of the 64-bit product (int64 wraps like uint64; the mask makes the
        # shift logical).
        cell = (pending_values * multiplier >> (64 - bits)) & ((1 << bits) - 1)
        smallest = torch.full((1 << bits,), n, dtype=torch.int64, device=device)
        smallest.scatter_reduce_(0, cell, pending, "amin")
        candidate = smallest[cell]
        same = values[candidate] == pending_values
        first[pending[same]] = candidate[same]
        unresolved = ~same
        pending, pending_values = pending[unresolved], pending_values[unresolved]
    return first


def failing_index(placed: Tensor, keys: Tensor, slots: Tensor) -> Optional[int]:
    """First i that cannot be placed: the kernel's dry run said no (``placed[i]`` false), or the
    batch gives its slot to an earlier, different key, or its key to an earlier, different slot."""
    if keys.numel() == 0:
        return None
    bad = ~placed
    bad |= keys[first_occurrence(slots)] != keys
    bad |= slots[first_occurrence(keys)] != slots
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
