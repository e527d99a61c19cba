"""Score columns as they leave and re-enter a table: names, which are clocks, and the age encoding.

A timestamp is a reading of one device's clock (``%globaltimer`` on CUDA, ``steady_clock`` on the CPU), so
it means nothing to another device, another process or the same one after a restart. Files and deltas
therefore carry a timestamp column as an *age*: ``now_at_dump - timestamp``; a reader re-bases it on its
own clock as ``now_at_load - age``. Relative order (what eviction and thresholds look at) survives exactly.
Counts (LFU), steps and custom scores are not clocks and travel as they are.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbScoreStrategy, DynamicEmbTableOptions

__all__ = [
    "clock_columns",
    "default_scores",
    "from_ages",
    "score_column_names",
    "to_ages",
]

# NO_EVICTION scores by insertion number, not by time (docs/table_design.md, "Policy codes and
# score words"): its column travels as it is, like STEP's.
_CLOCKS = (DynamicEmbScoreStrategy.TIMESTAMP,)


def score_column_names(options: DynamicEmbTableOptions) -> Tuple[str, ...]:
    """Strategy names of the score columns in the user's tuple order, e.g. ``("LFU", "TIMESTAMP")``."""
    return tuple(s.name for s in options.score_strategies)


def clock_columns(options: DynamicEmbTableOptions) -> List[int]:
    """Indices (user order) of the columns that hold clock readings."""
    return [i for i, s in enumerate(options.score_strategies) if s in _CLOCKS]


def to_ages(scores: torch.Tensor, columns: Sequence[int], now: int) -> torch.Tensor:
    """Copy of ``scores`` (n, k) int64 with each clock column replaced by ``now - timestamp``."""
    out = scores.clone()
    for c in columns:
        out[:, c] = now - out[:, c]
    return out


def from_ages(scores: torch.Tensor, columns: Sequence[int], now: int) -> torch.Tensor:
    """Inverse of :func:`to_ages` on the reader's clock: each clock column becomes ``now - age``."""
    return to_ages(scores, columns, now)  # now - (now_then - ts) re-based: the same subtraction


def default_scores(
    options: DynamicEmbTableOptions, n: int, *, now: int, current: int, device: torch.device
) -> torch.Tensor:
    """Scores for rows restored without their source scores: every key scores alike.

    Clock columns get ``now``; STEP, CUSTOMIZED and NO_EVICTION get the table's ``current`` score (its
    next insertion number for NO_EVICTION); LFU counts 1 (one access, as for a freshly inserted key). Built from zeros so a column no rule fills is deterministic.

    Returns:
        (n, num_scores) int64 on ``device``, in the strategy tuple's order.
    """
    out = torch.zeros(n, options.num_scores, dtype=torch.int64, device=device)
    for c, strategy in enumerate(options.score_strategies):
        if strategy in _CLOCKS:
            out[:, c] = now
        elif strategy == DynamicEmbScoreStrategy.LFU:
            out[:, c] = 1
        else:
            out[:, c] = current
    return out
