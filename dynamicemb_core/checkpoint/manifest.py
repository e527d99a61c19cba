"""The checkpoint folder's manifest: the list of shard files, written last, so a partial dump is never loadable.

Layout of a checkpoint folder::

    <root>/MANIFEST.json                                   written last, atomically
    <root>/<collection>/<table>.rank<r>-of-<w>.demb        one shard file per table per writer rank
    <root>/<collection>/<table>.rank<r>-of-<w>.counter.demb  its admission counter (``counter=True``)

Each rank writes its shards and then a small fragment ``.manifest.rank<r>.json``; after a barrier rank 0
merges the fragments into ``MANIFEST.json`` and deletes shard files the new manifest does not list (left by
an earlier dump with more ranks or other tables). A dump first removes the old manifest, so while it runs
the folder is "incomplete" rather than a mix of two dumps.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

from dynamicemb_core.checkpoint.atomic import atomic_write
from dynamicemb_core.checkpoint.errors import CheckpointCorruptError
from dynamicemb_core.checkpoint.format import FORMAT_VERSION

__all__ = [
    "COUNTER",
    "MANIFEST_NAME",
    "ROWS",
    "ManifestEntry",
    "merge_rank_manifests",
    "read_manifest",
    "remove_manifest",
    "shard_relpath",
    "write_rank_manifest",
]

MANIFEST_NAME = "MANIFEST.json"
SHARD_SUFFIX = ".demb"
ROWS = "rows"
COUNTER = "counter"


@dataclass(frozen=True)
class ManifestEntry:
    """One shard file of a checkpoint.

    Attributes:
        collection: the collection's module path; table: the table's name.
        rank, world_size: the writer's rank and the number of writer ranks.
        path: the file, relative to the checkpoint root.
        nbytes: its size; num_rows: rows it holds.
        kind: ``"rows"`` (the table's keys and rows) or ``"counter"`` (its admission counter).
    """

    collection: str
    table: str
    rank: int
    world_size: int
    path: str
    nbytes: int
    num_rows: int
    kind: str = ROWS


def _safe(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return cleaned or "_"


def shard_relpath(collection: str, table: str, rank: int, world_size: int, kind: str = ROWS) -> str:
    """Where a table's shard (or its counter's, ``kind="counter"``) from ``rank`` lives, relative to
    the checkpoint root."""
    part = "" if kind == ROWS else f".{kind}"
    return os.path.join(
        _safe(collection), f"{_safe(table)}.rank{rank}-of-{world_size}{part}{SHARD_SUFFIX}"
    )


def _fragment(root: str, rank: int) -> str:
    return os.path.join(root, f".manifest.rank{rank}.json")


def _dump_json(path: str, obj: object) -> None:
    atomic_write(path, [json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")])


def remove_manifest(root: str) -> None:
    """Mark the folder incomplete (called before any shard of a new dump is written)."""
    for path in [os.path.join(root, MANIFEST_NAME)] + glob.glob(
        os.path.join(root, ".manifest.rank*.json")
    ):
        if os.path.exists(path):
            os.unlink(path)


def write_rank_manifest(root: str, rank: int, entries: Sequence[ManifestEntry]) -> None:
    """Record the shards this rank finished writing."""
    _dump_json(_fragment(root, rank), [asdict(e) for e in entries])


def merge_rank_manifests(root: str, world_size: int) -> List[ManifestEntry]:
    """Rank 0, after a barrier: merge every rank's fragment into MANIFEST.json and drop stale shards.

    Raises:
        CheckpointCorruptError: a rank's fragment is missing (that rank did not finish).
    """
    entries: List[ManifestEntry] = []
    for rank in range(world_size):
        frag = _fragment(root, rank)
        if not os.path.exists(frag):
            raise CheckpointCorruptError(
                f"checkpoint {root}: rank {rank} of {world_size} did not finish its shards ({frag} missing)"
            )
        with open(frag, "r", encoding="utf-8") as f:
            entries.extend(ManifestEntry(**e) for e in json.load(f))
    _dump_json(
        os.path.join(root, MANIFEST_NAME),
        {
            "format_version": FORMAT_VERSION,
            "world_size": world_size,
            "files": [asdict(e) for e in entries],
        },
    )
    listed = {os.path.normpath(os.path.join(root, e.path)) for e in entries}
    for path in glob.glob(os.path.join(root, "*", "*" + SHARD_SUFFIX)):
        if os.path.normpath(path) not in listed:
            os.unlink(path)
    for rank in range(world_size):
        os.unlink(_fragment(root, rank))
    return entries


def read_manifest(root: str) -> List[ManifestEntry]:
    """Read MANIFEST.json and check that every listed file exists with its recorded size.

    Raises:
        FileNotFoundError / NotADirectoryError: ``root`` does not exist, or is a file.
        CheckpointCorruptError: no manifest (the dump did not finish), or a listed file is missing or of
            another size.
    """
    if not os.path.exists(root):
        raise FileNotFoundError(f"checkpoint {root}: the path does not exist")
    if not os.path.isdir(root):
        raise NotADirectoryError(
            f"checkpoint {root}: not a folder (DynamicEmbDump writes a folder)"
        )
    path = os.path.join(root, MANIFEST_NAME)
    if not os.path.exists(path):
        raise CheckpointCorruptError(
            f"checkpoint {root}: no {MANIFEST_NAME}; the dump that wrote this folder did not finish "
            f"(or this is not a DynamicEmbDump folder)"
        )
    with open(path, "r", encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as err:
            raise CheckpointCorruptError(f"checkpoint {path}: unreadable manifest: {err}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointCorruptError(
            f"checkpoint {path}: format version {meta.get('format_version')}; this build reads {FORMAT_VERSION}"
        )
    entries = [ManifestEntry(**e) for e in meta["files"]]
    for e in entries:
        full = os.path.join(root, e.path)
        if not os.path.exists(full):
            raise CheckpointCorruptError(f"checkpoint {root}: listed file {e.path} is missing")
        size = os.path.getsize(full)
        if size != e.nbytes:
            raise CheckpointCorruptError(
                f"checkpoint {root}: file {e.path} is {size} bytes, manifest says {e.nbytes} (truncated?)"
            )
    return entries


def entries_by_table(
    entries: Sequence[ManifestEntry], kind: str = ROWS
) -> Dict[tuple, List[ManifestEntry]]:
    """Group the entries of ``kind`` by ``(collection, table)``, each list ordered by writer rank."""
    grouped: Dict[tuple, List[ManifestEntry]] = {}
    for e in sorted(entries, key=lambda e: e.rank):
        if e.kind == kind:
            grouped.setdefault((e.collection, e.table), []).append(e)
    return grouped
