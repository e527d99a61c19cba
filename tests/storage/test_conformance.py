"""The core's storages pass the plugin conformance suites (the same ones third-party storages run)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import pytest
import torch

from dynamicemb_core.storage.grouped import GroupedDeviceStorage
from dynamicemb_core.storage.table_views import CachedTableView
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.testing.storage_suite import StorageDumpSuite, StorageSuite, default_tables
from dynamicemb_core.types import PerTableStorage, StorageTableSpec

CAPACITY = 8192


def _sized(tables: Sequence[StorageTableSpec]) -> list:
    return [dataclasses.replace(t, capacity=t.capacity or CAPACITY) for t in tables]


def _refuses_other_dtypes(make, dtype: torch.dtype) -> None:
    """A group stores half-precision embeddings (beside float32 optimizer state) but moves logical
    float32 rows, so its tables say float32; other dtypes are refused when it is built."""
    if dtype == torch.float64:
        with pytest.raises(ValueError, match="share one dtype"):
            make(default_tables(dtype))
        return
    group = make(default_tables(dtype)).inner  # the group, behind the per-table adapter
    assert isinstance(group, GroupedDeviceStorage) and group.row_dtype == dtype
    assert {t.dtype for t in group.tables} == {torch.float32}


class TestGroup(StorageSuite, StorageDumpSuite):
    """A group of device tables (the ``device`` builtin, and the host table of cached ones)."""

    def make_storage(self, tables, device):
        tables = _sized(tables)
        return GroupedDeviceStorage(tables, device, dims=[t.dim for t in tables])

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
    def test_each_row_dtype_round_trips_bitwise(self, make, dtype):
        _refuses_other_dtypes(make, dtype)


class TestHybridGroup(StorageSuite):
    """A group whose tables keep half of their slots' rows in host memory (hybrid tables)."""

    def make_storage(self, tables, device):
        tables = _sized(tables)
        return GroupedDeviceStorage(
            tables,
            device,
            dims=[t.dim for t in tables],
            device_rows=[t.capacity // 2 for t in tables],
        )

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
    def test_each_row_dtype_round_trips_bitwise(self, make, dtype):
        _refuses_other_dtypes(make, dtype)


class _CachedTables(PerTableStorage):
    """The cached tables of one group (a 64-row cache each over one dict storage), table t's
    calls going to its :class:`CachedTableView`: the union of cache and backing store must behave
    as one storage."""

    def __init__(self, tables: Sequence[StorageTableSpec], device: torch.device) -> None:
        super().__init__(tables, device)
        n = len(tables)
        backing = PyDictStorage(list(tables), "cpu")
        group = GroupedDeviceStorage(
            list(tables),
            device,
            dims=[t.dim for t in tables],
            cache_rows=[64] * n,
            backing=[(backing, t) for t in range(n)],
        )
        self.views = [CachedTableView(group, t) for t in range(n)]

    def find(self, table_id, keys):
        return self.views[table_id].find(0, keys)

    def insert(self, table_id, keys, rows, scores):
        self.views[table_id].insert(0, keys, rows, scores)

    def erase(self, table_id, keys):
        self.views[table_id].erase(0, keys)

    def size(self, table_id):
        return self.views[table_id].size(0)

    def export(self, table_id, batch_size=65536):
        return self.views[table_id].export(0, batch_size)


class TestCachedTablesOverDict(StorageSuite):
    def make_storage(self, tables, device):
        return _CachedTables(_sized(tables), device)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
    def test_each_row_dtype_round_trips_bitwise(self, make, dtype):
        """Cached tables keep float32 rows: other row dtypes are refused when the group is built,
        instead of being stored converted."""
        with pytest.raises(ValueError, match="cached tables keep float32 rows|share one dtype"):
            make(default_tables(dtype))
