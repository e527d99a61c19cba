"""DynamicEmbDump and DynamicEmbLoad: full checkpoints of a model's dynamic tables.

Every rank writes its own shard of each table in parallel (one file per table per rank); rank 0 then
publishes a manifest. Loading reads the shards of every writer rank and keeps the keys this rank owns
under the *target's* sharding, so a checkpoint written by N processes loads into M. Every file is read and
checked (checksums, dim, dtype, score columns, optimizer width) before the first row is written to any
table, so a bad checkpoint leaves the model exactly as it was.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.distributed as dist
from torch import nn

from dynamicemb_core.checkpoint.collectives import barrier, group_rank, group_size
from dynamicemb_core.checkpoint.discovery import find_tables
from dynamicemb_core.checkpoint.errors import CheckpointMismatchError
from dynamicemb_core.checkpoint.format import (
    ShardHeader,
    ShardPayload,
    check_header,
    read_shard,
    read_shard_header,
    verify_shard,
    write_shard,
)
from dynamicemb_core.checkpoint.manifest import (
    ManifestEntry,
    entries_by_table,
    merge_rank_manifests,
    read_manifest,
    remove_manifest,
    shard_relpath,
    write_rank_manifest,
)
from dynamicemb_core.checkpoint.ownership import owned_mask
from dynamicemb_core.checkpoint.progress import row_bar
from dynamicemb_core.checkpoint.scores import score_column_names
from dynamicemb_core.checkpoint.table_io import export_rows, insert_rows
from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["DynamicEmbDump", "DynamicEmbLoad", "dump_tables", "load_tables"]

TableNames = Optional[Dict[str, List[str]]]


def _header(handle: TableHandle, n: int, optim: bool, rank: int, world: int) -> ShardHeader:
    return ShardHeader(
        table_name=handle.name,
        collection=handle.collection,
        num_rows=n,
        dim=handle.dim,
        optimizer_width=handle.optimizer_width if optim else 0,
        dtype=handle.dtype,
        score_columns=score_column_names(handle.options),
        rank=rank,
        world_size=world,
        extra={"optimizer": handle.optimizer, "dist_type": handle.dist_type},
    )


def dump_tables(
    path: str,
    handles: Sequence[TableHandle],
    *,
    optim: bool = False,
    pg: Optional[dist.ProcessGroup] = None,
    show_progress: Optional[bool] = None,
) -> List[ManifestEntry]:
    """Write ``handles`` to the checkpoint folder ``path``; every rank of ``pg`` must call it.

    Returns:
        The manifest entries this rank wrote.
    """
    rank, world = group_rank(pg), group_size(pg)
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        remove_manifest(path)
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
        header = _header(handle, rows.keys.numel(), optim, rank, world)
        payload = ShardPayload(
            keys=rows.keys,
            embeddings=rows.embeddings,
            optimizer_states=rows.optimizer_states if optim else rows.optimizer_states[:, :0],
            scores=rows.scores,
        )
        rel = shard_relpath(handle.collection, handle.name, rank, world)
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        size = write_shard(os.path.join(path, rel), header, payload)
        entries.append(
            ManifestEntry(handle.collection, handle.name, rank, world, rel, size, header.num_rows)
        )
    write_rank_manifest(path, rank, entries)
    barrier(pg)
    if rank == 0:
        merge_rank_manifests(path, world)
    barrier(pg)
    return entries


def _check_all(
    path: str, handles: Sequence[TableHandle], optim: bool
) -> List[Tuple[TableHandle, List[ShardHeader], List[str]]]:
    grouped = entries_by_table(read_manifest(path))
    plan = []
    for handle in handles:
        files = grouped.get((handle.collection, handle.name))
        if not files:
            have = sorted(f"{c}/{t}" for c, t in grouped)
            raise CheckpointMismatchError(
                f"checkpoint {path} has no table '{handle.qualified_name}'; it holds {have}"
            )
        headers, paths = [], []
        for entry in files:
            full = os.path.join(path, entry.path)
            header = read_shard_header(full)
            check_header(
                header,
                dim=handle.dim,
                dtype=handle.dtype,
                score_columns=score_column_names(handle.options),
                optimizer_width=handle.optimizer_width if optim and handle.state_width else None,
                where=handle.qualified_name,
            )
            headers.append(header)
            paths.append(full)
        plan.append((handle, headers, paths))
    return plan


def load_tables(
    path: str,
    handles: Sequence[TableHandle],
    *,
    optim: bool = False,
    show_progress: Optional[bool] = None,
    rank_for_bar: int = 0,
) -> Dict[str, Tuple[int, int]]:
    """Load every handle's rows from ``path``, keeping the keys each handle's shard owns.

    Every header and every section checksum of every table is verified (streaming, one chunk at a time)
    before any table is written; the files are then read again one at a time to be written.

    Returns:
        ``{"collection/table": (placed, unplaced)}``.

    Raises:
        CheckpointCorruptError, CheckpointMismatchError: nothing was written.
    """
    plan = _check_all(path, handles, optim)
    for _, _, paths in plan:
        for full in paths:
            verify_shard(full)  # every checksum, before any table is written
    result = {}
    for handle, headers, paths in plan:
        total = sum(h.num_rows for h in headers)
        placed = unplaced = 0
        desc = f"load {handle.qualified_name}"
        with row_bar(total, desc, rank=rank_for_bar, show_progress=show_progress) as bar:
            for full in paths:  # one file in memory at a time
                _, p = read_shard(full)
                keep = owned_mask(p.keys, handle)
                if not bool(keep.all()):
                    p = ShardPayload(*(t[keep] for _, t in p.sections()))
                    bar.update(int((~keep).sum()))
                opt = p.optimizer_states if optim and p.optimizer_states.shape[1] else None
                a, b = insert_rows(handle, p.keys, p.embeddings, opt, p.scores, bar)
                placed, unplaced = placed + a, unplaced + b
                if handle.drop_from_cache is not None:
                    handle.drop_from_cache(p.keys)
        result[handle.qualified_name] = (placed, unplaced)
    return result


def DynamicEmbDump(
    path: str,
    model: nn.Module,
    table_names: TableNames = None,
    optim: Optional[bool] = False,
    pg: Optional[dist.ProcessGroup] = None,
    *,
    show_progress: Optional[bool] = None,
) -> None:
    """Dump the model's dynamic tables (keys, embeddings, scores and optionally optimizer state) to ``path``.

    Every rank of ``pg`` writes its shard of every table in parallel; rank 0 then writes ``MANIFEST.json``.
    A dump that dies halfway leaves no manifest, and :func:`DynamicEmbLoad` refuses such a folder.

    Args:
        path: checkpoint folder (created when missing; a previous checkpoint in it is replaced).
        model: the model holding dynamic tables (plain BatchedDynamicEmbeddingTables or TorchRec-sharded).
        table_names: ``{collection_path: [table, ...]}`` to dump a subset; None dumps every dynamic table.
        optim: also dump optimizer states.
        pg: process group whose ranks dump together (WORLD when None).
        show_progress: force the rank-0 progress bars on or off (None: only on a terminal).
    """
    dump_tables(
        path, find_tables(model, table_names), optim=bool(optim), pg=pg, show_progress=show_progress
    )


def DynamicEmbLoad(
    path: str,
    model: nn.Module,
    table_names: Union[TableNames, List[str]] = None,
    optim: bool = False,
    pg: Optional[dist.ProcessGroup] = None,
    *,
    show_progress: Optional[bool] = None,
) -> None:
    """Load a :func:`DynamicEmbDump` checkpoint into the model's dynamic tables.

    Keys are routed by owner under the model's current sharding, so the writer's and reader's process
    counts may differ. Timestamps are re-based on this process's clock (files store ages).

    Args:
        path: checkpoint folder.
        model: the model holding dynamic tables.
        table_names: ``{collection_path: [table, ...]}`` (or a plain list of table names, matched in every
            collection) to load a subset; None loads every dynamic table.
        optim: also restore optimizer states (otherwise keys already present keep theirs, new keys get a
            fresh state).
        pg: process group of the loading ranks (used only for the progress bar's rank).
        show_progress: force the rank-0 progress bars on or off.

    Raises:
        CheckpointCorruptError: missing manifest, truncated file, bad checksum (nothing was written).
        CheckpointMismatchError: a table missing from the checkpoint, or of another dim / dtype / score
            columns / optimizer width (nothing was written).
    """
    if isinstance(table_names, (list, tuple)):  # the seed's signature: names in any collection
        wanted = set(table_names)
        handles = [h for h in find_tables(model, None) if h.name in wanted]
        missing = wanted - {h.name for h in handles}
        if missing:
            raise ValueError(f"table_names: the model has no dynamic table {sorted(missing)}")
    else:
        handles = find_tables(model, table_names)
    load_tables(
        path, handles, optim=optim, show_progress=show_progress, rank_for_bar=group_rank(pg)
    )
