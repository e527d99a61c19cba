"""demb-rocksdb behind the device cache when its calls fail: nothing acknowledged is lost."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from demb_rocksdb import RocksDBStorage
from dynamicemb_core.testing.fault_suite import FaultInjectionSuite
from dynamicemb_core.types import Storage, StorageTableSpec


class TestRocksDBUnderFaults(FaultInjectionSuite):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Any) -> None:
        self.tmp = tmp_path
        self.count = itertools.count()

    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        return RocksDBStorage([spec], path=str(self.tmp / f"db{next(self.count)}"))
