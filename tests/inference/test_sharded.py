"""from_model on a TorchRec collection sharded onto dynamic tables (DMP, one gloo process).

Oracle: the sharded model's own eval forward on the same KJT.
"""

from __future__ import annotations

import torch

from tests.shard.dist_harness import global_batch, run_workers, shard_model


def _serve_both(rank: int, world: int) -> None:
    for pooled in (True, False):  # one spawned process for both: its start-up is the slow part
        _serve(rank, world, pooled)


def _serve(rank: int, world: int, pooled: bool) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

    from dynamicemb_core import DynamicEmbTableOptions
    from dynamicemb_core.inference import (
        InferenceEmbeddingBagCollection,
        InferenceEmbeddingCollection,
    )
    from dynamicemb_core.planner import DynamicEmbParameterConstraints

    cls = EmbeddingBagConfig if pooled else EmbeddingConfig
    configs = [
        cls(name="user", embedding_dim=4, num_embeddings=60, feature_names=["f0", "f1"]),
        cls(name="item", embedding_dim=4, num_embeddings=40, feature_names=["f2"]),
    ]
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=16)
        )
        for c in configs
    }
    model = shard_model(
        pooled,
        configs,
        constraints,
        {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1},
        world,
    )
    rows = {"f0": 60, "f1": 60, "f2": 40}
    for step in range(3):
        out = model(global_batch(step, ["f0", "f1", "f2"], rows, 8))
        flat = out if pooled else torch.cat([out[f].values() for f in out])
        flat.square().sum().backward()
        model.fused_optimizer.step()
    model.eval()
    cls_served = InferenceEmbeddingBagCollection if pooled else InferenceEmbeddingCollection
    served = cls_served.from_model(model)
    assert served.collection == "model.coll"
    assert served.feature_names == ["f0", "f1", "f2"]
    kjt = global_batch(50, ["f0", "f1", "f2"], {"f0": 90, "f1": 90, "f2": 60}, 6)  # some unseen
    with torch.no_grad():
        want = model(kjt)
        got = served(kjt)
    if pooled:
        assert torch.equal(got.values(), want)
    else:
        for f in ("f0", "f1", "f2"):
            assert torch.equal(got[f].values(), want[f].values())
            assert torch.equal(got[f].lengths(), want[f].lengths())


def test_from_model_of_a_sharded_collection() -> None:
    """EmbeddingBagCollection and EmbeddingCollection, each against its own eval forward."""
    run_workers(_serve_both, world=1)
