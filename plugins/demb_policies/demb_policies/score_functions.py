"""Named eviction score functions for the compound (TIMESTAMP, LFU) strategy.

``decayed_lfu`` ranks a key by ``log(count) - age * ln(2) / half_life``: its access count halved for
every ``half_life_s`` seconds since its last access, in log space (the same order as
``count * 2^(-age / half_life)`` without overflow or underflow). A key used often long ago loses to
one used a little, recently; among keys of the same age it is plain LFU. The lowest value is
evicted first.

The table compiles the function with numba (``numba.cfunc`` on CPU, numba-cuda on GPU), so each one
must be a plain Python function ``f(scores, cur_timestamp)`` with its constants in the body and
``scores`` indexed by constants. The score words arrive in the order of the table's strategy tuple,
so there is one function per order, and the half-life is written into the function's source: the
factory generates a function per (order, half-life) from one template, so the formula lives in
exactly one place.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Sequence, Tuple

from dynamicemb_core.config import DynamicEmbScoreStrategy, normalize_score_strategy

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "decayed_lfu_count_first",
    "decayed_lfu_ts_first",
    "make_decayed_lfu",
]

ScoreFunction = Callable[..., float]
DEFAULT_HALF_LIFE_S = 3600.0  # one hour: a key idle for a day keeps 2^-24 of its count

_TEMPLATE = '''
def {name}(scores, cur_timestamp):
    """Decayed LFU: log(count) minus age (ns) times ln(2) / ({half_life_s!r} s). Lowest evicted first."""
    age_ns = cur_timestamp - scores[{ts}]
    if age_ns < 0:
        age_ns = 0
    return math.log(max(scores[{count}], 1)) - age_ns * {rate_per_ns!r}
'''

_made: Dict[Tuple[bool, float], ScoreFunction] = {}


def _generate(timestamp_first: bool, half_life_s: float) -> ScoreFunction:
    key = (timestamp_first, half_life_s)
    if key not in _made:
        name = "decayed_lfu_ts_first" if timestamp_first else "decayed_lfu_count_first"
        source = _TEMPLATE.format(
            name=name,
            half_life_s=half_life_s,
            ts=0 if timestamp_first else 1,
            count=1 if timestamp_first else 0,
            rate_per_ns=math.log(2.0) / (half_life_s * 1e9),
        )
        namespace: Dict[str, object] = {"math": math}
        exec(
            compile(source, f"<demb_policies.{name} half_life_s={half_life_s}>", "exec"), namespace
        )
        fn = namespace[name]
        fn.__module__ = __name__  # type: ignore[attr-defined]
        fn.__source__ = source  # type: ignore[attr-defined]  # for readers: the code numba compiles
        _made[key] = fn  # type: ignore[assignment]
    return _made[key]


def make_decayed_lfu(
    score_strategy: Sequence[DynamicEmbScoreStrategy], half_life_s: float = DEFAULT_HALF_LIFE_S
) -> ScoreFunction:
    """The ``decayed_lfu`` factory: a score function for a table with this strategy tuple.

    Args:
        score_strategy: the table's compound strategy, (TIMESTAMP, LFU) or (LFU, TIMESTAMP).
        half_life_s: seconds after which an idle key's count weighs half (> 0).

    Returns:
        A plain function ``f(scores, cur_timestamp) -> float`` (same object for the same inputs).

    Raises:
        ValueError: the strategy is not the compound pair, or half_life_s is not positive.
    """
    strategies = normalize_score_strategy(score_strategy)
    if len(strategies) != 2:
        raise ValueError(
            f"score_function 'decayed_lfu' needs the compound score_strategy (TIMESTAMP, LFU) in either "
            f"order, got {tuple(s.name for s in strategies)}"
        )
    if not (
        isinstance(half_life_s, (int, float)) and math.isfinite(half_life_s) and half_life_s > 0
    ):
        raise ValueError(
            f"score_function 'decayed_lfu': half_life_s must be a positive number, got {half_life_s!r}"
        )
    return _generate(strategies[0] == DynamicEmbScoreStrategy.TIMESTAMP, float(half_life_s))


decayed_lfu_ts_first = _generate(True, DEFAULT_HALF_LIFE_S)  # for (TIMESTAMP, LFU) tables
decayed_lfu_count_first = _generate(False, DEFAULT_HALF_LIFE_S)  # for (LFU, TIMESTAMP) tables
