"""How much headroom a dynamic table needs: distinct ids vs capacity vs evictions.

    python -m dynamicemb_core.demo.sizing [--ids 943 10000] [--factors 1 1.25 1.5 2] [--epochs 3]

A dynamic table places each key in one bucket chosen by its hash and evicts only inside that
bucket. Hashing spreads n ids over the buckets unevenly (a multinomial, not a perfect deal), so
with exactly n slots some buckets are handed more keys than they have slots and evict while
others keep free slots: a table sized at its id count still evicts, epoch after epoch, even though
the ids would fit. This measures it with :class:`~dynamicemb_core.table.ScoredHashTable` as the
planner sizes a table (one rank: ``num_embeddings`` rounded up to whole buckets of 128): for each
id count and capacity factor, every id is inserted once per epoch, in shuffled batches, and the
evictions per epoch and the ids kept at the end are printed. docs/sizing.md reports one run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from dynamicemb_core.planner.capacity import DEFAULT_BUCKET_CAPACITY, align_up

__all__ = ["SizingResult", "main", "measure"]


@dataclass(frozen=True)
class SizingResult:
    """One measurement: ``ids`` distinct keys in a table of ``capacity`` slots."""

    ids: int
    factor: float
    num_embeddings: int
    capacity: int
    evictions_per_epoch: List[int]
    kept: int  # distinct ids present after the last epoch


def measure(
    ids: int,
    factor: float,
    epochs: int = 3,
    batch_size: int = 256,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
    seed: int = 0,
) -> SizingResult:
    """Insert ids 1..``ids`` ``epochs`` times into a table of ``num_embeddings = ceil(factor*ids)``.

    The capacity is what the planner gives one rank: ``num_embeddings`` rounded up to whole buckets.
    The table starts at that capacity (no doubling) and evicts by TIMESTAMP, the default strategy.
    """
    from dynamicemb_core.table import ScoredHashTable, TableSpec

    num_embeddings = -(-int(ids * factor * 1000) // 1000)  # ceil without float noise
    capacity = align_up(num_embeddings, bucket_capacity)
    spec = TableSpec(
        name=f"ids_{ids}_x{factor:g}",
        row_width=0,
        init_capacity=capacity,
        max_capacity=capacity,
        bucket_capacity=bucket_capacity,
    )
    table = ScoredHashTable([spec], device="cpu")
    keys = torch.arange(1, ids + 1, dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    per_epoch: List[int] = []
    for _ in range(epochs):
        order = keys[torch.randperm(ids, generator=generator)]
        evicted = 0
        for start in range(0, ids, batch_size):
            result = table.insert_and_evict(order[start : start + batch_size], 0)
            evicted += 0 if result.evicted is None else int(result.evicted.keys.numel())
        per_epoch.append(evicted)
    kept = int(table.find(keys, 0).found.sum())
    return SizingResult(ids, factor, num_embeddings, table.capacity(0), per_epoch, kept)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one row per (id count, factor)."""
    parser = argparse.ArgumentParser(prog="python -m dynamicemb_core.demo.sizing")
    parser.add_argument("--ids", type=int, nargs="+", default=[943, 10_000])
    parser.add_argument("--factors", type=float, nargs="+", default=[1.0, 1.25, 1.5, 2.0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        f"{'ids':>7} {'factor':>6} {'num_emb':>8} {'slots':>7} {'evicted per epoch':>22} {'kept':>12}"
    )
    for ids in args.ids:
        for factor in args.factors:
            r = measure(ids, factor, epochs=args.epochs, seed=args.seed)
            per_epoch = ", ".join(map(str, r.evictions_per_epoch))
            print(
                f"{r.ids:>7} {r.factor:>6g} {r.num_embeddings:>8} {r.capacity:>7} "
                f"{per_epoch:>22} {r.kept:>6}/{r.ids:<6}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
