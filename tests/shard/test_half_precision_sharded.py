"""TorchRec's ``DataType.FP16`` through the planner and the sharder: 2 processes (gloo), row-wise
sharded dynamic tables whose configs say FP16 store float16 embeddings (and float32 optimizer state),
and train like an unsharded float32 twin whose rows are rounded to float16 after every step."""

from __future__ import annotations

import dataclasses

import torch
from dist_harness import (
    ReferenceOptimizer,
    _flatten,
    _local_rows,
    _twin_weight,
    dynamic_kernels,
    global_batch,
    make_collection,
    mirror_dynamic_rows,
    rank_slice,
    run_workers,
    shard_model,
)
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank
from dynamicemb_core.types import MemoryType

HYPER = {"learning_rate": 0.1, "eps": 1e-3, "beta1": 0.8, "beta2": 0.9}
STEPS = 3


def _configs(data_type: DataType):
    return [
        EmbeddingBagConfig(
            name="t0", embedding_dim=4, num_embeddings=40, feature_names=["f0", "f1"],
            data_type=data_type,
        ),
        EmbeddingBagConfig(
            name="t1", embedding_dim=6, num_embeddings=34, feature_names=["f2"],
            pooling=PoolingType.MEAN, data_type=data_type,
        ),
    ]  # fmt: skip


def _fp16_through_dmp(rank: int, world: int) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    configs = _configs(DataType.FP16)
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY),
        )
        for c in configs
    }
    optimizer = "exact_row_wise_adagrad"
    model = shard_model(
        True, configs, constraints, {"optimizer": EmbOptimType(optimizer), **HYPER}, world
    )
    kernels = dynamic_kernels(model)
    assert sorted(kernels) == ["t0", "t1"]
    for name, (kernel, t) in kernels.items():
        emb = kernel.emb_module
        assert emb.table_options[t].embedding_dtype == torch.float16, name
        assert emb.tables[t].group.rows.values.dtype == torch.float16, name
        # Sized by the stored row: 2 bytes per embedding element (padded to even), 4 per state one.
        tier, spec = emb.tables[t], emb.tables[t].tables[0]
        used = tier.memory_usage(MemoryType.HOST) + tier.memory_usage(MemoryType.DEVICE)
        assert used == tier.capacity(0) * (
            (spec.dim + 1) // 2 * 4 + 4 * (spec.row_width - spec.dim)
        )
    torch.manual_seed(0)
    twin = make_collection(
        True,
        [dataclasses.replace(c, data_type=DataType.FP32) for c in configs],
        torch.device("cpu"),
    )
    with torch.no_grad():
        for c in configs:
            w = _twin_weight(twin, True, c.name)
            w.copy_(w.half().float())
    mirror_dynamic_rows(model, twin, True, rank, world)
    refs = {
        c.name: ReferenceOptimizer(optimizer, HYPER["learning_rate"], HYPER["eps"], HYPER["beta1"],
                                   HYPER["beta2"], round_to=torch.float16)
        for c in configs
    }  # fmt: skip
    table_of = {f: c for c in configs for f in c.feature_names}
    for step in range(STEPS):
        kjt = global_batch(
            step, sorted(table_of), {f: c.num_embeddings for f, c in table_of.items()}, 8 * world
        )
        out = _flatten(model(rank_slice(kjt, rank, world)), True)
        full = twin(kjt).values()
        assert out.dtype == torch.float32  # TorchRec's default output dtype
        # One float16 unit of the rows at most (gradient sums run in another order).
        torch.testing.assert_close(
            out, _local_rows(full, True, kjt, rank, world), atol=2e-3, rtol=0
        )
        target = torch.randn(full.shape, generator=torch.Generator().manual_seed(step))
        (out * _local_rows(target, True, kjt, rank, world)).sum().backward()
        model.fused_optimizer.step()
        (full * target).sum().div(world).backward()
        with torch.no_grad():
            for c in configs:
                w = _twin_weight(twin, True, c.name)
                touched = torch.unique(torch.cat([kjt[f].values() for f in c.feature_names]))
                refs[c.name].step(w.data, w.grad, touched)
                w.grad = None
    for name, (kernel, t) in kernels.items():
        weight = _twin_weight(twin, True, name).detach()
        keys = torch.arange(weight.shape[0])
        owned = (
            owner_rank(keys, kernel.dist_types[t], world, num_embeddings=weight.shape[0]) == rank
        )
        found, rows, _ = kernel.emb_module.tables[t].find(0, keys)
        assert torch.equal(found, owned)
        emb = rows[owned][:, : weight.shape[1]]
        assert torch.equal(emb, emb.half().float())  # stored as float16
        want = weight[keys[owned]]
        torch.testing.assert_close(emb, want, rtol=2.0**-10, atol=1e-6)
        assert (emb == want).float().mean() > 0.9


def test_fp16_tables_plan_shard_and_train_in_float16() -> None:
    run_workers(_fp16_through_dmp)
