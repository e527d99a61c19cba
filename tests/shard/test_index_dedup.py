"""``use_index_dedup=True`` on the EmbeddingCollection sharder (the seed's flag): ids deduplicated per
table by our own ``unique`` op on CPU and CUDA (TorchRec's path calls an FBGEMM op with no CPU kernel),
and training matches an unsharded TorchRec twin step by step (issue 15 item 7)."""

from __future__ import annotations

import itertools

import pytest
import torch
from dist_harness import run_workers, train_against_twin
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.dedup import dedup_by_table

HYPER = {"learning_rate": 0.1, "eps": 1e-3, "beta1": 0.8, "beta2": 0.9}


def test_dedup_merges_a_tables_features_and_keeps_tables_apart(device):
    # t0 has features a, b; t1 has c. Id 7 appears in all three.
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.tensor([7, 3, 7, 7, 5, 3, 7, 7, 2**62], device=device),
        lengths=torch.tensor([2, 1, 1, 2, 2, 1], device=device),
        weights=torch.arange(9, dtype=torch.float32, device=device),
    )
    dedup, reverse = dedup_by_table(kjt, [2, 1], accumulate_weights=True)
    assert dedup.keys() == ["a", "b", "c"]
    values = dedup.values()
    # every input id is the deduplicated value reverse points at
    assert torch.equal(values[reverse], kjt.values())
    # t0's ids {7, 3, 5} once each (in a's and b's bags), t1's {7, 2**62} once each (in c's bags)
    per_key = dedup.length_per_key()
    assert per_key[0] + per_key[1] == 3 and per_key[2] == 2
    assert sorted(values[:3].tolist()) == [3, 5, 7]
    assert sorted(values[3:].tolist()) == [7, 2**62]
    assert dedup.stride() == kjt.stride()
    # weights of equal ids are summed: t0's 7 sits at positions 0, 2, 3
    seven = int((values[:3] == 7).nonzero())
    assert dedup.weights()[seven].item() == 0 + 2 + 3
    plain, _ = dedup_by_table(kjt, [2, 1])
    assert plain.weights_or_none() is None  # as TorchRec: weights only when accumulating
    with pytest.raises(ValueError, match="does not cover"):
        dedup_by_table(kjt, [1, 1])


CONFIGS = [
    EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=40, feature_names=["f0", "f1"]),
    EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=34, feature_names=["f2"]),
]


def _cases(rank: int, world: int) -> None:
    import dynamicemb_core.shard.dedup as dedup_module

    calls = []
    original = dedup_module.dedup_by_table

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dedup_module.dedup_by_table = counting  # the sharded module imports it at call time
    for dist_type, optimizer in itertools.product(
        ["roundrobin", "hash_roundrobin"], ["exact_sgd", "adam"]
    ):
        constraints = {
            c.name: DynamicEmbParameterConstraints(
                use_dynamicemb=True,
                dynamicemb_options=DynamicEmbTableOptions(
                    dist_type=dist_type, bucket_capacity=MAX_BUCKET_CAPACITY
                ),
            )
            for c in CONFIGS
        }
        try:
            train_against_twin(
                rank,
                world,
                False,
                CONFIGS,
                constraints,
                optimizer,
                HYPER,
                3,
                batch_per_rank=6,
                sharder_kwargs={"use_index_dedup": True},
            )
        except Exception as err:
            raise AssertionError(f"dist_type={dist_type} optimizer={optimizer}: {err}") from err
    assert len(calls) >= 4 * 3, "the deduplication did not run"


def test_index_dedup_trains_like_the_unsharded_twin_on_cpu():
    run_workers(_cases)
