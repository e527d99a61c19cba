"""The scored hash table's CUDA ops on one GPU, against torch.index_select and HierarchicalKV's figures.

Run (on a CUDA machine, from the repository root)::

    python benchmarks/bench_table_cuda.py                      # 64M slots, 1,048,576 keys per op
    python benchmarks/bench_table_cuda.py --slots 4194304 --dims 32 --load-factors 0.5   # quick
    python benchmarks/bench_table_cuda.py --small    # seconds: a smoke run (nox -s bench)

Without a CUDA device it exits with a message saying so: status 1, or 0 with ``--small`` (a smoke
run has nothing to check there, and ``nox -s bench`` runs on CPU machines too).

Set-up, as HierarchicalKV's ``merlin_hashtable_benchmark`` does it: one table of ``--slots`` slots
(buckets of 128, TIMESTAMP policy with the device clock, HKV's LRU), filled with consecutive keys to
load factor λ; each measured call gets 1,048,576 keys of which 60% were inserted last and 40% are
new (HKV's ``hitrate=0.6``, ``Hit_Mode::last_insert``, which its benchmark gives every op, find and
``find*`` included: HKV's find copies the rows of the 60% it finds). The lookups get that key set too.
Mutating ops restart from a snapshot of the filled table before every repeat; each figure is the
median of ``--repeats`` CUDA-event timings after a warm-up. Each (λ, dim) runs in a process of its
own, with its own table (in one process the cells timed after the first ran 5-20 % slower). Throughput is in billions of key-value
pairs per second, counted like HKV (keys / seconds / 2^30), so figures compare with its table.

The columns: ``ours`` (table op, plus value rows where HKV's API moves them: find + gather_rows
against HKV's find; insert + scatter_rows; find_or_insert + gather_rows; insert_and_evict +
gather_rows of the evicted rows + scatter_rows of the new ones), ``index_select`` (the same number of fp32 rows of the same
width from a static tensor of the same shape, timed in the same run), the bytes each call moves by a
simple model (key in, digest line, key compare, score words, outputs, value rows) per second and as
a share of the ~4.3 TB/s the device copies at, and the ratio to HKV's figure for the same API.
``export_if`` exports keys, slots and scores (no values) of the whole table; its throughput counts
exported keys (HKV's export_batch_if counts the keys it dumps, with values).

The inserting ops run on each engine of ``--engines`` (default all three): ``parallel``, the
key-parallel CUDA engine (the default; csrc/cuda/table_upsert_parallel.cuh); ``unique``, the same
engine called with ``unique_keys=True`` (the keys are distinct, so it builds no leader map: what a
grouped lookup, whose keys come out of its unique, runs); and ``deterministic``, the bucket-ordered
one that ``DEMB_DETERMINISM_MODE=1`` selects (csrc/cuda/table_upsert.cuh); lookups and export have
one engine ("-").

The ops run with ``check=False`` unless ``--checked``: ScoredHashTable validates its input and then
calls them so, and HKV checks nothing either; ``--checked`` shows what the ops' own data checks
(one small kernel and a device synchronisation per checked op) cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from small import add_small_flag, apply_small

from dynamicemb_core.ops import table_ops as ops
from dynamicemb_core.ops.table_ops import TableState

TIMESTAMP = 0
BUCKET = 128
KEYS_PER_OP = 1 << 20  # the default of --keys
HIT_RATE = 0.6  # HKV's default in test_one_api
COPY_TBPS = 4.3  # device-to-device copy, measured on the H200 (shared/device/README.md)
GIB = float(1 << 30)  # HKV divides by 1024^3 for "billion"

# HierarchicalKV on this H200, 1,048,576 keys per op, uint64 keys, fp32 values, LRU (issue 3).
HKV: Dict[Tuple[float, int, str], float] = {}
for _dim, _row in {
    8: (3.41, 6.38, 2.12, 2.06, 1.86, 6.73),
    32: (3.40, 6.70, 1.99, 2.04, 1.66, 1.32),
    64: (3.58, 6.90, 1.87, 1.86, 1.57, 0.71),
}.items():
    for _api, _v in zip(
        ("find+gather", "find", "find_or_insert", "insert", "insert_and_evict", "export_if"),
        _row,
        strict=False,
    ):
        HKV[(0.5, _dim, _api)] = _v
HKV.update(
    {
        (1.0, 32, "find+gather"): 3.61,
        (1.0, 32, "find_or_insert"): 1.27,
        (1.0, 32, "insert_and_evict"): 0.82,
    }
)
# Every op the bench times, in its order (--ops picks some).
OPS = (
    "find",
    "find+gather",
    "insert",
    "find_or_insert",
    "insert_and_evict",
    "export_if",
)
# Targets of issue 3, as multiples of HKV's figure.
TARGET = {
    "find": 1.0,
    "find+gather": 1.2,
    "find_or_insert": 1.1,
    "insert_and_evict": 1.1,
    "export_if": 1.0,
}
# --small: every op at two load factors (1.0: inserts evict) and two dims, 4096 keys, 64k slots.
SMALL = {
    "slots": 1 << 16,
    "keys": 1 << 12,
    "dims": [8, 32],
    "load_factors": [0.5, 1.0],
    "repeats": 2,
}


def empty_state(slots: int, dev: torch.device) -> TableState:
    longs = {"dtype": torch.int64, "device": dev}
    return TableState(
        table_keys=torch.zeros(slots, **longs),
        digests=torch.zeros(slots, dtype=torch.uint8, device=dev),
        scores=torch.zeros(slots, 2, **longs),
        slot_offsets=torch.tensor([0, slots], **longs),
        bucket_caps=torch.tensor([BUCKET], **longs),
        policies=torch.tensor([TIMESTAMP], **longs),
        sizes=torch.zeros(1, **longs),
    )


def fill(state: TableState, load_factor: float, fns, clock, chunk: int) -> int:
    """Insert consecutive keys, ``chunk`` a call, until the table holds load_factor * slots keys;
    return the next key."""
    dev = state.table_keys.device
    cap = state.table_keys.numel()
    target = int(cap * load_factor)
    start = 0
    for _ in range(4 * cap // chunk + 8):  # at 1.0, evictions make the last 1% slow to fill
        size = int(state.sizes[0])
        if target - size <= cap * 0.001:
            break
        n = min(chunk, max(target - size, 1))
        keys = torch.arange(start, start + n, device=dev)
        ops.find_or_insert(keys, torch.zeros_like(keys), state, fns, clock)
        start += n
    return start


def time_ms(
    fn: Callable[[], object], repeats: int, before: Callable[[], None] | None = None
) -> float:
    """Median over repeats of one call, timed with CUDA events (``before`` runs untimed)."""
    times: List[float] = []
    for _ in range(repeats + 1):  # the first is a warm-up
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[1:])


def probe_bytes(dim: int) -> Dict[str, float]:
    """Bytes one key moves in each op (model: key + table id in, one 128-byte digest line, the
    matched key, score words, outputs; value rows read and/or written at 4 * dim bytes). The
    lookups run on HIT_RATE present keys: only those read a key to compare, score words and a
    value row (a missing key's row is written as zeros)."""
    row = 4 * dim
    base = 8 + 8 + BUCKET + 8 + 16  # key, table id, digests, key compare, score words
    look = 8 + 8 + BUCKET  # key, table id, digests
    hit = HIT_RATE
    return {
        "find": look + hit * (8 + 16) + 8 + 1 + 16,
        "find+gather": look + hit * (8 + 16) + 8 + 1 + 16 + hit * row + row,
        "insert": base + 16 + 8 + 8 + 16 + 2 * row,  # + sort pass, write key/score, rows in/out
        "find_or_insert": base + 16 + 8 + 8 + 1 + 16 + 2 * row,
        "insert_and_evict": base + 16 + 8 + 8 + 1 + 16 + 4 * row,
        "index_select": 8 + 2 * row,
    }


@dataclass
class Filled:
    """One filled table and the key sets every dim measures with."""

    state: TableState
    snapshot: TableState
    load_factor: float  # measured after filling
    mixed: torch.Tensor  # 60% last-inserted + 40% new keys, shuffled
    tids: torch.Tensor
    fns: torch.Tensor
    clock: torch.Tensor

    def restore(self) -> None:
        for dst, src in zip(self.state, self.snapshot, strict=True):
            dst.copy_(src)


def make_filled(slots: int, lf: float, gen: torch.Generator, keys: int) -> Filled:
    """A table of ``slots`` filled to ``lf``, with key sets of ``keys`` keys for each measured call."""
    dev = torch.device("cuda")
    fns = torch.zeros(1, dtype=torch.int64)
    clock = torch.full((1,), -1, dtype=torch.int64, device=dev)  # read %globaltimer
    state = empty_state(slots, dev)
    start = fill(state, lf, fns, clock, keys)
    n_hit = int(keys * HIT_RATE)
    hit = torch.arange(start - n_hit, start, device=dev)
    new = torch.arange(start, start + keys - n_hit, device=dev)
    mixed = torch.cat([hit, new])[torch.randperm(keys, device=dev, generator=gen)]
    return Filled(
        state,
        TableState(*(t.clone() for t in state)),
        int(state.sizes[0]) / slots,
        mixed,
        torch.zeros(keys, dtype=torch.int64, device=dev),
        fns,
        clock,
    )


def cases_for(
    f: Filled,
    values: torch.Tensor,
    new_rows: torch.Tensor,
    exported: List[int],
    check: bool,
    engines: List[str],
) -> List[Tuple[str, str, Callable[[], None], Callable[[], None] | None]]:
    """(op, engine, timed call, untimed set-up before each repeat); ``check``: the ops' data
    checks; the inserting ops once per engine."""
    st, k, t, fns, clock = f.state, f.mixed, f.tids, f.fns, f.clock
    c = {"check": check}
    threshold = torch.zeros(1, dtype=torch.int64, device=values.device)  # every clock time passes

    def inserting(engine: str):
        # "unique": the key-parallel engine told the keys are distinct (they are: HKV's key set)
        e = {**c, "deterministic": engine == "deterministic", "unique_keys": engine == "unique"}

        def ins() -> None:
            ops.scatter_rows(values, ops.insert(k, t, st, fns, clock, **e), new_rows, **c)

        def foi() -> None:
            ops.gather_rows(values, ops.find_or_insert(k, t, st, fns, clock, **e)[0], **c)

        def iae() -> None:
            out = ops.insert_and_evict(k, t, st, fns, clock, **e)
            ops.gather_rows(values, out[3], **c)
            ops.scatter_rows(values, out[0], new_rows, **c)

        return [
            ("insert", engine, ins, f.restore),
            ("find_or_insert", engine, foi, f.restore),
            ("insert_and_evict", engine, iae, f.restore),
        ]

    def exp() -> None:
        exported[0] = ops.export_if(st, threshold, 0)[0].numel()

    cases = [
        ("find", "-", lambda: ops.find(k, t, st, clock, False, **c), None),
        (
            "find+gather",
            "-",
            lambda: ops.gather_rows(values, ops.find(k, t, st, clock, False, **c)[0], **c),
            None,
        ),
    ]
    for engine in engines:
        cases += inserting(engine)
    return cases + [("export_if", "-", exp, None)]


def bench_dim(
    f: Filled, dim: int, values: torch.Tensor, static: torch.Tensor, args, gen: torch.Generator
) -> List[List[str]]:
    slots = values.size(0)
    keys = f.mixed.numel()
    idx = torch.randint(0, slots, (keys,), device=values.device, generator=gen)
    t_ref = time_ms(lambda: static.index_select(0, idx), args.repeats)
    ref_bkv = keys / (t_ref * 1e-3) / GIB
    new_rows = torch.ones(keys, dim, device=values.device)
    exported = [0]
    model = probe_bytes(dim)
    lf = min(args.load_factors, key=lambda x: abs(x - f.load_factor))
    rows = []
    cases = cases_for(f, values, new_rows, exported, args.checked, args.engines)
    for name, engine, fn, before in cases:
        if args.ops and name not in args.ops:
            continue
        ms = time_ms(fn, args.repeats, before)
        n = exported[0] if name == "export_if" else keys
        bkv = n / (ms * 1e-3) / GIB
        if name == "export_if":
            moved = slots * (1 + 16 * f.load_factor) + n * (8 + 8 + 16 + 8)
        else:
            moved = keys * model[name]
        tbps = moved / (ms * 1e-3) / 1e12
        hkv = HKV.get((lf, dim, name)) if keys == KEYS_PER_OP else None  # HKV: 1M keys a call
        goal = 0.7 if engine == "deterministic" else TARGET.get(name)  # issue 14's targets
        ratio = "n/a"
        if hkv:
            ratio = f"{bkv / hkv:.2f}x"
            if goal:
                ratio += " (met)" if bkv / hkv >= goal else f" (target {goal:.1f}x)"
        rows.append(
            [
                f"{f.load_factor:.2f}",
                str(dim),
                name,
                engine,
                f"{bkv:.2f}",
                f"{ms:.3f}",
                f"{ref_bkv:.2f}",
                f"{t_ref / ms:.2f}",
                f"{tbps:.2f} ({100 * tbps / COPY_TBPS:.0f}%)",
                f"{hkv:.2f}" if hkv else "-",
                ratio,
            ]
        )
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def profile(args: argparse.Namespace) -> str:
    """Kernel-level breakdown of one call of each op (torch.profiler), first dim and λ only."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    gen = torch.Generator(device="cuda").manual_seed(0)
    f = make_filled(args.slots, args.load_factors[0], gen, args.keys)
    dim = args.dims[0]
    values = torch.empty(args.slots, dim, device="cuda")
    out = []
    for name, engine, fn, before in cases_for(
        f, values, torch.ones(args.keys, dim, device="cuda"), [0], args.checked, args.engines
    ):
        if args.ops and name not in args.ops:
            continue
        for _ in range(2):
            if before is not None:
                before()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
        out.append(f"### {name} ({engine})\n{table}")
    return "\n".join(out)


def bench_cell(args: argparse.Namespace, lf: float, dim: int) -> List[List[str]]:
    """The table rows of one (λ, dim): a table filled to ``lf``, value rows of ``dim`` floats."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    filled = make_filled(args.slots, lf, gen, args.keys)
    values = torch.empty(args.slots, dim, dtype=torch.float32, device=dev)
    static = torch.empty(args.slots, dim, dtype=torch.float32, device=dev)
    return bench_dim(filled, dim, values, static, args, gen)


def cell_argv(args: argparse.Namespace, lf: float, dim: int) -> List[str]:
    """This script's arguments for one (λ, dim), run in a process of its own (``--cell``)."""
    argv = ["--cell", "--slots", str(args.slots), "--keys", str(args.keys)]
    argv += ["--repeats", str(args.repeats), "--dims", str(dim), "--load-factors", str(lf)]
    argv += ["--engines", *args.engines]
    if args.ops:
        argv += ["--ops", *args.ops]
    if args.checked:
        argv.append("--checked")
    return argv


def run(args: argparse.Namespace) -> str:
    """Every (λ, dim) in a process of its own: timed one after another in one process, the cells
    after the first ran 5-20 % slower on every op, lookups included (on the H200; cause not
    isolated)."""
    rows: List[List[str]] = []
    for lf in args.load_factors:
        for dim in args.dims:
            child = subprocess.run(  # its progress lines reach our stderr as they come
                [sys.executable, str(Path(__file__).resolve()), *cell_argv(args, lf, dim)],
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            )
            if child.returncode != 0:
                raise SystemExit(
                    f"λ {lf}, dim {dim} failed (rc {child.returncode}):\n{child.stdout}"
                )
            rows += json.loads(child.stdout.strip().splitlines()[-1])
    return render(args, rows)


def render(args: argparse.Namespace, rows: List[List[str]]) -> str:
    commit = os.environ.get("DEMB_COMMIT", "")  # set it where the tree is a copy without .git
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            pass
    commit = commit or "unknown"
    head = [
        f"Machine: {platform.node()} ({platform.machine()}), GPU: {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, commit {commit}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"Command: `python benchmarks/bench_table_cuda.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"Table: {args.slots:,} slots, buckets of {BUCKET}, TIMESTAMP (device clock); "
        f"{args.keys:,} keys per op ({int(HIT_RATE * 100)}% present); "
        f"median of {args.repeats}; ops called with check={args.checked} "
        f"({'the ops check ids and slots: one device sync each' if args.checked else 'as ScoredHashTable calls them, having validated its input'}).",
        "",
        "| λ | dim | op | engine | ours (B-KV/s) | ours (ms) | index_select (B-rows/s) | "
        "speedup vs index_select | modelled TB/s (% of 4.3) | HKV (B-KV/s) | speedup vs HKV |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slots", type=int, default=1 << 26)
    p.add_argument("--dims", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--keys", type=int, default=KEYS_PER_OP, help="keys per measured call (HKV's: 1048576)"
    )
    p.add_argument("--profile", action="store_true", help="print a per-kernel breakdown instead")
    p.add_argument(
        "--engines",
        nargs="+",
        choices=["parallel", "unique", "deterministic"],
        default=["parallel", "unique", "deterministic"],
        help="CUDA insert engines to time the inserting ops on (lookups have one)",
    )
    p.add_argument(
        "--ops",
        nargs="+",
        choices=OPS,
        default=[],
        help="time only these ops (default: every op)",
    )
    p.add_argument(
        "--checked",
        action="store_true",
        help="call the ops with check=True (their data checks, one device sync each) instead of "
        "check=False, the way ScoredHashTable calls them",
    )
    p.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)  # run()'s child
    add_small_flag(p)
    args = apply_small(p, p.parse_args(), SMALL)
    if not torch.cuda.is_available():
        message = "bench_table_cuda.py needs a CUDA device; torch sees none"
        if args.small:
            print(f"{message}: skipped (--small)", file=sys.stderr)
            raise SystemExit(0)
        raise SystemExit(message)
    if args.profile:
        print(profile(args))
    elif args.cell:  # one (λ, dim): its rows as JSON, for run() in the parent process
        print(json.dumps(bench_cell(args, args.load_factors[0], args.dims[0])))
    else:
        print(run(args))


if __name__ == "__main__":
    main()
