"""Per-table against batched multi-table calls through the storage plugins, and their raw clients.

    python benchmarks/bench_storage_plugins.py                 # full run, prints the Markdown table
    python benchmarks/bench_storage_plugins.py --write-docs    # and replace "## Storage plugins" in docs/benchmarks.md
    python benchmarks/bench_storage_plugins.py --small         # a quick smoke run (nox bench)

Each step moves a batch of 4096 (table, key) pairs spread uniformly over 10 tables (in shuffled
order, as a grouped lookup sends them), rows of 512 bytes (128 float32, one int64 score word),
between tensors and the backend, three ways on the same keys:
- batched: ``RedisStorage`` / ``RocksDBStorage`` ``insert(keys, table_ids, rows, scores)`` and
  ``find(keys, table_ids)``, one call for all 10 tables (Redis: one pipeline; RocksDB: one
  multi-get / one WriteBatch), from and to torch tensors (encoding, header checks, decoding);
- per table: the same storage driven as the per-table contract drives it (what the adapter does
  for a ``PerTableStorage``, and what the lookup did with one call per table): 10 calls per step,
  one per table, each on that table's keys;
- peer: the raw client doing the same work with the value bytes already encoded, in one round trip:
  redis-py + hiredis ``MSET`` / ``MGET`` of 4096 string keys; rocksdict one ``WriteBatch`` / one
  multi-get of 4096 prefixed keys.

All three run in one process, alternating per repeat, after a preload (finds always hit) and a
warm-up; each figure is the median over repeats. ``batched / per table`` is the gain of one call
over ten; ``vs peer = peer_time / batched_time`` (1.0 is the raw client's rate). Redis is a local
redis-server on a loopback port started here.
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
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source checkout without the core installed
    sys.path.insert(0, str(REPO))
SECTION = "## Storage plugins"
BATCH = 4096
DIM = 128  # 128 float32 = 512 bytes per row
TABLES = 10

# (case, batched rows/s, per-table rows/s, peer rows/s)
Result = Tuple[str, float, float, float]


def _compare(
    fns: Sequence[Callable[[], None]], rows_per_call: int, calls: int, repeats: int
) -> List[float]:
    """Rows/s of each function: medians over ``repeats``, the functions alternating per repeat so
    that a busy machine slows all alike."""
    for fn in fns:  # warm-up
        fn()
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[k].append((time.perf_counter() - start) / calls)
    return [rows_per_call / statistics.median(t) for t in times]


class _Batches:
    """The same batches of (table, key) pairs: tensors for ours, pre-encoded bytes for the peer."""

    def __init__(
        self, key_space: int, num_batches: int, table_prefix: Callable[[int], bytes]
    ) -> None:
        from dynamicemb_core.storage.contract.row_codec import RowCodec, encode_keys
        from dynamicemb_core.types import StorageTableSpec

        self.specs = [StorageTableSpec(f"bench{t}", dim=DIM, row_width=DIM) for t in range(TABLES)]
        codec = RowCodec(self.specs[0])  # every table has the same layout
        g = torch.Generator().manual_seed(0)
        self.keys: List[torch.Tensor] = []
        self.tids: List[torch.Tensor] = []
        for _ in range(num_batches):
            pairs = torch.unique(
                torch.randint(0, key_space * TABLES, (BATCH,), generator=g)
            )  # pair p = table p % TABLES, key (p // TABLES) * 7919 - 12345
            order = torch.randperm(pairs.numel(), generator=g)
            pairs = pairs[order]
            self.keys.append((pairs // TABLES) * 7919 - 12345)
            self.tids.append(pairs % TABLES)
        self.rows = [torch.randn(k.numel(), DIM, generator=g) for k in self.keys]
        self.scores = [torch.randint(0, 2**40, (k.numel(), 1), generator=g) for k in self.keys]
        # per table: positions of its pairs in each batch (what a per-table caller sends)
        self.by_table = [
            [(t, (tids == t).nonzero().squeeze(1)) for t in range(TABLES)] for tids in self.tids
        ]
        self.values = [codec.encode(r, s) for r, s in zip(self.rows, self.scores)]
        self.raw_keys = []
        for keys, tids in zip(self.keys, self.tids):
            raw = [b""] * keys.numel()
            for t in range(TABLES):
                pos = (tids == t).nonzero().squeeze(1)
                for p, k in zip(pos.tolist(), encode_keys(keys[pos], table_prefix(t))):
                    raw[p] = k
            self.raw_keys.append(raw)
        self.i = 0

    def next(self) -> int:
        self.i = (self.i + 1) % len(self.keys)
        return self.i


def _three_ways(
    args: argparse.Namespace,
    b: _Batches,
    storage: Any,
    peer_write: Callable[[int], Any],
    peer_read: Callable[[int], Sequence[Any]],
    cases: Tuple[str, str],
) -> List[Result]:
    """Preload every batch into both, then time insert and find: batched, per table, peer."""
    for i in range(len(b.keys)):  # preload both so find always hits
        storage.insert(b.keys[i], b.tids[i], b.rows[i], b.scores[i])
        peer_write(i)

    def batched_insert() -> None:
        i = b.next()
        storage.insert(b.keys[i], b.tids[i], b.rows[i], b.scores[i])

    def per_table_insert() -> None:
        i = b.next()
        for _, pos in b.by_table[i]:
            storage.insert(b.keys[i][pos], b.tids[i][pos], b.rows[i][pos], b.scores[i][pos])

    def peer_insert() -> None:
        peer_write(b.next())

    def batched_find() -> None:
        i = b.next()
        found, _, _ = storage.find(b.keys[i], b.tids[i])
        assert bool(found.all())

    def per_table_find() -> None:
        i = b.next()
        for _, pos in b.by_table[i]:
            found, _, _ = storage.find(b.keys[i][pos], b.tids[i][pos])
            assert bool(found.all())

    def peer_find() -> None:
        assert peer_read(b.next())[0] is not None

    n = sum(k.numel() for k in b.keys) / len(b.keys)
    out: List[Result] = []
    for case, fns in zip(
        cases,
        (
            (batched_insert, per_table_insert, peer_insert),
            (batched_find, per_table_find, peer_find),
        ),
    ):
        batched, per_table, peer = _compare(fns, int(n), args.calls, args.repeats)
        out.append((case, batched, per_table, peer))
    return out


def bench_redis(args: argparse.Namespace) -> List[Result]:
    import redis

    from demb_redis import RedisStorage
    from demb_redis.server import LocalRedisServer

    with LocalRedisServer() as server:
        # the peer uses plain string keys in one tagged namespace, one key per (table, key)
        b = _Batches(args.key_space, args.batches, lambda t: b"demb:{bench:peer}:%d:" % t)
        storage = RedisStorage(b.specs, url=server.url, model="bench")
        raw = redis.Redis.from_url(server.url)
        out = _three_ways(
            args,
            b,
            storage,
            lambda i: raw.mset(dict(zip(b.raw_keys[i], b.values[i]))),
            lambda i: raw.mget(b.raw_keys[i]),
            ("redis insert (pipelined HSET; peer MSET)", "redis find (pipelined HMGET; peer MGET)"),
        )
        storage.clear()
        storage.close()
    return out


def bench_rocksdb(args: argparse.Namespace) -> List[Result]:
    from rocksdict import Options, Rdict, WriteBatch

    from demb_rocksdb import RocksDBStorage

    with tempfile.TemporaryDirectory(prefix="demb-bench-") as tmp:
        b = _Batches(args.key_space, args.batches, lambda t: b"bench%d\x00" % t)
        storage = RocksDBStorage(b.specs, path=os.path.join(tmp, "ours"))
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        raw = Rdict(os.path.join(tmp, "peer"), options)

        def peer_write(i: int) -> None:
            wb = WriteBatch(raw_mode=True)
            for k, v in zip(b.raw_keys[i], b.values[i]):
                wb.put(k, v)
            raw.write(wb)

        out = _three_ways(
            args,
            b,
            storage,
            peer_write,
            lambda i: raw[b.raw_keys[i]],
            ("rocksdb insert (WriteBatch)", "rocksdb find (multi-get)"),
        )
        storage.close()
        raw.close()
    return out


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _redis_server_version() -> str:
    try:
        text = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        return text.split("v=")[1].split()[0]
    except (OSError, IndexError):
        return "unknown"


def render(results: List[Result], command: str) -> str:
    load = (
        ", ".join(f"{x:.1f}" for x in os.getloadavg()) + f" (1, 5, 15 min; {os.cpu_count()} cores)"
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"Machine: {_cpu()}; GPU: none (host-side storage tiers). torch {torch.__version__}, "
        f"fbgemm-gpu-cpu {_version('fbgemm-gpu-cpu')}, torchrec {_version('torchrec')}; redis-server "
        f"{_redis_server_version()} on loopback, redis-py {_version('redis')} + hiredis {_version('hiredis')}, "
        f"rocksdict {_version('rocksdict')}. Commit {commit}. Command: `{command}`.",
        "",
        f"Steps of {BATCH} (table, key) pairs spread over {TABLES} tables in shuffled order, rows of 512 B "
        "(128 float32 + one int64 score; 528 B stored with the header), 100k keys per table, median "
        "of repeats. Rates in thousand rows per second. Batched: one multi-table call per step; per "
        f"table: {TABLES} calls per step, one per table; peer: the raw client, one round trip per step. "
        "`vs peer = peer_time / batched_time`.",
        "",
        "| case | batched (k rows/s) | per table (k rows/s) | batched / per table | peer: raw client (k rows/s) | vs peer |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case, batched, per_table, peer in results:
        lines.append(
            f"| {case} | {batched / 1e3:.0f} | {per_table / 1e3:.0f} | {batched / per_table:.2f} "
            f"| {peer / 1e3:.0f} | {batched / peer:.2f} |"
        )
    lines += [
        "",
        f"Load average when the run ended: {load}. What separates the three: per table pays one "
        f"call's fixed cost (validation, grouping, a Redis round trip or a RocksDB write/multi-get) "
        f"{TABLES} times per step, batched once. Against the raw client, batched Redis sends {TABLES} "
        "HMGET/HSET commands (one per table's hash) in one pipeline where the peer sends one MGET/MSET "
        "of string keys, and ours also encodes and decodes tensors; batched RocksDB sends its keys "
        "sorted by table (one key range per table), the peer in the call's shuffled order.",
    ]
    return "\n".join(lines)


def write_docs(table: str) -> None:
    """Replace (or append) the "## Storage plugins" section of docs/benchmarks.md; nothing else."""
    path = REPO / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    body = f"{SECTION}\n\n{table}\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(SECTION))
        rest = text[end + 1 :] if end >= 0 else ""
        text = text[:start] + body + ("\n" + rest if rest else "")
    path.write_text(text)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="few calls and repeats (smoke run)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--only", choices=["redis", "rocksdb"], help="run one backend")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: the small per-call tensor ops only lose to a "
        "thread pool on a shared machine, and the peer does no torch work)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.key_space, args.batches = (20_000, 4) if args.small else (100_000, 24)
    args.calls, args.repeats = (2, 2) if args.small else (8, 11)
    results: List[Result] = []
    if args.only in (None, "redis"):
        results += bench_redis(args)
    if args.only in (None, "rocksdb"):
        results += bench_rocksdb(args)
    command = (
        "python benchmarks/bench_storage_plugins.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    table = render(results, command.replace(" --write-docs", ""))
    print(table)
    if args.write_docs:
        write_docs(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
