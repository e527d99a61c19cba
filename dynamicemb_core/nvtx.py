"""NVTX ranges around the training step's ops and the DMP stages, for ``nsys profile``.

``nsys profile -t cuda,nvtx python train.py`` then shows, on the host timeline, where a step's time
goes: ``dynamicemb::input_dist`` / ``lookup`` / ``output_dist`` (the sharded collection's stages)
and, inside the lookup, ``dynamicemb::unique``, ``find_or_insert``, ``gather`` and, in backward,
``reduce_update``, as NVIDIA's DynamicEmb marks its own. ``torch.cuda.nvtx`` only: no new
dependency. Whether CUDA is present is read once, at import: on a machine without it
:func:`nvtx_range` returns one shared no-op context (no call into CUDA), and with it a push and a
pop cost well under a microsecond when no profiler listens.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, ContextManager, TypeVar

import torch

__all__ = ["NVTX_ENABLED", "nvtx_range", "pop", "push", "ranged"]

F = TypeVar("F", bound=Callable[..., Any])

#: Whether ranges are emitted (CUDA present when this module was imported).
NVTX_ENABLED: bool = torch.cuda.is_available()

_NOOP: ContextManager[None] = contextlib.nullcontext()


class _Range:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        torch.cuda.nvtx.range_push(self.name)

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.nvtx.range_pop()


def nvtx_range(name: str) -> ContextManager[None]:
    """A context that marks its body as the NVTX range ``name`` (a no-op without CUDA)."""
    return _Range(name) if NVTX_ENABLED else _NOOP


def push(name: str) -> None:
    """Open the NVTX range ``name`` (module hooks, where a ``with`` block does not fit)."""
    if NVTX_ENABLED:
        torch.cuda.nvtx.range_push(name)


def pop() -> None:
    """Close the innermost range opened by :func:`push`."""
    if NVTX_ENABLED:
        torch.cuda.nvtx.range_pop()


def ranged(name: str) -> Callable[[F], F]:
    """Decorator: each call of the function is the NVTX range ``name``. Without CUDA it returns
    the function itself, so CPU code pays nothing."""

    def wrap(fn: F) -> F:
        if not NVTX_ENABLED:
            return fn

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            torch.cuda.nvtx.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.nvtx.range_pop()

        return call  # type: ignore[return-value]

    return wrap
