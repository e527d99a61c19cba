"""Batched find and insert through the storage plugins against their raw clients, in one process.

    python benchmarks/bench_storage_plugins.py                 # full run, prints the Markdown table
    python benchmarks/bench_storage_plugins.py --write-docs    # and replace "## Storage plugins" in docs/benchmarks.md
    python benchmarks/bench_storage_plugins.py --small         # a quick smoke run (nox bench)

Each case moves batches of 4096 rows of 512 bytes (128 float32, one int64 score word) between
tensors and the backend:
- ours: ``RedisStorage`` / ``RocksDBStorage`` ``insert(keys, rows, scores)`` and ``find(keys)``, from
  and to torch tensors (key and row encoding, header checks and decoding included);
- peer: the raw client on the same backend with the same value bytes already encoded: redis-py +
  hiredis ``MSET`` / ``MGET``; rocksdict ``WriteBatch`` / multi-get.

Both run on the same keys (a 100k-key space, preloaded) in the same process, alternating, after a
warm-up; each figure is the median over repeats. ``speedup = peer_time / our_time``: 1.0 is the raw
client's rate, the target is >= 0.8. Redis is a local redis-server on a loopback port started here.
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
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source checkout without the core installed
    sys.path.insert(0, str(REPO))
SECTION = "## Storage plugins"
BATCH = 4096
DIM = 128  # 128 float32 = 512 bytes per row


def _compare(
    ours: Callable[[], None], peer: Callable[[], None], rows_per_call: int, calls: int, repeats: int
) -> Tuple[float, float]:
    """(our rows/s, peer rows/s): medians over ``repeats``, ours and peer alternating per repeat so
    that a busy machine slows both alike."""
    ours()  # warm-up
    peer()
    times: Dict[str, List[float]] = {"ours": [], "peer": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("peer", peer)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return rows_per_call / statistics.median(times["ours"]), rows_per_call / statistics.median(
        times["peer"]
    )


class _Batches:
    """The same key batches, tensors and pre-encoded bytes for ours and the peer."""

    def __init__(self, key_space: int, num_batches: int, codec_prefix: bytes = b"") -> None:
        from dynamicemb_core.plugins.row_codec import RowCodec, encode_keys
        from dynamicemb_core.types import StorageTableSpec

        self.spec = StorageTableSpec("bench", dim=DIM, row_width=DIM)
        codec = RowCodec(self.spec)
        g = torch.Generator().manual_seed(0)
        self.all_keys = torch.randperm(key_space, generator=g).to(torch.int64) * 7919 - 12345
        self.keys = [
            self.all_keys[torch.randint(0, key_space, (BATCH,), generator=g)].unique()
            for _ in range(num_batches)
        ]
        self.rows = [torch.randn(k.numel(), DIM, generator=g) for k in self.keys]
        self.scores = [torch.randint(0, 2**40, (k.numel(), 1), generator=g) for k in self.keys]
        self.values = [codec.encode(r, s) for r, s in zip(self.rows, self.scores)]
        self.raw_keys = [encode_keys(k, codec_prefix) for k in self.keys]
        self.i = 0

    def next(self) -> int:
        self.i = (self.i + 1) % len(self.keys)
        return self.i


def _ours_vs_peer(
    args: argparse.Namespace,
    b: _Batches,
    storage: Any,
    peer_write: Callable[[int], Any],
    peer_read: Callable[[int], Sequence[Any]],
    cases: Tuple[str, str],
) -> List[Tuple[str, float, float]]:
    """Preload every batch into both, then time insert and find of ``storage`` against the peer's
    ``peer_write(i)`` / ``peer_read(i)`` of the same batch ``i``; one row per case (insert, find)."""
    for i in range(len(b.keys)):  # preload both so find always hits
        storage.insert(0, b.keys[i], b.rows[i], b.scores[i])
        peer_write(i)

    def ours_insert() -> None:
        i = b.next()
        storage.insert(0, b.keys[i], b.rows[i], b.scores[i])

    def peer_insert() -> None:
        peer_write(b.next())

    def ours_find() -> None:
        found, _, _ = storage.find(0, b.keys[b.next()])
        assert bool(found.all())

    def peer_find() -> None:
        assert peer_read(b.next())[0] is not None

    n = b.keys[0].numel()
    return [
        (case, *_compare(ours, peer, n, args.calls, args.repeats))
        for case, ours, peer in zip(cases, (ours_insert, ours_find), (peer_insert, peer_find))
    ]


def bench_redis(args: argparse.Namespace) -> List[Tuple[str, float, float]]:
    import redis

    from demb_redis import RedisStorage
    from demb_redis.server import LocalRedisServer

    with LocalRedisServer() as server:
        b = _Batches(args.key_space, args.batches)
        storage = RedisStorage([b.spec], url=server.url, model="bench")
        raw = redis.Redis.from_url(server.url)
        # the peer uses plain string keys in the same tagged namespace, one key per row
        peer_keys = [[b"demb:{bench:peer}:" + k for k in ks] for ks in b.raw_keys]
        out = _ours_vs_peer(
            args,
            b,
            storage,
            lambda i: raw.mset(dict(zip(peer_keys[i], b.values[i]))),
            lambda i: raw.mget(peer_keys[i]),
            ("redis insert (HSET vs MSET)", "redis find (HMGET vs MGET)"),
        )
        storage.clear()
        storage.close()
    return out


def bench_rocksdb(args: argparse.Namespace) -> List[Tuple[str, float, float]]:
    from rocksdict import Options, Rdict, WriteBatch

    from demb_rocksdb import RocksDBStorage

    with tempfile.TemporaryDirectory(prefix="demb-bench-") as tmp:
        b = _Batches(args.key_space, args.batches, codec_prefix=b"bench\x00")
        storage = RocksDBStorage([b.spec], path=os.path.join(tmp, "ours"))
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        raw = Rdict(os.path.join(tmp, "peer"), options)

        def peer_write(i: int) -> None:
            wb = WriteBatch(raw_mode=True)
            for k, v in zip(b.raw_keys[i], b.values[i]):
                wb.put(k, v)
            raw.write(wb)

        out = _ours_vs_peer(
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


def render(results: List[Tuple[str, float, float]], command: str) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"Machine: {_cpu()}; GPU: none (host-side storage tiers). torch {torch.__version__}, "
        f"fbgemm-gpu-cpu {_version('fbgemm-gpu-cpu')}, torchrec {_version('torchrec')}; redis-server "
        f"{_redis_server_version()} on loopback, redis-py {_version('redis')} + hiredis {_version('hiredis')}, "
        f"rocksdict {_version('rocksdict')}. Commit {commit}. Command: `{command}`.",
        "",
        f"Batches of {BATCH} rows x 512 B (128 float32 + one int64 score; 528 B stored with the header), "
        "100k-key space, median of repeats. Rates in thousand rows per second; `speedup = peer_time / our_time`.",
        "",
        "| case | ours (k rows/s) | peer: raw client (k rows/s) | speedup |",
        "|---|---:|---:|---:|",
    ]
    for case, ours, peer in results:
        lines.append(f"| {case} | {ours / 1e3:.0f} | {peer / 1e3:.0f} | {ours / peer:.2f} |")
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
    args = parser.parse_args(argv)
    args.key_space, args.batches = (20_000, 4) if args.small else (100_000, 24)
    args.calls, args.repeats = (2, 2) if args.small else (8, 11)
    results: List[Tuple[str, float, float]] = []
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
