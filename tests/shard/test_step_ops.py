"""A DMP training step's host ops do not grow with the number of dynamic tables.

One step (forward, backward with the fused update, ``fused_optimizer.step()``) of a model of 1 and of
8 tables, one feature each, under DistributedModelParallel (gloo, world size 1), counted with
torch.profiler on the CPU: ATen and custom dispatcher ops. The dynamic model may grow by no more than
TorchRec's own static row-wise model of the same shape grows (its EC output is split per feature)
plus a small constant. The input dist's per-feature routing once added ~13 ops a table.

The bucketizer of a world of 3 is held to the same rule (its routing runs per dist_type, never per
feature).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Dict, List, Tuple

import pytest
import torch
from dist_harness import run_workers, shard_model
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.rw_input_dist import FeatureRoute, bucketize_kjt_by_owner

_OP = re.compile(r"^(aten|dynamicemb|fbgemm|c10d|torchrec)::")
# ops a step may add over TorchRec's own growth from 1 to 8 tables (today: 0)
SLACK = 6


def _ops(fn: Callable[[], None]) -> Tuple[int, Counter]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = Counter(e.name for e in prof.events() if _OP.match(e.name))
    return sum(names.values()), names


def _batch(tables: int, step: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, 4, (tables * 8,), generator=g)
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=[f"f{i}" for i in range(tables)], values=values, lengths=lengths)


def _step_ops(pooled: bool, tables: int, dynamic: bool) -> Tuple[int, Counter]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    cls = EmbeddingBagConfig if pooled else EmbeddingConfig
    configs = [
        cls(name=f"t{i}", embedding_dim=8, num_embeddings=1000, feature_names=[f"f{i}"])
        for i in range(tables)
    ]
    if dynamic:
        constraints: Dict[str, DynamicEmbParameterConstraints] = {
            c.name: DynamicEmbParameterConstraints(
                use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions()
            )
            for c in configs
        }
    else:
        constraints = {
            c.name: DynamicEmbParameterConstraints(
                sharding_types=[ShardingType.ROW_WISE.value], compute_kernels=["fused"]
            )
            for c in configs
        }
    model = shard_model(
        pooled, configs, constraints, {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}, 1
    )

    def step(i: int) -> None:
        out = model(_batch(tables, i))
        loss = out.sum() if pooled else torch.cat([out[f].values() for f in sorted(out)]).sum()
        loss.backward()
        model.fused_optimizer.step()

    for i in range(2):  # TorchRec builds its input dist lazily
        step(i)
    return _ops(lambda: step(2))


def _compare(rank: int, world: int, pooled: bool) -> None:
    counts = {
        (dynamic, tables): _step_ops(pooled, tables, dynamic)
        for dynamic in (True, False)
        for tables in (1, 8)
    }
    grown = {d: counts[(d, 8)][0] - counts[(d, 1)][0] for d in (True, False)}
    extra = counts[(True, 8)][1] - counts[(True, 1)][1]
    assert grown[True] <= grown[False] + SLACK, (
        f"a DMP step of dynamic tables ran {counts[(True, 1)][0]} ops at 1 table and "
        f"{counts[(True, 8)][0]} at 8 (TorchRec's static tables: {counts[(False, 1)][0]} -> "
        f"{counts[(False, 8)][0]}); the ops that grew: {extra.most_common(8)}"
    )


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_dmp_step_ops_do_not_grow_with_tables(pooled: bool) -> None:
    run_workers(_compare, pooled, world=1)


def test_bucketize_ops_do_not_grow_with_features() -> None:
    def kjt_and_routes(features: int) -> Tuple[KeyedJaggedTensor, List[FeatureRoute]]:
        kinds = [
            FeatureRoute("roundrobin", 100),
            FeatureRoute("hash_roundrobin", 100),
            FeatureRoute("continuous", 150, local_rows=True),
            FeatureRoute("continuous", 70),
        ]
        routes = [kinds[f % len(kinds)] for f in range(features)]
        lengths = torch.full((features * 4,), 2)
        values = torch.arange(int(lengths.sum())) % 70
        keys = [f"f{f}" for f in range(features)]
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths), routes

    counts = {}
    for features in (4, 16):
        kjt, routes = kjt_and_routes(features)
        kjt.length_per_key()  # TorchRec's cache, as after its own checks
        counts[features] = _ops(lambda k=kjt, r=routes: bucketize_kjt_by_owner(k, r, 3))[0]
    assert counts[16] - counts[4] <= 2, counts
