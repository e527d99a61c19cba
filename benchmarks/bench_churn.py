"""Training step on full tables whose batches bring new ids: insert and evict every step.

The steady state of a real recommender: every table is at capacity, and a share of each batch's ids
was never seen, so every step inserts them and evicts as many old keys. Three modules with the same
tables, each filled to capacity first (every slot taken), step in turn on their own batches (the
same shape): **no churn** (every id already stored: ids drawn by a power law over the stored keys),
**5 %** and **20 %** of each batch's ids new (fresh keys, never seen before, in place of that share of
the stored-key draws). Each line prints the median step time (forward, backward with the fused
update), the ratio to the no-churn step of the same run (goal <= 1.2x) and what the tables counted
during the timed steps (keys placed and evicted per step, from ``module.metrics()``).

``BatchedDynamicEmbeddingTables`` directly (the step DMP's lookup runs), pooling SUM, EXACT_SGD (or
``--optimizer adam``), scores TIMESTAMP (the default LRU). CPU and CUDA; on CUDA every row is in
device memory (the budget holds every row).

Run:
    PYTHONPATH=. python benchmarks/bench_churn.py                  # CPU defaults
    PYTHONPATH=. python benchmarks/bench_churn.py --small          # a smoke run in seconds
    PYTHONPATH=. python benchmarks/bench_churn.py --device cuda    # 10 tables x 1M rows, ~1M ids a step
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from small import add_small_flag, apply_small

SMALL = {
    "tables": 2,
    "dim": 16,
    "capacity": 4096,
    "ids": 4096,
    "batch": 64,
    "warmup": 1,
    "repeats": 2,
}


def build(args, device: torch.device):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core import DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    state = 2 if args.optimizer == "adam" else 0
    budget = args.capacity * args.dim * 4 * (1 + state) if device.type == "cuda" else 0
    opts = [
        DynamicEmbTableOptions(
            dim=args.dim,
            max_capacity=args.capacity,
            init_capacity=args.capacity,
            bucket_capacity=128,
            local_hbm_for_values=budget,
        )
        for _ in range(args.tables)
    ]
    opt = EmbOptimType.ADAM if args.optimizer == "adam" else EmbOptimType.EXACT_SGD
    return BatchedDynamicEmbeddingTables(
        opts,
        [f"t{i}" for i in range(args.tables)],
        list(range(args.tables)),
        DynamicEmbPoolingMode.SUM,
        opt,
        device,
        learning_rate=0.01,
    )


def fill(module, args, device: torch.device) -> List[np.ndarray]:
    """Insert keys until every table is at capacity; return each table's stored keys."""
    T, C = args.tables, args.capacity
    chunk = min(C, 1 << 18)
    # keys 0 .. 2C of every table, in chunks (one bag a chunk): more keys than slots, so every
    # bucket ends full; the last ones written are the ones kept (LRU)
    for start in range(0, 2 * C, chunk):
        keys = torch.arange(start, start + chunk, dtype=torch.int64)
        indices = keys.repeat(T).to(device)
        offsets = torch.arange(T + 1, dtype=torch.int64, device=device) * chunk
        module(indices, offsets).sum().backward()
    stored = []
    candidates = torch.arange(2 * C, dtype=torch.int64, device=device)
    for t in range(T):
        found = module.tables[t].find(0, candidates)[0]
        stored.append(candidates[found].cpu().numpy())
    return stored


def batches(
    args, stored: List[np.ndarray], new_share: float, steps: int, seed: int
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches: per table a power law over its stored keys, ``new_share`` of the ids
    replaced by keys never seen (a counter far past the filled range, distinct per step)."""
    rng = np.random.default_rng(seed)
    T, B = args.tables, args.batch
    per_bag = max(1, args.ids // (T * B))
    fresh = 1 << 40
    out = []
    # which stored keys are hot: a random order of each table's keys (fixed over the steps)
    hot = [stored[t][rng.permutation(len(stored[t]))] for t in range(T)]
    for _ in range(steps):
        lengths = np.full(T * B, per_bag, dtype=np.int64)
        parts = []
        for t in range(T):
            n = B * per_bag
            ranks = (rng.zipf(args.alpha, size=n) - 1) % len(hot[t])
            ids = hot[t][ranks]
            k = int(round(new_share * n))
            if k:
                where = rng.choice(n, size=k, replace=False)
                ids[where] = np.arange(fresh, fresh + k)
                fresh += k
            parts.append(ids)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        out.append((torch.from_numpy(np.concatenate(parts)), torch.from_numpy(offsets)))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tables", type=int, default=None, help="tables (CUDA 10, CPU 4)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--capacity", type=int, default=None, help="rows a table (CUDA 2^20, CPU 2^16)")
    p.add_argument("--ids", type=int, default=None, help="ids a step (CUDA 1048576, CPU 65536)")
    p.add_argument("--batch", type=int, default=None, help="samples a step (CUDA 4096, CPU 512)")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--shares", default="0.05,0.2", help="shares of new ids, besides 0")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=0)
    add_small_flag(p)
    args = apply_small(p, p.parse_args(argv), SMALL)
    cuda = args.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    args.tables = args.tables or (10 if cuda else 4)
    args.capacity = args.capacity or (1 << 20 if cuda else 1 << 16)
    args.ids = args.ids or (1048576 if cuda else 65536)
    args.batch = args.batch or (4096 if cuda else 512)
    if args.threads:
        torch.set_num_threads(args.threads)
    shares = [0.0] + [float(s) for s in args.shares.split(",")]
    where = (
        torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
    )
    print(
        f"# bench_churn: {where}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.tables} tables x {args.capacity} rows (full) x dim {args.dim}, "
        f"{args.optimizer.upper()}, ~{args.ids} ids a step (power law alpha {args.alpha} over the "
        f"stored keys), median of {args.repeats} steps, the three modules in turn"
        + ("; rows all in HBM" if cuda else "")
    )
    modules, steps_of = [], []
    steps = args.warmup + args.repeats
    for i, share in enumerate(shares):
        torch.manual_seed(0)
        module = build(args, device)
        stored = fill(module, args, device)
        size = sum(s["size"] for s in module.table_stats())
        cap = sum(s["capacity"] for s in module.table_stats())
        if i == 0:
            print(f"# filled: {size} keys in {cap} slots ({size / cap:.3f})")
        data = [(a.to(device), b.to(device)) for a, b in batches(args, stored, share, steps, 7 + i)]
        modules.append(module)
        steps_of.append(data)
    times: Dict[int, List[float]] = {i: [] for i in range(len(shares))}
    counted: Dict[int, Dict[str, int]] = {}
    for s in range(steps):
        if s == args.warmup:
            for m in modules:
                m.reset_metrics()
        for i, module in enumerate(modules):
            indices, offsets = steps_of[i][s]
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            module(indices, offsets).sum().backward()
            if cuda:
                torch.cuda.synchronize()
            if s >= args.warmup:
                times[i].append((time.perf_counter() - t0) * 1e3)
    for i, module in enumerate(modules):
        total: Dict[str, int] = {}
        for per in module.metrics().values():
            for k, v in per.items():
                total[k] = total.get(k, 0) + v
        counted[i] = total
    base = statistics.median(times[0])
    print(
        "| new ids | step (ms) | vs no churn | placed / step | evicted / step | unplaced / step |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for i, share in enumerate(shares):
        ms = statistics.median(times[i])
        c = counted[i]
        ratio = ms / base
        worst = max(worst, ratio)
        print(
            f"| {share:.0%} | {ms:.2f} | {ratio:.2f}x | {c.get('placed', 0) / args.repeats:.0f} | "
            f"{c.get('evicted', 0) / args.repeats:.0f} | {c.get('unplaced', 0) / args.repeats:.0f} |"
        )
    print(f"# worst churn step / no-churn step: {worst:.2f}x (goal <= 1.2x)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
