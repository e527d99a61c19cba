"""Training step of half-precision dynamic tables against float32 ones, with FBGEMM's TBE as the peer.

Ours: ``BatchedDynamicEmbeddingTables`` with ``embedding_dtype`` float32, float16 and bfloat16 (the
whole table in device memory). Peer: FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` with
``weights_precision`` FP32 and FP16 (its CPU build has no BF16 kernels), for EXACT_SGD and
EXACT_ROWWISE_ADAGRAD. All timed in the same process on the same power-law batches, alternating per
repeat (bench_training.py's ``time_pair``), so the ratios share one background load. Also printed:
each layout's bytes per stored row. ``+SR``: our half-precision layouts with
``stochastic_rounding=True`` (the cost of the per-element hash and the second neighbour).

Run:
    PYTHONPATH=. python benchmarks/bench_half_precision.py --threads 1
    PYTHONPATH=. python benchmarks/bench_half_precision.py --device cuda --no-peer   # ours only
    PYTHONPATH=. python benchmarks/bench_half_precision.py --small   # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import platform
from typing import Callable, List, Tuple

import numpy as np
import torch
from bench_training import power_law_batch, time_pair
from small import add_small_flag, apply_small

SMALL = {"tables": 2, "dim": 16, "ids": 2048, "num_ids": 4096, "batch": 64, "batches": 2,
         "warmup": 1, "repeats": 2}  # fmt: skip
# Our layouts timed: label -> (row dtype, stochastic_rounding).
LAYOUTS = {
    "fp32": (torch.float32, False),
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
    "fp16+SR": (torch.float16, True),
    "bf16+SR": (torch.bfloat16, True),
}


def ours_step(
    args, optimizer, dtype, batches, device, stochastic: bool = False
) -> Tuple[Callable[[int], None], int]:
    """A training step of our module in ``dtype`` (``stochastic``: stochastic rounding of the
    updates), and its bytes per stored row."""
    from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
    from dynamicemb_core.optim import optimizer_kind, row_width
    from dynamicemb_core.optim.layout import row_bytes

    cap = 1 << int(np.ceil(np.log2(args.num_ids)))
    width = row_width(optimizer_kind(optimizer), args.dim, True)
    per_row = row_bytes(width, args.dim, dtype)
    opts = [
        DynamicEmbTableOptions(
            dim=args.dim, max_capacity=cap, init_capacity=cap, local_hbm_for_values=cap * per_row,
            embedding_dtype=dtype,
        )
        for _ in range(args.tables)
    ]  # fmt: skip
    module = BatchedDynamicEmbeddingTables(
        opts, [f"t{i}" for i in range(args.tables)], list(range(args.tables)),
        DynamicEmbPoolingMode.SUM, optimizer, device, learning_rate=0.01,
        stochastic_rounding=stochastic,
    )  # fmt: skip

    def step(i: int) -> None:
        idx, off = batches[i % len(batches)]
        module(idx, off).sum().backward()

    return step, per_row


def tbe_step(args, optimizer, precision, batches, device) -> Callable[[int], None]:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    where = (
        (EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
        if device.type == "cuda"
        else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    )
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(args.num_ids, args.dim, *where) for _ in range(args.tables)],
        optimizer=optimizer, pooling_mode=PoolingMode.SUM, weights_precision=precision,
        learning_rate=0.01, eps=1e-8, stochastic_rounding=False,
        **({"device": device} if device.type == "cuda" else {}),
    )  # fmt: skip

    def step(i: int) -> None:
        idx, off = batches[i % len(batches)]
        tbe(idx, off).sum().backward()

    return step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ids", type=int, default=65536, help="ids per batch")
    p.add_argument("--num-ids", type=int, default=100_000, help="id space per table")
    p.add_argument("--batch", type=int, default=512, help="samples per feature")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--optimizers", default="sgd,rowwise")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-peer", action="store_true", help="ours only (no FBGEMM build at hand)")
    add_small_flag(p)
    args = apply_small(p, p.parse_args(argv), SMALL)
    if args.threads:
        torch.set_num_threads(args.threads)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType

    device = torch.device(args.device)
    batches = [
        tuple(t.to(device) for t in power_law_batch(
            args.tables, args.batch, args.ids, args.num_ids, args.alpha, s))
        for s in range(args.batches)
    ]  # fmt: skip
    print(
        f"# {platform.node()} {args.device} threads={torch.get_num_threads()} tables={args.tables} "
        f"dim={args.dim} ids/batch~{args.ids} num_ids={args.num_ids} batch={args.batch} "
        f"alpha={args.alpha} repeats={args.repeats}"
    )
    print("| optimizer | layout | bytes/row | ms/step | vs ours fp32 |\n|---|---|---|---|---|")
    optimizers = {"sgd": EmbOptimType.EXACT_SGD, "rowwise": EmbOptimType.EXACT_ROWWISE_ADAGRAD}
    for name in args.optimizers.split(","):
        opt = optimizers[name]
        labels: List[str] = []
        steps: List[Callable[[int], None]] = []
        sizes: List[str] = []
        for label, (dtype, stochastic) in LAYOUTS.items():
            step, per_row = ours_step(args, opt, dtype, batches, device, stochastic)
            labels.append(f"ours {label}")
            steps.append(step)
            sizes.append(str(per_row))
        if not args.no_peer:
            for label, precision in (("fp32", SparseType.FP32), ("fp16", SparseType.FP16)):
                labels.append(f"TBE {label}")
                steps.append(tbe_step(args, opt, precision, batches, device))
                sizes.append("-")
        times = time_pair(steps, args.warmup, args.repeats, device)
        for label, size, ms in zip(labels, sizes, times):
            print(f"| {name} | {label} | {size} | {ms:.2f} | {ms / times[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
