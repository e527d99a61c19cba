"""The core's storages pass the plugin conformance suites (the same ones third-party storages run)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from dynamicemb_core.storage import CachedStorage, DeviceStorage, HybridStorage
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.testing.storage_suite import StorageDumpSuite, StorageSuite
from dynamicemb_core.types import StorageTableSpec

CAPACITY = 8192


def _sized(tables: Sequence[StorageTableSpec]) -> list:
    return [dataclasses.replace(t, capacity=t.capacity or CAPACITY) for t in tables]


class TestDeviceStorage(StorageSuite, StorageDumpSuite):
    def make_storage(self, tables, device):
        return DeviceStorage(_sized(tables), device)


class TestHybridStorage(StorageSuite):
    def make_storage(self, tables, device):
        tables = _sized(tables)
        hbm = [
            t.capacity // 2 * t.row_width * torch.empty(0, dtype=t.dtype).element_size()
            for t in tables
        ]
        return HybridStorage(tables, device, hbm_bytes=hbm)


class TestCachedStorageOverDict(StorageSuite):
    def make_storage(self, tables, device):
        tables = _sized(tables)
        return CachedStorage(tables, device, PyDictStorage(tables, "cpu"), [64] * len(tables))
