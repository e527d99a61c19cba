"""Where a CUDA training step's wall time goes between the host and the GPU.

Wraps the step's ops (every call into ``torch.ops.dynamicemb`` and the torch ops the step makes
itself are not wrapped; the phases are the dynamicemb ops) with host timestamps and CUDA events, runs
``--steps`` steps of the 10-table bench shape, and prints per op: host time spent inside the call,
host time since the previous wrapped call returned (Python between ops), and the GPU's idle time
just before the op's first kernel (the event before the call minus the event after the previous
call, when the GPU had drained its queue). Events cost a few microseconds of host time each.

Run (GPU machine): PYTHONPATH=.:benchmarks python benchmarks/host_timeline.py --optimizer sgd
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List, Tuple

import torch

sys.path.insert(0, "benchmarks")
import bench_training as bt


class Recorder:
    def __init__(self) -> None:
        self.on = False
        self.marks: List[Tuple[str, str, float, Any]] = []  # (name, "in"/"out", host t, event)

    def mark(self, name: str, where: str) -> None:
        if not self.on:
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append((name, where, time.perf_counter(), ev))


REC = Recorder()


def wrap_ops() -> None:
    names = [
        "segmented_unique",
        "bag_unique",
        "find_or_insert",
        "placement_counts",
        "grouped_init_rows",
        "grouped_gather",
        "grouped_reduce_update",
    ]
    from dynamicemb_core.ops import lookup_ops, table_ops

    for mod in (lookup_ops, table_ops):
        orig_ops = mod._ops

        def patched(orig=orig_ops):
            real = orig()
            return _Proxy(real, names)

        mod._ops = patched


class _Proxy:
    def __init__(self, real: Any, names: List[str]) -> None:
        self._real, self._names = real, names

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._real, name)
        if name not in self._names:
            return op
        return _OpProxy(op, name)


class _OpProxy:
    def __init__(self, op: Any, name: str) -> None:
        self._op, self._name = op, name

    @property
    def default(self) -> Any:
        op, name = self._op.default, self._name

        def call(*a: Any, **k: Any) -> Any:
            REC.mark(name, "in")
            r = op(*a, **k)
            REC.mark(name, "out")
            return r

        return call


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ids", type=int, default=1048576)
    p.add_argument("--num-ids", type=int, default=1000000)
    p.add_argument("--cprofile", type=int, default=0, help="also cProfile this many steps")
    a = p.parse_args()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    args = argparse.Namespace(
        tables=a.tables,
        dim=128,
        num_ids=a.num_ids,
        pooling="none",
        batch=4096,
        ids=a.ids,
        alpha=1.05,
    )
    dev = torch.device("cuda")
    opt = EmbOptimType.EXACT_SGD if a.optimizer == "sgd" else EmbOptimType.ADAM
    batches = [
        tuple(t.to(dev) for t in bt.power_law_batch(a.tables, 4096, a.ids, a.num_ids, 1.05, s))
        for s in range(2)
    ]
    module = bt.ours_module(args, opt, dev)
    wrap_ops()

    def step(i: int) -> None:
        idx, off = batches[i % 2]
        REC.mark("step", "in")
        out = module(idx, off)
        REC.mark("forward returned", "out")
        loss = out.sum()
        REC.mark("sum", "out")
        loss.backward()
        REC.mark("backward returned", "out")

    for i in range(4):
        step(i)
    torch.cuda.synchronize()
    # plain wall times first (no events)
    walls = []
    for i in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    print(f"wall per step (no marks), median of 20: {statistics.median(walls):.3f} ms")
    # host-only launch time: the step with the GPU kept busy beforehand (a long kernel queued)
    per: Dict[str, List[Tuple[float, float, float]]] = defaultdict(list)
    totals = []
    for i in range(a.steps):
        torch.cuda.synchronize()
        REC.marks = []
        REC.on = True
        t0 = time.perf_counter()
        step(i)
        t_launched = time.perf_counter()
        torch.cuda.synchronize()
        t_end = time.perf_counter()
        REC.on = False
        marks = REC.marks
        first_ev = marks[0][3]
        prev_out_host, prev_ev = marks[0][2], marks[0][3]
        seq = []
        for name, where, th, ev in marks[1:]:
            if where == "in":
                gap_gpu = prev_ev.elapsed_time(ev)  # ms between previous out and this in
                seq.append((name, (th - prev_out_host) * 1e3, gap_gpu))
                in_host = th
            else:
                if name in ("forward returned", "sum", "backward returned"):
                    gap_gpu = prev_ev.elapsed_time(ev)
                    seq.append((name, (th - prev_out_host) * 1e3, gap_gpu))
                else:
                    seq.append((name + " (inside)", (th - in_host) * 1e3, 0.0))
                prev_out_host, prev_ev = th, ev
        gpu_total = first_ev.elapsed_time(marks[-1][3])
        totals.append(((t_launched - t0) * 1e3, (t_end - t0) * 1e3, gpu_total))
        for k, (name, host_ms, gpu_gap) in enumerate(seq):
            per[f"{k:02d} {name}"].append((host_ms, gpu_gap, 0.0))
    print(
        "with marks: host launch time %.3f ms, step wall %.3f ms, GPU first->last mark %.3f ms"
        % tuple(statistics.median(x[i] for x in totals) for i in range(3))
    )
    print(f"{'phase':44s} {'host ms':>8s} {'GPU ms between marks':>22s}")
    for key in sorted(per):
        v = per[key]
        print(
            f"{key:44s} {statistics.median(x[0] for x in v):8.3f} "
            f"{statistics.median(x[1] for x in v):22.3f}"
        )

    if a.cprofile:
        import cProfile
        import pstats

        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(a.cprofile):
            step(i)
            torch.cuda.synchronize()
        pr.disable()
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats("dynamicemb_core", 45)


if __name__ == "__main__":
    main()
