"""replay_increment: write a delta back at its source slots, leaving the target layout-identical.

The work is split in two so that "no table is written until every table has been checked" is a property
of the control flow: :func:`plan_replay` resolves and checks every table of every collection and writes
nothing; :func:`apply_replay` writes one already-checked table. Checks: the layout (capacity, row
capacity, bucket width, score words, world size, score strategy by physical order, dim, dist_type), every
tensor's shape, and for every owned key that its slot lies in its home bucket and no other key claims it;
after that the kernel's own per-key check cannot fail.

Ownership comes from the global rank and the table's own shard world size, never from a process group:
the delta may have been gathered over any group, but the table was sharded over its own ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm.auto import tqdm

from dynamicemb_core.checkpoint.collectives import global_rank
from dynamicemb_core.checkpoint.discovery import find_tables
from dynamicemb_core.checkpoint.errors import IncompatibleDeltaError
from dynamicemb_core.checkpoint.layout import bucket_capacity, check_layout
from dynamicemb_core.checkpoint.ownership import check_dist_type_supported, owned_mask
from dynamicemb_core.checkpoint.progress import row_bar
from dynamicemb_core.checkpoint.scores import clock_columns, default_scores, from_ages
from dynamicemb_core.checkpoint.table_io import assemble_rows, table_now
from dynamicemb_core.checkpoint.types import DeltaDumpResult, ReplayContent, TableHandle
from dynamicemb_core.config import DynamicEmbTableOptions

__all__ = ["apply_replay", "plan_replay", "replay_increment"]

_CHUNK = 1 << 18


@dataclass
class ReplayJob:
    """Everything the write of one table needs, already filtered to the keys this shard owns.

    Attributes:
        handle: the target table.
        keys, slots: (n,) int64 on the table's device.
        values: (n, dim) embeddings.
        states: (n, w) optimizer state when OPTIMIZER_STATE was asked for and the target keeps state.
        ages: (n, num_scores) scores in the target's column order when SCORE was asked for.
        erased: owned keys the source erased (removed from the target).
        evicted: owned keys the source evicted (dropped from the target's cache only).
    """

    handle: TableHandle
    keys: torch.Tensor
    slots: torch.Tensor
    values: torch.Tensor
    states: Optional[torch.Tensor]
    ages: Optional[torch.Tensor]
    erased: torch.Tensor
    evicted: torch.Tensor


def _fail(handle: TableHandle, message: str) -> IncompatibleDeltaError:
    return IncompatibleDeltaError(
        f"replay_increment: table '{handle.qualified_name}': {message} (nothing was written to any table)"
    )


def _check_tensor(
    handle: TableHandle,
    name: str,
    tensor: object,
    shape: Sequence[int],
    dtypes: Sequence[torch.dtype],
) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise _fail(handle, f"{name} must be a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != tuple(shape) or tensor.dtype not in dtypes:
        raise _fail(
            handle,
            f"{name} must be {'/'.join(str(d) for d in dtypes)} of shape {tuple(shape)}, "
            f"got {tensor.dtype} of shape {tuple(tensor.shape)}",
        )
    return tensor


def _home_buckets(keys: torch.Tensor, num_buckets: int) -> torch.Tensor:
    from dynamicemb_core.table.hashing import buckets_of_tensor

    return buckets_of_tensor(keys, num_buckets)


def _check_slots(handle: TableHandle, keys: torch.Tensor, slots: torch.Tensor) -> None:
    capacity = int(handle.table.capacity(handle.table_id))
    bad = (slots < 0) | (slots >= capacity)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise _fail(handle, f"key {int(keys[i])} has slot {int(slots[i])} outside [0, {capacity})")
    width = bucket_capacity(handle)
    home = _home_buckets(keys, capacity // width)
    wrong = torch.div(slots, width, rounding_mode="floor") != home
    if bool(wrong.any()):
        i = int(wrong.nonzero()[0])
        raise _fail(
            handle,
            f"key {int(keys[i])} cannot be placed at slot {int(slots[i])}: its home bucket is "
            f"{int(home[i])} (slots {int(home[i]) * width}..{int(home[i]) * width + width - 1})",
        )
    # O(n) slot check: the first claimant of every slot, by scatter (no sort)
    index = torch.arange(keys.numel(), device=keys.device)
    first = torch.full((capacity,), keys.numel(), dtype=torch.int64, device=keys.device)
    first.scatter_reduce_(0, slots, index, reduce="amin")
    clash = keys[first[slots]] != keys
    if bool(clash.any()):
        i = int(clash.nonzero()[0])
        j = int(first[slots[i]])
        raise _fail(
            handle, f"keys {int(keys[j])} and {int(keys[i])} both claim slot {int(slots[i])}"
        )
    korder = torch.argsort(keys)  # any order among equal keys will do
    ks, ss = keys[korder], slots[korder]
    split = (ks[1:] == ks[:-1]) & (ss[1:] != ss[:-1])
    if bool(split.any()):
        i = int(split.nonzero()[0])
        raise _fail(
            handle, f"key {int(ks[i])} appears at two slots ({int(ss[i])} and {int(ss[i + 1])})"
        )


def _column_permutation(
    source: DynamicEmbTableOptions, target: DynamicEmbTableOptions
) -> List[int]:
    """For each of the target's score columns, the source column holding the same strategy.

    (TIMESTAMP, LFU) and (LFU, TIMESTAMP) tables share one layout (check_layout accepts them), but their
    user-visible columns are swapped; a delta's scores are in the source's order.
    """
    order = list(source.score_strategies)
    return [order.index(s) for s in target.score_strategies]


def _check_slot_exact(handle: TableHandle, delta: DeltaDumpResult, i: int) -> None:
    """Refuse a delta without its evictions into a table whose keys a load packed.

    In such a table a delta key's slot may hold a key the source still has elsewhere (the load
    put it there) or one the source evicted to make room; only the delta's ``evicted_keys``
    (``EvictedItemMode.RETAIN_KEY``) tell the two apart. Without them the replay would guess,
    and a wrong guess keeps a key the source no longer holds, silently."""
    packed = handle.table.packed_slots(handle.table_id)
    evicted = delta.evicted_keys[i] if i < len(delta.evicted_keys) else None
    if packed is not None and evicted is None:
        shard = f"shard {handle.rank} of {handle.world_size}: " if handle.world_size > 1 else ""
        raise _fail(
            handle,
            f"{shard}its keys do not stand at the source's slots ({packed}), and the delta does "
            "not report the source's evictions (evicted_item_mode=DISCARD), so a key the source "
            "evicted cannot be told from one the load moved. Load a DynamicEmbDump of the source "
            "at its own world size and capacity (slot for slot), or train the source with "
            "evicted_item_mode=RETAIN_KEY",
        )


def _owned(handle: TableHandle, keys: Optional[torch.Tensor], device: torch.device) -> torch.Tensor:
    if keys is None:
        return torch.empty(0, dtype=torch.int64, device=device)
    keys = keys.to(device)
    return keys[owned_mask(keys, handle)]


def _plan_table(
    handle: TableHandle, delta: DeltaDumpResult, i: int, content: ReplayContent
) -> ReplayJob:
    check_dist_type_supported(handle, "replay_increment")
    meta = delta.meta[i]
    check_layout(handle, meta)
    _check_slot_exact(handle, delta, i)
    keys = _check_tensor(handle, "keys", delta.keys[i], (delta.keys[i].shape[0],), (torch.int64,))
    n = keys.shape[0]
    slots = _check_tensor(
        handle, "meta['slot_index']", meta.get("slot_index"), (n,), (torch.int64,)
    )
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    values = _check_tensor(handle, "values", delta.values[i], (n, handle.dim), floats)
    states = None
    if ReplayContent.OPTIMIZER_STATE in content and handle.state_width > 0:
        given = delta.optimizer_states[i] if i < len(delta.optimizer_states) else None
        if given is None or given.shape[-1] == 0:
            raise _fail(
                handle,
                "ReplayContent.OPTIMIZER_STATE asked for, but the delta carries no optimizer state",
            )
        states = _check_tensor(
            handle, "optimizer_states", given, (n, handle.optimizer_width), floats
        )
    ages = None
    if ReplayContent.SCORE in content:
        given = delta.scores[i] if i < len(delta.scores) else None
        ages = _check_tensor(
            handle, "scores", given, (n, handle.options.num_scores), (torch.int64,)
        )
        ages = ages[:, _column_permutation(meta["table_options"], handle.options)]
    device = handle.device
    keep = owned_mask(keys.to(device), handle)
    keys, slots = keys.to(device)[keep], slots.to(device)[keep]
    _check_slots(handle, keys, slots)
    return ReplayJob(
        handle=handle,
        keys=keys,
        slots=slots,
        values=values.to(device)[keep],
        states=None if states is None else states.to(device)[keep],
        ages=None if ages is None else ages.to(device)[keep],
        erased=_owned(handle, delta.erased_keys[i] if i < len(delta.erased_keys) else None, device),
        evicted=_owned(
            handle, delta.evicted_keys[i] if i < len(delta.evicted_keys) else None, device
        ),
    )


def plan_replay(
    handles: Sequence[TableHandle],
    deltas: Dict[str, DeltaDumpResult],
    content: ReplayContent,
    *,
    every_shard: bool = False,
) -> List[ReplayJob]:
    """Resolve and check every table of every collection in ``deltas``; write nothing.

    ``handles`` may hold several shards of one table (a served collection holds all of them): each
    shard gets its own job with the keys it owns. The jobs of one table account for every delta key
    owned by the shards present; with ``every_shard`` (the caller holds the whole table) every key
    of the delta must land in a job, so no row of the delta is left unapplied.

    Raises:
        TypeError: ``deltas`` or ``content`` of the wrong type.
        ValueError: a collection or table the model does not have.
        IncompatibleDeltaError: a layout, shape or slot that does not fit.
        NotImplementedError: a table sharded with ``dist_type="continuous"``.
    """
    if not isinstance(content, ReplayContent):
        raise TypeError(
            f"replay_increment: content must be a ReplayContent, got {type(content).__name__}"
        )
    if not isinstance(deltas, dict):
        raise TypeError(
            f"replay_increment: deltas must be Dict[str, DeltaDumpResult], got {type(deltas).__name__}"
        )
    by_name: Dict[Tuple[str, str], List[TableHandle]] = {}
    for h in handles:  # every shard of a table, not the last one seen
        by_name.setdefault((h.collection, h.name), []).append(h)
    collections = sorted({h.collection for h in handles})
    jobs = []
    for collection, delta in deltas.items():
        if not isinstance(delta, DeltaDumpResult):
            raise TypeError(
                f"replay_increment: deltas['{collection}'] must be a DeltaDumpResult, got {type(delta).__name__}"
            )
        if collection not in collections:
            raise ValueError(
                f"replay_increment: the model has no collection '{collection}'; it has {collections}"
            )
        for field in ("keys", "values", "meta"):
            if len(getattr(delta, field)) != len(delta.table_names):
                raise ValueError(
                    f"replay_increment: deltas['{collection}'].{field} has {len(getattr(delta, field))} "
                    f"entries for {len(delta.table_names)} tables"
                )
        for i, name in enumerate(delta.table_names):
            shards = by_name.get((collection, name))
            if shards is None:
                have = sorted(n for c, n in by_name if c == collection)
                raise ValueError(
                    f"replay_increment: collection '{collection}' has no table '{name}'; it has {have}"
                )
            table_jobs = [_plan_table(handle, delta, i, content) for handle in shards]
            _check_coverage(shards, table_jobs, delta.keys[i], every_shard)
            jobs.extend(table_jobs)
    return jobs


def _check_coverage(
    shards: Sequence[TableHandle], jobs: Sequence[ReplayJob], keys: torch.Tensor, every_shard: bool
) -> None:
    """Refuse a plan that would leave a row of the delta unapplied without saying so.

    Each of the table's shards present here must be a distinct shard of one world size, and the
    jobs must hold exactly the delta's keys those shards own: all of them when ``every_shard``
    (a served collection, which holds every shard), else those of the shards present (a trainer's
    rank; the other ranks replay the rest)."""
    first = shards[0]
    ranks = [h.rank for h in shards]
    worlds = {h.world_size for h in shards}
    if (
        len(set(ranks)) != len(ranks)
        or len(worlds) != 1
        or not all(0 <= r < first.world_size for r in ranks)
    ):
        raise _fail(
            first, f"shards {ranks} of world sizes {sorted(worlds)} are not distinct shards"
        )
    planned = sum(int(job.keys.numel()) for job in jobs)
    n = int(keys.numel())
    if every_shard:
        if len(ranks) != first.world_size:
            raise _fail(
                first,
                f"only shards {sorted(ranks)} of {first.world_size} are here; the delta's keys of "
                "the others would be left unapplied",
            )
        expected = n
    else:
        expected = sum(int(owned_mask(keys, h).sum()) for h in shards)
    if planned != expected:
        raise _fail(
            first,
            f"{planned} of the delta's {expected} keys (of {n}) owned by shards {sorted(ranks)} "
            "would be applied",
        )


def _check_applied(job: ReplayJob) -> None:
    """After the write: every key of the job stands at its slot; raise naming how many do not."""
    if not job.keys.numel():
        return
    found = job.handle.table.find(job.keys, job.handle.table_id)
    ok = found.found & (found.slots == job.slots)
    missing = int((~ok).sum())
    if missing:
        i = int((~ok).nonzero()[0])
        raise RuntimeError(
            f"replay_increment: table '{job.handle.qualified_name}' (shard {job.handle.rank}): "
            f"{missing} of the delta's {job.keys.numel()} keys are not at their slot after the "
            f"write (first: key {int(job.keys[i])}, slot {int(job.slots[i])})"
        )


def _occupants(job: ReplayJob) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(key, used)`` of each of the job's target slots, read from the table's flat state.

    The flat layout (``table_keys``, ``digests``, ``slot_offsets``) is the table's documented contract
    (docs/table_design.md); reading it costs O(n) where exporting the whole table would cost O(capacity).
    """
    table, t = job.handle.table, job.handle.table_id
    state = table.state
    first = state.slot_offsets[t].to(job.slots.device)
    global_slots = job.slots + first
    return state.table_keys[global_slots], state.digests[global_slots] != 0


@dataclass
class _Displaced:
    """Keys that stood where the delta's keys go, and are neither in the delta nor removed by it:
    their slot, row and scores, read before they were taken out."""

    keys: torch.Tensor
    rows: torch.Tensor
    scores: torch.Tensor


def _evict_displaced(job: ReplayJob) -> Tuple[torch.Tensor, _Displaced]:
    """Take out keys that stand where the delta's keys go; return (n,) bool "slot held this very key"
    and the keys taken out that the delta does not account for.

    A target slot may hold a key the source evicted (its replacement is this delta's key), a key the
    source holds at another slot (a target a load had to pack, ``packed_slots``: a delta reporting
    evictions is needed for it, see :func:`_check_slot_exact`), or a delta key that sits at another slot of its bucket in the
    target. All are removed first so every slot is empty or already holds its key when ``insert_at``
    runs; the second kind is put back by :func:`_relocate`.
    """
    table, t = job.handle.table, job.handle.table_id
    occupant, used = _occupants(job)
    same = used & (occupant == job.keys)
    other = used & ~same
    found = table.find(job.keys, t)
    moved = found.found & (found.slots != job.slots)
    gone = torch.cat([job.keys, job.erased, job.evicted])
    live = other & ~torch.isin(occupant, gone)
    keys = occupant[live]
    rows = job.handle.storage.read_rows(t, job.slots[live])
    scores = (
        table.find(keys, t).scores
        if keys.numel()
        else torch.empty(0, job.handle.options.num_scores, dtype=torch.int64, device=keys.device)
    )
    doomed = torch.cat([occupant[other], job.keys[moved]])
    if doomed.numel():
        table.erase(torch.unique(doomed), t)
    return same, _Displaced(keys, rows, scores)


def _relocate(job: ReplayJob, displaced: _Displaced) -> int:
    """Put displaced keys back, with their rows and scores, in a free slot of their home bucket.

    Called once the delta's keys stand at their slots. A displaced key whose bucket has no free slot
    left is dropped: the bucket holds as many keys as the source's, so the source evicted it.

    Returns:
        How many keys were dropped.
    """
    n = displaced.keys.numel()
    if not n:
        return 0
    handle, table, t = job.handle, job.handle.table, job.handle.table_id
    width = bucket_capacity(handle)
    capacity = int(table.capacity(t))
    home = _home_buckets(displaced.keys, capacity // width).cpu().tolist()
    first = int(table.state.slot_offsets[t])
    used = (table.state.digests[first : first + capacity] != 0).cpu()
    keep, slots = [], []
    for i, bucket in enumerate(home):
        free = (~used[bucket * width : (bucket + 1) * width]).nonzero()
        if free.numel():
            slot = bucket * width + int(free[0])
            used[slot] = True
            keep.append(i)
            slots.append(slot)
    if keep:
        device = displaced.keys.device
        index = torch.tensor(keep, dtype=torch.int64, device=device)
        where = torch.tensor(slots, dtype=torch.int64, device=device)
        table.insert_at(t, displaced.keys[index], where, scores=displaced.scores[index])
        handle.storage.write_rows(t, where, displaced.rows[index])
    return n - len(keep)


def apply_replay(job: ReplayJob, bar: Optional[tqdm] = None) -> None:
    """Write one checked table: displace occupants, place every key at its slot, put back displaced
    keys the source may still hold, then remove the keys the source erased or evicted (those the
    delta does not bring back)."""
    handle, table, t = job.handle, job.handle.table, job.handle.table_id
    same, displaced = _evict_displaced(job)
    now = table_now(handle)
    columns = clock_columns(handle.options)
    for lo in range(0, job.keys.numel(), _CHUNK):
        hi = lo + _CHUNK
        keys, slots = job.keys[lo:hi], job.slots[lo:hi]
        previous = handle.storage.read_rows(t, slots) if job.states is None else None
        states = None if job.states is None else job.states[lo:hi]
        rows = assemble_rows(handle, job.values[lo:hi], states, previous, same[lo:hi])
        if job.ages is not None:
            scores = from_ages(job.ages[lo:hi], columns, now)
        else:
            current = int(table.get_score(t))
            scores = default_scores(
                handle.options, keys.numel(), now=now, current=current, device=keys.device
            )
        table.insert_at(t, keys, slots, scores=scores)
        handle.storage.write_rows(t, slots, rows)
        if bar is not None:
            bar.update(keys.numel())
    _relocate(job, displaced)
    gone = torch.cat([job.erased, job.evicted])
    gone = gone[~torch.isin(gone, job.keys)]  # a key erased or evicted, then back, is in the delta
    if gone.numel():
        table.erase(torch.unique(gone), t)
    _check_applied(job)
    if handle.drop_from_cache is not None:
        handle.drop_from_cache(torch.cat([job.keys, job.erased, job.evicted]))


def replay_increment(
    model: nn.Module,
    deltas: Dict[str, DeltaDumpResult],
    content: ReplayContent = ReplayContent.EMBEDDING_ONLY,
    *,
    show_progress: Optional[bool] = None,
) -> None:
    """Apply deltas from :func:`incremental_dump` to a model whose tables share the source's layout.

    Every key goes to the slot and value row it held in the source. Keys that this process does not own
    (by the global rank and the table's shard world size) are skipped. The target's cache is flushed,
    then the delta's keys, its erased keys and its evicted keys are dropped from it; erased and
    evicted keys are removed from the table.

    Slots: a target whose keys stand at the source's slots (loaded slot for slot by
    ``DynamicEmbLoad`` or ``from_dump``, which happens whenever it can take the source's layout;
    built by ``from_model``; or fed every delta from the start) replays any delta exactly. A table
    a load had to pack (another world size, capacity or bucket width; see
    ``ScoredHashTable.packed_slots`` and docs/torchrec.md, "Where keys land") may hold, where a
    delta key goes, a key the source still holds elsewhere: such a key, neither in the delta nor
    reported erased or evicted, moves to a free slot of its bucket with its row, and where its
    bucket has none it is dropped, as the source must have evicted it. That is exact when the delta
    reports the source's evictions (``EvictedItemMode.RETAIN_KEY``); a delta that does not
    (``DISCARD``, ``evicted_keys`` None) is refused for a packed table before anything is written,
    since a key the source evicted cannot be told from one the load moved.

    Every key of the delta that this process's shards own is written, or an error is raised:
    planned keys are counted against the delta before anything is written, and each written key
    is checked at its slot afterwards.

    Args:
        model: the target model (a replica with ``training=False`` stores embeddings only; optimizer state
            in the delta is then dropped).
        deltas: ``{collection_path: DeltaDumpResult}`` as returned by ``incremental_dump``.
        content: what comes along with each embedding: ``OPTIMIZER_STATE``, ``SCORE``, both (``ALL``) or
            neither (``EMBEDDING_ONLY``: a fresh optimizer state for keys new to their slot, and every
            restored key scored alike: the target's clock, step or custom score; LFU count 1).
        show_progress: force the progress bar on or off.

    Raises:
        IncompatibleDeltaError: a table's layout or the delta's shapes do not fit, a key cannot be
            placed at its slot, or a packed table gets a delta without its evictions; raised
            before any table is written.
    """
    handles = find_tables(model, None)
    jobs = plan_replay(handles, deltas, content, every_shard=False)
    for job in jobs:  # only now, so a rejected delta leaves the model exactly as it was
        if job.handle.flush_cache is not None:
            job.handle.flush_cache()
    total = sum(job.keys.numel() for job in jobs)
    with row_bar(total, "replay_increment", rank=global_rank(), show_progress=show_progress) as bar:
        for job in jobs:
            apply_replay(job, bar)
