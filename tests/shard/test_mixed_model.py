"""Dynamic and native TorchRec tables in one collection under DMP (2 processes, gloo).

The native tables are sharded row-wise (sharing the all-to-all with the dynamic table, through our
input dist) and table-wise (TorchRec's own sharding); all three train, and the model matches its
unsharded twin step by step. The fused optimizer is exposed like TorchRec's, and the state_dict holds
the native tables but not the dynamic one.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import (
    CPU,
    dynamic_kernels,
    global_batch,
    rank_slice,
    run_workers,
    train_against_twin,
)
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints

HYPER = {"learning_rate": 0.05, "eps": 1e-3, "beta1": 0.9, "beta2": 0.99}


def _configs(pooled: bool):
    cls = EmbeddingBagConfig if pooled else EmbeddingConfig
    return [
        cls(name="dyn", embedding_dim=4, num_embeddings=50, feature_names=["f0"]),
        cls(name="native_rw", embedding_dim=4, num_embeddings=20, feature_names=["f1"]),
        cls(name="native_tw", embedding_dim=4, num_embeddings=10, feature_names=["f2"]),
    ]


def _constraints():
    return {
        "dyn": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY),
        ),
        "native_rw": DynamicEmbParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value]),
        "native_tw": DynamicEmbParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
    }


def _mixed(rank: int, world: int, pooled: bool, optimizer: str, device: torch.device = CPU) -> None:
    model = train_against_twin(
        rank, world, pooled, _configs(pooled), _constraints(), optimizer, HYPER, 3, device=device
    )
    kind = "embedding_bags" if pooled else "embeddings"
    state = model.state_dict()
    assert f"coll.{kind}.native_rw.weight" in state
    assert f"coll.{kind}.native_tw.weight" in state
    assert not any(".dyn." in k for k in state), sorted(state)
    # a strict round trip through state_dict works and leaves the dynamic rows alone
    ((kernel, t),) = dynamic_kernels(model).values()
    tier = kernel.emb_module.tables[t]
    keys = torch.arange(50, device=device)
    before = tier.find(0, keys)[1]
    model.load_state_dict(state)
    assert torch.equal(tier.find(0, keys)[1], before)
    # eval: unseen ids are not inserted and read as eval_initializer_args (zeros by default)
    model.eval()
    size = tier.size(0)
    batch = rank_slice(
        global_batch(99, ["f0", "f1", "f2"], {"f0": 50, "f1": 20, "f2": 10}, 4 * world), rank, world
    )
    unseen = KeyedJaggedTensor(
        keys=batch.keys(),
        values=torch.cat(
            [batch["f0"].values() + 10**12, batch["f1"].values(), batch["f2"].values()]
        ),
        lengths=batch.lengths(),
    ).to(device)
    out = model(unseen)
    f0 = out[:, :4] if pooled else out["f0"].values()
    assert torch.count_nonzero(f0) == 0
    assert tier.size(0) == size
    # TorchRec's fused optimizer view holds every table, the dynamic one keyed like the native ones
    keys = set(model.fused_optimizer.params)
    assert any(k.endswith(f"{kind}.dyn.weight") for k in keys), sorted(keys)
    assert any(k.endswith(f"{kind}.native_rw.weight") for k in keys), sorted(keys)
    # the learning rate set through param_groups reaches the dynamic table at step()
    for group in model.fused_optimizer.param_groups:
        group["lr"] = 0.001
    model.fused_optimizer.step()
    assert kernel.emb_module.get_learning_rate() == pytest.approx(0.001)


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_dynamic_and_native_tables_train_together(pooled: bool) -> None:
    run_workers(_all, pooled)


def _all(rank: int, world: int, pooled: bool, device: str = "cpu") -> None:
    for optimizer in ("exact_sgd", "exact_row_wise_adagrad"):
        _mixed(
            rank,
            world,
            pooled,
            optimizer,
            torch.device(device, rank) if device == "cuda" else torch.device(device),
        )
