"""DynamicEmbDump and DynamicEmbLoad: full checkpoints of a model's dynamic tables.

Every rank writes its own shard of each table in parallel (one file per table per rank); rank 0 then
publishes a manifest. Loading reads the shards of every writer rank and keeps the keys this rank owns
under the *target's* sharding, so a checkpoint written by N processes loads into M. Every file is read and
checked before the first row is written to any table, so a bad checkpoint leaves the model exactly as it
was: its identity against the manifest (collection, table, kind, rank, world size, row count, dump id,
header checksum), its checksums, its fit to the target (dim, dtype, score columns, optimizer width), and
that every key it brings finds a slot in its target table: the slot the file records, when the table
can take the layout the file was written from (:func:`_slot_plan`, the file's slots checked), else one
of its home bucket (:func:`check_room`; the table is then marked packed).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from dynamicemb_core.checkpoint.collectives import (
    barrier,
    broadcast_object,
    group_rank,
    group_size,
)
from dynamicemb_core.checkpoint.discovery import find_tables
from dynamicemb_core.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
)
from dynamicemb_core.checkpoint.format import (
    ROWS,
    ShardHeader,
    ShardPayload,
    SlotLayout,
    check_header,
    read_shard,
    read_shard_identity,
    read_shard_keys,
    read_shard_section,
    verify_shard,
)
from dynamicemb_core.checkpoint.layout import bucket_capacity
from dynamicemb_core.checkpoint.manifest import (
    COUNTER,
    MANIFEST_NAME,
    ManifestEntry,
    check_entry,
    entries_by_table,
    merge_rank_manifests,
    new_dump_id,
    read_manifest,
    remove_manifest,
    write_entry,
    write_rank_manifest,
)
from dynamicemb_core.checkpoint.ownership import owned_mask
from dynamicemb_core.checkpoint.progress import row_bar
from dynamicemb_core.checkpoint.scores import score_column_names
from dynamicemb_core.checkpoint.state import (
    COUNT_COLUMNS,
    SCORE_CLOCK,
    TRAINING_STATE,
    check_training_states,
    counter_header,
    counter_payload,
    load_counter,
    restore_score_clock,
    restore_training,
    saved_score_clock,
    score_clock,
    training_state,
)
from dynamicemb_core.checkpoint.table_io import (
    check_room,
    export_rows,
    insert_rows,
    insert_rows_at,
)
from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["DynamicEmbDump", "DynamicEmbLoad", "dump_tables", "load_tables"]

TableNames = Optional[Dict[str, List[str]]]


def _header(
    handle: TableHandle, n: int, optim: bool, rank: int, world: int, dump_id: str
) -> ShardHeader:
    extra: Dict[str, Any] = {"optimizer": handle.optimizer, "dist_type": handle.dist_type}
    clock = score_clock(handle)
    if clock is not None:
        extra[SCORE_CLOCK] = clock
    if optim and handle.owner is not None:
        extra[TRAINING_STATE] = training_state(handle)
    return ShardHeader(
        table_name=handle.name,
        collection=handle.collection,
        num_rows=n,
        dim=handle.dim,
        optimizer_width=handle.optimizer_width if optim else 0,
        dtype=handle.embedding_dtype,
        state_dtype=None if handle.state_dtype == handle.embedding_dtype else handle.state_dtype,
        score_columns=score_column_names(handle.options),
        rank=rank,
        world_size=world,
        extra=extra,
        dump_id=dump_id,
        slot_layout=SlotLayout(
            capacity=int(handle.table.capacity(handle.table_id)),
            bucket_capacity=bucket_capacity(handle),
            row_capacity=handle.row_capacity,
            packed=handle.table.packed_slots(handle.table_id),
        ),
    )


def _folder_problem(path: str, allow_overwrite: bool) -> Optional[Tuple[str, str]]:
    """Why ``path`` cannot take a new dump, as ``(exception name, message)``; None when it can."""
    if not os.path.exists(path):
        return None
    if not os.path.isdir(path):
        return "NotADirectoryError", f"DynamicEmbDump: {path} exists and is not a folder"
    entries = sorted(os.listdir(path))
    if not entries or allow_overwrite:
        return None
    held = (
        "a checkpoint (MANIFEST.json)"
        if MANIFEST_NAME in entries
        else f"{len(entries)} entries ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''})"
    )
    return (
        "FileExistsError",
        f"DynamicEmbDump: {path} already holds {held}; dump into a new or empty folder, or pass "
        "allow_overwrite=True to replace the checkpoint there",
    )


def check_dump_folder(path: str, allow_overwrite: bool, pg: Optional[dist.ProcessGroup]) -> None:
    """Refuse a folder holding something else, on every rank alike (rank 0 looks, all raise).

    Raises:
        FileExistsError: ``path`` is not empty and ``allow_overwrite`` is False.
        NotADirectoryError: ``path`` is a file.
    """
    problem = _folder_problem(path, allow_overwrite) if group_rank(pg) == 0 else None
    problem = broadcast_object(problem, pg)
    if problem is not None:
        kind, message = problem
        raise {"FileExistsError": FileExistsError, "NotADirectoryError": NotADirectoryError}[kind](
            message
        )


def dump_tables(
    path: str,
    handles: Sequence[TableHandle],
    *,
    optim: bool = False,
    counter: bool = False,
    pg: Optional[dist.ProcessGroup] = None,
    show_progress: Optional[bool] = None,
    allow_overwrite: bool = False,
) -> List[ManifestEntry]:
    """Write ``handles`` to the checkpoint folder ``path``; every rank of ``pg`` must call it.

    Returns:
        The manifest entries this rank wrote.
    """
    rank, world = group_rank(pg), group_size(pg)
    check_dump_folder(path, allow_overwrite, pg)
    dump_id = broadcast_object(new_dump_id() if rank == 0 else None, pg)
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        remove_manifest(path)  # and temp files a killed dump left
    barrier(pg)
    entries = []
    for handle in handles:
        if handle.flush_cache is not None:
            handle.flush_cache()
        total = handle.table.size(handle.table_id)
        with row_bar(
            total, f"dump {handle.qualified_name}", rank=rank, show_progress=show_progress
        ) as bar:
            rows = export_rows(handle, None, bar)
        header = _header(handle, rows.keys.numel(), optim, rank, world, dump_id)
        payload = ShardPayload(
            keys=rows.keys,
            embeddings=rows.embeddings,
            optimizer_states=rows.optimizer_states if optim else rows.optimizer_states[:, :0],
            scores=rows.scores,
            slots=rows.slots,
        )
        entries.append(write_entry(path, header, payload, ROWS))
        if counter and handle.counter is not None:
            counts = counter_payload(handle.counter)
            head = counter_header(handle, counts.keys.numel(), rank, world)
            head = dataclasses.replace(head, dump_id=dump_id)
            entries.append(write_entry(path, head, counts, COUNTER))
    write_rank_manifest(path, rank, entries)
    barrier(pg)
    if rank == 0:
        merge_rank_manifests(path, world, dump_id)
    barrier(pg)
    return entries


Plan = List[Tuple[TableHandle, List[ShardHeader], List[str]]]


def _check_all(
    path: str,
    grouped: Dict[tuple, List[ManifestEntry]],
    handles: Sequence[TableHandle],
    optim: bool,
) -> Plan:
    plan = []
    for handle in handles:
        files = grouped.get((handle.collection, handle.name))
        if not files:
            have = sorted(f"{c}/{t}" for c, t in grouped)
            raise CheckpointMismatchError(
                f"checkpoint {path} has no table '{handle.qualified_name}'; it holds {have}"
            )
        headers, paths = _checked_headers(
            path,
            files,
            dim=handle.dim,
            dtype=handle.embedding_dtype,
            score_columns=score_column_names(handle.options),
            optimizer_width=handle.optimizer_width if optim and handle.state_width else None,
            where=handle.qualified_name,
        )
        plan.append((handle, headers, paths))
    return plan


def _check_counters(
    path: str, grouped: Dict[tuple, List[ManifestEntry]], handles: Sequence[TableHandle]
) -> Plan:
    """The counter files of every table that has an admission counter (``counter=True``)."""
    plan = []
    for handle in handles:
        files = grouped.get((handle.collection, handle.name), [])
        if handle.counter is None:
            if files:
                raise CheckpointMismatchError(
                    f"checkpoint {path} holds admission counts for '{handle.qualified_name}', but "
                    "the target table has no admit_strategy to count with; load with counter=False"
                )
            continue
        if not files:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds no admission counter for '{handle.qualified_name}' (it "
                "was dumped without counter=True); load with counter=False"
            )
        headers, paths = _checked_headers(
            path,
            files,
            dim=0,
            score_columns=COUNT_COLUMNS,
            optimizer_width=0,
            where=f"{handle.qualified_name} (admission counter)",
        )
        plan.append((handle, headers, paths))
    return plan


def _checked_headers(
    path: str, files: List[ManifestEntry], **expected: Any
) -> Tuple[List[Any], List[str]]:
    """Each file's header, checked against its manifest entry (identity) and ``expected``
    (``check_header``'s keywords), and its path."""
    headers, paths = [], []
    for entry in files:
        full = os.path.join(path, entry.path)
        header, crc = read_shard_identity(full)
        check_entry(path, entry, header, crc)
        _check_extra(full, header)
        check_header(header, **expected)
        headers.append(header)
        paths.append(full)
    return headers, paths


def _check_extra(full: str, header: ShardHeader) -> None:
    """The header's ``extra`` fields a load applies after writing rows must be usable now: the
    score clock an int, the training state an object (its contents: check_training_states)."""
    clock = header.extra.get(SCORE_CLOCK)
    state = header.extra.get(TRAINING_STATE)
    if (clock is not None and (not isinstance(clock, int) or isinstance(clock, bool))) or (
        state is not None and not isinstance(state, dict)
    ):
        raise CheckpointCorruptError(
            f"checkpoint file {full}: damaged header: extra {SCORE_CLOCK}={clock!r} / "
            f"{TRAINING_STATE}={type(state).__name__} (expected an int / an object)"
        )


def _owned(payload: ShardPayload, handle: TableHandle) -> ShardPayload:
    keep = owned_mask(payload.keys, handle)
    if bool(keep.all()):
        return payload
    return ShardPayload(*(t[keep] for _, t in payload.sections()))


def _owned_keys(handle: TableHandle, paths: Sequence[str]) -> Tuple[torch.Tensor, List[int]]:
    """The keys of ``paths`` that ``handle``'s shard owns, after checking every section's checksum
    of each file (holding a chunk and the keys section at a time), and how many each file brings.
    A dump's files hold each key once; a key listed twice (a crafted folder) is counted twice,
    which can only make the room check stricter."""
    parts = [torch.empty(0, dtype=torch.int64)]
    for full in paths:
        verify_shard(full)  # every section's checksum, a chunk at a time
        keys = read_shard_keys(full)
        parts.append(keys[owned_mask(keys, handle)])
    return torch.cat(parts), [p.numel() for p in parts[1:]]


@dataclasses.dataclass
class _Room:
    """What the load of one table will do, decided before anything is written.

    Attributes:
        handle: the table; keys: the keys it takes (owned by its shard); capacity: the capacity
        it grows to first; total: keys it holds after the load.
        source: with a slot-exact load, the index (in the table's file list) of the one file
            whose keys go back to their recorded slots; None: a packing load.
        layout: that file's slot layout.
        packed: why the load packs (None when slot-exact); the table records it
            (``ScoredHashTable.packed_slots``).
    """

    handle: TableHandle
    keys: torch.Tensor
    capacity: int
    total: int
    source: Optional[int] = None
    layout: Optional[SlotLayout] = None
    packed: Optional[str] = None


def _capacity_for(handle: TableHandle, wanted: int) -> int:
    """The capacity ``reserve(wanted)`` would reach if memory allows: doubling from today's,
    stopping at ``max_capacity`` unless the table grows past it (NO_EVICTION)."""
    spec = handle.table.specs[handle.table_id]
    capacity = int(handle.table.capacity(handle.table_id))
    while capacity < wanted:
        if capacity >= spec.max_capacity and not spec.grows_past_max_capacity:
            break
        capacity *= 2
    return capacity


def _slot_plan(
    handle: TableHandle, headers: Sequence[ShardHeader], paths: Sequence[str], brought: List[int]
) -> Tuple[Optional[int], int, str]:
    """Whether ``handle``'s table can take its keys at the slots their file records.

    It can when one file holds all the keys the shard owns, written by the same shard of the same
    world size (all its keys owned here), with its slots (format 3); and the table reaches the
    file's capacity (empty: by growing to it within ``max_capacity``; holding keys: it has it,
    and each key it holds is in the file at the slot it already has) with the same bucket width.

    Returns:
        ``(file index or None, capacity, why not)``.
    """
    table, t = handle.table, handle.table_id
    world = {h.world_size for h in headers}
    mine = [i for i, h in enumerate(headers) if h.rank == handle.rank]
    if world != {handle.world_size} or len(mine) != 1:
        return (
            None,
            0,
            (
                f"loaded from a dump of world size {', '.join(map(str, sorted(world)))} into "
                f"shard {handle.rank} of {handle.world_size}"
            ),
        )
    i = mine[0]
    layout = headers[i].slot_layout
    if layout is None:
        return None, 0, "loaded from a file that records no slots (format 2)"
    if brought[i] != headers[i].num_rows or sum(brought) != brought[i]:
        return (
            None,
            0,
            (
                f"the dump's shards own other keys than this one ({headers[i].extra.get('dist_type')}"
                f" vs {handle.dist_type})"
            ),
        )
    held = table.size(t)
    capacity = int(table.capacity(t)) if held else _capacity_for(handle, layout.capacity)
    width = capacity if table.specs[t].single_bucket else int(table.bucket_capacity(t))
    if capacity != layout.capacity or width != layout.bucket_capacity:
        return (
            None,
            0,
            (
                f"loaded from a table of capacity {layout.capacity} (buckets of "
                f"{layout.bucket_capacity}) into one of capacity {capacity} (buckets of {width}"
                + (
                    f", holding {held} keys"
                    if held
                    else f", max_capacity {table.specs[t].max_capacity}"
                )
                + ")"
            ),
        )
    keys, slots = read_shard_keys(paths[i]), read_shard_section(paths[i], "slots")
    _check_slots(paths[i], keys, slots, layout)
    if held:
        mine_now = table.export(t)
        order = torch.argsort(keys)
        where = torch.searchsorted(keys[order], mine_now.keys.cpu()).clamp(
            max=max(keys.numel() - 1, 0)
        )
        same = (
            (keys[order][where] == mine_now.keys.cpu())
            & (slots[order][where] == mine_now.slots.cpu())
            if keys.numel()
            else torch.zeros(held, dtype=torch.bool)
        )
        if not bool(same.all()):
            return (
                None,
                0,
                (f"the table held {int((~same).sum())} keys at other slots than the file's"),
            )
    return i, capacity, ""


def _check_slots(path: str, keys: torch.Tensor, slots: torch.Tensor, layout: SlotLayout) -> None:
    """A file's slots fit its own layout: each in its key's home bucket, none twice, below the
    row capacity; raise CheckpointCorruptError naming the file and the first bad key otherwise."""
    from dynamicemb_core.table.hashing import buckets_of_tensor

    if not keys.numel():
        return
    width = layout.bucket_capacity
    home = buckets_of_tensor(keys, layout.capacity // width)
    bad = (slots < 0) | (slots >= min(layout.capacity, layout.row_capacity))
    bad |= torch.div(slots, width, rounding_mode="floor") != home
    problem = "lies outside its home bucket"
    if not bool(bad.any()):  # slots in range: count them; keys: unique (a sort) only to test
        twice_slot = torch.bincount(slots, minlength=layout.capacity)[slots] > 1
        twice_key = torch.zeros_like(bad)
        if torch.unique(keys).numel() != keys.numel():
            ordered, index = torch.sort(keys)
            twice_key[index[1:]] = ordered[1:] == ordered[:-1]
        bad = twice_slot | twice_key
        problem = "shares its slot or key with another row of the file"
    if bool(bad.any()):
        j = int(bad.nonzero()[0])
        raise CheckpointCorruptError(
            f"checkpoint file {path}: key {int(keys[j])} at slot {int(slots[j])} {problem} "
            f"(capacity {layout.capacity}, buckets of {width}); nothing was written"
        )


def _check_rooms(plan: Plan) -> List[_Room]:
    """Per table, how it takes its keys (:func:`_slot_plan`: slot for slot when it can, else
    packed), the capacity it must grow to, and the keys it holds after the load, refusing
    (:func:`check_room`) a table that cannot hold them all."""
    rooms = []
    for handle, headers, paths in plan:
        keys, brought = _owned_keys(handle, paths)
        source, capacity, why = _slot_plan(handle, headers, paths, brought)
        if source is not None:
            layout = headers[source].slot_layout
            assert layout is not None  # _slot_plan picks only a file that records its layout
            total = keys.numel()  # the keys held already are the file's (checked)
            rooms.append(_Room(handle, keys, capacity, total, source, layout, layout.packed))
        else:
            capacity, total = check_room(handle, keys)
            rooms.append(_Room(handle, keys, capacity, total, packed=why))
    return rooms


def _grow(rooms: List[_Room]) -> None:
    """Grow every table to the capacity its check planned (a rehash: keys and rows stay). Where
    memory stops a table short of it, a slot-exact load turns into a packing one, and the
    table's buckets are checked again at the capacity it reached."""
    for room in rooms:
        handle = room.handle
        reached = handle.table.reserve(handle.table_id, room.capacity)
        if room.layout is not None and (
            reached != room.layout.capacity or handle.row_capacity < room.layout.row_capacity
        ):
            room.source, room.layout = None, None
            room.packed = (
                f"the table reached {reached} slots ({handle.row_capacity} rows) of the "
                f"source's {room.capacity}"
            )
            room.capacity, room.total = check_room(handle, room.keys, reached)
        elif reached < room.capacity:
            check_room(handle, room.keys, reached)


def _check_landed(handle: TableHandle, keys: torch.Tensor, total: int, unplaced: int) -> None:
    """After writing: the table holds the ``total`` keys :func:`check_room` counted (its own and
    every loaded one), or each loaded key is found. A failure is a bug, reported rather than
    returned as a silent partial load."""
    table, t = handle.table, handle.table_id
    if not unplaced and table.size(t) >= total:
        return
    missing = keys.numel() - int(table.find(keys.to(handle.device), t).found.sum())
    if unplaced or missing:
        raise CheckpointError(
            f"load of table '{handle.qualified_name}': {max(unplaced, missing)} of {keys.numel()} "
            "keys are not in the table after writing although its room was checked (a bug; the "
            "table was written, the other tables may not be)"
        )


def load_tables(
    path: str,
    handles: Sequence[TableHandle],
    *,
    optim: bool = False,
    counter: bool = False,
    show_progress: Optional[bool] = None,
    rank_for_bar: int = 0,
) -> Dict[str, Tuple[int, int]]:
    """Load every handle's rows from ``path``, keeping the keys each handle's shard owns.

    Before any table is written: the manifest and every file's identity against it, every header
    against its target, every section checksum of every table (and of its admission counter with
    ``counter``), that each table can hold every key it will hold (:func:`check_room`), and with
    ``optim`` the saved optimizer step and hyper-parameters against the target modules. Then the
    tables grow to the capacity that check planned, and the files are read again one at a time to
    be written. After the rows come the admission counts, the tables' score clocks (STEP step,
    CUSTOMIZED score) and, with ``optim``, each module's optimizer step and hyper-parameters.

    Returns:
        ``{"collection/table": (placed, unplaced)}`` (rows written, rows that found no slot),
        summed over the handles of one table; unplaced is 0 (a load that cannot place every key is
        refused).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointCorruptError, CheckpointMismatchError: nothing was written.
    """
    entries = read_manifest(path)
    plan = _check_all(path, entries_by_table(entries), handles, optim)
    trainings = check_training_states([(h, hs) for h, hs, _ in plan], path) if optim else []
    counters = _check_counters(path, entries_by_table(entries, COUNTER), handles) if counter else []
    for _, _, paths in counters:
        for full in paths:
            verify_shard(full)  # every checksum, before any table is written
    rooms = _check_rooms(plan)  # reads every rows file: checksums, slots, room for its keys
    _grow(rooms)
    result: Dict[str, Tuple[int, int]] = {}
    for (handle, headers, paths), room in zip(plan, rooms, strict=True):
        total = sum(h.num_rows for h in headers)
        placed = unplaced = 0
        desc = f"load {handle.qualified_name}"
        with row_bar(total, desc, rank=rank_for_bar, show_progress=show_progress) as bar:
            for j, full in enumerate(paths):  # one file in memory at a time
                if room.source is not None and j != room.source:
                    bar.update(headers[j].num_rows)  # owns none of this shard's keys (checked)
                    continue
                _, whole = read_shard(full)
                p = _owned(whole, handle)
                bar.update(whole.keys.numel() - p.keys.numel())
                opt = p.optimizer_states if optim and p.optimizer_states.shape[1] else None
                if room.source is not None:
                    assert p.slots is not None  # the slot-exact source's file records slots
                    a, b = (
                        insert_rows_at(handle, p.keys, p.slots, p.embeddings, opt, p.scores, bar),
                        0,
                    )
                else:
                    a, b = insert_rows(handle, p.keys, p.embeddings, opt, p.scores, bar)
                placed, unplaced = placed + a, unplaced + b
                if handle.drop_from_cache is not None:
                    handle.drop_from_cache(p.keys)
        _check_landed(handle, room.keys, room.total, unplaced)
        handle.table.set_packed_slots(handle.table_id, room.packed)
        restore_score_clock(handle, saved_score_clock(headers))
        before = result.get(handle.qualified_name, (0, 0))  # a served table's shards add up
        result[handle.qualified_name] = (before[0] + placed, before[1] + unplaced)
    for handle, _, paths in counters:
        parts = [_owned(read_shard(full)[1], handle) for full in paths]
        keys = torch.cat([p.keys for p in parts])
        load_counter(handle.counter, keys, torch.cat([p.scores[:, 0] for p in parts]))
    for restore in trainings:
        restore_training(restore)
    return result


def _check_pg(pg: Any, api: str) -> None:
    if isinstance(pg, bool):
        raise TypeError(
            f"{api}: the fifth argument is the process group (the seed's signature), got {pg!r}; "
            "pass counter=... (and allow_overwrite=...) by keyword"
        )


def DynamicEmbDump(
    path: str,
    model: nn.Module,
    table_names: TableNames = None,
    optim: Optional[bool] = False,
    pg: Optional[dist.ProcessGroup] = None,
    *,
    counter: bool = False,
    allow_overwrite: bool = False,
    show_progress: Optional[bool] = None,
) -> None:
    """Dump the model's dynamic tables to the folder ``path``: everything needed to resume training.

    Every rank of ``pg`` writes its shard of every table in parallel; rank 0 then writes
    ``MANIFEST.json``. A dump that dies halfway leaves no manifest, and :func:`DynamicEmbLoad`
    refuses such a folder. Each table's file holds its keys, embeddings and scores (timestamps as
    ages) and its score clock (the step of a STEP table, the score of a CUSTOMIZED one).

    Args:
        path: checkpoint folder; created when missing, refused when it holds anything (unless
            ``allow_overwrite``).
        model: the model holding dynamic tables (plain BatchedDynamicEmbeddingTables or TorchRec-sharded).
        table_names: ``{collection_path: [table, ...]}`` to dump a subset; None dumps every dynamic table.
        optim: also dump optimizer states (per row) and each lookup module's optimizer step and
            hyper-parameters (learning rate, eps, betas, weight decay, ...).
        pg: process group whose ranks dump together (WORLD when None).
        counter: also dump each table's admission counter (keys seen, not yet admitted, and counts).
        allow_overwrite: dump into a non-empty folder, replacing the checkpoint there (shard files
            the new manifest does not list are deleted; other files are left alone).
        show_progress: force the rank-0 progress bars on or off (None: only on a terminal).

    Every file names the dump (a random ``dump_id``), its collection, table, kind, rank and world
    size; the manifest lists the same and each file's header checksum, which :func:`DynamicEmbLoad`
    checks (docs/torchrec.md, "Identity of a checkpoint's files"). Temp files a killed dump left
    in ``path`` are deleted first.

    Raises:
        FileExistsError: ``path`` is not empty and ``allow_overwrite`` is False (nothing written).
        NotADirectoryError: ``path`` is a file.
        CheckpointWriteError: a file could not be written (a full disk, ...); the message names it
            and the folder is left without a manifest.
    """
    _check_pg(pg, "DynamicEmbDump")
    dump_tables(
        path,
        find_tables(model, table_names),
        optim=bool(optim),
        counter=bool(counter),
        pg=pg,
        show_progress=show_progress,
        allow_overwrite=bool(allow_overwrite),
    )


def DynamicEmbLoad(
    path: str,
    model: nn.Module,
    table_names: Union[TableNames, List[str]] = None,
    optim: bool = False,
    pg: Optional[dist.ProcessGroup] = None,
    *,
    counter: bool = False,
    show_progress: Optional[bool] = None,
) -> Dict[str, Tuple[int, int]]:
    """Load a :func:`DynamicEmbDump` checkpoint into the model's dynamic tables.

    Keys are routed by owner under the model's current sharding, so the writer's and reader's process
    counts may differ. Where a table can take the layout it was dumped from (same shard of the same
    world size, the dumped capacity within its ``max_capacity``, the same bucket width), every key
    goes back to its dumped slot, so the source's ``incremental_dump`` deltas replay into it slot
    for slot; otherwise the load packs each bucket and marks the table
    (``ScoredHashTable.packed_slots``; docs/torchrec.md, "Where keys land"). Timestamps are re-based on this process's clock (files store ages); STEP and
    CUSTOMIZED score clocks move forward to the saved ones.

    Args:
        path: checkpoint folder.
        model: the model holding dynamic tables.
        table_names: ``{collection_path: [table, ...]}`` (or a plain list of table names, matched in every
            collection) to load a subset; None loads every dynamic table.
        optim: also restore optimizer states (otherwise keys already present keep theirs, new keys get a
            fresh state) and each module's optimizer step and hyper-parameters, so training resumes
            as if it had not stopped.
        pg: process group of the loading ranks (used only for the progress bar's rank).
        counter: also restore the admission counters (the dump must have been written with it).
        show_progress: force the rank-0 progress bars on or off.

    Returns:
        ``{"collection/table": (placed, unplaced)}``: rows this process wrote per table, and rows
        that found no slot (always 0: such a load is refused before writing).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointCorruptError: missing manifest, damaged manifest (missing, unexpected or mistyped
            fields, not UTF-8 JSON, a path outside the folder), truncated file, bad checksum, a
            checkpoint of format version 1 (nothing was written).
        CheckpointMismatchError: a file that is not the one its manifest entry lists (another
            table's, collection's or dump's; see docs/torchrec.md); a table missing from the
            checkpoint, or of another dim / dtype / score columns / optimizer width; more keys than
            the target table can hold (``max_capacity``, or a bucket that would overflow); with
            ``optim``, no saved optimizer state or another optimizer; with ``counter``, no saved
            counter (nothing was written).
    """
    _check_pg(pg, "DynamicEmbLoad")
    if isinstance(table_names, (list, tuple)):  # the seed's signature: names in any collection
        wanted = set(table_names)
        handles = [h for h in find_tables(model, None) if h.name in wanted]
        missing = wanted - {h.name for h in handles}
        if missing:
            raise ValueError(f"table_names: the model has no dynamic table {sorted(missing)}")
    else:
        handles = find_tables(model, table_names)
    return load_tables(
        path,
        handles,
        optim=optim,
        counter=bool(counter),
        show_progress=show_progress,
        rank_for_bar=group_rank(pg),
    )
