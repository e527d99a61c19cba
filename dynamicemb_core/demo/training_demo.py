"""Train a small DLRM whose tables are dynamic, through the planner and DistributedModelParallel.

    python -m dynamicemb_core demo [--steps 400] [--batch-size 512] [--device auto] [--out DIR]
    torchrun --nproc_per_node 2 -m dynamicemb_core demo      # more processes

The data is a seeded synthetic click stream (:mod:`dynamicemb_core.demo.data`) whose power-law ids
drift, so far more ids arrive than the tables hold: the tables fill, then evict by score (TIMESTAMP,
least recently used first). The demo shows a progress bar; per interval the loss, the throughput and
each table's size, capacity and evictions (summed over ranks); then a summary and a PNG plot of loss
and occupancy. Beside the PNG, a TensorBoard log (``<out>/tensorboard``, written every interval by
:class:`dynamicemb_core.tracking.tensorboard.TableMetricsWriter`: each table's counters, occupancy
and eviction rate, and the loss); open it with ``tensorboard --logdir <out>/tensorboard``. CPU by default (gloo); CUDA (NCCL) when present or asked for with ``--device cuda``.

What is shown is the user's path: TorchRec table configs, ``DynamicEmbParameterConstraints`` marking
the tables dynamic, ``DynamicEmbeddingShardingPlanner``, our sharder, ``DistributedModelParallel``,
and a dense optimizer beside the tables' fused one.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from dynamicemb_core.demo.data import ClickData, ClickDataConfig
from dynamicemb_core.demo.report import (
    History,
    IntervalRecord,
    RunInfo,
    TableStats,
    format_interval,
    format_summary,
    plot,
)

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

__all__ = ["build_model", "main", "parse_args", "tensorboard_dir"]

FEATURES = ("user_id", "item_id", "category_id")
# The tables' score strategy (DynamicEmbTableOptions' default), as the plot's title names it.
POLICY = "TIMESTAMP (least recently used evicted first)"


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dynamicemb_core demo", description=__doc__.split("\n")[0]
    )
    p.add_argument("--steps", type=int, default=400, help="training steps")
    p.add_argument("--batch-size", type=int, default=512, help="samples per step per process")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension")
    p.add_argument(
        "--rows", type=int, default=32768, help="num_embeddings of each table (all ranks)"
    )
    p.add_argument("--id-space", type=int, default=1_000_000, help="power-law ranks per feature")
    p.add_argument("--alpha", type=float, default=1.05, help="power-law exponent")
    p.add_argument("--drift", type=int, default=5, help="ranks the hot ids move per step")
    p.add_argument("--interval", type=int, default=20, help="steps per logging interval")
    p.add_argument(
        "--lr", type=float, default=0.02, help="learning rate (tables: Adam; dense: Adam)"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--out", default="demo_out", help="folder for the PNG plot and the TensorBoard log"
    )
    p.add_argument(
        "--no-tensorboard", action="store_true", help="write no TensorBoard log (<out>/tensorboard)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p.parse_args(argv)


def _init_distributed(device_kind: str) -> torch.device:
    """Join torchrun's process group, or make a one-process group; return this process's device."""
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        # An in-process store: no port to pick (another process could take a "free" one first).
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if device_kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def build_model(args: argparse.Namespace, device: torch.device) -> "DistributedModelParallel":
    """The DLRM, planned with dynamic tables and wrapped in DistributedModelParallel."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dynamicemb_core import DynamicEmbScoreStrategy, DynamicEmbTableOptions
    from dynamicemb_core.planner import (
        DynamicEmbeddingShardingPlanner,
        DynamicEmbParameterConstraints,
    )
    from dynamicemb_core.planner.planner import default_topology
    from dynamicemb_core.shard import DynamicEmbeddingBagCollectionSharder

    configs = [
        EmbeddingBagConfig(
            name=f"t_{f}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f]
        )
        for f in FEATURES
    ]
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=128,
                dist_type="hash_roundrobin",
                score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,  # POLICY says it in the plot
            ),
        )
        for c in configs
    }
    model = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(
            tables=configs, device=torch.device("meta")
        ),
        dense_in_features=8,
        dense_arch_layer_sizes=[32, args.dim],
        over_arch_layer_sizes=[32, 1],
        dense_device=device,
    )
    world = dist.get_world_size()
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=default_topology(world, device.type), constraints=constraints
    )
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": args.lr, "eps": 1e-8}
    )
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=device,
        plan=plan,
        sharders=[sharder],
    )


def _table_stats(model: nn.Module, device: torch.device) -> Dict[str, TableStats]:
    """Per table, size / capacity / evictions summed over ranks."""
    from dynamicemb_core.shard import BatchedDynamicEmbeddingKernel

    names: List[str] = []
    values: List[List[int]] = []
    for m in model.modules():
        if isinstance(m, BatchedDynamicEmbeddingKernel):
            for s in m.emb_module.table_stats():
                names.append(s["name"])
                values.append([s["size"], s["capacity"], s["evictions"]])
    totals = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(totals)
    return {n: TableStats(*map(int, row)) for n, row in zip(names, totals.tolist())}


def _say(line: str, progress: object) -> None:
    """Print a line without breaking the progress bar."""
    if progress is not None:
        progress.write(line, file=sys.stdout)  # type: ignore[attr-defined]
    else:
        print(line, flush=True)


def _train(args: argparse.Namespace, device: torch.device) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args, device)
    dense_params = [p for n, p in model.named_parameters() if p.requires_grad]
    dense_opt = torch.optim.Adam(dense_params, lr=args.lr)
    data = ClickData(
        ClickDataConfig(
            FEATURES, id_space=args.id_space, alpha=args.alpha, drift=args.drift, seed=args.seed
        )
    )
    loss_fn = nn.BCEWithLogitsLoss()
    history = History()
    board = None
    if not args.no_tensorboard:
        from dynamicemb_core.tracking.tensorboard import TableMetricsWriter

        group = dist.GroupMember.WORLD if world > 1 else None
        try:  # on every rank, since the writer's sums are collectives
            importlib.import_module("torch.utils.tensorboard")
        except ImportError as error:  # the package does not require tensorboard
            if rank == 0:
                print(f"no TensorBoard log ({error}; pip install tensorboard)", file=sys.stderr)
        else:
            board = TableMetricsWriter(tensorboard_dir(args.out), every=args.interval, group=group)
    progress = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=args.steps, desc="demo", unit="step", file=sys.stderr)
    start = interval_start = time.perf_counter()
    interval_loss = torch.zeros((), device=device)
    interval_steps = 0
    for step in range(1, args.steps + 1):
        dense, sparse, labels = data.batch(step, args.batch_size, rank, world)
        logits = model(dense.to(device), sparse.to(device)).squeeze(-1)
        loss = loss_fn(logits, labels.to(device))
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        model.fused_optimizer.step()
        interval_loss += loss.detach()
        interval_steps += 1
        if progress is not None:
            progress.update(1)
        if step % args.interval == 0 or step == args.steps:
            dist.all_reduce(interval_loss)
            elapsed = time.perf_counter() - interval_start
            record = IntervalRecord(
                step=step,
                loss=float(interval_loss) / (interval_steps * world),
                samples_per_s=interval_steps * args.batch_size * world / max(elapsed, 1e-9),
                tables=_table_stats(model, device),
            )
            history.add(record)
            if board is not None:  # every rank: the counts are summed over them
                board.write(model, step)
                board.add_scalar("demo/loss", record.loss, step)
                board.add_scalar("demo/samples_per_s", record.samples_per_s, step)
            if rank == 0:
                _say(format_interval(record), progress)
            interval_loss.zero_()
            interval_steps = 0
            interval_start = time.perf_counter()
    seconds = time.perf_counter() - start
    if progress is not None:
        progress.close()
    if board is not None:
        board.close()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "demo.png")
        info = RunInfo(
            tables=list(history.records[0].tables),
            rows=args.rows,
            policy=POLICY,
            steps=args.steps,
            batch_size=args.batch_size,
            world=world,
        )
        plot(history, path, info)
        print(
            format_summary(history, seconds, args.steps * args.batch_size * world, path, world),
            flush=True,
        )
        if board is not None:
            print(f"tensorboard: tensorboard --logdir {tensorboard_dir(args.out)}", flush=True)
    return 0


def tensorboard_dir(out: str) -> str:
    """The demo's TensorBoard log folder, beside its PNG."""
    return os.path.join(out, "tensorboard")


def _quiet_torchrec() -> None:
    """Silence TorchRec's setup chatter so the demo's own lines stand out (the demo is an app).

    Among it: the input validator's "out of range (0, num_embeddings)" warning, which does not
    apply to dynamic tables (any int64 id is valid), and planner/DDP advice for dense models.
    """
    for name in ("torchrec", "root"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the training demo; returns the exit code."""
    args = parse_args(argv)
    _quiet_torchrec()
    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available", file=sys.stderr)
        return 2
    if kind == "cpu":
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        )
    device = _init_distributed(kind)
    try:
        return _train(args, device)
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """Tear the process group down only once nothing refers to it any more.

    DMP's modules (and DDP's reducer inside them) hold the group through reference cycles; left to
    interpreter exit, gloo's threads were destroyed during finalization and intermittently aborted a
    rank ("terminate called without an active exception", SIGABRT) after a successful run. That
    is PyTorch's gloo backend (docs/torchrec.md, "Ending a distributed program"); every program
    that trains with several processes should end the same way.
    """
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
