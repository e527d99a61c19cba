"""Training step (forward, backward, fused update) of dynamic tables vs FBGEMM's static fused tables.

Shape (the issue's): 10 tables of dim 128, one pooled (SUM) feature each, ~1M ids a batch drawn from
a power law (alpha = 1.05), EXACT_SGD and ADAM. Peers, timed in the same process on the same
batches: FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (what TorchRec's fused
EmbeddingBagCollection runs) for SGD, and for ADAM too on CUDA; FBGEMM's CPU build refuses ADAM, so
on CPU the ADAM peer is ``torch.optim.SparseAdam`` over ``nn.EmbeddingBag(sparse=True)``.

On this 2-core CPU the default batch is smaller (``--ids 131072``, 100k ids per table); the issue's
shape is ``--ids 1048576 --num-ids 1000000`` (use it on the GPU machine).

Run:
    PYTHONPATH=. python benchmarks/bench_training.py --threads 1   # CPU defaults, one thread
    PYTHONPATH=. python benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000
    PYTHONPATH=. python benchmarks/bench_training.py --small    # seconds: a smoke run (nox -s bench)
    PYTHONPATH=. python benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 \
        --batch 4096 --optimizers sgd --warmup 3 --profile   # where a step's time goes
    PYTHONPATH=. python benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 \
        --batch 4096 --repeats 12 --split   # forward / backward apart, and where a step syncs
    PYTHONPATH=. python benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 \
        --batch 4096 --pooling none --table-counts 1,10,26   # upstream DynamicEmb's shape
    PYTHONPATH=. python benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 \
        --batch 4096 --pooling none --table-counts 10 --setups cache0.8,cache1.0,hybrid,host

Storage setups (``--setups``, upstream DynamicEmb's benchmark shape; on CPU every part is host
memory and the peer FBGEMM's CPU TBE: a ``cacheF`` setup is the cache in front of a host table,
``hybrid`` times the split rows' own work against the same TBE, ``host`` is a plain CPU table):
    hbm        every value row in device memory; peer: TBE with ``EmbeddingLocation.DEVICE``.
    cacheF     10 % of the rows' bytes in device memory as a cache in front of host memory
               (``caching=True``); the batches draw their ids from ``F`` x the cache's rows (cache
               footprint F: 0.8 fits the cache, 1.0 fills it); peer: TBE's UVM cache
               (``EmbeddingLocation.MANAGED_CACHING``, ``cache_load_factor`` 0.1).
    hybrid     10 % of the rows in device memory, the rest in host memory (split by slot); peer:
               TBE in UVM (``EmbeddingLocation.MANAGED``).
    host       every value row in host memory (a zero device budget); peer: TBE in UVM.
Our tables hold ``next_pow2(num_ids)`` rows; TBE's ``num_ids``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from typing import Callable, List, Tuple

import numpy as np
import torch
from small import add_small_flag, apply_small
from torch import nn

# --small: the same steps (ours and both peers, SGD and ADAM) on 2 tiny tables, 2 timed steps.
SMALL = {
    "tables": 2,
    "dim": 16,
    "ids": 2048,
    "num_ids": 4096,
    "batch": 64,
    "batches": 2,
    "warmup": 1,
    "repeats": 2,
}


def power_law_batch(
    tables: int, batch: int, ids: int, num_ids: int, alpha: float, seed: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(indices, offsets) feature-major, ~``ids`` ids, Zipf(alpha) ranks folded into [0, num_ids)."""
    rng = np.random.default_rng(seed)
    per_bag = max(1, ids // (tables * batch))
    lengths = rng.integers(1, 2 * per_bag, size=tables * batch)  # mean ~ per_bag
    n = int(lengths.sum())
    ranks = rng.zipf(alpha, size=n) - 1
    # scatter ranks over the id space so hot ids are not all adjacent (as hashed ids are not)
    idx = (ranks * 2654435761) % num_ids
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(offsets.astype(np.int64))


def time_pair(
    steps: List[Callable[[int], None]], warmup: int, repeats: int, device: torch.device
) -> List[float]:
    """Median milliseconds of each ``step(i)``, alternating them per repeat.

    Alternating keeps ours and the peer under the same background load (this machine is shared).
    """
    for step in steps:
        for i in range(warmup):
            step(i)
    times: List[List[float]] = [[] for _ in steps]
    for i in range(repeats):
        for k, step in enumerate(steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(warmup + i)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def profile_steps(
    step: Callable[[int], None], warmup: int, device: torch.device, trace: str = ""
) -> str:
    """Where two steps' time goes: torch.profiler's tables by self CPU time and by CUDA time, and
    the launch counts (CUDA: kernels, memsets, copies the two steps ran). ``trace``: also write
    the profile's chrome trace there (the timeline shows where the GPU waits on the host)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(warmup):
        step(i)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for i in range(2):
            step(warmup + i)
        if device.type == "cuda":
            torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    averages = prof.key_averages()
    tables = [averages.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60)]
    if device.type == "cuda":
        calls = {"cudaLaunchKernel": 0, "cudaMemsetAsync": 0, "cudaMemcpyAsync": 0}
        for e in averages:
            for name in calls:
                if e.key.startswith(name):
                    calls[name] += e.count
        tables.append(
            "runtime calls in 2 steps: " + ", ".join(f"{k} {v}" for k, v in calls.items())
        )
    if device.type == "cuda":
        tables.append(
            averages.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60)
        )
    return "\n".join(tables)


SETUPS = ("hbm", "cache0.8", "cache1.0", "hybrid", "host")


def setup_ids(args, setup: str) -> int:
    """The id space the batches draw from: a cache setup's footprint times the cache's rows."""
    if setup.startswith("cache"):
        return max(1, int(float(setup[len("cache") :]) * 0.1 * args.num_ids))
    return args.num_ids


def ours_module(args, optimizer, device, setup: str = "hbm") -> torch.nn.Module:
    from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
    from dynamicemb_core.optim import optimizer_kind, row_width

    pooling = DynamicEmbPoolingMode.NONE if args.pooling == "none" else DynamicEmbPoolingMode.SUM
    cap = 1 << int(np.ceil(np.log2(args.num_ids)))  # TBE's rows, rounded up to a power of two
    full = cap * row_width(optimizer_kind(optimizer), args.dim, True) * 4
    # hbm: a budget holding every row (0 would put them all on the host); the others: 10 %
    hbm = {"hbm": full, "host": 0}.get(setup, full // 10)
    opts = [
        DynamicEmbTableOptions(
            dim=args.dim,
            max_capacity=cap,
            init_capacity=cap,
            local_hbm_for_values=hbm,
            caching=setup.startswith("cache"),
        )
        for _ in range(args.tables)
    ]
    module = BatchedDynamicEmbeddingTables(
        opts,
        [f"t{i}" for i in range(args.tables)],
        list(range(args.tables)),
        pooling,
        optimizer,
        device,
        learning_rate=0.01,
    )
    return module


def ours_step(args, optimizer, batches, device, setup: str = "hbm") -> Callable[[int], None]:
    module = ours_module(args, optimizer, device, setup)

    def step(i: int) -> None:
        idx, off = batches[i % len(batches)]
        module(idx, off).sum().backward()

    return step


def split_steps(module, batches, warmup: int, repeats: int, device: torch.device) -> str:
    """Forward and backward wall times (medians), and on CUDA where one step synchronises.

    The sync sites are the host synchronisations torch's sync debug mode reports, grouped by the
    line of dynamicemb_core that caused them; readbacks inside the C++ ops are not among them.
    """
    import collections
    import traceback
    import warnings

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for i in range(warmup):
        idx, off = batches[i % len(batches)]
        module(idx, off).sum().backward()
    fwd, bwd = [], []
    for i in range(repeats):
        idx, off = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        out = module(idx, off)
        sync()
        t1 = time.perf_counter()
        out.sum().backward()
        sync()
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    f, b = statistics.median(fwd) * 1e3, statistics.median(bwd) * 1e3
    lines = [f"forward {f:.2f} ms, backward {b:.2f} ms, step {f + b:.2f} ms (medians of {repeats})"]
    if device.type != "cuda":
        return "\n".join(lines)
    sites: collections.Counter = collections.Counter()

    def record(*_: object, **__: object) -> None:
        ours = [fr for fr in traceback.extract_stack()[:-2] if "dynamicemb_core" in fr.filename]
        where = ours[-1] if ours else None
        sites[
            f"{where.filename.split('dynamicemb_core/')[-1]}:{where.lineno}" if where else "?"
        ] += 1

    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        idx, off = batches[0]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            module(idx, off).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = shown
    lines.append(f"host syncs torch saw in one step: {sum(sites.values())}")
    lines += [f"  {n:4d}  {site}" for site, n in sites.most_common(12)]
    return "\n".join(lines)


def tbe_step(args, optimizer, batches, device, setup: str = "hbm") -> Callable[[int], None]:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    on_cuda = device.type == "cuda"
    loc = EmbeddingLocation.HOST
    if on_cuda:
        loc = {
            "hbm": EmbeddingLocation.DEVICE,
            "hybrid": EmbeddingLocation.MANAGED,
            "host": EmbeddingLocation.MANAGED,
        }.get(setup, EmbeddingLocation.MANAGED_CACHING)
    cdev = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(args.num_ids, args.dim, loc, cdev) for _ in range(args.tables)],
        optimizer=optimizer,
        learning_rate=0.01,
        pooling_mode=PoolingMode.NONE if args.pooling == "none" else PoolingMode.SUM,
        cache_load_factor=0.1,  # read only by MANAGED_CACHING tables
        **({"device": device} if on_cuda else {}),
    )

    def step(i: int) -> None:
        idx, off = batches[i % len(batches)]
        tbe(idx, off).sum().backward()

    return step


def sparse_adam_step(args, batches, device) -> Callable[[int], None]:
    bags = nn.ModuleList(
        nn.EmbeddingBag(args.num_ids, args.dim, mode="sum", sparse=True) for _ in range(args.tables)
    ).to(device)
    opt = torch.optim.SparseAdam(bags.parameters(), lr=0.01)
    B = args.batch

    def step(i: int) -> None:
        idx, off = batches[i % len(batches)]
        outs = []
        for t, bag in enumerate(bags):
            lo, hi = off[t * B], off[(t + 1) * B]
            outs.append(bag(idx[lo:hi], off[t * B : (t + 1) * B] - lo))
        torch.cat(outs, 1).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def header(args, device: torch.device) -> str:
    import fbgemm_gpu
    import torchrec

    commit = os.environ.get("DEMB_COMMIT", "")  # set it where the tree is a copy without .git
    if not commit:
        try:
            commit = subprocess.check_output(
                ["git", "rev-parse", "--short", "HEAD"], text=True
            ).strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    return (
        f"Machine: {platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads; "
        f"GPU: {gpu}; torch {torch.__version__}, fbgemm_gpu {getattr(fbgemm_gpu, '__version__', '?')}, "
        f"torchrec {getattr(torchrec, '__version__', '?')}; commit {commit}\n"
        f"Command: `python benchmarks/bench_training.py --device {device.type} --ids {args.ids} "
        f"--num-ids {args.num_ids} --table-counts {args.table_counts or args.tables} "
        f"--setups {args.setups} --dim {args.dim} --batch {args.batch} --threads {args.threads} "
        f"--pooling {args.pooling} --warmup {args.warmup} --repeats {args.repeats} "
        f"--batches {args.batches}{' --small' if args.small else ''}`\n"
        f"Shape: tables x dim {args.dim}, {args.pooling.upper()} pooling, "
        f"~{args.ids} ids a batch "
        f"(power law alpha {args.alpha}, {args.num_ids} ids per table), median of {args.repeats} "
        f"steps (ours and the peer alternating) after {args.warmup} warm-up steps each (the "
        f"warm-up inserts the keys).\n"
    )


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=131072, help="ids per batch (issue: 1048576)")
    p.add_argument("--num-ids", type=int, default=100_000, help="id space per table")
    p.add_argument("--batch", type=int, default=1024, help="samples per feature")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--optimizers", default="sgd,adam")
    p.add_argument("--pooling", choices=["sum", "none"], default="sum")
    p.add_argument(
        "--table-counts",
        default="",
        help="comma-separated table counts to run one after another (upstream's 1,10,26); "
        "default: --tables",
    )
    p.add_argument(
        "--setups",
        default="hbm",
        help="comma-separated storage setups: " + ", ".join(SETUPS) + " (see the module docs)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--no-peer", action="store_true", help="time ours only (no FBGEMM build at hand)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead of timing: torch.profiler tables of two of our steps (CPU and CUDA time)",
    )
    p.add_argument(
        "--trace",
        default="",
        help="with --profile: write each profiled step pair's chrome trace to this path prefix",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="instead of the peer comparison: our forward and backward times apart, and (CUDA) "
        "where a step synchronises with the host",
    )
    add_small_flag(p)
    args = apply_small(p, p.parse_args(argv), SMALL)
    if args.threads:
        torch.set_num_threads(args.threads)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    device = torch.device(args.device)
    counts = [int(c) for c in args.table_counts.split(",") if c] or [args.tables]
    setups = [x for x in args.setups.split(",") if x]
    for setup in setups:
        if setup not in SETUPS:
            p.error(f"--setups: unknown setup {setup!r}; known: {', '.join(SETUPS)}")
    if not (args.profile or args.split):
        print(header(args, device))
        print(TABLE_HEAD, flush=True)
    rows = []
    for setup in setups:
        for count in counts:
            args.tables = count
            rows += run_shape(args, device, EmbOptimType, setup)
    if rows:
        print("\nAll rows:\n" + TABLE_HEAD)
        print("\n".join(row_line(r) for r in rows))


def run_shape(args, device: torch.device, EmbOptimType, setup: str) -> List[tuple]:
    """Time ours (and the peer) at ``args.tables`` tables in one storage setup; returns the rows
    (printed as they come, so a run cut short keeps what it measured)."""
    ids = setup_ids(args, setup)
    batches = [
        tuple(
            t.to(device)
            for t in power_law_batch(args.tables, args.batch, args.ids, ids, args.alpha, s)
        )
        for s in range(args.batches)
    ]
    rows: List[tuple] = []
    for name in args.optimizers.split(","):
        opt = EmbOptimType.EXACT_SGD if name == "sgd" else EmbOptimType.ADAM
        title = f"{setup}, {args.tables} tables, {name.upper()}, {args.pooling.upper()}"
        if args.split:
            module = ours_module(args, opt, device, setup)
            report = split_steps(module, batches, args.warmup, args.repeats, device)
            print(f"== {title}\n{report}", flush=True)
            del module
            continue
        ours = ours_step(args, opt, batches, device, setup)
        if args.profile:
            where = f"{args.trace}_ours_{setup}_{args.tables}_{name}.json" if args.trace else ""
            print(
                f"== ours: {title}\n{profile_steps(ours, args.warmup, device, where)}", flush=True
            )
            del ours
            if not args.no_peer and device.type == "cuda":
                peer = tbe_step(args, opt, batches, device, setup)
                where = where.replace("_ours_", "_tbe_")
                print(
                    f"== TBE: {title}\n{profile_steps(peer, args.warmup, device, where)}",
                    flush=True,
                )
                del peer
            continue
        if args.no_peer:
            (t_ours,) = time_pair([ours], args.warmup, args.repeats, device)
            rows.append((setup, args.tables, name.upper(), t_ours, "not run", float("nan")))
            del ours
        else:
            if name == "adam" and device.type == "cpu":
                peer_name = "torch SparseAdam + EmbeddingBag(sparse)"
                peer = sparse_adam_step(args, batches, device)
            else:
                where = (
                    TBE_PLACEMENT.get(setup, "(UVM cache)") if device.type == "cuda" else "(CPU)"
                )
                peer_name = "FBGEMM TBE " + where
                peer = tbe_step(args, opt, batches, device, setup)
            t_ours, t_peer = time_pair([ours, peer], args.warmup, args.repeats, device)
            rows.append((setup, args.tables, name.upper(), t_ours, peer_name, t_peer))
            del ours, peer
        print(row_line(rows[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


TBE_PLACEMENT = {"hbm": "(HBM)", "hybrid": "(UVM)", "host": "(UVM)"}
TABLE_HEAD = (
    "| setup | tables | optimizer | ours (ms) | peer | peer (ms) | ours / peer | peer / ours |\n"
    "|---|---:|---|---:|---|---:|---:|---:|"
)


def row_line(row: tuple) -> str:
    setup, tables, opt, ours, peer_name, peer = row
    return (
        f"| {setup} | {tables} | {opt} | {ours:.2f} | {peer_name} | {peer:.2f} | "
        f"{ours / peer:.2f} | {peer / ours:.2f} |"
    )


if __name__ == "__main__":
    main()
