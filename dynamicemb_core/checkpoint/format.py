"""The on-disk format of one table shard: a self-describing header, then four or five sections.

One file holds one table's rows from one writer rank::

    magic "DEMBSHRD" (8 bytes) | format version u32 | header length u32 | header crc32 u32
    | header (UTF-8 JSON) | keys | embeddings | optimizer_states | scores [| slots]

The header carries everything a reader needs to refuse a file before touching a table: its identity
(collection, table name, kind ``rows`` / ``counter``, writer rank and world size, and the ``dump_id`` shared
by every file of one dump, which the manifest records too), row count, embedding dim, optimizer-state width, element dtype (and ``state_dtype`` when the optimizer state is
stored in another dtype than the embeddings: float32 beside half-precision embeddings), the score columns in
the strategy tuple's order,
and per section its dtype, shape, offset, byte length and crc32 (zlib). Sections are little-endian, row
major. Timestamp score columns are stored as *ages* (nanoseconds before the dump) because a device clock
means nothing on another device or after a restart (the same rule as incremental_dump's deltas).

A rows file (format 3) also records where each key stood: the ``slots`` section, (n,) int64 table-local
slots, and the header's ``slot_layout`` (the writer table's ``capacity``, ``bucket_capacity`` and
``row_capacity`` those slots refer to, and ``packed``: why the writer's own keys do not stand at the slots
of the table it was loaded from, or null). A load that can take that layout puts every key back at its
slot, so deltas of the writer replay into the loaded table slot for slot (docs/torchrec.md, "Where keys
land"). The section has a crc32 like the others and is covered by the header's checksum.

Why JSON in a binary file: the header is a few hundred bytes, human-inspectable with ``head -c``, and new
fields can be added without a version bump; the payload stays raw so a row section can be memory-mapped.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.checkpoint.atomic import atomic_write
from dynamicemb_core.checkpoint.errors import CheckpointCorruptError, CheckpointMismatchError

__all__ = [
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "SlotLayout",
    "ROWS",
    "COUNTER",
    "MAGIC",
    "ShardHeader",
    "ShardPayload",
    "check_header",
    "dtype_from_name",
    "dtype_name",
    "read_shard",
    "read_shard_header",
    "read_shard_identity",
    "read_shard_keys",
    "read_shard_section",
    "verify_shard",
    "write_shard",
]

MAGIC = b"DEMBSHRD"
# 2: files and manifest name their dump (``dump_id``) and kind; the manifest records each file's header
# checksum. Version 1 files (no dump identity) are refused: re-dump them with this build.
# 3: rows files record each key's slot and the layout of the table they were written from
# (``slot_layout`` and the ``slots`` section). Version 2 files are still read; their rows are
# placed as a packing load places them (a new header field needs a new version: a reader refuses
# fields it does not know, so a version 2 build says "format version 3" rather than "damaged").
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)
ROWS = "rows"  # a table's keys and rows
COUNTER = "counter"  # a table's admission counter: keys and counts
_PREFIX = struct.Struct("<8sIII")  # magic, version, header length, header crc32
_SECTIONS = ("keys", "embeddings", "optimizer_states", "scores")
_SLOTS = "slots"  # the fifth section, present exactly when the header has a slot_layout
_ALIGN = (
    64  # bytes; every section starts on this boundary so it can be viewed (or mmapped) in place
)
_DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
}

if sys.byteorder != "little":  # pragma: no cover - every platform torch ships for is little-endian
    raise ImportError(
        "dynamicemb_core.checkpoint writes little-endian files and needs a little-endian host"
    )


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``; raises ValueError for a dtype the format does not store."""
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"checkpoint: dtype {dtype} is not storable; supported: {sorted(_DTYPES)}")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`; raises CheckpointCorruptError for an unknown name."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointCorruptError(f"checkpoint: unknown dtype {name!r} in header") from None


@dataclass(frozen=True)
class SlotLayout:
    """The layout of the table a rows file was written from: what its ``slots`` section means.

    Attributes:
        capacity: the table's slots (the shard's, for a sharded table) when it was written.
        bucket_capacity: slots per bucket then (a key's slot lies in bucket
            ``hash(key) % (capacity // bucket_capacity)``).
        row_capacity: value rows behind the slots.
        packed: None when the writer's keys stood where its source put them (a table that trained
            itself, or loaded slot for slot); otherwise why not (it was filled by a packing load),
            which a table loaded from this file inherits.
    """

    capacity: int
    bucket_capacity: int
    row_capacity: int
    packed: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """The header's ``slot_layout`` object."""
        return {
            "capacity": self.capacity,
            "bucket_capacity": self.bucket_capacity,
            "row_capacity": self.row_capacity,
            "packed": self.packed,
        }


def _slot_layout(path: str, raw: Any) -> SlotLayout:
    fields = ("capacity", "bucket_capacity", "row_capacity")
    ok = (
        isinstance(raw, dict)
        and set(raw) == set(fields) | {"packed"}
        and all(_typed(raw[k], int) and raw[k] > 0 for k in fields)
        and (raw["packed"] is None or isinstance(raw["packed"], str))
        and raw["capacity"] % raw["bucket_capacity"] == 0
    )
    if not ok:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: damaged header: slot_layout {raw!r} is not "
            "{capacity, bucket_capacity, row_capacity: positive ints (capacity a multiple of "
            "bucket_capacity), packed: null or a string}"
        )
    return SlotLayout(**raw)


@dataclass(frozen=True)
class ShardHeader:
    """What a shard file says about itself (everything except the per-section layout).

    Attributes:
        table_name: the table's name inside its collection.
        collection: the collection's module path in the model.
        num_rows: rows stored.
        dim: embedding width in elements.
        optimizer_width: optimizer-state elements per row in the file (0: none stored).
        dtype: element dtype of the embeddings (and of the optimizer states unless ``state_dtype``).
        score_columns: strategy names of the score columns, in the strategy tuple's order.
        rank: the writer's rank; world_size: ranks the table was sharded over when written.
        extra: free-form metadata (optimizer name, dist_type, ...), JSON-serializable.
        state_dtype: element dtype of the optimizer states when it differs from ``dtype`` (a
            half-precision table keeps float32 state); None: ``dtype``.
        dump_id: the identity of the dump that wrote the file (random, shared by all its files
            and recorded in its manifest); a load refuses a file whose id differs from the manifest's.
        kind: ``"rows"`` or ``"counter"``.
        slot_layout: the writer table's layout; set exactly when the file has a ``slots``
            section (every rows file of format 3; None for counters and format 2 files).
    """

    table_name: str
    collection: str
    num_rows: int
    dim: int
    optimizer_width: int
    dtype: torch.dtype
    score_columns: Tuple[str, ...]
    rank: int = 0
    world_size: int = 1
    extra: Dict[str, Any] = field(default_factory=dict)
    state_dtype: Optional[torch.dtype] = None
    dump_id: str = ""
    kind: str = ROWS
    slot_layout: Optional[SlotLayout] = None

    @property
    def states_dtype(self) -> torch.dtype:
        """Element dtype of the optimizer-state section."""
        return self.state_dtype if self.state_dtype is not None else self.dtype

    @property
    def num_scores(self) -> int:
        """Score words per row."""
        return len(self.score_columns)

    def describe(self) -> str:
        """Short text naming the file's table for error messages."""
        what = "" if self.kind == ROWS else f" {self.kind}"
        return (
            f"table '{self.collection}/{self.table_name}'{what} (rank {self.rank} of "
            f"{self.world_size})"
        )


@dataclass
class ShardPayload:
    """The four sections of a shard, on the CPU.

    Attributes:
        keys: (n,) int64.
        embeddings: (n, dim) of the header's dtype.
        optimizer_states: (n, optimizer_width) of the header's dtype; (n, 0) when none are stored.
        scores: (n, num_scores) int64, timestamp columns as ages.
        slots: (n,) int64 table-local slot of each key, or None (a file without a slot_layout).
    """

    keys: torch.Tensor
    embeddings: torch.Tensor
    optimizer_states: torch.Tensor
    scores: torch.Tensor
    slots: Optional[torch.Tensor] = None

    def sections(self) -> List[Tuple[str, torch.Tensor]]:
        """Sections in file order (``slots`` last, when present)."""
        names = _SECTIONS + ((_SLOTS,) if self.slots is not None else ())
        return [(name, getattr(self, name)) for name in names]


def _expected_shapes(header: ShardHeader) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    n = header.num_rows
    shapes = {
        "keys": ((n,), torch.int64),
        "embeddings": ((n, header.dim), header.dtype),
        "optimizer_states": ((n, header.optimizer_width), header.states_dtype),
        "scores": ((n, header.num_scores), torch.int64),
    }
    if header.slot_layout is not None:
        shapes[_SLOTS] = ((n,), torch.int64)
    return shapes


def _validate_payload(header: ShardHeader, payload: ShardPayload) -> None:
    if (header.slot_layout is None) != (payload.slots is None):
        raise ValueError(
            f"checkpoint: {header.describe()}: a slots section goes with a slot_layout in the "
            "header, and only with it"
        )
    for name, (shape, dtype) in _expected_shapes(header).items():
        tensor = getattr(payload, name)
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(
                f"checkpoint: {header.describe()}: section '{name}' must be {dtype} of shape {shape}, "
                f"got {tensor.dtype} of shape {tuple(tensor.shape)}"
            )


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    if tensor.numel() == 0:  # an empty view may carry stride 0, which view(uint8) refuses
        return memoryview(b"")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def write_shard(path: str, header: ShardHeader, payload: ShardPayload) -> int:
    """Write one shard file atomically (temp file, fsync, rename).

    Args:
        path: destination file.
        header: what the file describes; ``num_rows`` etc. must match ``payload``.
        payload: the sections, on any device (copied to the CPU).

    Returns:
        The file's size in bytes.

    Raises:
        ValueError: a section's shape or dtype disagrees with the header (nothing is written).
    """
    _validate_payload(header, payload)
    buffers = [(name, _as_bytes(t), t) for name, t in payload.sections()]
    sections = []
    chunks: List[Any] = []
    offset = 0
    for name, buf, tensor in buffers:
        pad = -offset % _ALIGN
        if pad:
            chunks.append(bytes(pad))
            offset += pad
        chunks.append(buf)
        sections.append(
            {
                "name": name,
                "dtype": dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "offset": offset,
                "nbytes": buf.nbytes,
                "crc32": zlib.crc32(buf),
            }
        )
        offset += buf.nbytes
    meta = {
        "table_name": header.table_name,
        "collection": header.collection,
        "num_rows": header.num_rows,
        "dim": header.dim,
        "optimizer_width": header.optimizer_width,
        "dtype": dtype_name(header.dtype),
        **(
            {"state_dtype": dtype_name(header.state_dtype)}
            if header.state_dtype is not None
            else {}
        ),
        "score_columns": list(header.score_columns),
        "score_timestamps_as_age": True,
        "rank": header.rank,
        "world_size": header.world_size,
        "dump_id": header.dump_id,
        "kind": header.kind,
        **({"slot_layout": header.slot_layout.to_json()} if header.slot_layout is not None else {}),
        "extra": header.extra,
        "payload_nbytes": offset,
        "sections": sections,
    }
    blob = json.dumps(meta, sort_keys=True).encode("utf-8")
    blob += b" " * (-(_PREFIX.size + len(blob)) % _ALIGN)  # JSON ignores trailing spaces
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob), zlib.crc32(blob))
    return atomic_write(path, [prefix, blob] + chunks)


def _parse_header(path: str, raw: bytes, file_size: int) -> Tuple[ShardHeader, Dict[str, Any], int]:
    if len(raw) < _PREFIX.size:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: truncated ({file_size} bytes, shorter than the "
            f"{_PREFIX.size}-byte prefix)"
        )
    magic, version, header_len, header_crc = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: not a dynamicemb shard (magic {magic!r}, expected {MAGIC!r})"
        )
    if version not in READABLE_VERSIONS:
        old = (
            " (written before files named their dump; re-dump it with this build)"
            if version < min(READABLE_VERSIONS)
            else ""
        )
        raise CheckpointCorruptError(
            f"checkpoint file {path}: format version {version}; this build reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}{old}"
        )
    end = _PREFIX.size + header_len
    if len(raw) < end:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: truncated inside its header ({file_size} bytes, header ends at {end})"
        )
    blob = raw[_PREFIX.size : end]
    if zlib.crc32(blob) != header_crc:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: header checksum mismatch (file is corrupt)"
        )
    meta = _header_meta(path, blob)
    header = ShardHeader(
        table_name=meta["table_name"],
        collection=meta["collection"],
        num_rows=meta["num_rows"],
        dim=meta["dim"],
        optimizer_width=meta["optimizer_width"],
        dtype=dtype_from_name(meta["dtype"]),
        state_dtype=dtype_from_name(meta["state_dtype"]) if "state_dtype" in meta else None,
        score_columns=tuple(meta["score_columns"]),
        rank=meta["rank"],
        world_size=meta["world_size"],
        extra=dict(meta.get("extra", {})),
        dump_id=meta["dump_id"],
        kind=meta["kind"],
        slot_layout=_slot_layout(path, meta["slot_layout"]) if "slot_layout" in meta else None,
    )
    if header.slot_layout is not None and (version < 3 or header.kind != ROWS):
        raise CheckpointCorruptError(
            f"checkpoint file {path}: damaged header: a slot_layout in a {header.kind} file of "
            f"format version {version}"
        )
    expected_size = end + meta["payload_nbytes"]
    if file_size != expected_size:
        what = "truncated" if file_size < expected_size else "has trailing bytes"
        raise CheckpointCorruptError(
            f"checkpoint file {path}: {what}: {file_size} bytes, header says {expected_size}"
        )
    return header, meta, end


# The header's fields and their JSON types (``int`` excludes ``bool``); ``state_dtype`` and
# ``extra`` are optional. A header that passes its checksum but not this is refused all the same.
_HEADER_FIELDS: Dict[str, Tuple[type, bool]] = {
    "table_name": (str, True),
    "collection": (str, True),
    "num_rows": (int, True),
    "dim": (int, True),
    "optimizer_width": (int, True),
    "dtype": (str, True),
    "state_dtype": (str, False),
    "score_columns": (list, True),
    "score_timestamps_as_age": (bool, True),
    "rank": (int, True),
    "world_size": (int, True),
    "dump_id": (str, True),
    "kind": (str, True),
    "slot_layout": (dict, False),
    "extra": (dict, False),
    "payload_nbytes": (int, True),
    "sections": (list, True),
}
_SECTION_FIELDS: Dict[str, type] = {
    "name": str,
    "dtype": str,
    "shape": list,
    "offset": int,
    "nbytes": int,
    "crc32": int,
}


def _typed(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _header_meta(path: str, blob: bytes) -> Dict[str, Any]:
    """Decode and type-check a header's JSON, raising CheckpointCorruptError naming ``path``."""
    try:
        meta = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointCorruptError(f"checkpoint file {path}: unreadable header: {err}") from None
    problems = []
    if not isinstance(meta, dict):
        raise CheckpointCorruptError(f"checkpoint file {path}: the header is not a JSON object")
    for name, (kind, required) in _HEADER_FIELDS.items():
        if name not in meta:
            if required:
                problems.append(f"'{name}' is missing")
        elif not _typed(meta[name], kind):
            problems.append(f"'{name}' is {type(meta[name]).__name__}, expected {kind.__name__}")
    problems += [f"unexpected field '{k}'" for k in sorted(set(meta) - set(_HEADER_FIELDS))]
    for i, sec in enumerate(meta.get("sections", []) if not problems else []):
        if not isinstance(sec, dict) or set(sec) != set(_SECTION_FIELDS):
            problems.append(f"section {i} is not {{{', '.join(_SECTION_FIELDS)}}}")
        elif not all(_typed(sec[k], t) for k, t in _SECTION_FIELDS.items()):
            problems.append(f"section {i} has a field of the wrong type")
        elif sec["offset"] < 0 or sec["nbytes"] < 0:
            problems.append(f"section {i} has a negative offset or length")
    if not problems and (meta["num_rows"] < 0 or meta["dim"] < 0 or meta["optimizer_width"] < 0):
        problems.append("a negative row count or width")
    if not problems and meta["kind"] not in (ROWS, COUNTER):
        problems.append(f"kind {meta['kind']!r} is neither {ROWS!r} nor {COUNTER!r}")
    if problems:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: damaged header: " + "; ".join(problems)
        )
    return meta


def _read_header(path: str, f: BinaryIO) -> Tuple[ShardHeader, Dict[str, Any], int]:
    """Read the open shard ``f``'s header (whatever its length) and check it with
    :func:`_parse_header`; the file is left positioned after the header."""
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    head = f.read(_PREFIX.size)
    if len(head) == _PREFIX.size and head[:8] == MAGIC:
        head += f.read(_PREFIX.unpack(head)[2])
    return _parse_header(path, head, size)


def read_shard_header(path: str) -> ShardHeader:
    """Read and check a shard's header (magic, version, header checksum, file length) without its payload."""
    return read_shard_identity(path)[0]


def read_shard_identity(path: str) -> Tuple[ShardHeader, int]:
    """A shard's checked header and its header checksum (crc32 of the header's JSON).

    The header holds every section's crc32, so its checksum stands for the whole content: the
    manifest records it, and a load refuses a file whose checksum is not the one listed.
    """
    with open(path, "rb") as f:
        header = _read_header(path, f)[0]
        f.seek(0)
        return header, _PREFIX.unpack(f.read(_PREFIX.size))[3]


def check_header(
    header: ShardHeader,
    *,
    dim: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
    score_columns: Optional[Sequence[str]] = None,
    optimizer_width: Optional[int] = None,
    where: str = "",
) -> None:
    """Raise CheckpointMismatchError when a file does not fit the target table.

    A file's embedding dtype fits a target of the same dtype, or one that holds every value of the
    file's exactly (float16 / bfloat16 embeddings load into a float32 table, widened); a narrowing
    load (float32 into a half-precision table, float16 into bfloat16) is refused: it would round.

    Args:
        header: the file's header.
        dim, dtype, score_columns, optimizer_width: the target's values; None skips that check.
        where: the target table's name for the message.
    """
    checks = [
        ("dim", dim, header.dim),
        ("dtype", None if dtype is None or _widens(header.dtype, dtype) else dtype, header.dtype),
        (
            "score columns",
            None if score_columns is None else tuple(score_columns),
            header.score_columns,
        ),
        ("optimizer state width", optimizer_width, header.optimizer_width),
    ]
    for name, expected, found in checks:
        if expected is not None and expected != found:
            raise CheckpointMismatchError(
                f"checkpoint {header.describe()} does not fit target table '{where or header.table_name}': "
                f"{name} expected {expected}, file has {found}"
            )


def _widens(found: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of dtype ``found`` converts exactly to ``target``."""
    return found == target or (
        found in (torch.float16, torch.bfloat16) and target in (torch.float32, torch.float64)
    )


def read_shard(path: str) -> Tuple[ShardHeader, ShardPayload]:
    """Read a whole shard and verify every section's shape and checksum.

    Raises:
        CheckpointCorruptError: wrong magic or version, truncation, or a checksum mismatch.
    """
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    header, meta, start = _parse_header(
        path, bytes(raw[: _PREFIX.size + _header_len(raw)]), len(raw)
    )
    payload_bytes = (
        torch.frombuffer(raw, dtype=torch.uint8) if len(raw) else torch.empty(0, dtype=torch.uint8)
    )
    expected = _expected_shapes(header)
    tensors: Dict[str, torch.Tensor] = {}
    by_name = {s["name"]: s for s in meta["sections"]}
    for name, (shape, dtype) in expected.items():
        sec = by_name.get(name)
        if sec is None or tuple(sec["shape"]) != shape or dtype_from_name(sec["dtype"]) != dtype:
            raise CheckpointCorruptError(
                f"checkpoint file {path}: section '{name}' is missing or disagrees with the header"
            )
        lo = start + int(sec["offset"])
        hi = lo + int(sec["nbytes"])
        if int(sec["nbytes"]) != _numel(shape) * dtype.itemsize or hi > len(raw):
            raise CheckpointCorruptError(
                f"checkpoint file {path}: section '{name}' has {sec['nbytes']} bytes at offset "
                f"{sec['offset']}, which disagrees with its shape {list(shape)} or the file's length"
            )
        view = memoryview(raw)[lo:hi]
        if zlib.crc32(view) != int(sec["crc32"]):
            raise CheckpointCorruptError(
                f"checkpoint file {path}: section '{name}' checksum mismatch (file is corrupt)"
            )
        tensors[name] = payload_bytes[lo:hi].view(dtype).reshape(shape)
    return header, ShardPayload(**tensors)


def read_shard_keys(path: str) -> torch.Tensor:
    """A shard's keys section alone, checked against its crc32 (the header checked as by
    :func:`read_shard_header`): what a load needs to plan its tables' room without holding the
    rows. Raises CheckpointCorruptError as :func:`read_shard`."""
    return read_shard_section(path, "keys")


def read_shard_section(path: str, name: str) -> torch.Tensor:
    """One (n,) int64 section of a shard (``"keys"`` or ``"slots"``), checked against its crc32
    and the header; raises CheckpointCorruptError as :func:`read_shard`, also when the file has
    no such section."""
    with open(path, "rb") as f:
        header, meta, start = _read_header(path, f)
        (sec,) = [s for s in meta["sections"] if s["name"] == name] or [None]
        n = header.num_rows
        if (
            sec is None
            or name not in _expected_shapes(header)
            or tuple(sec["shape"]) != (n,)
            or sec["dtype"] != "int64"
            or sec["nbytes"] != 8 * n
        ):
            raise CheckpointCorruptError(
                f"checkpoint file {path}: section '{name}' is missing or disagrees with the header"
            )
        f.seek(start + sec["offset"])
        raw = bytearray(f.read(sec["nbytes"]))
    if len(raw) != sec["nbytes"]:
        raise CheckpointCorruptError(f"checkpoint file {path}: truncated in section '{name}'")
    if zlib.crc32(raw) != sec["crc32"]:
        raise CheckpointCorruptError(
            f"checkpoint file {path}: section '{name}' checksum mismatch (file is corrupt)"
        )
    return torch.frombuffer(raw, dtype=torch.int64) if n else torch.empty(0, dtype=torch.int64)


def verify_shard(path: str, chunk_bytes: int = 1 << 24) -> ShardHeader:
    """Check a whole shard (header, length, every section's checksum) while holding one chunk at a time.

    Loading verifies every file of every table before writing any row, then reads the files again one
    at a time; this pass keeps that guarantee without holding a whole checkpoint in memory.

    Raises:
        CheckpointCorruptError: as :func:`read_shard`.
    """
    with open(path, "rb") as f:
        header, meta, start = _read_header(path, f)
        for sec in sorted(meta["sections"], key=lambda s: int(s["offset"])):
            f.seek(start + int(sec["offset"]))
            remaining, crc = int(sec["nbytes"]), 0
            while remaining:
                block = f.read(min(chunk_bytes, remaining))
                if not block:
                    raise CheckpointCorruptError(
                        f"checkpoint file {path}: truncated in section '{sec['name']}'"
                    )
                crc = zlib.crc32(block, crc)
                remaining -= len(block)
            if crc != int(sec["crc32"]):
                raise CheckpointCorruptError(
                    f"checkpoint file {path}: section '{sec['name']}' checksum mismatch (file is corrupt)"
                )
    return header


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _header_len(raw: bytearray) -> int:
    if len(raw) < _PREFIX.size or bytes(raw[:8]) != MAGIC:
        return 0
    return _PREFIX.unpack_from(raw)[2]
