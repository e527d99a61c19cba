"""Callbacks that do not keep their owner alive.

A hash table calls back the storage that owns it (growth listeners, the counters' ``before_read``);
a bound method of the owner stored in the table would make a reference cycle (owner -> table ->
method -> owner), and the owner's device memory would stay allocated after ``del`` until Python's
cycle collector happens to run. :func:`weak_method` holds the owner weakly instead.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

__all__ = ["weak_method"]


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """A callable that calls the bound ``method`` while its object lives, and does nothing after."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call
