"""Training through a real 3-master Redis Cluster, with the master holding the table restarted.

The table's rows live in one hash, ``demb:{model:t}:rows``, on the master owning its hash-tag slot.
That master is killed (SIGKILL) before a step: the step raises a clear error naming the table and
the failed operation (its slot has no server); the node is restarted on its port with its AOF and
nodes.conf, the cluster reports ok again, training goes on, and every key reads what it read
before: nothing acknowledged was lost (the oracle is the same training on a device table).
"""

from __future__ import annotations

import uuid

import torch
from redis.crc import key_slot

from demb_redis import RedisStorage, RedisStorageError
from demb_redis.server import LocalRedisCluster
from dynamicemb_core.storage import StorageTierError
from dynamicemb_core.testing.fault_suite import (
    ROW_BYTES,
    make_module,
    table_spec,
    train_with_faults,
)

CPU = torch.device("cpu")


def test_train_through_a_cluster_and_restart_the_master_of_the_tables_slot(
    redis_cluster: LocalRedisCluster,
) -> None:
    model = uuid.uuid4().hex[:12]
    store = RedisStorage(
        [table_spec()],
        url=redis_cluster.url,
        model=model,
        cluster=True,
        retries=1,
        retry_backoff_s=0.05,
        socket_timeout=30.0,  # bounds a hang only: a killed node refuses at once
        socket_connect_timeout=10.0,
    )
    owner = redis_cluster.node_for_slot(key_slot(f"demb:{{{model}:t}}:rows".encode()))
    tiered = make_module(CPU, external_storage=store, local_hbm_for_values=64 * ROW_BYTES)

    def kill_owner(step: int) -> None:
        if step == 3:
            redis_cluster.servers[owner].kill()

    log = train_with_faults(
        tiered,
        make_module(CPU),
        7,
        recover=lambda: redis_cluster.restart_node(owner),
        before_step=kill_owner,
        error_type=StorageTierError,
    )
    assert [e is not None for e in log.failed] == [i == 3 for i in range(7)]
    err = log.failed[3]
    assert isinstance(err, StorageTierError) and "table 't'" in str(err)
    assert isinstance(err.__cause__, RedisStorageError)
    assert f"model {model!r}" in str(err) and "Redis Cluster node serving it" in str(err)
    assert tiered.tables[0].spills(0) > 0 and store.sizes()[0] > 0  # rows lived in the cluster
