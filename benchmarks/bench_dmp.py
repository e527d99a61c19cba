"""The user's training step under DistributedModelParallel: dynamic tables vs TorchRec's static ones.

A TorchRec model of N tables x dim 128, one feature each — an ``EmbeddingCollection`` (pooling NONE,
sequence output) or an ``EmbeddingBagCollection`` (SUM) — sharded by ``DistributedModelParallel``
twice: with this project's planner and sharders (every table dynamic) and with TorchRec's own
row-wise fused tables (FBGEMM TBE, ``EmbeddingComputeKernel.FUSED``). Both take the same power-law
batches (alpha 1.05), alternating steps; a step is forward, ``loss.backward()`` (the fused update)
and ``fused_optimizer.step()``. It prints, per (model, optimizer, tables), both median step times,
the ratio dynamic / static, and the ATen + custom ops one step runs on the host for each model
(``torch.profiler``, CPU activity; ``--ops``, on by default on CPU).

World size 1: gloo on CPU, NCCL on CUDA. On CUDA the dynamic tables keep every row in device
memory: their ``global_hbm_for_values`` is set to all rows' bytes (the default 0 would put every
row in host memory). The static peer on CPU is TorchRec's row-wise sharding through this
project's sharder (TorchRec's own EBC sharder offers no row-wise sharding on CPU; for native
tables the sharder is TorchRec's code path unchanged); on CUDA it is TorchRec's planner and
sharders. FBGEMM's CPU TBE has no ADAM: that static row reads ``n/a`` on CPU.

Run:
    PYTHONPATH=. python benchmarks/bench_dmp.py                        # CPU defaults (smaller batch)
    PYTHONPATH=. python benchmarks/bench_dmp.py --small                # a smoke run in seconds
    PYTHONPATH=. python benchmarks/bench_dmp.py --device cuda          # ~1M ids a step, 1/10/26 tables
    PYTHONPATH=. python benchmarks/bench_dmp.py --ops-only --tables 1,16 --models ebc  # op counts
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import platform
import re
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from bench_training import power_law_batch, time_pair
from small import add_small_flag, apply_small
from torch import nn

SMALL = {
    "tables": "1,4",
    "dim": 16,
    "ids": 4096,
    "num_ids": 4096,
    "batch": 64,
    "warmup": 1,
    "repeats": 2,
    "batches": 2,
}

# what counts as an op: ATen and the custom libraries' dispatcher ops (not autograd nodes,
# record_function ranges or profiler bookkeeping)
_OP = re.compile(r"^(aten|dynamicemb|fbgemm|c10d|torchrec)::")


class Loss(nn.Module):
    """The model: one collection; the loss sums its output (the gradient reaches every row)."""

    def __init__(self, collection: nn.Module, pooled: bool) -> None:
        super().__init__()
        self.coll = collection
        self.pooled = pooled

    def forward(self, kjt: Any) -> torch.Tensor:
        out = self.coll(kjt)
        if self.pooled:
            return out.values().sum()
        # EmbeddingCollection: {feature: JaggedTensor}, the rows of all features in one sum
        return torch.cat([jt.values() for jt in out.values()]).sum()


def configs(pooled: bool, tables: int, dim: int, num_ids: int) -> List[Any]:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    if pooled:
        return [
            EmbeddingBagConfig(
                name=f"t{i}",
                embedding_dim=dim,
                num_embeddings=num_ids,
                feature_names=[f"f{i}"],
                pooling=PoolingType.SUM,
            )
            for i in range(tables)
        ]
    return [
        EmbeddingConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=num_ids, feature_names=[f"f{i}"]
        )
        for i in range(tables)
    ]


def collection(pooled: bool, cfgs: List[Any]) -> nn.Module:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    meta = torch.device("meta")
    if pooled:
        return Loss(EmbeddingBagCollection(tables=cfgs, device=meta), True)
    return Loss(EmbeddingCollection(tables=cfgs, device=meta), False)


def fused_params(optimizer: str) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.01}
    return {
        "optimizer": EmbOptimType.ADAM,
        "learning_rate": 1e-3,
        "eps": 1e-8,
        "beta1": 0.9,
        "beta2": 0.999,
    }


def row_bytes(optimizer: str, dim: int) -> int:
    """float32 value row: the embedding and (ADAM) its two moments."""
    return 4 * dim * (3 if optimizer == "adam" else 1)


def dynamic_model(
    args, pooled: bool, optimizer: str, tables: int, device: torch.device
) -> nn.Module:
    """The model with every table dynamic: this project's planner + sharders under DMP."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from dynamicemb_core import DynamicEmbTableOptions
    from dynamicemb_core.planner import (
        DynamicEmbeddingShardingPlanner,
        DynamicEmbParameterConstraints,
    )
    from dynamicemb_core.planner.planner import default_topology
    from dynamicemb_core.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    cfgs = configs(pooled, tables, args.dim, args.num_ids)
    # every row on the device: the budget holds all of a table's rows (capacity: next power of
    # two of num_ids, rounded up to whole buckets by the planner; twice num_ids covers it)
    hbm = 2 * args.num_ids * row_bytes(optimizer, args.dim) if device.type == "cuda" else 0
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(global_hbm_for_values=hbm),
        )
        for c in cfgs
    }
    cls = DynamicEmbeddingBagCollectionSharder if pooled else DynamicEmbeddingCollectionSharder
    sharders = [cls(fused_params=fused_params(optimizer))]
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=cfgs, topology=default_topology(1, device.type), constraints=constraints
    )
    model = collection(pooled, cfgs)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=device,
        plan=plan,
        sharders=sharders,
    )
    if device.type == "cuda":
        _check_all_on_device(dmp)
    return dmp


def _check_all_on_device(model: nn.Module) -> None:
    """Every dynamic table of ``model`` keeps all its rows in device memory (no hybrid part)."""
    from dynamicemb_core.shard import BatchedDynamicEmbeddingKernel

    for m in model.modules():
        if isinstance(m, BatchedDynamicEmbeddingKernel):
            limits = m.emb_module._group.storage._device_limits  # None: every row on the device
            if any(limit is not None for limit in limits):
                raise RuntimeError(
                    f"tables {m.table_names}: device rows {limits}; raise the budget"
                )


def static_model(
    args, pooled: bool, optimizer: str, tables: int, device: torch.device
) -> nn.Module:
    """The same model on TorchRec's row-wise fused tables (FBGEMM TBE)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv, ShardingType

    cfgs = configs(pooled, tables, args.dim, args.num_ids)
    rw = [ShardingType.ROW_WISE.value]
    fused = [EmbeddingComputeKernel.FUSED.value]
    params = fused_params(optimizer)
    if device.type == "cpu":
        # TorchRec's EBC sharder offers no row-wise sharding on CPU; ours adds it and leaves
        # native tables to TorchRec's own sharding code
        from dynamicemb_core.shard import (
            DynamicEmbeddingBagCollectionSharder as Ebc,
        )
        from dynamicemb_core.shard import (
            DynamicEmbeddingCollectionSharder as Ec,
        )
    else:
        Ebc, Ec = EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
    sharders = [(Ebc if pooled else Ec)(fused_params=params)]
    constraints = {
        c.name: ParameterConstraints(sharding_types=rw, compute_kernels=fused) for c in cfgs
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device=device.type), constraints=constraints
    )
    model = collection(pooled, cfgs)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=device,
        plan=plan,
        sharders=sharders,
    )


def power_law_kjts(args, tables: int, device: torch.device) -> List[Any]:
    """``--batches`` KJTs of ``tables`` features, ~``--ids`` ids each, Zipf(alpha) ids
    (bench_training's batches, as a KeyedJaggedTensor)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    out = []
    for s in range(args.batches):
        ids, offsets = power_law_batch(
            tables, args.batch, args.ids, args.num_ids, args.alpha, seed=1234 + s
        )
        out.append(
            KeyedJaggedTensor(
                keys=[f"f{i}" for i in range(tables)],
                values=ids,
                lengths=offsets.diff().to(torch.int32),
            ).to(device)
        )
    return out


def make_step(model: nn.Module, batches: List[Any]) -> Callable[[int], None]:
    opt = model.fused_optimizer

    def step(i: int) -> None:
        loss = model(batches[i % len(batches)])
        loss.backward()
        opt.step()

    return step


def count_ops(step: Callable[[int], None], i: int) -> Tuple[int, collections.Counter]:
    """ATen + custom ops one call of ``step`` runs on the host (torch.profiler, CPU activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(i)
    names = collections.Counter(e.name for e in prof.events() if _OP.match(e.name))
    return sum(names.values()), names


def print_profile(label: str, step: Callable[[int], None], device: torch.device, top: int) -> None:
    """Where one model's step spends its time: torch.profiler over 3 steps (CPU and, on CUDA, the
    kernels), the ``top`` ops by self device time (CUDA) or self CPU time, and the GPU's busy time
    per step against the wall time (a step whose GPU is mostly idle is host-bound)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps = 3
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    averages = prof.key_averages()
    busy = 0.0
    if cuda:  # the kernels' own rows (an op's row repeats its kernels' time)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time_total for e in kernels) / 1e3 / steps
    print(
        f"## profile {label}: wall {wall:.2f} ms a step"
        + (f", GPU busy {busy:.2f} ms" if cuda else "")
    )
    sort = "self_cpu_time_total"
    if cuda:
        sort = (
            "self_device_time_total"
            if hasattr(averages[0], "self_device_time_total")
            else "self_cuda_time_total"
        )
    print(averages.table(sort_by=sort, row_limit=top))
    if cuda:
        print(averages.table(sort_by="cpu_time_total", row_limit=top))


def release(device: torch.device) -> None:
    """Return the dropped models' device memory before the next ones are built. The dynamic
    tables free theirs on ``del``; TorchRec's DMP and sharded modules hold reference cycles, so
    the collector runs here."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_case(
    args, pooled: bool, optimizer: str, tables: int, device: torch.device
) -> Dict[str, Any]:
    """One row: both models on the same batches; 'n/a' for a model that cannot be built here."""
    batches = power_law_kjts(args, tables, device)
    row: Dict[str, Any] = {
        "model": "EBC (SUM)" if pooled else "EC (NONE)",
        "opt": optimizer,
        "tables": tables,
    }
    steps, names, models = [], [], []
    for name, build in (("dynamic", dynamic_model), ("static", static_model)):
        try:
            model = build(args, pooled, optimizer, tables, device)
            step = make_step(model, batches)
            step(0)  # builds TorchRec's lazy input dist, checks the model runs
        except Exception as err:
            row[name] = f"n/a ({type(err).__name__}: {str(err).splitlines()[0][:80]})"
            continue
        models.append(model)
        steps.append(step)
        names.append(name)
    if args.ops:
        for name, step in zip(names, steps):
            step(1)
            row[f"{name}_ops"], row[f"{name}_names"] = count_ops(step, 2)
    if not args.ops_only and steps:
        for name, ms in zip(names, time_pair(steps, args.warmup, args.repeats, device)):
            row[name] = ms
    if args.profile:
        for name, step in zip(names, steps):
            print_profile(
                f"{row['model']} {optimizer} {tables} tables, {name}", step, device, args.profile
            )
    return row


def fmt(row: Dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = row.get(key, "-")
        return f"{v:.2f} ms" if isinstance(v, float) else str(v)

    ratio = "-"
    if isinstance(row.get("dynamic"), float) and isinstance(row.get("static"), float):
        ratio = f"{row['dynamic'] / row['static']:.2f}x"
    ops = lambda k: str(row.get(k, "-"))  # noqa: E731
    return (
        f"| {row['model']} | {row['opt']} | {row['tables']} | {ms('dynamic')} | {ms('static')} | "
        f"{ratio} | {ops('dynamic_ops')} | {ops('static_ops')} |"
    )


def init_process_group(device: torch.device) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tables", default="1,10,26", help="table counts, comma-separated")
    p.add_argument("--models", default="ec,ebc")
    p.add_argument("--optimizers", default="sgd,adam")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=None, help="ids a step (CUDA 1048576, CPU 65536)")
    p.add_argument("--num-ids", type=int, default=None, help="rows a table (CUDA 5e5, CPU 1e5)")
    p.add_argument("--batch", type=int, default=None, help="samples a step (CUDA 4096, CPU 512)")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)"
    )
    p.add_argument(
        "--ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="count each model's ops per step (default: on CPU)",
    )
    p.add_argument("--ops-only", action="store_true", help="count ops, do not time")
    p.add_argument(
        "--top-ops", type=int, default=0, help="print the N ops whose counts differ most"
    )
    p.add_argument(
        "--profile", type=int, default=0, help="print each model's N costliest ops (torch.profiler)"
    )
    add_small_flag(p)
    args = apply_small(p, p.parse_args(argv), SMALL)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.ids = args.ids or (1048576 if cuda else 65536)
    # 500k rows a table on CUDA: at 26 tables with ADAM both models (dynamic and TBE, each
    # embedding + two moments) take ~40 GB together; 1M rows would not fit an 80 GB card
    args.num_ids = args.num_ids or (500_000 if cuda else 100_000)
    args.batch = args.batch or (4096 if cuda else 512)
    args.ops = (not cuda or args.ops_only) if args.ops is None else args.ops
    if args.ops_only:
        args.ops = True
    if args.threads:
        torch.set_num_threads(args.threads)
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
    init_process_group(device)
    import torchrec

    where = (
        torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
    )
    print(
        f"# bench_dmp: {where}, torch {torch.__version__}, torchrec {torchrec.__version__}, "
        f"{'nccl' if cuda else 'gloo'} world 1, {torch.get_num_threads()} threads; "
        f"dim {args.dim}, ~{args.ids} ids a step over batch {args.batch} (power law alpha "
        f"{args.alpha}, {args.num_ids} ids a table), median of {args.repeats} alternating steps"
        + ("; dynamic rows all in HBM (global_hbm_for_values = every row's bytes)" if cuda else "")
    )
    print(
        "| model | optimizer | tables | dynamic | static TorchRec | dynamic / static | ops dynamic | ops static |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    missing = 0
    for model_name in args.models.split(","):
        for opt in args.optimizers.split(","):
            for tables in [int(t) for t in str(args.tables).split(",")]:
                try:
                    row = run_case(args, model_name == "ebc", opt, tables, device)
                except Exception as err:
                    row = {
                        "model": model_name,
                        "opt": opt,
                        "tables": tables,
                        "dynamic": f"FAILED ({type(err).__name__}: {str(err).splitlines()[0][:100]})",
                    }
                release(device)  # this row's models are gone: their memory too
                if not isinstance(row.get("dynamic"), float) and not args.ops_only:
                    missing += 1
                print(fmt(row), flush=True)
                if args.top_ops and "dynamic_names" in row and "static_names" in row:
                    d, s = row["dynamic_names"], row["static_names"]
                    top = sorted(set(d) | set(s), key=lambda n: -abs(d[n] - s[n]))[: args.top_ops]
                    print("  " + ", ".join(f"{n} {d[n]}/{s[n]}" for n in top))
    if missing:
        print(f"# FAILED: {missing} row(s) without a dynamic time (crashed or out of memory)")
    dist.destroy_process_group()
    return 1 if missing else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
