"""Typed wrappers over the hash-table ops ``torch.ops.dynamicemb.*`` (docs/table_design.md).

Each wrapper loads the library on first use and calls ``<op>.default``. Shapes: ``n`` keys per call,
``T`` logical tables, ``S`` slots in all. Every tensor lives on the table's device; keys, table ids,
slots and scores are int64. Slots are local to their table; -1 means missing / not placed.

``check`` (keyword-only): True, the default, raises IndexError for a table id outside [0, T) or a
slot outside [-1, capacity) before anything is written. On CUDA that check costs a device
synchronisation, so a caller that validated its input already (ScoredHashTable does) passes False;
the CUDA kernels then treat such ids as missing and such slots as empty. CPU kernels always check.

The evicting ops (``insert``, ``find_or_insert``, ``insert_and_evict``) also take, keyword-only:
``pins``, an optional (S,) int32 pin count per global slot (a slot with a count above 0 is never a
victim), and ``deterministic``: on CUDA, True runs the bucket-ordered engine (slot-for-slot the CPU
kernels' result), False the key-parallel one (which new key gets which of its bucket's free or
evicted slots depends on the schedule). None, the default, reads
``DEMB_DETERMINISM_MODE`` (:func:`dynamicemb_core.environment.determinism_mode`) at the call;
:class:`~dynamicemb_core.table.ScoredHashTable` reads it once, when it is built. CPU kernels are
deterministic always. ``unique_keys``: the caller promises that no (table id, key) pair occurs
twice in ``keys`` (a lookup's keys after its unique); the key-parallel engine then skips its per-call
leader map, 10-16% of an inserting call on the H200. A key that does occur twice may then be stored
twice, so pass it only for keys made distinct; the other engines ignore it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from dynamicemb_core.environment import determinism_mode
from dynamicemb_core.ops.loader import ensure_loaded

__all__ = [
    "TableState",
    "device_clock",
    "erase",
    "export_if",
    "find",
    "find_or_insert",
    "gather_rows",
    "insert",
    "insert_and_evict",
    "insert_at",
    "scatter_rows",
]


class TableState(NamedTuple):
    """The flat state of ``T`` logical tables, in the ops' argument order.

    Attributes:
        table_keys: (S,) int64, the key in each slot (meaningful where ``digests != 0``).
        digests: (S,) uint8, 0 for an empty slot, else the key's digest (1..255).
        scores: (S, 2) int64, score words in internal order.
        slot_offsets: (T+1,) int64, first global slot of each table.
        bucket_caps: (T,) int64, slots per bucket.
        policies: (T,) int64, score policy codes.
        sizes: (T,) int64, occupied slots per table.
    """

    table_keys: Tensor
    digests: Tensor
    scores: Tensor
    slot_offsets: Tensor
    bucket_caps: Tensor
    policies: Tensor
    sizes: Tensor


def _ops() -> Any:
    ensure_loaded()
    return torch.ops.dynamicemb


def _deterministic(flag: Optional[bool]) -> bool:
    """``flag``, or ``DEMB_DETERMINISM_MODE`` when None."""
    if flag is not None:
        return bool(flag)
    return determinism_mode()


def _with_score_fns(state: TableState, score_fns: Tensor) -> Tuple[Tensor, ...]:
    """The state arguments of the ops that score new keys: ``score_fns`` (T,) goes right before
    ``sizes``, the one state tensor they list after it."""
    return (*state[:-1], score_fns, state.sizes)


def find(
    keys: Tensor,
    table_ids: Tensor,
    state: TableState,
    cur_scores: Tensor,
    update_score: bool,
    *,
    check: bool = True,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Look keys up. Returns ``(slots (n,), found (n,) bool, scores (n, 2) internal order)``.

    ``counts``: (n,) int64 >= 0 on the keys' device, the accesses each key's touch counts (an LFU
    count grows by it, 0: none; see ``csrc/ops.cpp``); None: 1 per occurrence."""
    return _ops().find.default(keys, table_ids, *state, cur_scores, update_score, check, counts)


def insert(
    keys: Tensor,
    table_ids: Tensor,
    state: TableState,
    score_fns: Tensor,
    cur_scores: Tensor,
    input_scores: Optional[Tensor] = None,
    *,
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: Optional[bool] = None,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tensor:
    """Insert-or-assign keys; ``input_scores`` (n, 2) internal order replace the policy's words;
    ``counts`` as :func:`find`'s."""
    return _ops().insert.default(
        keys,
        table_ids,
        *_with_score_fns(state, score_fns),
        cur_scores,
        input_scores,
        check,
        pins,
        _deterministic(deterministic),
        unique_keys,
        counts,
    )


def find_or_insert(
    keys: Tensor,
    table_ids: Tensor,
    state: TableState,
    score_fns: Tensor,
    cur_scores: Tensor,
    *,
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: Optional[bool] = None,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Find keys, inserting absent ones. Returns ``(slots (n,), is_new (n,) bool)``; ``counts``
    as :func:`find`'s."""
    return _ops().find_or_insert.default(
        keys,
        table_ids,
        *_with_score_fns(state, score_fns),
        cur_scores,
        check,
        pins,
        _deterministic(deterministic),
        unique_keys,
        counts,
    )


def insert_and_evict(
    keys: Tensor,
    table_ids: Tensor,
    state: TableState,
    score_fns: Tensor,
    cur_scores: Tensor,
    input_scores: Optional[Tensor] = None,
    *,
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: Optional[bool] = None,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Insert and report evictions (``counts`` as :func:`find`'s).

    Returns:
        ``(slots (n,), is_new (n,) bool, ev_keys (m,), ev_slots (m,), ev_scores (m, 2) internal
        order, ev_table_ids (m,))``; an evicted key's slot now holds the new key that took it.
    """
    return _ops().insert_and_evict.default(
        keys,
        table_ids,
        *_with_score_fns(state, score_fns),
        cur_scores,
        input_scores,
        check,
        pins,
        _deterministic(deterministic),
        unique_keys,
        counts,
    )


def erase(keys: Tensor, table_ids: Tensor, state: TableState, *, check: bool = True) -> Tensor:
    """Remove keys. Returns ``erased (n,) bool`` (true for every occurrence of a present key)."""
    return _ops().erase.default(keys, table_ids, *state, check)


def export_if(
    state: TableState, thresholds: Tensor, column: int
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Occupied slots with ``scores[:, column] >= thresholds[t]``, by global slot.

    Returns:
        ``(keys (m,), slots (m,) local, scores (m, 2) internal order, table_ids (m,))``.
    """
    return _ops().export_if.default(*state, thresholds, column)


def insert_at(
    keys: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    state: TableState,
    input_scores: Tensor,
    dry_run: bool,
) -> Tensor:
    """Slot-exact placement (replay). Returns ``placed (n,) bool``; ``dry_run`` writes nothing."""
    return _ops().insert_at.default(keys, table_ids, slots, *state, input_scores, dry_run)


def gather_rows(values: Tensor, slots: Tensor, *, check: bool = True) -> Tensor:
    """Rows of a (capacity, width) tensor at ``slots`` (n,); slot -1 gives a zero row. -> (n, width)"""
    return _ops().gather_rows.default(values, slots, check)


def scatter_rows(values: Tensor, slots: Tensor, rows: Tensor, *, check: bool = True) -> None:
    """Write ``rows`` (n, width) into ``values`` at ``slots``; -1 skipped, last write wins."""
    _ops().scatter_rows.default(values, slots, rows, check)


def device_clock(like: Tensor) -> int:
    """The nanosecond clock the table kernels read on ``like``'s device when ``cur_scores[t] < 0``
    (CPU: ``std::chrono::steady_clock``; CUDA: ``%globaltimer``, which waits for the stream)."""
    return int(_ops().device_clock.default(like))
