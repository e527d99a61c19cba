"""Compile a compound strategy's ``score_function`` for the CUDA kernels with numba-cuda.

On CPU the function becomes a C callback (:mod:`dynamicemb_core.table.score_function`) that the
kernel calls per candidate slot. A GPU kernel cannot call a function it was not linked with, so on
CUDA the function is compiled, as a numba-cuda device function, into a small kernel::

    victim_ranks(scores, slot_offsets, t, now, out)   # out[g] = f(user-order words of g, now[t])

that the C++ insert op launches (by handle, csrc/cuda/score_fn_launch.cuh) right before it picks
victims. Ranking every slot first is exact, not an approximation: the contract protects every slot
a call writes, so a victim's words are still the ones it had when the call began. ``now`` is the
call's resolved time (the device clock, or ``cur_scores[t]`` when given), the same value the CPU
kernel passes, so the same Python function picks the same victims on both devices.

Compiled kernels are cached per (function object, column order, device, compute capability) and
kept alive, with the function, for the life of the process, because the handle in ``score_fns``
points into them. Keyed by the object, not its source, as on CPU (score_function.py says why).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch

from dynamicemb_core.config import (
    DynamicEmbScoreStrategy,
    ScoreStrategySpec,
    normalize_score_strategy,
)
from dynamicemb_core.table.score_function import FunctionKey, compile_score_function

__all__ = ["CompiledCudaScoreFunction", "compile_score_function_cuda", "score_fn_handle"]

_cache: Dict[Tuple[Any, ...], "CompiledCudaScoreFunction"] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class CompiledCudaScoreFunction:
    """A compiled ranking kernel: ``handle`` (a CUkernel) is what ``score_fns[t]`` carries."""

    handle: int
    kernel: Any  # the numba dispatcher; owns the loaded module the handle points into
    timestamp_first: bool
    compute_capability: Tuple[int, int]


def _timestamp_first(score_strategy: ScoreStrategySpec) -> bool:
    strategies = normalize_score_strategy(score_strategy)
    if len(strategies) != 2:
        raise ValueError(
            "score_function is only supported with the compound score_strategy (TIMESTAMP, LFU) in "
            f"either order; got {tuple(s.name for s in strategies)}"
        )
    return strategies[0] == DynamicEmbScoreStrategy.TIMESTAMP


def compile_score_function_cuda(
    fn: Callable[..., float],
    score_strategy: ScoreStrategySpec,
    device: torch.device | str | int,
) -> CompiledCudaScoreFunction:
    """Compile ``fn`` into the ranking kernel for a compound table on a CUDA ``device``.

    Args:
        fn: numba-compilable ``f(scores, cur_timestamp) -> float``, ``scores`` in the tuple order of
            ``score_strategy``; NaN means "evict first".
        score_strategy: (TIMESTAMP, LFU) or (LFU, TIMESTAMP).
        device: the CUDA device the table lives on.

    Returns:
        The compiled kernel and its handle (cached).

    Raises:
        ValueError: the strategy is not the compound pair, or ``device`` is not a CUDA device.
        TypeError: numba-cuda cannot compile ``fn`` (the message carries numba's reason).
    """
    timestamp_first = _timestamp_first(score_strategy)
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise ValueError(f"compile_score_function_cuda needs a CUDA device, got {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(index)
    key = (FunctionKey(fn), timestamp_first, index, cc)
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            hit = _cache[key] = _compile(fn, timestamp_first, index, cc)
    return hit


def score_fn_handle(
    fn: Callable[..., float] | None,
    score_strategy: ScoreStrategySpec,
    device: torch.device | str,
) -> int:
    """The ``score_fns[t]`` entry for a table on ``device``: 0 without a function, else the CPU
    callback's address or the CUDA kernel's handle. One call for the table class on any device."""
    if fn is None:
        return 0
    dev = torch.device(device)
    if dev.type == "cuda":
        return compile_score_function_cuda(fn, score_strategy, dev).handle
    return compile_score_function(fn, score_strategy).address


def _compile(
    fn: Callable[..., float], timestamp_first: bool, index: int, cc: Tuple[int, int]
) -> CompiledCudaScoreFunction:
    from numba import cuda, types

    signature = types.void(
        types.CPointer(types.int64),  # scores: (S, 2) internal order [count, timestamp]
        types.CPointer(types.int64),  # slot_offsets: (T+1,)
        types.int64,  # t: the table to rank
        types.CPointer(types.int64),  # now: (T,) the call's resolved time per table
        types.CPointer(types.float64),  # out: (S,) ranks
    )
    try:
        user = cuda.jit(device=True)(fn)
        if timestamp_first:

            def victim_ranks(  # numba kernel; user order [ts, count]
                scores: Any, slot_offsets: Any, t: int, now: Any, out: Any
            ) -> None:
                # numba's stub types the intrinsic's typing-time signature (typingctx, ndim)
                g = slot_offsets[t] + cuda.grid(1)  # type: ignore[call-arg]
                end = slot_offsets[t + 1]
                at = now[t]
                while g < end:
                    out[g] = user((scores[2 * g + 1], scores[2 * g]), at)
                    g += cuda.gridsize(1)
        else:

            def victim_ranks(  # numba kernel; user order [count, ts]
                scores: Any, slot_offsets: Any, t: int, now: Any, out: Any
            ) -> None:
                # numba's stub types the intrinsic's typing-time signature (typingctx, ndim)
                g = slot_offsets[t] + cuda.grid(1)  # type: ignore[call-arg]
                end = slot_offsets[t + 1]
                at = now[t]
                while g < end:
                    out[g] = user((scores[2 * g], scores[2 * g + 1]), at)
                    g += cuda.gridsize(1)

        with cuda.gpus[index]:
            kernel = cuda.jit(signature)(victim_ranks)
            compiled = next(iter(kernel.overloads.values()))
            # numba-cuda exposes no public accessor for the loaded function; the code library's
            # cufunc is the kernel loaded in this device's (primary) context, the one torch uses.
            handle = int(compiled._codelibrary.get_cufunc().handle)
    except Exception as err:  # numba raises its own error types; surface one clear TypeError
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"score_function {name} could not be compiled with numba-cuda for cuda:{index} "
            f"(sm_{cc[0]}{cc[1]}); it must index scores with constants and return a number: {err}"
        ) from err
    return CompiledCudaScoreFunction(handle, kernel, timestamp_first, cc)
