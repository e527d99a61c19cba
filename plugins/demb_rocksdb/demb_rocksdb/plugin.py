"""Entry point of demb-rocksdb in the ``dynamicemb`` group: registers the ``rocksdb`` storage."""

from __future__ import annotations

from dynamicemb_core.plugins import RegisterFn, hookimpl


@hookimpl
def dynamicemb_register_storages(register: RegisterFn) -> None:
    from demb_rocksdb.storage import RocksDBStorage

    register(
        "rocksdb", RocksDBStorage, description="rows in a local RocksDB, a key prefix per table"
    )
