"""Serving lookups per second: dynamic inference tables vs TorchRec's static tables, exported alike.

    python benchmarks/bench_serving.py [--device cpu|cuda|all] [--small]

The model: ``--features`` tables (26, as Criteo), one feature each, SUM pooling, dim ``--dim``, one
id per bag (one-hot features), a batch of ``--batch`` samples (16384). Both sides hold the same rows:

- dynamic: an ``InferenceEmbeddingBagCollection``, ``--rows`` keys per table in a table of twice that
  capacity (load factor 0.5), filled through the checkpoint loader's row writer;
- static: TorchRec's ``EmbeddingBagCollection`` (``nn.EmbeddingBag`` per table) with
  ``num_embeddings = --rows`` and the same rows copied into its weights.

Each is measured three ways, in the same run: eager, the ``torch.export`` program, and an
AOTInductor package (``aoti_compile_and_package``, wrapper at -O0), compiled without its tables and
attached to the live module's tensors (``compile_package(embed_constants=False)`` + ``attach``, what a
server holding the module does; it keeps GBs of rows out of the compile). The dynamic side is exported with
dynamic batch sizes; TorchRec's KJT path does not export with a dynamic batch, so the static side is
exported for the benchmark's batch shape. Ids are uniform over the stored keys (every lookup hits), so
both sides compute the same sums: the script checks the outputs are equal before timing.

Figure: ids looked up per second (``batch * features / time per batch``), median of ``--iters`` timed
batches after ``--warmup``; the ratio is dynamic / static. Results go to stdout as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class StaticLookup(nn.Module):
    """TorchRec's EmbeddingBagCollection behind the same (values, offsets) call."""

    def __init__(self, ebc: nn.Module, features: List[str]) -> None:
        super().__init__()
        self.ebc = ebc
        self.features = features

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        kjt = KeyedJaggedTensor(keys=self.features, values=values, offsets=offsets)
        return self.ebc(kjt).values()


def build(args: argparse.Namespace, device: torch.device) -> Tuple[nn.Module, nn.Module]:
    """(dynamic LookupModule, static StaticLookup) holding the same rows."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dynamicemb_core.checkpoint.table_io import insert_rows
    from dynamicemb_core.config import DynamicEmbTableOptions
    from dynamicemb_core.inference import InferenceEmbeddingBagCollection, LookupModule

    names = [f"t{i}" for i in range(args.features)]
    configs = [
        EmbeddingBagConfig(
            name=n, embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{i}"]
        )
        for i, n in enumerate(names)
    ]
    bucket = 128
    capacity = -(-2 * args.rows // bucket) * bucket
    options = DynamicEmbTableOptions(dim=args.dim, max_capacity=capacity, bucket_capacity=bucket)
    dynamic = InferenceEmbeddingBagCollection(configs, [options] * len(configs), device)
    static = EmbeddingBagCollection(tables=configs, device=device)
    gen = torch.Generator().manual_seed(0)
    keys = torch.arange(args.rows, dtype=torch.int64)
    no_age = torch.zeros(args.rows, 1, dtype=torch.int64)
    for handle, name in zip(dynamic.embeddings.handles(""), names):
        rows = torch.rand(args.rows, args.dim, generator=gen) - 0.5
        placed, unplaced = insert_rows(handle, keys, rows, None, no_age)
        if unplaced:
            raise RuntimeError(f"table {name}: {unplaced} keys found no slot")
        with torch.no_grad():
            static.embedding_bags[name].weight.copy_(rows.to(device))
    features = [f"f{i}" for i in range(args.features)]
    return LookupModule(dynamic).eval(), StaticLookup(static, features).eval()


def _measure(
    args: argparse.Namespace,
    device: torch.device,
    side: str,
    how: str,
    fn: Callable[[], Any],
    n: int,
    times: Dict[str, float],
) -> Dict[str, Any]:
    with torch.no_grad():
        sec = _time(fn, device, args.warmup, args.iters)
    print(f"  {device.type} {side} {how}: {sec * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return {
        "device": device.type,
        "side": side,
        "how": how,
        "ms": sec * 1e3,
        "ids_per_s": n / sec,
        **times,
    }


def run_device(args: argparse.Namespace, device: torch.device) -> List[Dict[str, Any]]:
    """Eager and torch.export of both sides first, then their AOTInductor packages, so that the
    cheap rows are measured (and printed) even when the compiles do not finish in time."""
    from dynamicemb_core.inference import attach, compile_package, export_model
    from dynamicemb_core.inference.runtime import load_package

    dynamic, static = build(args, device)
    n = args.batch * args.features
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, args.rows, (n,), generator=gen).to(device)
    offsets = torch.arange(n + 1, dtype=torch.int64).to(device)
    with torch.no_grad():
        want = static(values, offsets)
        got = dynamic(values, offsets)
    if not torch.equal(got, want):
        raise RuntimeError(f"dynamic and static outputs differ by {(got - want).abs().max()}")
    results = []
    sides = (("dynamic", dynamic), ("static (TorchRec)", static))
    programs = {}
    for side, module in sides:
        start = time.perf_counter()
        if side == "dynamic":
            programs[side] = export_model(module, (values, offsets))
        else:
            with torch.no_grad():
                programs[side] = torch.export.export(module, (values, offsets), strict=False)
        times = {"export_s": time.perf_counter() - start, "compile_s": float("nan")}
        exported = programs[side].module()
        results.append(
            _measure(args, device, side, "eager", lambda m=module: m(values, offsets), n, times)
        )
        results.append(
            _measure(
                args, device, side, "torch.export", lambda e=exported: e(values, offsets), n, times
            )
        )
    if args.no_aoti:
        return results
    print(report(args, results) + "\n(AOTInductor packages compiling)\n", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench_serving_")
    for side, module in sides:
        # the package reads the live module's tensors (attach): no multi-GB copy of the tables
        start = time.perf_counter()
        path = compile_package(
            programs[side],
            os.path.join(tmp, f"{side[:6]}.pt2"),
            fast_compile=True,
            embed_constants=False,
        )
        compile_s = time.perf_counter() - start
        package = load_package(path)
        attach(package, module)
        if not torch.equal(package(values, offsets), want):
            raise RuntimeError(f"{side}: the AOTInductor package's output differs")
        export_s = next(r["export_s"] for r in results if r["side"] == side)
        times = {"export_s": export_s, "compile_s": compile_s}
        results.append(
            _measure(
                args, device, side, "AOTInductor", lambda p=package: p(values, offsets), n, times
            )
        )
    return results


def report(args: argparse.Namespace, results: List[Dict[str, Any]]) -> str:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "-"
    lines = [
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} CPU threads, GPU {gpu}; torch {torch.__version__}; "
        f"commit {_commit()}",
        f"model: {args.features} tables x {args.rows} keys, dim {args.dim}, SUM, one id per bag; "
        f"batch {args.batch} samples = {args.batch * args.features} ids; median of {args.iters}",
        "",
        "| device | how | dynamic ms | static ms | dynamic Mids/s | static Mids/s | dynamic / static |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r["device"], r["side"], r["how"]): r for r in results}
    for (dev, side, how), r in by.items():
        if side != "dynamic":
            continue
        s = by.get((dev, "static (TorchRec)", how))
        if s is None:
            continue
        lines.append(
            f"| {dev} | {how} | {r['ms']:.2f} | {s['ms']:.2f} | {r['ids_per_s'] / 1e6:.1f} | "
            f"{s['ids_per_s'] / 1e6:.1f} | {r['ids_per_s'] / s['ids_per_s']:.2f} |"
        )
    compile_lines = [
        f"{r['device']} {r['side']}: export {r['export_s']:.1f} s, AOTInductor compile "
        f"{r['compile_s']:.1f} s"
        for r in results
        if r["how"] == ("eager" if args.no_aoti else "AOTInductor")
    ]
    return "\n".join(lines + [""] + compile_lines)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "all"])
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rows", type=int, default=None, help="keys per table")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-aoti", action="store_true", help="skip the AOTInductor packages")
    parser.add_argument("--small", action="store_true", help="a quick run of every path")
    args = parser.parse_args(argv)
    if args.small:
        args.features, args.batch, args.dim, args.iters, args.warmup = 4, 256, 16, 3, 1
        args.rows = args.rows or 1000
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    results = []
    for name in devices:
        if name == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: skipping cuda", file=sys.stderr)
            continue
        device = torch.device(name)
        rows = args.rows or (1 << 19 if name == "cuda" else 1 << 15)
        run_args = argparse.Namespace(**{**vars(args), "rows": rows})
        results.extend(run_device(run_args, device))
        print(report(run_args, [r for r in results if r["device"] == name]), flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
