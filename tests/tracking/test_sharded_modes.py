"""The optimizer-state tracking modes through DMP (2 processes, gloo): recorded by the sharded
collection's TorchRec hook, reported as raw keys on their owner rank (issue 15 item 11)."""

from __future__ import annotations

from typing import Dict

from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank
from tests.checkpoint.helpers import snapshot
from tests.shard.dist_harness import global_batch, rank_slice, run_workers, shard_model

CONFIGS = [
    EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=60, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=60, feature_names=["f2"]),
]
TABLE = {"f0": "t0", "f1": "t0", "f2": "t1"}
DIM = {"t0": 4, "t1": 8}


def _accumulator(model, table: str, key: int) -> float:
    rows = snapshot(model)[f"model.coll/{table}"].rows
    return float(rows[key][DIM[table]]) if key in rows else 0.0


def _diff_mode_through_dmp(rank: int, world: int) -> None:
    from dynamicemb_core.tracking import DynamicEmbDeltaTracker, TrackingMode

    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=64)
        )
        for c in CONFIGS
    }
    model = shard_model(
        True,
        CONFIGS,
        constraints,
        {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1},
        world,
    )
    tracker = DynamicEmbDeltaTracker(model, mode=TrackingMode.MOMENTUM_DIFF)
    tracker.attach(model)
    assert tracker.fqn_to_feature_names() == {"coll.t0": ["f0", "f1"], "coll.t1": ["f2"]}
    first: Dict[str, Dict[int, float]] = {"coll.t0": {}, "coll.t1": {}}
    for step in range(4):
        kjt = global_batch(step, sorted(TABLE), {f: 60 for f in TABLE}, 8 * world)
        for f, t in TABLE.items():
            keys = kjt[f].values()
            for k in keys[owner_rank(keys, "roundrobin", world) == rank].tolist():
                first[f"coll.{t}"].setdefault(k, _accumulator(model, t, k))
        model(rank_slice(kjt, rank, world)).pow(2).sum().backward()  # DMP steps the tracker
        if step in (0, 3):  # a window of one step, then one of three
            got = tracker.get_unique()
            grew = 0
            for fqn, per_key in first.items():
                rows = dict(zip(got[fqn].ids.tolist(), got[fqn].states.tolist(), strict=True))
                assert rows.keys() == per_key.keys(), fqn
                for k, then in per_key.items():
                    now = _accumulator(model, fqn.split(".")[1], k)
                    assert abs(rows[k] - (now - then)) <= 1e-5 * max(1.0, now), (fqn, k)
                    grew += rows[k] > 0
            assert grew > 0
            first = {"coll.t0": {}, "coll.t1": {}}


def test_momentum_diff_through_dmp_reports_owned_raw_keys():
    run_workers(_diff_mode_through_dmp)
