"""A/B of a training step over host rows: staged (each host row read once a step) vs in place.

Builds ``bench_training.py``'s module for the ``hybrid`` (10 % of the rows in device memory) and
``host`` (none) setups and times, alternating on the same batches and the same module, its step
with the host rows staged (``GroupedRows.stage``: the forward reads each host row whole onto the
device, the backward updates it there and writes it back) and in place (the forward reads the
embedding, the update reads and writes the row across the bus). Prints, per setup, the unique pairs
and host pairs of the batch, the bytes each variant moves over the bus a step and the rate that
implies; with ``--link``, the pinned copy bandwidth both ways (the link's practical ceiling).

    python benchmarks/ab_host_rows.py --device cuda --ids 1048576 --num-ids 1000000 --batch 4096 \\
        --setups hybrid,host --optimizers sgd --link [--profile FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List

import torch
from bench_training import SETUPS, ours_module, power_law_batch, profile_steps, split_steps

from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim import optimizer_kind, row_width


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def link_rates(device: torch.device, nbytes: int = 1 << 30) -> str:
    """Pinned host <-> device copy rates (GB/s, medians of 5): what the bus carries at best."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = []
    for name, dst, src in (("host->device", dev, host), ("device->host", host, dev)):
        times = []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out.append(f"{name} {nbytes / statistics.median(times[1:]) / 1e9:.1f} GB/s")
    return "pinned copies of 1 GiB: " + ", ".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=1048576)
    p.add_argument("--num-ids", type=int, default=1000000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--pooling", choices=["sum", "none"], default="none")
    p.add_argument("--setups", default="hybrid,host")
    p.add_argument("--optimizers", default="sgd")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--link", action="store_true", help="also the pinned copy rates")
    p.add_argument("--split", action="store_true", help="also the staged step's --split report")
    p.add_argument("--profile", default="", help="append the staged step's profile to this file")
    args = p.parse_args()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    device = torch.device(args.device)
    if args.link and device.type == "cuda":
        print(link_rates(device), flush=True)
    for setup in [s for s in args.setups.split(",") if s]:
        assert setup in SETUPS and not setup.startswith("cache"), setup
        idx, off = power_law_batch(args.tables, args.batch, args.ids, args.num_ids, args.alpha, 0)
        batch = (idx.to(device), off.to(device))
        for name in args.optimizers.split(","):
            opt = EmbOptimType.EXACT_SGD if name == "sgd" else EmbOptimType.ADAM
            print(run_one(args, device, setup, name, opt, batch), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


def run_one(args, device: torch.device, setup: str, name: str, opt, batch) -> str:
    """One setup and optimizer: both variants alternating on one module; the report's text."""
    t0 = time.perf_counter()
    module = ours_module(args, opt, device, setup)
    rows = module._group.storage.rows
    built = time.perf_counter() - t0
    if rows._host_ops is None:
        return f"== {setup}, {name}: no host part the device addresses (nothing to stage)"
    module(*batch).sum().backward()  # the keys go in
    group = module._group
    tids = group.table_ids(batch[1], batch[0].numel(), args.batch)
    keys, utids, *_ = lookup_ops.segmented_unique(batch[0], tids, args.tables)
    slots = group.storage.find_all(keys, utids)[0]
    u = keys.numel()
    on_host = int((rows._masks(utids, slots)[1] >= 0).sum())
    width = row_width(optimizer_kind(opt), args.dim, True) * 4
    staged_bytes = on_host * 2 * width  # the row read by the forward, written by the update
    inplace_bytes = on_host * (args.dim * 4 + 2 * width)  # + the embedding read by the forward

    def variant(stage: bool) -> Callable[[int], None]:
        def step(i: int) -> None:
            rows.stages = stage
            module(*batch).sum().backward()

        return step

    steps = [variant(True), variant(False)]
    for step in steps:
        for i in range(args.warmup):
            step(i)
    times: List[List[float]] = [[], []]
    for i in range(args.repeats):
        for k, step in enumerate(steps):
            sync(device)
            t = time.perf_counter()
            step(i)
            sync(device)
            times[k].append((time.perf_counter() - t) * 1e3)
    staged_ms, inplace_ms = (statistics.median(t) for t in times)
    lines = [
        f"== {setup}, {args.tables} tables, {name.upper()}, {args.pooling.upper()}: built in "
        f"{built:.1f} s; {u} unique pairs, {on_host} in host rows of {width} B; medians of "
        f"{args.repeats}, alternating",
        f"staged   {staged_ms:8.2f} ms  bus {staged_bytes / 1e6:7.1f} MB a step "
        f"({staged_bytes / staged_ms / 1e6:.1f} GB/s over the whole step)",
        f"in place {inplace_ms:8.2f} ms  bus {inplace_bytes / 1e6:7.1f} MB a step "
        f"({inplace_bytes / inplace_ms / 1e6:.1f} GB/s over the whole step)",
        f"in place / staged: {inplace_ms / staged_ms:.2f}x",
    ]
    rows.stages = True
    if args.split:
        lines.append(split_steps(module, [batch], 1, 3, device))
    if args.profile:
        report = profile_steps(steps[0], 1, device)
        with open(args.profile, "a") as f:
            f.write(f"== staged: {setup} {name}\n{report}\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
