"""Through a row-wise sharded model (DMP, 2 processes, gloo on CPU): the per-table counters
(``table_metrics``) and NO_EVICTION incremental dumps that threshold on insertion numbers."""

from __future__ import annotations

from typing import List

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbTableOptions, reset_table_metrics, table_metrics
from dynamicemb_core.config import DynamicEmbScoreStrategy
from dynamicemb_core.incremental_dump import get_score, incremental_dump
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank
from tests.shard.dist_harness import run_workers, shard_model

TABLES = ("t0", "t1")


def _model(world: int, rows: int, strategy: DynamicEmbScoreStrategy):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, t in enumerate(TABLES)
    ]
    constraints = {
        t: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                dist_type="roundrobin", bucket_capacity=16, score_strategy=strategy
            ),
        )
        for t in TABLES
    }
    hyper = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    return shard_model(True, configs, constraints, hyper, world)


def _step(model, keys: List[List[int]]) -> None:
    lengths = torch.tensor([len(k) for k in keys], dtype=torch.int64)
    values = torch.tensor([k for ks in keys for k in ks], dtype=torch.int64)
    kjt = KeyedJaggedTensor(
        keys=[f"f{i}" for i in range(len(keys))], values=values, lengths=lengths
    )
    model(kjt).pow(2).sum().backward()


def _counters_per_rank(rank: int, world: int) -> None:
    model = _model(world, 16 * world, DynamicEmbScoreStrategy.TIMESTAMP)
    # every rank feeds the same batch; roundrobin gives each rank 24 distinct keys of t0 for its
    # one bucket of 16 slots (16 placed, 8 not), and 4 of t1
    _step(model, [list(range(24 * world)), list(range(4 * world))])
    got = table_metrics(model)
    assert got == {
        "model.coll": {
            "t0": {"hits": 0, "misses": 24, "placed": 16, "evicted": 0, "unplaced": 8},
            "t1": {"hits": 0, "misses": 4, "placed": 4, "evicted": 0, "unplaced": 0},
        }
    }, got
    _step(model, [list(range(24 * world)), list(range(8 * world, 10 * world))])
    read = table_metrics(model, reset=True)["model.coll"]
    t0, t1 = read["t0"], read["t1"]
    assert (t0["hits"], t0["misses"], t0["unplaced"]) == (16, 24 + 8, 8 + 8)
    assert (t1["placed"], t1["evicted"]) == (6, 0), (t0, t1)
    assert table_metrics(model)["model.coll"]["t1"] == dict.fromkeys(t1, 0)
    _step(model, [[0], [0]])
    reset_table_metrics(model)
    assert all(v == 0 for c in table_metrics(model)["model.coll"].values() for v in c.values())


def _no_eviction_dumps_inserted_keys(rank: int, world: int) -> None:
    model = _model(world, 400, DynamicEmbScoreStrategy.NO_EVICTION)
    old = [list(range(0, 40)), list(range(100, 110))]
    _step(model, old)
    mine = [
        [k for k in ks if owner_rank(torch.tensor([k]), "roundrobin", world) == rank] for ks in old
    ]
    since = get_score(model)
    assert since == {"model.coll": {t: len(mine[i]) for i, t in enumerate(TABLES)}}, since
    new = [list(range(300, 306)), [350, 351, 352]]
    _step(model, [old[0] + new[0], old[1] + new[1]])  # the old keys are trained again
    delta = incremental_dump(model, since)["model.coll"]
    for i, t in enumerate(TABLES):
        assert delta.table_names[i] == t
        assert sorted(delta.keys[i].tolist()) == new[i], t  # every rank's new keys, no old one


def _cases(rank: int, world: int) -> None:
    _counters_per_rank(rank, world)
    _no_eviction_dumps_inserted_keys(rank, world)


def test_counters_and_no_eviction_dumps_through_a_sharded_model():
    run_workers(_cases, timeout=300)
