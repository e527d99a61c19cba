"""Row-wise sharded dynamic tables under DMP (2 processes, gloo) vs an unsharded TorchRec twin.

For EC and EBC, each dist_type and each optimizer: the twin (a plain TorchRec collection with the same
initial weights, trained on the whole batch with the reference optimizer) and the sharded model (each
rank trains its slice of the batch) give the same outputs at every step and the same rows (embedding
and optimizer state) at the end; every key lives only on the rank its dist_type names. Capacity is
ample (one bucket per rank with room for a hash split's imbalance), so nothing is evicted.

TorchRec divides the gradients reaching sharded tables by the world size (DDP-style averaging), so the
twin's loss is the mean over ranks of the per-rank losses.
"""

from __future__ import annotations

import itertools
from typing import List

import pytest
import torch
from dist_harness import run_workers, train_against_twin
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints

DIST_TYPES = ["continuous", "roundrobin", "hash_roundrobin"]
OPTIMIZERS = ["exact_sgd", "exact_adagrad", "exact_row_wise_adagrad", "adam"]
HYPER = {"learning_rate": 0.1, "eps": 1e-3, "beta1": 0.8, "beta2": 0.9}
STEPS = 3


def _configs(pooled: bool) -> List:
    if pooled:  # mixed dims, SUM and MEAN, one table serving two features
        return [
            EmbeddingBagConfig(
                name="t0", embedding_dim=4, num_embeddings=40, feature_names=["f0", "f1"]
            ),
            EmbeddingBagConfig(
                name="t1",
                embedding_dim=8,
                num_embeddings=34,
                feature_names=["f2"],
                pooling=PoolingType.MEAN,
            ),
        ]
    return [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=40, feature_names=["f0", "f1"]),
        EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=34, feature_names=["f2"]),
    ]


def dynamic_constraints(configs: List, dist_type: str) -> dict:
    """Every table dynamic, one bucket per rank (ample: nothing is evicted)."""
    return {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                dist_type=dist_type, bucket_capacity=MAX_BUCKET_CAPACITY
            ),
        )
        for c in configs
    }


def _one_case(rank: int, world: int, pooled: bool, dist_type: str, optimizer: str) -> None:
    configs = _configs(pooled)
    constraints = dynamic_constraints(configs, dist_type)
    train_against_twin(rank, world, pooled, configs, constraints, optimizer, HYPER, STEPS)


def _all_cases(rank: int, world: int, pooled: bool, cases) -> None:
    for dist_type, optimizer in cases:
        try:
            _one_case(rank, world, pooled, dist_type, optimizer)
        except Exception as err:
            raise AssertionError(
                f"pooled={pooled} dist_type={dist_type} optimizer={optimizer}: {err}"
            ) from err


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_sharded_matches_unsharded_twin_every_dist_type_and_optimizer(pooled: bool) -> None:
    run_workers(_all_cases, pooled, list(itertools.product(DIST_TYPES, OPTIMIZERS)))


def _weighted_cases(rank: int, world: int) -> None:
    configs = [c for c in _configs(True) if c.pooling is PoolingType.SUM]
    for dist_type, optimizer in itertools.product(DIST_TYPES, ["exact_sgd", "adam"]):
        constraints = dynamic_constraints(configs, dist_type)
        try:
            train_against_twin(
                rank, world, True, configs, constraints, optimizer, HYPER, STEPS, weighted=True
            )
        except Exception as err:
            raise AssertionError(f"dist_type={dist_type} optimizer={optimizer}: {err}") from err


def test_weighted_features_match_a_weighted_twin() -> None:
    """TorchRec weighted features (is_weighted EBC): the ids' weights travel through the input dist
    to the dynamic tables' SUM pooling and their backward, as in the unsharded weighted twin."""
    run_workers(_weighted_cases)


def _any_int64_keys(rank: int, world: int) -> None:
    """Ids anywhere in int64 (negative, past num_embeddings) train and are stored only by their owner."""
    from dist_harness import dynamic_kernels, shard_model
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dynamicemb_core.shard.ownership import owner_rank

    g = torch.Generator().manual_seed(7)
    all_keys = torch.randint(-(2**62), 2**62, (2 * 24,), generator=g)
    mine = all_keys[rank * 24 : (rank + 1) * 24]  # each rank sends its own 24 ids, 3 per bag
    for dist_type in DIST_TYPES:
        configs = [
            EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=64, feature_names=["f"])
        ]
        constraints = dynamic_constraints(configs, dist_type)
        model = shard_model(
            True, configs, constraints, {"optimizer": EmbOptimType.EXACT_SGD}, world
        )
        kjt = KeyedJaggedTensor(keys=["f"], values=mine, lengths=torch.full((8,), 3))
        model(kjt).sum().backward()
        ((kernel, t),) = dynamic_kernels(model).values()
        found = kernel.emb_module.tables[t].find(0, all_keys)[0]
        owners = owner_rank(all_keys, dist_type, world, num_embeddings=64)
        assert torch.equal(found, owners == rank), dist_type


def test_any_int64_id_is_stored_on_its_owner_rank_only() -> None:
    run_workers(_any_int64_keys)


def _long_case(rank: int, world: int, pooled: bool) -> None:
    for dist_type in DIST_TYPES:
        for optimizer in OPTIMIZERS:
            configs = _configs(pooled)
            constraints = dynamic_constraints(configs, dist_type)
            train_against_twin(
                rank,
                world,
                pooled,
                configs,
                constraints,
                optimizer,
                HYPER,
                steps=15,
                batch_per_rank=16,
            )


@pytest.mark.slow
@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_sharded_matches_twin_over_longer_runs(pooled: bool) -> None:
    run_workers(_long_case, pooled, timeout=900)
