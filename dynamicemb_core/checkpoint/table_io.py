"""Reading rows out of one table and writing them back: the table-level half of dump, load and replay.

A stored row is ``[embedding (dim) | optimizer state (runtime width)]``. Files and deltas carry the
embedding and, separately, the optimizer state at its *checkpoint* width (``handle.optimizer_width``):
rowwise Adagrad reserves 16 bytes per row at runtime but fills one scalar, and shipping the padding would
make a file's idea of a row depend on the runtime layout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from tqdm.auto import tqdm

from dynamicemb_core.checkpoint.errors import CheckpointMismatchError
from dynamicemb_core.checkpoint.scores import clock_columns, from_ages, to_ages
from dynamicemb_core.checkpoint.types import TableHandle
from dynamicemb_core.config import DynamicEmbCheckMode
from dynamicemb_core.table.expansion import needs_growth
from dynamicemb_core.table.hashing import buckets_of_tensor

__all__ = [
    "TableRows",
    "assemble_rows",
    "check_room",
    "export_rows",
    "insert_rows",
    "insert_rows_at",
    "planned_capacity",
    "table_now",
]

_CHUNK = 1 << 17  # rows read or written per table call; bounds temporary memory and paces the bar


@dataclass
class TableRows:
    """Rows exported from one table, in slot order, on the table's device.

    Attributes:
        keys: (n,) int64; slots: (n,) int64 local slots; embeddings: (n, dim) of the table's
        embedding dtype; optimizer_states: (n, optimizer_width) of its state dtype; scores:
        (n, num_scores) int64, user order, as ages.
        now: the table clock the ages are relative to.
    """

    keys: torch.Tensor
    slots: torch.Tensor
    embeddings: torch.Tensor
    optimizer_states: torch.Tensor
    scores: torch.Tensor
    now: int


def table_now(handle: TableHandle) -> int:
    """The table's clock now, in the unit its timestamp scores use (ns).

    A clock-scored table answers ``get_score`` with the time its next call would write; a negative answer
    means "read the clock at the call", and on the CPU that clock is CLOCK_MONOTONIC (``steady_clock``).
    """
    if clock_columns(handle.options):
        score = int(handle.table.get_score(handle.table_id))
        if score >= 0:
            return score
    return time.monotonic_ns()


def export_rows(
    handle: TableHandle, threshold: Optional[int] = None, bar: Optional[tqdm] = None
) -> TableRows:
    """Export every row (or those whose score passes ``threshold``) with embedding, state and scores.

    Args:
        handle: the table.
        threshold: None exports all rows; otherwise the table's export threshold (time-based for a
            clock-scored strategy, absolute score otherwise).
        bar: an optional tqdm bar advanced by rows read.
    """
    now = table_now(handle)
    exported = handle.table.export(handle.table_id, threshold)
    keys, slots, scores = exported.keys, exported.slots, exported.scores
    if bar is not None:  # the bar was sized by the table; a threshold selects fewer rows
        bar.total = keys.numel()
        bar.refresh()
    dim, width = handle.dim, handle.optimizer_width
    emb_parts, opt_parts = [], []
    for lo in range(0, keys.numel(), _CHUNK):
        rows = handle.storage.read_rows(handle.table_id, slots[lo : lo + _CHUNK])
        emb_parts.append(rows[:, :dim])
        opt_parts.append(rows[:, dim : dim + width])
        if bar is not None:
            bar.update(rows.shape[0])
    # A half-precision table's embeddings leave in its dtype (exactly: they are stored so), its
    # optimizer state in float32; the rows read are float32 either way.
    device, emb_dtype, state_dtype = keys.device, handle.embedding_dtype, handle.state_dtype
    embeddings = (
        torch.cat(emb_parts).to(emb_dtype)
        if emb_parts
        else torch.empty(0, dim, dtype=emb_dtype, device=device)
    )
    states = (
        torch.cat(opt_parts).to(state_dtype)
        if opt_parts
        else torch.empty(0, width, dtype=state_dtype, device=device)
    )
    scores = to_ages(scores.to(torch.int64), clock_columns(handle.options), now)
    return TableRows(keys, slots, embeddings, states, scores, now)


def assemble_rows(
    handle: TableHandle,
    embeddings: torch.Tensor,
    optimizer_states: Optional[torch.Tensor],
    previous: Optional[torch.Tensor] = None,
    keep_previous: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Build full stored rows from embeddings and (optionally) optimizer states.

    Args:
        handle: the target table.
        embeddings: (n, dim).
        optimizer_states: (n, w) at the checkpoint width, or None to not restore the state. Columns beyond
            the target's runtime width are dropped (a training=False replica has no room for them).
        previous: (n, row_width) rows currently at the target slots, used where ``keep_previous`` is true.
        keep_previous: (n,) bool; rows whose optimizer state is kept when ``optimizer_states`` is None
            (the same key already held that row). Other rows get a fresh state (``state_init``).

    Returns:
        (n, row_width) of the table's dtype on its device.
    """
    device, dtype = handle.device, handle.dtype
    n = embeddings.shape[0]
    rows = torch.zeros(n, handle.row_width, dtype=dtype, device=device)
    rows[:, : handle.dim] = embeddings.to(device=device, dtype=dtype)
    state_width = handle.state_width
    if state_width == 0:
        return rows
    if optimizer_states is not None:
        w = min(optimizer_states.shape[1], state_width)
        rows[:, handle.dim : handle.dim + w] = optimizer_states[:, :w].to(
            device=device, dtype=dtype
        )
        return rows
    filled = min(handle.optimizer_width, state_width)
    rows[:, handle.dim : handle.dim + filled] = handle.state_init
    if previous is not None and keep_previous is not None and bool(keep_previous.any()):
        keep = keep_previous.to(device)
        rows[keep, handle.dim :] = previous[keep, handle.dim :].to(device=device, dtype=dtype)
    return rows


def insert_rows(
    handle: TableHandle,
    keys: torch.Tensor,
    embeddings: torch.Tensor,
    optimizer_states: Optional[torch.Tensor],
    ages: torch.Tensor,
    bar: Optional[tqdm] = None,
) -> Tuple[int, int]:
    """Insert (or overwrite) keys with their rows and scores, as a load does.

    Keys already in the table keep their optimizer state when ``optimizer_states`` is None. Timestamp
    columns of ``ages`` are re-based on this table's clock.

    Returns:
        ``(placed, unplaced)`` key counts; a key is unplaced when its bucket had no slot it could take.
    """
    device = handle.device
    columns = clock_columns(handle.options)
    placed = unplaced = 0
    for lo in range(0, keys.numel(), _CHUNK):
        k = keys[lo : lo + _CHUNK].to(device)
        found = handle.table.find(k, handle.table_id)
        previous = (
            handle.storage.read_rows(handle.table_id, found.slots)
            if optimizer_states is None
            else None
        )
        opt = None if optimizer_states is None else optimizer_states[lo : lo + _CHUNK]
        rows = assemble_rows(handle, embeddings[lo : lo + _CHUNK], opt, previous, found.found)
        scores = from_ages(ages[lo : lo + _CHUNK].to(device), columns, table_now(handle))
        slots = handle.table.insert(k, handle.table_id, scores=scores)
        handle.storage.write_rows(handle.table_id, slots, rows)
        missed = int((slots < 0).sum())
        unplaced += missed
        placed += k.numel() - missed
        if bar is not None:
            bar.update(k.numel())
    if unplaced and handle.options.safe_check_mode == DynamicEmbCheckMode.ERROR:
        from dynamicemb_core.types import DynamicEmbError

        raise DynamicEmbError(
            f"table '{handle.qualified_name}': {unplaced} loaded keys found no free slot in their bucket "
            f"(capacity {handle.table.capacity(handle.table_id)}); raise max_capacity or bucket_capacity"
        )
    return placed, unplaced


def insert_rows_at(
    handle: TableHandle,
    keys: torch.Tensor,
    slots: torch.Tensor,
    embeddings: torch.Tensor,
    optimizer_states: Optional[torch.Tensor],
    ages: torch.Tensor,
    bar: Optional[tqdm] = None,
) -> int:
    """Put each key at its given local slot with its row and scores (a slot-exact load).

    The caller has checked the slots (home bucket, no slot or key twice, no other key of the
    table in the way), so ``ScoredHashTable.insert_at``'s own check (its kernel's dry run; the
    batch's duplicates are not checked again: ``distinct=True``), which runs before each chunk is
    written, cannot fail. Keys already in the table (at these very slots) keep their optimizer
    state when ``optimizer_states`` is None, as :func:`insert_rows`.

    Returns:
        Keys placed.
    """
    device, table, t = handle.device, handle.table, handle.table_id
    columns = clock_columns(handle.options)
    # keys the table held before may keep their optimizer state; an empty table holds none (the
    # file's keys are distinct, so an earlier chunk's keys are not this chunk's)
    held = optimizer_states is None and table.size(t) > 0
    for lo in range(0, keys.numel(), _CHUNK):
        k = keys[lo : lo + _CHUNK].to(device)
        at = slots[lo : lo + _CHUNK].to(device)
        previous = keep = None
        if held:
            found = table.find(k, t)
            previous, keep = handle.storage.read_rows(t, found.slots), found.found
        opt = None if optimizer_states is None else optimizer_states[lo : lo + _CHUNK]
        rows = assemble_rows(handle, embeddings[lo : lo + _CHUNK], opt, previous, keep)
        scores = from_ages(ages[lo : lo + _CHUNK].to(device), columns, table_now(handle))
        table.insert_at(t, k, at, scores=scores, distinct=True)
        handle.storage.write_rows(t, at, rows)
        if bar is not None:
            bar.update(k.numel())
    return keys.numel()


def planned_capacity(handle: TableHandle, num_keys: int) -> int:
    """The capacity an insert of ``num_keys`` keys grows the table to: doubled while they exceed
    its load factor, up to ``max_capacity`` (the rule of ``ScoredHashTable``'s inserts)."""
    spec = handle.table.specs[handle.table_id]
    capacity = handle.table.capacity(handle.table_id)
    while needs_growth(
        0,
        num_keys,
        capacity,
        spec.max_capacity,
        spec.max_load_factor,
        spec.no_eviction,
        spec.grows_past_max_capacity,
    ):
        capacity *= 2
    return capacity


def check_room(
    handle: TableHandle, keys: torch.Tensor, capacity: Optional[int] = None
) -> Tuple[int, int]:
    """Refuse a load whose keys would not all find a slot in the table (checked before writing).

    A key lands only in its home bucket (``hash % num_buckets``); a full bucket would evict one of
    the table's keys or refuse the new one, and either loses a row the load promised. So every key
    the table holds after the load (those it holds now and the new ones) must fit its bucket. The
    capacity checked starts at :func:`planned_capacity` of that count and doubles while a bucket
    overflows, up to ``max_capacity`` (past it for a table that grows past it, which memory bounds
    instead); the caller grows the table to it
    (``ScoredHashTable.reserve``) before writing.

    Args:
        handle: the target table.
        keys: (n,) int64 keys the load writes into it (this shard's; a key given twice counts
            twice).
        capacity: check at exactly this capacity (the one the table reached) instead.

    Returns:
        ``(capacity, keys held after the load)``.

    Raises:
        CheckpointMismatchError: more keys than ``max_capacity`` slots, or a bucket that overflows
            even at the largest capacity allowed; the message names the table, the key counts and
            the capacity.
    """
    table, t = handle.table, handle.table_id
    spec = table.specs[t]
    keys = keys.to(handle.device)
    held = table.size(t)
    new = keys[~table.find(keys, t).found] if held else keys
    total = held + new.numel()
    where = (
        f"table '{handle.qualified_name}'"
        + (f" (shard {handle.rank} of {handle.world_size})" if handle.world_size > 1 else "")
        + f": the checkpoint brings {keys.numel()} keys ({new.numel()} not in the table, which "
        f"holds {held})"
    )
    # A table that grows past max_capacity (NO_EVICTION, see GrowthGuard) is bounded by memory
    # instead: reserve() stops where the guard refuses, and the load raises for any key left out.
    unbounded = spec.grows_past_max_capacity
    if total > spec.max_capacity and not unbounded:
        raise CheckpointMismatchError(
            f"{where}; {total} keys do not fit its max_capacity of {spec.max_capacity} slots. "
            "Nothing was written: load into tables with a larger max_capacity"
        )
    fixed = capacity is not None
    capacity = capacity if capacity is not None else planned_capacity(handle, total)
    every = None
    if not spec.single_bucket:
        every = torch.cat([table.export(t).keys, new]) if held else new
    while True:
        if every is None:  # one bucket spanning the table
            width, fullest = capacity, total
            over = max(0, total - capacity)
        else:
            width = table.bucket_capacity(t)
            num_buckets = capacity // width
            counts = torch.bincount(buckets_of_tensor(every, num_buckets), minlength=num_buckets)
            fullest = int(counts.max()) if counts.numel() else 0
            over = int((counts - width).clamp(min=0).sum())
        if not over or fixed or (capacity >= spec.max_capacity and not unbounded):
            break
        capacity *= 2
    if over:
        raise CheckpointMismatchError(
            f"{where}; at {capacity} slots ({capacity // width} buckets of {width}) {over} keys "
            f"would find no free slot in their bucket (the fullest needs {fullest}). Nothing was "
            "written: load into tables with a larger max_capacity or bucket_capacity"
        )
    return capacity, total
