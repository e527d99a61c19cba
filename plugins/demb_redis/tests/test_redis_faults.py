"""demb-redis behind the device cache when Redis fails (issue 17).

- ``FaultInjectionSuite`` over a RedisStorage: injected failures of chosen calls;
- a real ``redis-server`` (AOF on) killed with SIGKILL and restarted during training, before a
  step (every call of the step is refused) and at random moments inside steps (a pipeline may be
  cut halfway: each key then reads its value from before or after that step).
The oracle is the same training on a plain device table (see ``fault_suite``).
"""

from __future__ import annotations

import random
import threading
import uuid
from typing import List, Optional

import pytest
import torch

from demb_redis import RedisStorage, RedisStorageError
from demb_redis.server import LocalRedisServer
from dynamicemb_core.storage import StorageTierError
from dynamicemb_core.testing.fault_suite import (
    ROW_BYTES,
    FaultInjectionSuite,
    make_module,
    table_spec,
    train_with_faults,
)
from dynamicemb_core.types import Storage, StorageTableSpec

CPU = torch.device("cpu")


class TestRedisUnderFaults(FaultInjectionSuite):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: LocalRedisServer) -> None:
        self.url = redis_server.url

    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        return RedisStorage([spec], url=self.url, model=uuid.uuid4().hex)


def _aof_server() -> LocalRedisServer:
    """AOF with ``appendfsync always``: every write is in the AOF before Redis acknowledges it
    (see ``LocalRedisServer``; with ``everysec`` a SIGKILL could lose acknowledged rows)."""
    return LocalRedisServer(appendonly=True)


def _store(server: LocalRedisServer) -> RedisStorage:
    # A killed server refuses or resets the connection at once: no call here waits for a timeout.
    # The timeouts only bound a hang; a short one would fail a healthy call on a loaded machine
    # (each write waits for the AOF's fsync).
    return RedisStorage(
        [table_spec()],
        url=server.url,
        model="killed",
        retries=0,
        socket_timeout=30.0,
        socket_connect_timeout=10.0,
    )


def test_server_killed_before_steps_then_restarted_loses_nothing() -> None:
    with _aof_server() as server:
        store = _store(server)
        tiered = make_module(CPU, external_storage=store, local_hbm_for_values=64 * ROW_BYTES)

        def kill(step: int) -> None:
            if step in (2, 5):
                server.kill()

        log = train_with_faults(
            tiered,
            make_module(CPU),
            8,
            recover=server.restart,
            before_step=kill,
            error_type=StorageTierError,
        )
        assert [e is not None for e in log.failed] == [i in (2, 5) for i in range(8)]
        for exc in log.failed:
            if exc is not None:
                assert isinstance(exc.__cause__, RedisStorageError)
                assert server.url in str(exc) and "table 't'" in str(exc)
        assert tiered.tables[0].spills(0) > 0  # the cache spilled into Redis between the kills


def test_server_killed_inside_steps_keeps_each_row_before_or_after() -> None:
    rng = random.Random(17)
    timers: List[Optional[threading.Timer]] = [None]
    with _aof_server() as server:
        tiered = make_module(
            CPU, external_storage=_store(server), local_hbm_for_values=64 * ROW_BYTES
        )

        def settle() -> None:
            timer = timers[0]
            if timer is not None:
                timer.join()

        def kill_soon(step: int) -> None:
            # A kill that lands after its step finished makes this step fail at its first call.
            settle()
            if step % 2 == 1 and server.pid is not None:
                timers[0] = threading.Timer(rng.uniform(0.0, 0.02), server.kill)
                timers[0].start()

        def recover() -> None:
            settle()
            server.restart()

        log = train_with_faults(
            tiered,
            make_module(CPU),
            12,
            recover=recover,
            before_step=kill_soon,
            allow_after=True,
            error_type=StorageTierError,
        )
        assert log.failures >= 3  # every kill fails its step or the next one
