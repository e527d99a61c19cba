"""A/B of a hybrid group's row work on CPU: ``GroupedRows`` at an older commit against this tree's.

The old class (by default 68f4f6b, which expanded a sequence output to every id and gathered both
parts over all of them) and this tree's, on its mapped path (both parts addressed in place) and its
copy path (the host part's own pairs compacted), on one batch: 10 tables of 65,536 rows, dim 128,
10 % device rows, 131,070 ids over ``--unique`` pairs (power law per table), SGD, sequence output,
one thread.

    python benchmarks/ab_grouped_rows.py [--old-commit 68f4f6b] [--unique 40000] [--repeats 6]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.storage.grouped_rows import GroupedRows

_PATH = "dynamicemb_core/storage/grouped_rows.py"
_SGD = (0, 0.01, 0.0, 0.0, 0.0, 0.0, 0, 1, -1)  # grouped_update's optimizer arguments
TABLES, CAPACITY, DIM, IDS = 10, 1 << 16, 128, 131072


def _old_class(commit: str) -> Any:
    """``GroupedRows`` as it was at ``commit`` (read from git, loaded as a module of its own)."""
    repo = Path(__file__).resolve().parents[1]
    text = subprocess.run(
        ["git", "show", f"{commit}:{_PATH}"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_grouped_rows.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_grouped_rows", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GroupedRows


def _batch(unique: int) -> Tuple[torch.Tensor, ...]:
    """(table ids, slots) of the unique pairs, the ids' ``inverse`` into them and bag offsets."""
    g = torch.Generator().manual_seed(0)
    tids = torch.randint(0, TABLES, (unique,), generator=g)
    slots = torch.empty(unique, dtype=torch.int64)
    for t in range(TABLES):
        idx = (tids == t).nonzero().squeeze(1)
        slots[idx] = torch.randperm(CAPACITY, generator=g)[: idx.numel()]
    tids, order = tids.sort()
    slots = slots[order]
    per = IDS // TABLES
    parts = []
    for t in range(TABLES):
        idx = (tids == t).nonzero().squeeze(1)
        w = 1.0 / torch.arange(1, idx.numel() + 1, dtype=torch.float64) ** 1.05
        parts.append(idx[torch.multinomial(w, per, replacement=True, generator=g)])
    inverse = torch.cat(parts)
    m = inverse.numel()
    offsets = torch.tensor(
        [t * per + b * (per // 16) for t in range(TABLES) for b in range(16)] + [m]
    )
    return tids, slots, inverse, offsets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-commit", default="68f4f6b")
    p.add_argument("--unique", type=int, default=40000)
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    tids, slots, inverse, offsets = _batch(args.unique)
    keys = torch.arange(slots.numel())
    features = torch.arange(TABLES)
    d_offsets = torch.arange(0, (TABLES + 1) * DIM, DIM)
    grad = torch.randn(inverse.numel(), DIM, generator=torch.Generator().manual_seed(1))
    shape = ([DIM] * TABLES, [DIM] * TABLES, [CAPACITY] * TABLES, [CAPACITY // 10] * TABLES)
    old = _old_class(args.old_commit)
    rows = {
        f"old ({args.old_commit})": (old(cpu, *shape), False),
        "mapped": (GroupedRows(cpu, *shape), True),
        "copy path": (GroupedRows(cpu, *shape, copy_host=True), True),
    }
    times: Dict[str, Tuple[List[float], List[float]]] = {k: ([], []) for k in rows}
    update = (tids, slots, grad, inverse, offsets, None, features, d_offsets)
    for rep in range(args.repeats + 1):  # the first round warms up
        for name, (r, takes_keys) in rows.items():
            t0 = time.perf_counter()
            r.gather(tids, slots, DIM, inverse=inverse)
            t1 = time.perf_counter()
            tail = (lookup_ops.POOL_NONE, 16, DIM, _SGD)
            r.reduce_update(*((keys,) if takes_keys else ()), *update, *tail)
            t2 = time.perf_counter()
            if rep:
                times[name][0].append((t1 - t0) * 1e3)
                times[name][1].append((t2 - t1) * 1e3)
    print(
        f"{TABLES} tables x {CAPACITY} rows, dim {DIM}, 10 % device rows, {inverse.numel()} ids "
        f"over {slots.numel()} pairs, SGD, sequence output, 1 thread; medians of {args.repeats}"
    )
    print("| | forward gather (ms) | backward reduce + update (ms) |\n|---|---:|---:|")
    for name, (f, b) in times.items():
        print(f"| {name} | {statistics.median(f):.1f} | {statistics.median(b):.1f} |")


if __name__ == "__main__":
    main()
