"""The reference dict storage passes the conformance suites it is the model for."""

from __future__ import annotations

from typing import Any, Dict, Sequence

import torch

from dynamicemb_core.testing.cache_suite import StorageUnderCacheSuite
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.testing.storage_suite import StorageDumpSuite, StorageSuite
from dynamicemb_core.types import MemoryType, Storage, StorageTableSpec


class TestPyDictStorage(StorageSuite, StorageDumpSuite):
    def make_storage(self, tables: Sequence[StorageTableSpec], device: torch.device) -> Storage:
        return PyDictStorage(tables, device)


def test_memory_usage_reports_host_bytes_only() -> None:
    spec = StorageTableSpec("t", dim=2, row_width=4)
    storage = PyDictStorage([spec])
    keys = torch.tensor([1, 2])
    storage.insert(
        keys, torch.zeros_like(keys), torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int64)
    )
    assert storage.memory_usage(MemoryType.HOST) == 2 * (8 + 16 + 8)
    assert storage.memory_usage(MemoryType.DEVICE) == 0


class TestPyDictStorageUnderCache(StorageUnderCacheSuite):
    storage_name = "dict"

    def storage_options(self) -> Dict[str, Any]:
        return {}
