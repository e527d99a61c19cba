"""Compile a compound strategy's Python ``score_function`` into a C callback for the CPU kernels.

The user writes ``f(scores, cur_timestamp) -> float`` with ``scores[0], scores[1]`` in the order of
the strategy tuple. The kernels know only internal order (``[count, timestamp]``, score_policy.h),
so the callback compiled here is an adapter: ``double cb(const int64_t* words, int64_t now)`` reads
the two internal words and calls the user's function (jitted with numba) with a 2-tuple in the
user's order. The callback's address is what ``score_fns[t]`` carries into the kernels.

Compiled callbacks are cached per (function object, column order): building a second table with the
same function object costs nothing, and the cache keeps the function and the machine code alive for
as long as the process (the address in ``score_fns`` must never dangle). The key is the object, not
its source: two closures of one ``def`` (or two functions with one source but other defaults or
globals) are different functions, and numba freezes captured values and globals into the machine
code, so each gets its own callback.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

from dynamicemb_core.config import (
    DynamicEmbScoreStrategy,
    ScoreStrategySpec,
    normalize_score_strategy,
)

__all__ = ["CompiledScoreFunction", "compile_score_function"]

_cache: Dict[Tuple[Any, ...], "CompiledScoreFunction"] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class CompiledScoreFunction:
    """A compiled adapter: ``address`` of ``double(const int64_t*, int64_t)``; ``cfunc`` owns it."""

    address: int
    cfunc: Any
    timestamp_first: bool


class FunctionKey:
    """A cache key that is one function object: hashed by ``id``, equal only to itself.

    It holds the function, so the id cannot be reused by another object while the key lives (the
    caches below live as long as the process). Works for any callable, hashable or not.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., float]) -> None:
        self.fn = fn

    def __hash__(self) -> int:
        return id(self.fn)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunctionKey) and other.fn is self.fn


def compile_score_function(
    fn: Callable[..., float], score_strategy: ScoreStrategySpec
) -> CompiledScoreFunction:
    """Compile ``fn`` for a compound table whose strategy tuple is ``score_strategy``.

    Args:
        fn: numba-compilable ``f(scores, cur_timestamp) -> float``; NaN means "evict first".
        score_strategy: the table's strategy: (TIMESTAMP, LFU) or (LFU, TIMESTAMP).

    Returns:
        The compiled adapter (cached per function object and column order).

    Raises:
        ValueError: the strategy is not the compound pair.
        TypeError: numba cannot compile ``fn`` (the message carries numba's reason).
    """
    strategies = normalize_score_strategy(score_strategy)
    if len(strategies) != 2:
        raise ValueError(
            "score_function is only supported with the compound score_strategy (TIMESTAMP, LFU) in "
            f"either order; got {tuple(s.name for s in strategies)}"
        )
    timestamp_first = strategies[0] == DynamicEmbScoreStrategy.TIMESTAMP
    key = (FunctionKey(fn), timestamp_first)
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            hit = _cache[key] = _compile(fn, timestamp_first)
    return hit


def _compile(fn: Callable[..., float], timestamp_first: bool) -> CompiledScoreFunction:
    import numba
    from numba import types

    try:
        user = numba.njit(cache=False)(fn)
        signature = types.float64(types.CPointer(types.int64), types.int64)
        if timestamp_first:

            def adapter(words: Any, now: int) -> float:  # internal [count, ts] -> user [ts, count]
                return user((words[1], words[0]), now)
        else:

            def adapter(words: Any, now: int) -> float:  # internal order is the user's [count, ts]
                return user((words[0], words[1]), now)

        # numba's inline annotation of cfunc omits the **options it forwards to the compiler
        compiled = numba.cfunc(signature, nopython=True)(adapter)  # type: ignore[call-arg]
    except Exception as err:  # numba raises its own error types; surface one clear TypeError
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"score_function {name} could not be compiled with numba (it must index scores with "
            f"constants and return a number): {err}"
        ) from err
    address = compiled.address
    assert address is not None  # set once a cfunc is compiled (numba types it Optional)
    return CompiledScoreFunction(address, compiled, timestamp_first)
