"""demb-redis as the last tier under the device cache: training matches a device table."""

from __future__ import annotations

import uuid
from typing import Any, Dict

import pytest

from demb_redis.server import LocalRedisServer
from dynamicemb_core.testing.cache_suite import StorageUnderCacheSuite


class TestRedisUnderCache(StorageUnderCacheSuite):
    storage_name = "redis"

    @pytest.fixture(autouse=True)
    def _server(self, redis_server: LocalRedisServer) -> None:
        self.url = redis_server.url

    def storage_options(self) -> Dict[str, Any]:
        return {"url": self.url, "model": uuid.uuid4().hex}
