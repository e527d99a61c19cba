"""demb-rocksdb: a :class:`~dynamicemb_core.types.Storage` on a local RocksDB for dynamicemb-core."""

from __future__ import annotations

from demb_rocksdb.storage import RocksDBStorage

__all__ = ["RocksDBStorage", "__version__"]
__version__ = "0.1.0"
