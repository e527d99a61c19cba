"""TorchRec's prefetch hook reaches dynamic tables with a device cache (2 processes, gloo).

TorchRec's prefetch pipeline calls ``ShardedModule.prefetch(dist_input, ...)`` for batch i+1 after
its input dist and before batch i's forward; TorchRec's own lookups skip groups of the customized
kernel, so ours must take the call. Here: the prefetch pins exactly the keys the rank received, the
forward of that batch releases them, and the forward gives what a model without prefetch gives.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import dynamic_kernels, global_batch, rank_slice, run_workers, shard_model
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.config import DynamicEmbInitializerArgs, DynamicEmbInitializerMode
from dynamicemb_core.planner import DynamicEmbParameterConstraints

NUM_IDS = 200


def _model(world: int, pooled: bool):
    cls = EmbeddingBagConfig if pooled else EmbeddingConfig
    configs = [cls(name="t", embedding_dim=4, num_embeddings=NUM_IDS, feature_names=["f"])]
    options = DynamicEmbTableOptions(
        bucket_capacity=16,
        caching=True,
        global_hbm_for_values=world * 32 * 16,  # a 32-row cache per rank (rows of 16 bytes)
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    )
    constraints = {
        "t": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    return shard_model(pooled, configs, constraints, fused, world)


def _prefetch_then_forward(rank: int, world: int, pooled: bool) -> None:
    model, plain = _model(world, pooled), _model(world, pooled)
    coll = model.module.coll
    ((kernel, t),) = dynamic_kernels(model).values()
    tier = kernel.emb_module.tables[t]
    kjt = rank_slice(global_batch(0, ["f"], {"f": NUM_IDS}, 4 * world), rank, world)

    ctx = coll.create_context()
    dist_input = coll.input_dist(ctx, kjt).wait().wait()
    received = torch.unique(torch.cat([features.values() for features in dist_input]))
    assert tier.pinned(0) == 0
    coll.prefetch(dist_input, None, ctx)
    assert tier.pinned(0) == received.numel() > 0
    assert bool((tier.pin_counts(0, received) == 1).all())

    out, want = model(kjt), plain(kjt)
    assert tier.pinned(0) == 0, "the forward releases the batch's pins"
    if pooled:
        torch.testing.assert_close(out, want)
    else:
        torch.testing.assert_close(out["f"].values(), want["f"].values())


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_torchrec_prefetch_pins_the_ranks_keys_until_their_forward(pooled: bool) -> None:
    run_workers(_prefetch_then_forward, pooled)
