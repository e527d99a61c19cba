"""Insert past capacity under each score strategy and show what the table keeps.

    python -m dynamicemb_core table-demo [--batches 4] [--fresh 24] [--hot 8] [--device cpu]

One :class:`~dynamicemb_core.table.ScoredHashTable` holds one logical table per strategy (TIMESTAMP,
STEP, CUSTOMIZED, LFU, NO_EVICTION, and the compound (TIMESTAMP, LFU) ranked by a score function),
each starting at 32 slots and allowed 64 (NO_EVICTION: 1024). The first batch inserts a few
"hot" keys three times each (LFU counts every occurrence) plus fresh keys; every later batch inserts
only fresh keys. The tables fill, double to 64 and then evict. After each batch the demo prints
size, capacity and the number of keys evicted; at the end, what each table exports.

What to look for: TIMESTAMP, STEP and CUSTOMIZED evict the oldest keys, so the hot keys of the first
batch go first; LFU and the compound table keep them (count 3 against 1); NO_EVICTION evicts
nothing and keeps doubling instead.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import torch

from dynamicemb_core.config import DynamicEmbScoreStrategy, ScoreStrategySpec

if TYPE_CHECKING:
    from dynamicemb_core.table import ScoredHashTable

__all__ = ["DEMO_TABLES", "DemoTable", "batch_keys", "decayed_lfu_score", "main", "run"]

_S = DynamicEmbScoreStrategy
# NO_EVICTION never evicts: it grows up to its max_capacity, which the demo sets high.
NO_EVICTION_MAX = 1024
_ROW_WIDTH = 4  # elements per value row: small enough to print
_SHOWN_ROWS = 5  # export rows printed per table


def decayed_lfu_score(scores: Sequence[int], cur_timestamp: int) -> float:
    """Time-decayed LFU for the (TIMESTAMP, LFU) compound strategy: higher is kept longer.

    ``scores[0]`` is the last access time in nanoseconds, ``scores[1]`` the access count (the order
    of the strategy tuple). Frequency counts logarithmically; every second of staleness costs a
    factor 0.9, so a key touched often long ago can still lose to a recent one.
    """
    age_seconds = (cur_timestamp - scores[0]) * 1e-9
    return math.log(max(scores[1], 1)) + age_seconds * math.log(0.9)


@dataclass(frozen=True)
class DemoTable:
    """One logical table of the demo: a label, its strategy and an optional score function."""

    name: str
    strategy: ScoreStrategySpec
    score_function: Optional[Callable[[Sequence[int], int], float]] = None


DEMO_TABLES: List[DemoTable] = [
    DemoTable("timestamp", _S.TIMESTAMP),
    DemoTable("step", _S.STEP),
    DemoTable("customized", _S.CUSTOMIZED),
    DemoTable("lfu", _S.LFU),
    DemoTable("no_eviction", _S.NO_EVICTION),
    DemoTable("compound", (_S.TIMESTAMP, _S.LFU), decayed_lfu_score),
]


HOT_REPEATS = 3  # occurrences of each hot key in the first batch
FIRST_FRESH_KEY = 1_000  # fresh keys count up from here; hot keys are 0..hot-1


def batch_keys(batch: int, hot: int, fresh: int) -> torch.Tensor:
    """Keys of one batch (int64): fresh keys never seen before, after the repeated hot keys in batch 0."""
    first_fresh = FIRST_FRESH_KEY + batch * fresh
    fresh_keys = torch.arange(first_fresh, first_fresh + fresh)
    if batch > 0:
        return fresh_keys
    return torch.cat([torch.arange(hot).repeat(HOT_REPEATS), fresh_keys])


def _rows_for(keys: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """Value rows that say where they came from: [key, batch, 0, 0] (n, _ROW_WIDTH)."""
    rows = torch.zeros(keys.numel(), _ROW_WIDTH, dtype=dtype)
    rows[:, 0] = keys.to(dtype)
    rows[:, 1] = batch
    return rows


def run(batches: int = 4, hot: int = 8, fresh: int = 24, device: str = "cpu") -> "ScoredHashTable":
    """Build the demo tables on ``device``, insert ``batches`` batches, print what happens.

    Returns:
        The table, one logical table per entry of :data:`DEMO_TABLES` in that order, so a test can
        check what the demo claims.
    """
    from dynamicemb_core.table import ScoredHashTable, TableSpec

    specs = [
        TableSpec(
            name=t.name,
            row_width=_ROW_WIDTH,
            init_capacity=32,
            max_capacity=NO_EVICTION_MAX if t.strategy == _S.NO_EVICTION else 64,
            bucket_capacity=16,
            score_strategy=t.strategy,
            score_function=t.score_function,
        )
        for t in DEMO_TABLES
    ]
    table = ScoredHashTable(specs, device=device)
    print(
        f"{len(specs)} tables in one ScoredHashTable on {device}: init_capacity 32, max_capacity 64 "
        f"({NO_EVICTION_MAX} for no_eviction), "
        f"bucket_capacity 16; batch 0 = {hot} hot keys x{HOT_REPEATS} + {fresh} fresh keys, "
        f"later batches = {fresh} fresh keys\n"
    )
    print(f"{'batch':>5}  " + "  ".join(f"{t.name:>22}" for t in DEMO_TABLES))
    print(f"{'':>5}  " + "  ".join(f"{'size/cap (evicted)':>22}" for _ in DEMO_TABLES))
    for batch in range(batches):
        cells = []
        for t_id, demo in enumerate(DEMO_TABLES):
            keys = batch_keys(batch, hot, fresh).to(device)
            if demo.strategy == _S.CUSTOMIZED:
                table.set_score(t_id, 100 * (batch + 1))  # later batches are worth more
            result = table.insert_and_evict(
                keys, t_id, rows=_rows_for(keys, batch, specs[t_id].dtype).to(device)
            )
            if demo.strategy == _S.STEP:
                table.advance_step(t_id)  # what a forward pass does once per step
            evicted = 0 if result.evicted is None else int(result.evicted.keys.numel())
            cell = f"{table.size(t_id)}/{table.capacity(t_id)} ({evicted})"
            cells.append(f"{cell:>22}")
        print(f"{batch:>5}  " + "  ".join(cells))
    print()
    for t_id, demo in enumerate(DEMO_TABLES):
        _print_export(table, t_id, demo)
    return table


def _print_export(table: "ScoredHashTable", table_id: int, demo: DemoTable) -> None:
    """Print how many keys ``table_id`` exports, how many are hot, and its first rows."""
    exported = table.export(table_id)
    keys = exported.keys.cpu()
    hot_kept = int((keys < FIRST_FRESH_KEY).sum())
    strategy = demo.strategy if isinstance(demo.strategy, tuple) else (demo.strategy,)
    columns = ", ".join(s.name for s in strategy)
    print(
        f"[{demo.name}] exports {keys.numel()} keys, {hot_kept} of them hot; "
        f"score columns: {columns}"
        + (f"; ranked by {demo.score_function.__name__}" if demo.score_function else "")
    )
    if keys.numel() == 0:
        return
    shown = slice(0, _SHOWN_ROWS)
    rows = table.read_rows(table_id, exported.slots[shown]).cpu()
    for key, slot, scores, row in zip(
        keys[shown].tolist(),
        exported.slots[shown].cpu().tolist(),
        exported.scores[shown].cpu().tolist(),
        rows.tolist(),
        strict=True,
    ):
        print(f"    key {key:>6}  slot {slot:>3}  scores {scores}  row {row}")


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` and run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamicemb_core table-demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--batches", type=int, default=4, help="batches to insert (default 4)")
    parser.add_argument("--hot", type=int, default=8, help="keys repeated in every batch (8)")
    parser.add_argument("--fresh", type=int, default=24, help="new keys per batch (24)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = parser.parse_args(argv)
    for name in ("batches", "hot", "fresh"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    run(batches=args.batches, hot=args.hot, fresh=args.fresh, device=args.device)
    return 0
