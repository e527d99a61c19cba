"""Hash-table ops on CPU against a static tensor and a Python dict, at several load factors.

Run:
    PYTHONPATH=. python benchmarks/bench_table_cpu.py                 # 1M keys per op, 2M slots
    PYTHONPATH=. python benchmarks/bench_table_cpu.py --keys 262144 --capacity 524288
    PYTHONPATH=. python benchmarks/bench_table_cpu.py --small   # seconds: a smoke run (nox -s bench)

Each case prefills a table (one logical table, buckets of 128, no growth) to a load factor, then
times one op over ``--keys`` keys, *including* moving the value rows, so every column does the same
work: key -> row, then read (find, find_or_insert) or write (insert, insert_and_evict) the rows.

* ours: ``torch.ops.dynamicemb.<op>`` then ``gather_rows`` / ``scatter_rows``.
* index_select: the rows already in a dense tensor with the slots known (the floor: no hashing).
* dict: a Python ``dict`` key -> row index, then ``index_select`` / ``index_copy_``.

find reads keys that are all present; the inserting ops get half present, half new keys (at 0.9 the
new ones evict). Mutating ops restore the state from a copy before each repeat (not timed). Times
are the median of ``--repeats`` after one warm-up; ``speedup = peer_time / our_time``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
from small import add_small_flag, apply_small

from dynamicemb_core.config import DynamicEmbScoreStrategy
from dynamicemb_core.ops import table_ops
from dynamicemb_core.ops.table_ops import TableState
from dynamicemb_core.table import ScoredHashTable, TableSpec

BUCKET = 128
# --small: every op at 0.5 and 0.9 (where inserts evict), one dim, 4096 keys into 16384 slots.
SMALL = {
    "keys": 1 << 12,
    "capacity": 1 << 14,
    "repeats": 1,
    "dims": [16],
    "load_factors": [0.5, 0.9],
}


def median_time(
    fn: Callable[[], object], repeats: int, setup: Callable[[], None] = lambda: None
) -> float:
    setup()
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(
    capacity: int, load_factor: float, dim: int, seed: int
) -> Tuple[ScoredHashTable, torch.Tensor]:
    """A table filled to ``load_factor`` with random distinct keys; returns it and those keys."""
    spec = TableSpec(
        "bench",
        row_width=dim,
        init_capacity=capacity,
        max_capacity=capacity,
        bucket_capacity=BUCKET,
        max_load_factor=1.0,
        score_strategy=DynamicEmbScoreStrategy.LFU,
    )
    table = ScoredHashTable([spec])
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randint(-(2**62), 2**62, (int(capacity * load_factor),), generator=gen).unique()
    keys = keys[torch.randperm(keys.numel(), generator=gen)]
    for chunk in keys.split(1 << 18):
        table.insert(chunk, rows=torch.randn(chunk.numel(), dim, generator=gen))
    return table, keys[table.find(keys).found]


def run_case(op: str, load_factor: float, dim: int, args: argparse.Namespace) -> Dict[str, float]:
    table, present = build(args.capacity, load_factor, dim, seed=1)
    gen = torch.Generator().manual_seed(2)
    n = args.keys
    hits = present[torch.randint(0, present.numel(), (n,), generator=gen)]
    if op == "find":
        keys = hits
    else:
        fresh = torch.randint(2**62, 2**63 - 1, (n - n // 2,), generator=gen)
        keys = torch.cat([hits[: n // 2], fresh])[torch.randperm(n, generator=gen)]
    tids = torch.zeros(n, dtype=torch.int64)
    rows = torch.randn(n, dim, generator=gen)
    fns = torch.zeros(1, dtype=torch.int64)
    cur = torch.zeros(1, dtype=torch.int64)
    base_state = [t.clone() for t in table.state]
    values = table.values(0)
    base_values = values.clone()
    state = TableState(*[t.clone() for t in base_state])

    def restore() -> None:
        for dst, src in zip(state, base_state):
            dst.copy_(src)
        values.copy_(base_values)

    def ours() -> None:
        if op == "find":
            slots = table_ops.find(keys, tids, state, cur, False)[0]
            table_ops.gather_rows(values, slots)
        elif op == "insert":
            slots = table_ops.insert(keys, tids, state, fns, cur)
            table_ops.scatter_rows(values, slots, rows)
        elif op == "find_or_insert":
            slots = table_ops.find_or_insert(keys, tids, state, fns, cur)[0]
            table_ops.gather_rows(values, slots)
        else:
            slots = table_ops.insert_and_evict(keys, tids, state, fns, cur)[0]
            table_ops.scatter_rows(values, slots, rows)

    reads = op in ("find", "find_or_insert")
    static_slots = torch.randint(0, args.capacity, (n,), generator=gen)

    def dense() -> None:
        if reads:
            values.index_select(0, static_slots)
        else:
            values.index_copy_(0, static_slots, rows)

    lookup = dict(zip(present.tolist(), range(present.numel())))

    def py_dict() -> None:
        index = []
        for k in keys.tolist():
            s = lookup.get(k)
            if s is None:
                s = lookup[k] = len(lookup) % args.capacity
            index.append(s)
        idx = torch.tensor(index)
        if reads:
            values.index_select(0, idx)
        else:
            values.index_copy_(0, idx, rows)

    mutating = op != "find"
    t_ours = median_time(ours, args.repeats, restore if mutating else lambda: None)
    t_dense = median_time(dense, args.repeats)
    t_dict = median_time(
        py_dict,
        max(1, args.repeats // 2),
        (lambda: lookup.clear() or lookup.update(zip(present.tolist(), range(present.numel()))))
        if mutating
        else lambda: None,
    )
    return {"ours": t_ours, "dense": t_dense, "dict": t_dict}


def header(argv: List[str]) -> str:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"
    versions = [f"torch {torch.__version__}"]
    for name in ("fbgemm_gpu", "torchrec"):
        try:
            module = __import__(name)
            versions.append(f"{name} {getattr(module, '__version__', '?')}")
        except Exception:
            versions.append(f"{name} n/a")
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return "\n".join(
        [
            f"- machine: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads; "
            f"GPU: none; load average at start {os.getloadavg()[0]:.1f} (shared machine: above "
            f"{os.cpu_count()} the figures understate every column)",
            f"- versions: {', '.join(versions)}; Python {platform.python_version()}",
            f"- commit: {commit}",
            f"- command: `PYTHONPATH=. python benchmarks/bench_table_cpu.py {' '.join(argv)}`",
        ]
    )


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1 << 20, help="keys per op (default 1M)")
    parser.add_argument("--capacity", type=int, default=1 << 21, help="table slots (default 2M)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--load-factors", type=float, nargs="+", default=[0.25, 0.5, 0.9])
    parser.add_argument(
        "--ops", nargs="+", default=["find", "insert", "find_or_insert", "insert_and_evict"]
    )
    add_small_flag(parser)
    args = apply_small(parser, parser.parse_args(argv), SMALL)
    print(header(argv))
    print(
        f"- {args.keys:,} keys per op; table of {args.capacity:,} slots in buckets of {BUCKET}; "
        f"median of {args.repeats}; M keys/s (higher is better); speedup = peer time / our time\n"
    )
    print(
        "| op | load factor | dim | ours (M keys/s) | index_select (M keys/s) | speedup vs index_select "
        "| dict (M keys/s) | speedup vs dict |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for dim in args.dims:
        for lf in args.load_factors:
            for op in args.ops:
                t = run_case(op, lf, dim, args)
                rate = {k: args.keys / v / 1e6 for k, v in t.items()}
                print(
                    f"| {op} | {lf} | {dim} | {rate['ours']:.1f} | {rate['dense']:.1f} | "
                    f"{t['dense'] / t['ours']:.2f} | {rate['dict']:.2f} | {t['dict'] / t['ours']:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
