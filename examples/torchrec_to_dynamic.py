"""Turn a TorchRec model's tables into dynamic tables: the four changes, on a runnable example.

    python examples/torchrec_to_dynamic.py                 # one process, CPU
    torchrun --nproc_per_node 2 examples/torchrec_to_dynamic.py

A TorchRec training script shards an EmbeddingBagCollection with ``EmbeddingShardingPlanner`` and
``EmbeddingBagCollectionSharder`` under ``DistributedModelParallel``. Making its tables dynamic (hash
tables that take any int64 id and evict by score when full) changes four things, marked CHANGE below:

1. the constraints: ``DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=...)``
   for each table to make dynamic (native tables keep a plain constraint);
2. the planner: ``DynamicEmbeddingShardingPlanner``, which also takes the table configs;
3. the sharder: ``DynamicEmbeddingBagCollectionSharder`` (or ``DynamicEmbeddingCollectionSharder``);
4. checkpoints: dynamic tables are not in ``state_dict()``; save them with ``DynamicEmbDump``.

Everything else (model code, KJT inputs, fused optimizer, dense optimizer) stays as it was.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynamicemb_core.planner.planner import default_topology
from dynamicemb_core.shard import DynamicEmbeddingBagCollectionSharder


def init_process_group() -> None:
    """torchrun's group, or a one-process gloo group."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        return
    # an in-process store: no port to pick (another process could take a "free" one first)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def main() -> float:
    init_process_group()
    world = dist.get_world_size()

    # The model, unchanged: two id features. Build it on "meta" so no dense table is allocated.
    tables = [
        EmbeddingBagConfig(
            name="user", embedding_dim=8, num_embeddings=100_000, feature_names=["user_id"]
        ),
        EmbeddingBagConfig(
            name="country", embedding_dim=8, num_embeddings=250, feature_names=["country"]
        ),
    ]
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))

    # CHANGE 1: say which tables are dynamic. "user" becomes a hash table holding at most
    # ceil(100000 / world) ids per rank (rounded up to whole buckets), evicting the least recently
    # used id when a bucket is full; "country" stays a native TorchRec table.
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=128),
        ),
        "country": DynamicEmbParameterConstraints(),
    }
    # CHANGE 2: the planner takes the table configs, checks the constraints against them and sizes
    # each dynamic table's shard (was: EmbeddingShardingPlanner(topology=..., constraints=...)).
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=tables, topology=default_topology(world, "cpu"), constraints=constraints
    )
    # CHANGE 3: our sharder, with the same fused_params TorchRec's takes.
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
    )
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=[sharder],
    )

    # Training is unchanged. Ids far beyond num_embeddings are fine for the dynamic table.
    g = torch.Generator().manual_seed(dist.get_rank())
    loss = torch.zeros(())
    for _ in range(3):
        users = torch.randint(0, 2**40, (4,), generator=g)  # any int64 id
        countries = torch.randint(0, 250, (4,), generator=g)
        kjt = KeyedJaggedTensor(
            keys=["user_id", "country"],
            values=torch.cat([users, countries]),
            lengths=torch.ones(8, dtype=torch.int64),
        )
        loss = dmp(kjt).values().pow(2).sum()
        loss.backward()  # the fused optimizer updates both tables inside backward

    # CHANGE 4 (checkpoints): state_dict() holds the native table only; dynamic tables are saved
    # with dynamicemb_core.DynamicEmbDump(path, dmp) and restored with DynamicEmbLoad(path, dmp).
    print("state_dict keys:", sorted(k for k in dmp.state_dict() if "embedding_bags" in k))
    print(f"rank {dist.get_rank()}: last loss {float(loss):.6f}")
    dist.destroy_process_group()
    return float(loss)


if __name__ == "__main__":
    main()
