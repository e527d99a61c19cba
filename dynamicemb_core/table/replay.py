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


def _smallest_index_per_cell(cell: Tensor, index: Tensor, cells: int, n: int) -> Tensor:
    """For each entry, the smallest ``index`` among the entries in its cell (``scatter_reduce`` amin)."""
    smallest = torch.full((cells,), n, dtype=torch.int64, device=cell.device)
    smallest.scatter_reduce_(0, cell, index, "amin")
    return smallest[cell]


def first_occurrence(values: Tensor) -> Tensor:
    """For each i, the smallest j with ``values[j] == values[i]`` (so j <= i), in expected O(n).

    Values spanning fewer than ``_CELLS_PER_ENTRY * n`` integers (slots) index a dense cell array
    directly: one scatter, exact. Other values (keys) go through rounds: each hashes the unresolved
    entries (multiply-shift with a new odd multiplier, so a collision does not repeat) into cells
    and keeps the smallest entry index per cell. Entry i whose cell's smallest index holds the same
    value is resolved: every occurrence of that value lies in the same cell and is still
    unresolved (values resolve together), so that index is the value's first occurrence. The rest
    share a cell with a smaller, different value and try again (their answer is overwritten);
    every non-empty cell resolves at least one value, so the rounds end, shrinking geometrically.

    Args:
        values: (n,) int64, any values.

    Returns:
        (n,) int64 indices on ``values``' device.
    """
    n = values.numel()
    device = values.device
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    index = torch.arange(n, dtype=torch.int64, device=device)
    lo, hi = (int(v) for v in torch.aminmax(values))
    if hi - lo < _CELLS_PER_ENTRY * n:  # Python ints: no overflow for any int64 range
        return _smallest_index_per_cell(values - lo, index, hi - lo + 1, n)
    first = torch.empty(n, dtype=torch.int64, device=device)
    pending, pending_values = index, values
    rounds = 0
    while pending.numel():
        rounds += 1
        bits = max(1, (_CELLS_PER_ENTRY * pending.numel() - 1).bit_length())
        multiplier = _as_int64((1 + 2 * rounds * _GOLDEN) & _MASK64)
        # The top `bits` bits of the 64-bit product (int64 wraps like uint64; the mask makes the
        # shift logical).
        cell = (pending_values * multiplier >> (64 - bits)) & ((1 << bits) - 1)
        candidate = _smallest_index_per_cell(cell, pending, 1 << bits, n)
        first[pending] = candidate  # final for the resolved; the others are overwritten later
        unresolved = (values[candidate] != pending_values).nonzero().squeeze(1)
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
