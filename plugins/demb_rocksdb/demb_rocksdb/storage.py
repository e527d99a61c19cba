"""``RocksDBStorage``: the rows of several tables in one local RocksDB, durable across restarts.

Keys are ``<table name> NUL <8-byte little-endian key>``: table names contain no NUL, so no table's
prefix is a prefix of another's, and a table's rows are one contiguous key range (export is one
forward scan). Values are whole stored rows in the layout of
:mod:`dynamicemb_core.plugins.row_codec`. Each table's layout header is also written once under
``NUL meta NUL <table>``, so reopening a database with another dim, dtype or score count fails at
construction instead of on the first read.

Every call may name keys of several tables (the multi-table ``Storage`` contract): writes go through
one ``WriteBatch`` per call, whatever the number of tables (atomic, one WAL append); reads are one
multi-get per call.
Every write is in the write-ahead log before ``insert`` returns, so it survives the process being
killed; :meth:`flush` also fsyncs the log for a machine crash (``sync_writes=True`` does so on every
write).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
from rocksdict import Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from dynamicemb_core.plugins.row_codec import (
    HEADER_BYTES,
    KEY_BYTES,
    RowCodec,
    decode_spans,
    encode_keys,
)
from dynamicemb_core.plugins.storage_adapter import TableGroups
from dynamicemb_core.plugins.storage_checks import (
    check_export_ids,
    check_insert_pairs,
    check_pairs,
    check_table_ids,
    check_table_specs,
    common_row_dtype,
)
from dynamicemb_core.types import DynamicEmbError, MemoryType, Storage, StorageTableSpec

__all__ = ["RocksDBStorage"]

_META = b"\x00meta\x00"


class RocksDBStorage(Storage):
    """A multi-table Storage on a RocksDB database directory (one process at a time: RocksDB locks it).

    Args:
        tables: the logical tables, in table-id order; names become key prefixes.
        device: where ``find`` and ``export`` return tensors.
        path: the database directory (created if missing).
        sync_writes: fsync the write-ahead log on every write (slower; survives power loss).
        max_open_files: RocksDB's file-handle budget (-1 = unlimited).
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str = "cpu",
        *,
        path: str,
        sync_writes: bool = False,
        max_open_files: int = -1,
    ) -> None:
        check_table_specs(type(self).__name__, tables)
        common_row_dtype(tables)  # one rows matrix per call: tables of one dtype
        for spec in tables:
            if "\x00" in spec.name or not spec.name:
                raise ValueError(
                    f"RocksDBStorage: table name {spec.name!r} must be non-empty without NUL"
                )
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError(f"RocksDBStorage: path must be a directory path, got {path!r}")
        super().__init__(tables, torch.device(device))
        self.path = str(path)
        self.sync_writes = sync_writes
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_max_open_files(max_open_files)
        try:
            self._db = Rdict(self.path, options)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            raise DynamicEmbError(
                f"demb-rocksdb: cannot open RocksDB at {self.path}: {exc}. If the message mentions a "
                f"lock, another process (or another RocksDBStorage) has this directory open"
            ) from exc
        self._write_options = WriteOptions()
        self._write_options.sync = sync_writes
        self._prefixes = [spec.name.encode() + b"\x00" for spec in self.tables]
        self._codecs = [
            RowCodec(t, context=f"demb-rocksdb: table {t.name!r} at {self.path}")
            for t in self.tables
        ]
        self._check_or_write_meta()

    def _check_or_write_meta(self) -> None:
        batch = WriteBatch(raw_mode=True)
        for spec, codec in zip(self.tables, self._codecs):
            meta_key = _META + spec.name.encode()
            stored = self._db.get(meta_key)
            header = bytes(codec.header)
            if stored is None:
                batch.put(meta_key, header)
            elif stored != header:
                self._db.close()
                raise ValueError(
                    f"demb-rocksdb: table {spec.name!r} at {self.path} was written as "
                    f"{codec.describe(stored + bytes(HEADER_BYTES))} but is opened as "
                    f"{codec.describe(header)}; use another path or table name, or migrate the data"
                )
        self._db.write(batch, self._write_options)

    def _raw_keys(self, keys: torch.Tensor, groups: TableGroups) -> List[List[bytes]]:
        """Each table's database keys (its prefix, then the key); ``keys`` in table order."""
        return [encode_keys(keys[a:b], self._prefixes[t]) for t, a, b in groups.spans]

    # -- Storage ----------------------------------------------------------------------------

    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_pairs(self.tables, keys, table_ids)
        groups = TableGroups(table_ids.cpu())
        keys = groups.sort(keys.cpu())
        raw = self._raw_keys(keys, groups)
        flat = [k for part in raw for k in part]
        values: List[Optional[bytes]] = self._db[flat] if flat else []  # one multi-get
        results = decode_spans(self._codecs, groups.spans, values, keys)
        found, rows, scores = groups.merge(self, results)
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        check_insert_pairs(self.tables, keys, table_ids, rows, scores)
        if keys.numel() == 0:
            return
        groups = TableGroups(table_ids.cpu())
        keys, rows, scores = (groups.sort(x.cpu()) for x in (keys, rows, scores))
        batch = WriteBatch(raw_mode=True)  # every table of the call: one atomic write
        for (t, a, b), part in zip(groups.spans, self._raw_keys(keys, groups)):
            spec = self.tables[t]
            values = self._codecs[t].encode(
                rows[a:b, : spec.row_width], scores[a:b, : spec.num_scores]
            )
            for key, value in zip(part, values):
                batch.put(key, value)
        self._db.write(batch, self._write_options)

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        if check_pairs(self.tables, keys, table_ids) == 0:
            return
        groups = TableGroups(table_ids.cpu())
        batch = WriteBatch(raw_mode=True)
        for part in self._raw_keys(groups.sort(keys.cpu()), groups):
            for key in part:
                batch.delete(key)
        self._db.write(batch, self._write_options)

    def _scan(self, table_id: int) -> Iterator[Tuple[bytes, bytes]]:
        prefix = self._prefixes[table_id]
        for key, value in self._db.items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key, value

    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        """Exact counts by a key scan of each table's range: O(rows), meant for stats, not hot paths."""
        return [sum(1 for _ in self._scan(t)) for t in check_table_ids(self.tables, table_ids)]

    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every row of the tables once, table by table (one forward scan of each range)."""
        for table_id in check_export_ids(self.tables, table_ids, batch_size):
            page: List[Tuple[bytes, bytes]] = []
            for item in self._scan(table_id):
                page.append(item)
                if len(page) == batch_size:
                    yield self._decode_page(table_id, page)
                    page = []
            if page:
                yield self._decode_page(table_id, page)

    def _decode_page(
        self, table_id: int, page: List[Tuple[bytes, bytes]]
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        prefix_len = len(self._prefixes[table_id])
        if any(len(k) != prefix_len + KEY_BYTES for k, _ in page):
            raise ValueError(
                f"demb-rocksdb: table {self.tables[table_id].name!r} at {self.path}: a key of unexpected "
                f"length in the table's range; something other than demb-rocksdb wrote to this database"
            )
        keys, r, sc = self._codecs[table_id].decode_items(page, prefix_len)
        spec, n = self.tables[table_id], keys.numel()
        rows = torch.zeros(n, self.max_row_width, dtype=self.row_dtype)
        scores = torch.zeros(n, self.max_num_scores, dtype=torch.int64)
        rows[:, : spec.row_width] = r
        scores[:, : spec.num_scores] = sc
        tids = torch.full((n,), table_id, dtype=torch.int64)
        return tuple(x.to(self.device) for x in (keys, tids, rows, scores))  # type: ignore[return-value]

    def flush(self) -> None:
        """fsync the write-ahead log: previous writes survive a machine crash too."""
        self._db.flush_wal(True)

    def close(self) -> None:
        """Flush and close the database (releases RocksDB's lock on the directory)."""
        if self._db is not None:
            self._db.flush_wal(True)
            self._db.close()
            self._db = None  # type: ignore[assignment]

    def dump(self, path: str) -> None:
        """Write a consistent RocksDB checkpoint (hard links where possible) to the new directory ``path``."""
        target = os.path.join(path, "rocksdb")
        if os.path.exists(target):
            raise FileExistsError(
                f"demb-rocksdb: dump target {target} exists; dump into a fresh directory"
            )
        os.makedirs(path, exist_ok=True)
        Checkpoint(self._db).create_checkpoint(target)

    def load(self, path: str) -> None:
        """Replace every table's rows with those of a :meth:`dump` under ``path`` (checked first)."""
        source_path = os.path.join(path, "rocksdb")
        if not os.path.isdir(source_path):
            raise FileNotFoundError(f"demb-rocksdb: no dump at {source_path}")
        source = RocksDBStorage(self.tables, self.device, path=source_path)  # checks the layout
        try:
            for table_id in range(len(self.tables)):
                batch = WriteBatch(raw_mode=True)
                for key, _ in self._scan(table_id):
                    batch.delete(key)
                for key, value in source._scan(table_id):
                    batch.put(key, value)
                self._db.write(batch, self._write_options)
        finally:
            source.close()

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes on disk (live SST files and the log) under EXTERNAL; 0 for other kinds."""
        if mem_type is not MemoryType.EXTERNAL:
            return 0
        return sum(
            os.path.getsize(os.path.join(self.path, f))
            for f in os.listdir(self.path)
            if f.endswith((".sst", ".log"))
        )

    def __enter__(self) -> "RocksDBStorage":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
