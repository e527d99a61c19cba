"""Growing one logical table of a ScoredHashTable: when to double it, and the doubling itself.

Doubling keeps the hash rule (``bucket = h % num_buckets``) by rehashing: export the table's keys in
slot order, insert them with their own score words into an empty region twice as large, and move
each value row from its old slot to its new one. Keys of old bucket ``b`` land in new buckets ``b``
or ``b + num_buckets``, so no new bucket receives more keys than an old one held and the rehash
never evicts. Other tables' local slots are untouched; only the flat arrays are spliced.

Whether a table may double at all is one rule, :meth:`GrowthGuard.refusal`:

- an evicting table never grows at or past ``max_capacity`` (past it, it evicts);
- a NO_EVICTION table grows past ``max_capacity`` as the seed says ("the table's capacity doubles
  whenever there are not enough slots for new keys, and this continues until available memory is
  exhausted"): ``max_capacity`` is only its planned size;
- no table doubles when the doubling's new buffers would not leave :func:`memory_headroom` free on
  the table's device (CUDA: ``mem_get_info``; host: ``MemAvailable`` of ``MemTotal``): the larger of
  :data:`HEADROOM_FRACTION` of the device's memory and :data:`HEADROOM_MIN_BYTES` stays free for
  the rest of training (activations, the optimizer, the allocator's cache, other processes).

A NO_EVICTION table that cannot grow warns once (``DynamicEmbWarning``) and leaves the keys it cannot
place unplaced: they read zeros, get no update and count as ``unplaced`` in the table's metrics (the
caller applies ``safe_check_mode``); its stored keys are untouched and training continues.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional, Set

import torch
from torch import Tensor

from dynamicemb_core.ops import table_ops
from dynamicemb_core.ops.table_ops import TableState
from dynamicemb_core.table.host_memory import host_zeros
from dynamicemb_core.types import DynamicEmbWarning

__all__ = [
    "Doubled",
    "GrowthGuard",
    "double_table",
    "doubling_bytes",
    "free_bytes",
    "memory_headroom",
    "needs_growth",
    "region_state",
    "total_bytes",
]

INT64_MIN = -(2**63)
# NO_EVICTION tables grow at this load factor whatever max_load_factor says (docs/table_design.md).
NO_EVICTION_LOAD_FACTOR = 0.5
# Memory a doubling must leave free on the table's device: this share of its total memory, and at
# least HEADROOM_MIN_BYTES (docs/sizing.md, "NO_EVICTION growth"). The one growth headroom rule.
HEADROOM_FRACTION = 0.10
HEADROOM_MIN_BYTES = 1 << 30  # 1 GiB


def needs_growth(
    size: int,
    incoming: int,
    capacity: int,
    max_capacity: int,
    max_load_factor: float,
    no_eviction: bool,
    past_max_capacity: Optional[bool] = None,
) -> bool:
    """True when ``incoming`` candidate keys would push the table past its load factor and it may grow.

    Args:
        size: keys in the table now.
        incoming: distinct keys of the call for this table (present or not: an upper bound).
        capacity: slots now; max_capacity: the cap of an evicting table (a NO_EVICTION table
            grows past it while memory allows, see :meth:`GrowthGuard.refusal`).
        max_load_factor: the table's; NO_EVICTION uses NO_EVICTION_LOAD_FACTOR.
        past_max_capacity: the table may grow past ``max_capacity``
            (``TableSpec.grows_past_max_capacity``); None: when NO_EVICTION.
    """
    load_factor = NO_EVICTION_LOAD_FACTOR if no_eviction else max_load_factor
    unbounded = no_eviction if past_max_capacity is None else past_max_capacity
    may_grow = unbounded or capacity < max_capacity
    return may_grow and incoming > 0 and size + incoming > load_factor * capacity


# Bytes of hash state per slot: key (8), digest (1), two score words (16).
_STATE_BYTES = 8 + 1 + 16


def doubling_bytes(capacity: int, total_slots: int, row_bytes: int) -> int:
    """New memory one doubling allocates while the old buffers are still alive.

    The table's region at twice its capacity (hash state and value rows), and the flat state of
    every table spliced around it (``total_slots + capacity`` slots of hash state).
    """
    return 2 * capacity * (_STATE_BYTES + row_bytes) + (total_slots + capacity) * _STATE_BYTES


def _meminfo(field: str) -> Optional[int]:
    """A ``/proc/meminfo`` field in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_bytes(device: torch.device) -> Optional[int]:
    """Memory the table's device can still give: CUDA's free memory, the host's ``MemAvailable``;
    None where it cannot be read (then nothing but ``max_capacity`` bounds growth)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        return _meminfo("MemAvailable")
    return None


def total_bytes(device: torch.device) -> Optional[int]:
    """The device's whole memory: CUDA's total, the host's ``MemTotal``; None where unknown."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        return int(total)
    if device.type == "cpu":
        return _meminfo("MemTotal")
    return None


def memory_headroom(device: torch.device) -> int:
    """Bytes a table's growth must leave free on ``device``: :data:`HEADROOM_FRACTION` of its
    memory, at least :data:`HEADROOM_MIN_BYTES`."""
    total = total_bytes(device)
    share = int(total * HEADROOM_FRACTION) if total is not None else 0
    return max(share, HEADROOM_MIN_BYTES)


class GrowthGuard:
    """The rule for whether a table may double, and the one warning per table when it may not."""

    def __init__(self) -> None:
        self._warned: Set[str] = set()

    @staticmethod
    def refusal(
        capacity: int,
        max_capacity: int,
        needed_bytes: int,
        device: torch.device,
        past_max_capacity: bool = False,
    ) -> Optional[str]:
        """None when the table may double; otherwise why not (for the warning). The module
        docstring states the rule; ``past_max_capacity``: a NO_EVICTION table's (not a cache's,
        ``TableSpec.grows_past_max_capacity``)."""
        if capacity >= max_capacity and not past_max_capacity:
            return f"it is at max_capacity ({max_capacity} slots)"
        free = free_bytes(device)
        if free is None:
            return None
        headroom = memory_headroom(device)
        if needed_bytes > free - headroom:
            return (
                f"doubling needs {needed_bytes} bytes and {free} are free on {device}, of which "
                f"{headroom} stay free (the growth headroom, docs/sizing.md; no allocation was "
                "tried)"
            )
        return None

    def allow(
        self,
        name: str,
        capacity: int,
        max_capacity: int,
        needed_bytes: int,
        device: torch.device,
        no_eviction: bool,
        past_max_capacity: Optional[bool] = None,
    ) -> bool:
        """True when the table may double. Warns once per table when it may not and that matters:
        a NO_EVICTION table (its keys go unplaced), or any table short of memory below its cap."""
        unbounded = no_eviction if past_max_capacity is None else past_max_capacity
        reason = self.refusal(capacity, max_capacity, needed_bytes, device, unbounded)
        if reason is None:
            return True
        at_cap = capacity >= max_capacity
        # a cache at its size (fixed capacity) spills to its next tier: nothing to warn about
        if ((no_eviction and unbounded) or not at_cap) and name not in self._warned:
            self._warned.add(name)
            effect = (
                "new keys that find their bucket full are not placed and follow safe_check_mode"
                if no_eviction
                else "it evicts instead of growing"
            )
            warnings.warn(
                f"table {name!r} cannot grow beyond {capacity} slots: {reason}; {effect} (its "
                "stored keys are kept, training continues; the table's 'unplaced' metric counts "
                "the keys). Free memory, shard the table over more ranks, or use an evicting "
                "score_strategy. Warned once per table.",
                DynamicEmbWarning,
                stacklevel=5,
            )
        return False


def region_state(state: TableState, t: int, begin: int, end: int) -> TableState:
    """A one-table state whose tensors are views of table ``t``'s region ``[begin, end)``.

    Ops on it read and write the real table (``sizes`` is a view too).
    """
    return TableState(
        state.table_keys[begin:end],
        state.digests[begin:end],
        state.scores[begin:end],
        torch.tensor([0, end - begin], dtype=torch.int64, device=state.table_keys.device),
        state.bucket_caps[t : t + 1],
        state.policies[t : t + 1],
        state.sizes[t : t + 1],
    )


@dataclass
class Doubled:
    """The result of doubling table ``t``.

    Attributes:
        state: the new flat state (new tensors; the old ones are no longer used).
        offsets: new first global slot of each table (T+1 ints).
        bucket_cap: the table's new bucket width (changes only for a single-bucket table).
        values: the table's new (2 * capacity, row_width) value buffer.
        old_slots, new_slots: (m,) int64, where each of the table's keys moved.
    """

    state: TableState
    offsets: List[int]
    bucket_cap: int
    values: Tensor
    old_slots: Tensor
    new_slots: Tensor


def double_table(
    state: TableState,
    offsets: List[int],
    t: int,
    bucket_cap: int,
    single_bucket: bool,
    values: Tensor,
    *,
    deterministic: Optional[bool] = None,
) -> Doubled:
    """Double table ``t`` (its bucket count, or its one bucket's width) and rehash it.

    Args:
        state: the flat state of all tables.
        offsets: first global slot of each table, T+1 Python ints (mirrors ``state.slot_offsets``).
        t: which table.
        bucket_cap: its bucket width now.
        single_bucket: True for a MAX_BUCKET_CAPACITY table (one bucket that doubles its width).
        values: its (capacity, row_width) value buffer.
        deterministic: the CUDA engine of the rehash insert (None: ``DEMB_DETERMINISM_MODE``).
    """
    begin, end = offsets[t], offsets[t + 1]
    capacity = end - begin
    device = state.table_keys.device
    old = region_state(state, t, begin, end)
    keys, old_slots, words, _ = table_ops.export_if(
        old, torch.full((1,), INT64_MIN, dtype=torch.int64, device=device), 0
    )
    new_cap = bucket_cap * 2 if single_bucket else bucket_cap
    bucket_caps = state.bucket_caps.clone()
    bucket_caps[t] = new_cap
    fresh = TableState(
        torch.zeros(2 * capacity, dtype=torch.int64, device=device),
        torch.zeros(2 * capacity, dtype=torch.uint8, device=device),
        torch.zeros(2 * capacity, 2, dtype=torch.int64, device=device),
        torch.tensor([0, 2 * capacity], dtype=torch.int64, device=device),
        bucket_caps[t : t + 1],
        state.policies[t : t + 1],
        torch.zeros(1, dtype=torch.int64, device=device),
    )
    zeros1 = torch.zeros(1, dtype=torch.int64, device=device)
    new_slots = table_ops.insert(
        keys,
        torch.zeros_like(keys),
        fresh,
        zeros1,
        zeros1,
        input_scores=words,
        deterministic=deterministic,
    )
    if bool((new_slots < 0).any()):  # impossible by the argument in the module docstring
        raise RuntimeError(f"rehash of table {t} lost keys while doubling; this is a bug")
    new_values = host_zeros((2 * capacity, values.shape[1]), values.dtype, values.device)
    if values.shape[1] > 0 and keys.numel() > 0:
        new_values.index_copy_(0, new_slots, values.index_select(0, old_slots))

    def splice(flat: Tensor, region: Tensor) -> Tensor:
        return torch.cat([flat[:begin], region, flat[end:]])

    new_state = TableState(
        splice(state.table_keys, fresh.table_keys),
        splice(state.digests, fresh.digests),
        splice(state.scores, fresh.scores),
        state.slot_offsets.clone(),
        bucket_caps,
        state.policies,
        state.sizes,
    )
    new_state.slot_offsets[t + 1 :] += capacity
    new_offsets = offsets[: t + 1] + [o + capacity for o in offsets[t + 1 :]]
    return Doubled(new_state, new_offsets, new_cap, new_values, old_slots, new_slots)
