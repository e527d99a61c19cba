"""The checkpoint folder's manifest: the list of shard files, written last, so a partial dump is never loadable.

Layout of a checkpoint folder::

    <root>/MANIFEST.json                                   written last, atomically
    <root>/<collection>/<table>.rank<r>-of-<w>.demb        one shard file per table per writer rank
    <root>/<collection>/<table>.rank<r>-of-<w>.counter.demb  its admission counter (``counter=True``)

Each rank writes its shards and then a small fragment ``.manifest.rank<r>.json``; after a barrier rank 0
merges the fragments into ``MANIFEST.json`` and deletes shard files the new manifest does not list (left by
an earlier dump with more ranks or other tables). A dump first removes the old manifest and any temp file
an interrupted write left, so while it runs the folder is "incomplete" rather than a mix of two dumps.

Identity: every file of one dump carries the dump's random ``dump_id``; the manifest records it, and per
file its collection, table, kind, writer rank and world size, row count, size and header checksum
(``crc32``). :func:`read_manifest` refuses a manifest that is not exactly this (a missing, unexpected or
mistyped field, a path outside the folder or not the one its entry names, a rank missing or listed
twice), and :func:`check_entry` refuses a file whose own header disagrees with its entry.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, List, Optional, Sequence

from dynamicemb_core.checkpoint.atomic import atomic_write, remove_stale_temps
from dynamicemb_core.checkpoint.errors import CheckpointCorruptError, CheckpointMismatchError
from dynamicemb_core.checkpoint.format import (
    COUNTER,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    ROWS,
    ShardHeader,
    ShardPayload,
    read_shard_identity,
    write_shard,
)

__all__ = [
    "COUNTER",
    "MANIFEST_NAME",
    "ROWS",
    "ManifestEntry",
    "check_entry",
    "merge_rank_manifests",
    "new_dump_id",
    "read_manifest",
    "remove_manifest",
    "shard_relpath",
    "write_entry",
    "write_rank_manifest",
]

MANIFEST_NAME = "MANIFEST.json"
SHARD_SUFFIX = ".demb"


@dataclass(frozen=True)
class ManifestEntry:
    """One shard file of a checkpoint.

    Attributes:
        collection: the collection's module path; table: the table's name.
        rank, world_size: the writer's rank and the number of writer ranks.
        path: the file, relative to the checkpoint root.
        nbytes: its size; num_rows: rows it holds.
        kind: ``"rows"`` (the table's keys and rows) or ``"counter"`` (its admission counter).
        dump_id: the dump that wrote the file (the file's header and the manifest say the same).
        crc32: the checksum of the file's header, which holds every section's checksum.
    """

    collection: str
    table: str
    rank: int
    world_size: int
    path: str
    nbytes: int
    num_rows: int
    kind: str = ROWS
    dump_id: str = ""
    crc32: int = 0

    def describe(self) -> str:
        """``collection/table`` with the kind and rank, for messages."""
        what = "" if self.kind == ROWS else f" {self.kind}"
        return f"'{self.collection}/{self.table}'{what} rank {self.rank} of {self.world_size}"


_ENTRY_TYPES: Dict[str, type] = {
    f.name: {"str": str, "int": int}[str(f.type)] for f in fields(ManifestEntry)
}
_MANIFEST_KEYS = ("dump_id", "files", "format_version", "world_size")


def new_dump_id() -> str:
    """A fresh random dump identity (32 hex digits)."""
    return uuid.uuid4().hex


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


def write_entry(
    root: str, header: ShardHeader, payload: ShardPayload, kind: str = ROWS
) -> ManifestEntry:
    """Write one shard file under ``root`` (at :func:`shard_relpath` of its header) and return the
    manifest entry that names it. ``header.dump_id`` must be the dump's id and ``header.kind`` ``kind``."""
    if not header.dump_id or header.kind != kind:
        raise ValueError(
            f"write_entry: {header.describe()} needs a dump_id and kind {kind!r} (got "
            f"{header.dump_id!r}, {header.kind!r})"
        )
    rel = shard_relpath(header.collection, header.table_name, header.rank, header.world_size, kind)
    full = os.path.join(root, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    size = write_shard(full, header, payload)
    crc = read_shard_identity(full)[1]
    return ManifestEntry(
        header.collection,
        header.table_name,
        header.rank,
        header.world_size,
        rel,
        size,
        header.num_rows,
        kind,
        header.dump_id,
        crc,
    )


def _fragment(root: str, rank: int) -> str:
    return os.path.join(root, f".manifest.rank{rank}.json")


def _dump_json(path: str, obj: object) -> None:
    atomic_write(path, [json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")])


def remove_manifest(root: str) -> None:
    """Mark the folder incomplete (called before any shard of a new dump is written), and delete the
    temp files an interrupted dump left (``.<file>.*.tmp`` of the manifest, its fragments and the
    shard files; see :func:`~dynamicemb_core.checkpoint.atomic.remove_stale_temps`)."""
    for path in [os.path.join(root, MANIFEST_NAME)] + glob.glob(
        os.path.join(root, ".manifest.rank*.json")
    ):
        if os.path.exists(path):
            os.unlink(path)
    remove_stale_temps(root, [MANIFEST_NAME, ".manifest.rank*.json"])
    for sub in glob.glob(os.path.join(root, "*", "")):
        remove_stale_temps(sub, ["*" + SHARD_SUFFIX])


def write_rank_manifest(root: str, rank: int, entries: Sequence[ManifestEntry]) -> None:
    """Record the shards this rank finished writing."""
    _dump_json(_fragment(root, rank), [asdict(e) for e in entries])


def merge_rank_manifests(
    root: str, world_size: int, dump_id: Optional[str] = None
) -> List[ManifestEntry]:
    """Rank 0, after a barrier: merge every rank's fragment into MANIFEST.json and drop stale shards.

    Args:
        root: the checkpoint folder.
        world_size: ranks that wrote fragments.
        dump_id: the dump's id; None takes it from the entries (which must all agree).

    Raises:
        CheckpointCorruptError: a rank's fragment is missing (that rank did not finish), is
            damaged, or names another dump.
    """
    entries: List[ManifestEntry] = []
    for rank in range(world_size):
        frag = _fragment(root, rank)
        if not os.path.exists(frag):
            raise CheckpointCorruptError(
                f"checkpoint {root}: rank {rank} of {world_size} did not finish its shards ({frag} missing)"
            )
        raw = _load_json(frag)
        if not isinstance(raw, list):
            raise CheckpointCorruptError(f"checkpoint file {frag}: not a list of entries")
        entries.extend(_entry(frag, i, e) for i, e in enumerate(raw))
    ids = {e.dump_id for e in entries} | ({dump_id} if dump_id is not None else set())
    if len(ids) > 1 or "" in ids:
        raise CheckpointCorruptError(
            f"checkpoint {root}: the ranks' fragments name dumps {sorted(ids)}; expected one"
        )
    _dump_json(
        os.path.join(root, MANIFEST_NAME),
        {
            "format_version": FORMAT_VERSION,
            "world_size": world_size,
            "dump_id": ids.pop() if ids else new_dump_id(),
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


def _load_json(path: str) -> Any:
    """A JSON file's value; CheckpointCorruptError naming ``path`` when it is not UTF-8 JSON."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: not UTF-8 text (byte {err.start}); the file is damaged or "
            "is not a manifest"
        ) from None
    except ValueError as err:
        raise CheckpointCorruptError(f"checkpoint file {path}: unreadable JSON: {err}") from None


def _typed(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _entry(path: str, index: int, raw: Any) -> ManifestEntry:
    """One listed file, checked field by field (names and types)."""
    where = f"checkpoint file {path}: files[{index}]"
    if not isinstance(raw, dict):
        raise CheckpointCorruptError(f"{where} is {type(raw).__name__}, expected an object")
    problems = [f"'{k}' is missing" for k in _ENTRY_TYPES if k not in raw]
    problems += [f"unexpected field '{k}'" for k in sorted(set(raw) - set(_ENTRY_TYPES))]
    problems += [
        f"'{k}' is {type(raw[k]).__name__}, expected {t.__name__}"
        for k, t in _ENTRY_TYPES.items()
        if k in raw and not _typed(raw[k], t)
    ]
    if not problems:
        if raw["kind"] not in (ROWS, COUNTER):
            problems.append(f"kind {raw['kind']!r} is neither {ROWS!r} nor {COUNTER!r}")
        if not 0 <= raw["rank"] < raw["world_size"]:
            problems.append(f"rank {raw['rank']} is not in [0, world_size {raw['world_size']})")
        if raw["nbytes"] < 0 or raw["num_rows"] < 0:
            problems.append("a negative size or row count")
    if problems:
        raise CheckpointCorruptError(f"{where} is damaged: " + "; ".join(problems))
    return ManifestEntry(**raw)


def _inside(root: str, entry: ManifestEntry, manifest: str) -> str:
    """The entry's file as a path under ``root``; refuses one that leaves the folder."""
    rel = entry.path
    parts = rel.replace("\\", "/").split("/")
    if os.path.isabs(rel) or ".." in parts or rel.startswith("~"):
        raise CheckpointCorruptError(
            f"checkpoint {manifest}: file {rel!r} of {entry.describe()} is outside the checkpoint "
            "folder (paths must be relative and stay inside it); refused"
        )
    expected = shard_relpath(
        entry.collection, entry.table, entry.rank, entry.world_size, entry.kind
    )
    if os.path.normpath(rel) != os.path.normpath(expected):
        raise CheckpointCorruptError(
            f"checkpoint {manifest}: file {rel!r} is listed for {entry.describe()}, whose file is "
            f"{expected!r}"
        )
    full = os.path.join(root, rel)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(full)]) != real_root:
        raise CheckpointCorruptError(
            f"checkpoint {manifest}: file {rel!r} resolves to {os.path.realpath(full)}, outside the "
            f"checkpoint folder {real_root} (a symbolic link?); refused"
        )
    return full


def read_manifest(root: str) -> List[ManifestEntry]:
    """Read MANIFEST.json, check its every field, and check that every listed file exists with its
    recorded size, inside the folder.

    Raises:
        FileNotFoundError / NotADirectoryError: ``root`` does not exist, or is a file.
        CheckpointCorruptError: no manifest (the dump did not finish); a manifest of another format
            version, not UTF-8 JSON, with a missing, unexpected or mistyped field, a path outside the
            folder or not the one its entry names, a rank missing or listed twice, an entry of
            another dump or world size; a listed file missing or of another size.
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
    meta = _load_json(path)
    if not isinstance(meta, dict):
        raise CheckpointCorruptError(
            f"checkpoint file {path}: a manifest is a JSON object, this is {type(meta).__name__}"
        )
    version = meta.get("format_version")
    if not (_typed(version, int) and version in READABLE_VERSIONS):
        old = (
            " (written before checkpoints named their dump; re-dump it with this build)"
            if _typed(version, int)
            and isinstance(version, int)
            and version < min(READABLE_VERSIONS)
            else ""
        )
        raise CheckpointCorruptError(
            f"checkpoint file {path}: format version {version!r}; this build reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}{old}"
        )
    problems = [f"'{k}' is missing" for k in _MANIFEST_KEYS if k not in meta]
    problems += [f"unexpected field '{k}'" for k in sorted(set(meta) - set(_MANIFEST_KEYS))]
    if not problems:
        if not (_typed(meta["world_size"], int) and meta["world_size"] > 0):
            problems.append(f"'world_size' is {meta['world_size']!r}, expected a positive int")
        if not (isinstance(meta["dump_id"], str) and meta["dump_id"]):
            problems.append(f"'dump_id' is {meta['dump_id']!r}, expected a non-empty string")
        if not isinstance(meta["files"], list):
            problems.append(f"'files' is {type(meta['files']).__name__}, expected a list")
    if problems:
        raise CheckpointCorruptError(f"checkpoint file {path} is damaged: " + "; ".join(problems))
    entries = [_entry(path, i, e) for i, e in enumerate(meta["files"])]
    _check_consistent(path, entries, meta["world_size"], meta["dump_id"])
    for e in entries:
        full = _inside(root, e, path)
        if not os.path.isfile(full):
            raise CheckpointCorruptError(f"checkpoint {root}: listed file {e.path} is missing")
        size = os.path.getsize(full)
        if size != e.nbytes:
            raise CheckpointCorruptError(
                f"checkpoint {root}: file {e.path} is {size} bytes, manifest says {e.nbytes} (truncated?)"
            )
    return entries


def _check_consistent(
    path: str, entries: Sequence[ManifestEntry], world_size: int, dump_id: str
) -> None:
    """Every entry of the manifest's dump and world size; each table's ranks 0..w-1 once each."""
    ranks: Dict[tuple, List[int]] = {}
    for e in entries:
        if e.dump_id != dump_id:
            raise CheckpointMismatchError(
                f"checkpoint file {path}: file {e.path} ({e.describe()}) is of dump {e.dump_id!r}, "
                f"the manifest of dump {dump_id!r}"
            )
        if e.world_size != world_size:
            raise CheckpointCorruptError(
                f"checkpoint file {path}: file {e.path} was written by {e.world_size} ranks, the "
                f"manifest says {world_size}"
            )
        ranks.setdefault((e.collection, e.table, e.kind), []).append(e.rank)
    for (collection, table, kind), got in ranks.items():
        if sorted(got) != list(range(world_size)):
            raise CheckpointCorruptError(
                f"checkpoint file {path}: {kind} of '{collection}/{table}' lists ranks "
                f"{sorted(got)}; a dump by {world_size} ranks has each of 0..{world_size - 1} once"
            )


def check_entry(root: str, entry: ManifestEntry, header: ShardHeader, crc32: int) -> None:
    """Refuse a file whose header is not the one its manifest entry lists (another table's file put
    in its place, a swapped or renamed file, a file of another dump or model).

    Raises:
        CheckpointMismatchError: naming the file and every field that differs.
    """
    checks = [
        ("collection", entry.collection, header.collection),
        ("table", entry.table, header.table_name),
        ("kind", entry.kind, header.kind),
        ("rank", entry.rank, header.rank),
        ("world size", entry.world_size, header.world_size),
        ("row count", entry.num_rows, header.num_rows),
        ("dump id", entry.dump_id, header.dump_id),
        ("header checksum", entry.crc32, crc32),
    ]
    wrong = [
        f"{name}: manifest {want!r}, file {got!r}" for name, want, got in checks if want != got
    ]
    if wrong:
        raise CheckpointMismatchError(
            f"checkpoint file {os.path.join(root, entry.path)} is not the file the manifest lists "
            f"for {entry.describe()} ({'; '.join(wrong)}); nothing was loaded"
        )


def entries_by_table(
    entries: Sequence[ManifestEntry], kind: str = ROWS
) -> Dict[tuple, List[ManifestEntry]]:
    """Group the entries of ``kind`` by ``(collection, table)``, each list ordered by writer rank."""
    grouped: Dict[tuple, List[ManifestEntry]] = {}
    for e in sorted(entries, key=lambda e: e.rank):
        if e.kind == kind:
            grouped.setdefault((e.collection, e.table), []).append(e)
    return grouped
