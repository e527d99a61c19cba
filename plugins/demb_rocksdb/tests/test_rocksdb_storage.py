"""demb-rocksdb on a real RocksDB: discovery, the conformance suites, layout checks, crash durability."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Iterator, Sequence

import pytest
import torch

from demb_rocksdb import RocksDBStorage
from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import KNOWN_PLUGINS, PluginKind, PluginRegistry, resolve_storage
from dynamicemb_core.plugins.storage_adapter import find_in_table
from dynamicemb_core.testing.storage_suite import (
    StorageDumpSuite,
    StoragePersistenceSuite,
    StorageSuite,
    bits,
    default_tables,
    make_rows,
)
from dynamicemb_core.types import DynamicEmbError, Storage, StorageTableSpec

SPEC = StorageTableSpec("emb", dim=4, row_width=8)


def test_entry_point_is_discovered_by_the_registry() -> None:
    entry = PluginRegistry().get(PluginKind.STORAGE, "rocksdb")
    assert entry.distribution.startswith("demb-rocksdb ")
    assert entry.plugin == "rocksdb" and entry.factory is RocksDBStorage
    assert KNOWN_PLUGINS[("storages", "rocksdb")] == "demb-rocksdb"  # the core's install hint


def test_table_options_resolve_rocksdb_by_name(tmp_path: os.PathLike) -> None:
    options = DynamicEmbTableOptions(
        external_storage="rocksdb", external_storage_options={"path": str(tmp_path)}
    )
    with resolve_storage(options, [SPEC], "cpu") as storage:
        assert isinstance(storage, RocksDBStorage) and storage.path == str(tmp_path)


class TestRocksDBStorage(StorageSuite, StoragePersistenceSuite, StorageDumpSuite):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp = tmp_path_factory

    def make_storage(self, tables: Sequence[StorageTableSpec], device: torch.device) -> Storage:
        return RocksDBStorage(tables, device, path=str(self.tmp.mktemp("db")))

    def reopen_storage(self, storage: Storage) -> Storage:
        assert isinstance(storage, RocksDBStorage)
        storage.close()
        return RocksDBStorage(storage.tables, storage.device, path=storage.path)


def test_reopening_with_another_layout_fails_at_construction(tmp_path: os.PathLike) -> None:
    RocksDBStorage([SPEC], path=str(tmp_path)).close()
    wider = StorageTableSpec("emb", dim=4, row_width=12)
    with pytest.raises(
        ValueError, match=r"table 'emb' .* written as .*row_width 8.* opened as .*row_width 12"
    ):
        RocksDBStorage([wider], path=str(tmp_path))
    RocksDBStorage([SPEC], path=str(tmp_path)).close()  # the failed open released the lock


def test_second_open_of_the_same_directory_is_a_clear_error(tmp_path: os.PathLike) -> None:
    with RocksDBStorage([SPEC], path=str(tmp_path)):
        with pytest.raises(DynamicEmbError, match="cannot open RocksDB at .*another process"):
            RocksDBStorage([SPEC], path=str(tmp_path))


_WRITER = textwrap.dedent(
    """
    import sys, time, torch
    from demb_rocksdb import RocksDBStorage
    from dynamicemb_core.testing.storage_suite import default_tables, make_rows, wide_rows
    storage = RocksDBStorage(default_tables(), path=sys.argv[1])
    # every table in one insert (one WriteBatch), then one erase
    keys = torch.cat([torch.arange(2000) * (t + 3) - 1000 for t in range(3)])
    tids = torch.arange(3).repeat_interleave(2000)
    per_table = [make_rows(spec, 2000, seed=t) for t, spec in enumerate(storage.tables)]
    storage.insert(keys, tids, *wide_rows(storage, tids, per_table))
    gone = torch.arange(-1000, -900)
    storage.erase(gone, torch.zeros_like(gone))
    storage.flush()
    print("flushed", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def killed_writer_dir(tmp_path: os.PathLike) -> Iterator[str]:
    """A database directory whose writer process was SIGKILLed right after a flushed write."""
    path = os.path.join(str(tmp_path), "db")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "flushed", f"writer did not finish its write (rc={proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        yield path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_flushed_writes_survive_a_killed_writer(killed_writer_dir: str) -> None:
    with RocksDBStorage(default_tables(), path=killed_writer_dir) as storage:
        for t, spec in enumerate(storage.tables):
            keys = torch.arange(2000) * (t + 3) - 1000
            rows, scores = make_rows(spec, keys.numel(), seed=t)
            found, got_rows, got_scores = find_in_table(storage, t, keys)
            erased = (
                (keys >= -1000) & (keys < -900)
                if t == 0
                else torch.zeros_like(keys, dtype=torch.bool)
            )
            assert torch.equal(found, ~erased)
            assert torch.equal(bits(got_rows[found]), bits(rows[found]))
            assert torch.equal(got_scores[found], scores[found])
            assert storage.sizes([t])[0] == int((~erased).sum())
