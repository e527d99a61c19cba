"""A real redis-server for the session, on a free loopback port, stopped by its pid."""

from __future__ import annotations

from typing import Iterator

import pytest

from demb_redis.server import LocalRedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as server:
        yield server
