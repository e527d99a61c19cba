"""Rows per second of incremental_dump and replay_increment for 1M changed rows (plus full dump/load).

    python benchmarks/bench_checkpoint.py [--rows 1000000] [--dim 32] [--device cpu|cuda] [--repeats 3]
    python benchmarks/bench_checkpoint.py --small     # seconds: a smoke run (nox -s bench)

A table of ``2 * rows`` slots is filled with ``rows`` keys (every row "changed": the threshold is older than
every score), then, median of ``--repeats`` after one warm-up:

- ``incremental_dump``: export by threshold, read the rows, split embedding / optimizer state, ages;
- ``replay_increment (ALL)``: plan (layout, shapes, home-bucket check) and write every key at its slot with
  its optimizer state and scores, into an empty table of the same layout;
- ``DynamicEmbDump`` / ``DynamicEmbLoad``: the same rows through the checksummed file format.

The peer column is a floor rather than a library: NVIDIA DynamicEmb (the original of these APIs) needs CUDA
and is not installable on the CPU machine, so the reference is the cost of the raw tensor work any
implementation must do, ``index_select`` of the rows plus ``index_copy_`` into a second buffer, on the same
rows. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List

import torch

sys.path.insert(0, ".")

from small import add_small_flag, apply_small

# --small: every case on 4096 rows of dim 8, one timed repeat after the warm-up.
SMALL = {"rows": 4096, "dim": 8, "repeats": 1}


def _model(rows: int, dim: int, device: str, training: bool = True) -> torch.nn.Module:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.config import (
        DynamicEmbPoolingMode,
        DynamicEmbScoreStrategy,
        DynamicEmbTableOptions,
    )
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
    from dynamicemb_core.optim import optimizer_kind, row_width

    capacity = 2 * rows
    opts = DynamicEmbTableOptions(
        dim=dim,
        max_capacity=capacity,
        init_capacity=capacity,
        bucket_capacity=128,
        training=training,
        score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
        # every row in device memory (a zero budget would keep the rows on the host)
        local_hbm_for_values=capacity
        * row_width(optimizer_kind(EmbOptimType.EXACT_ROWWISE_ADAGRAD), dim, training)
        * 4,
    )
    module = BatchedDynamicEmbeddingTables(
        [opts],
        ["t0"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        device,
        learning_rate=0.1,
    )
    holder = torch.nn.Module()
    holder.ebc = module
    return holder


def _fill(model: torch.nn.Module, rows: int, dim: int) -> None:
    tier = model.ebc.tables[0]
    gen = torch.Generator().manual_seed(0)
    keys = torch.randperm(8 * rows, generator=gen)[:rows].to(torch.int64).to(tier.device)
    width = tier.tables[0].row_width
    data = torch.randn(rows, width, generator=gen).to(tier.device)
    now = time.monotonic_ns()
    scores = torch.full((rows, 1), now, dtype=torch.int64, device=tier.device)
    for lo in range(0, rows, 1 << 18):
        tier.insert(
            0, keys[lo : lo + (1 << 18)], data[lo : lo + (1 << 18)], scores[lo : lo + (1 << 18)]
        )


def _median(fn: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times: List[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    add_small_flag(parser)
    args = apply_small(parser, parser.parse_args(argv), SMALL)

    from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb_core.incremental_dump import ReplayContent, incremental_dump, replay_increment

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    src = _model(args.rows, args.dim, args.device)
    _fill(src, args.rows, args.dim)
    oldest = -(2**63)
    results = {}
    holder = {}

    def dump() -> None:
        holder["delta"] = incremental_dump(src, oldest, show_progress=False)

    results["incremental_dump"] = _median(dump, args.repeats, sync)
    assert holder["delta"]["model.ebc"].keys[0].numel() == args.rows

    def replay() -> None:
        dst = _model(args.rows, args.dim, args.device)
        sync()
        start = time.perf_counter()
        replay_increment(dst, holder["delta"], ReplayContent.ALL, show_progress=False)
        sync()
        holder["replay_time"] = time.perf_counter() - start

    replay_times = []
    replay()
    for _ in range(args.repeats):
        replay()
        replay_times.append(holder["replay_time"])
    results["replay_increment (ALL)"] = statistics.median(replay_times)

    with tempfile.TemporaryDirectory() as tmp:
        results["DynamicEmbDump (optim)"] = _median(
            lambda: DynamicEmbDump(tmp, src, optim=True, allow_overwrite=True, show_progress=False),
            args.repeats,
            sync,
        )
        load_times = []
        for _ in range(args.repeats):
            dst = _model(args.rows, args.dim, args.device)
            start = time.perf_counter()
            DynamicEmbLoad(tmp, dst, optim=True, show_progress=False)
            sync()
            load_times.append(time.perf_counter() - start)
        results["DynamicEmbLoad (optim)"] = statistics.median(load_times)

    # the floor: gather the rows and scatter them into another buffer
    values = src.ebc.tables[0].table.values(0)
    slots = holder["delta"]["model.ebc"].meta[0]["slot_index"].to(values.device)
    other = torch.empty_like(values)
    floor = _median(
        lambda: other.index_copy_(0, slots, values.index_select(0, slots)), args.repeats, sync
    )

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    commit = commit or "(no git checkout here)"
    import fbgemm_gpu
    import torchrec

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "none"
    print(
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; GPU: {gpu}. "
        f"torch {torch.__version__}, fbgemm-gpu {getattr(fbgemm_gpu, '__version__', '?')}, torchrec "
        f"{getattr(torchrec, '__version__', '?')}. Commit {commit}. Command: `python benchmarks/bench_checkpoint.py "
        f"--rows {args.rows} --dim {args.dim} --device {args.device}{' --small' if args.small else ''}`.\n"
    )
    print(
        f"{args.rows} changed rows of dim {args.dim} (rowwise Adagrad: 1 state element, 1 TIMESTAMP score) in a "
        f"table of {2 * args.rows} slots; median of {args.repeats}. Rates in million rows per second; the peer "
        f"is the floor `index_select` + `index_copy_` of the same rows; `speedup = peer_time / our_time`.\n"
    )
    print("| case | ours (ms) | ours (M rows/s) | floor (ms) | speedup |")
    print("|---|---:|---:|---:|---:|")
    for case, seconds in results.items():
        rate = args.rows / seconds / 1e6
        print(
            f"| {case} | {seconds * 1e3:.1f} | {rate:.2f} | {floor * 1e3:.2f} | {floor / seconds:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
