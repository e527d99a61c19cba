"""demb-rocksdb as the last tier under the device cache: training matches a device table."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from dynamicemb_core.testing.cache_suite import StorageUnderCacheSuite


class TestRocksDBUnderCache(StorageUnderCacheSuite):
    storage_name = "rocksdb"

    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Any) -> None:
        self.path = str(tmp_path / "db")

    def storage_options(self) -> Dict[str, Any]:
        return {"path": self.path}
