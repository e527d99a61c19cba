"""A real redis-server and a real 3-master Redis Cluster for the session, on free loopback ports."""

from __future__ import annotations

from typing import Iterator

import pytest

from demb_redis.server import LocalRedisCluster, LocalRedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A real 3-master Redis Cluster on loopback ports (AOF on: a restarted node keeps its rows)."""
    with LocalRedisCluster(masters=3, appendonly=True) as cluster:
        yield cluster
