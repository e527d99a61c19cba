"""``FaultyStorage``: a Storage wrapper that fails chosen calls, to test what survives a store outage.

It wraps any storage (a plugin, ``PyDictStorage``, a host table: a per-table one through
``as_storage``'s adapter) and presents the multi-table :class:`~dynamicemb_core.types.Storage`
contract; it raises :class:`InjectedStorageFault` instead of (or, with ``when="after"``, after) forwarding a call:

- ``fail_nth={"insert": 3}``: the 3rd ``insert`` counted from construction or the last :meth:`arm`
  fails (an int, or a set of call numbers);
- ``rate=0.2, seed=7``: each faultable call fails with probability 0.2, reproducibly;
- :meth:`down` / :meth:`up`: every faultable call fails until the store is back (an outage).

``when="before"`` (default) models a refused call (nothing written); ``when="after"`` models a lost
acknowledgement (the call took effect, then the caller saw an error). Faultable methods are the
Storage ABC's data calls (:data:`FAULTABLE`); everything else, including attributes of the wrapped
object outside the ABC (a host table's ``table``, ``read_rows`` ...), passes through unfaulted, so
slot-based checkpoints still work through the wrapper.
"""

from __future__ import annotations

import random
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import torch

from dynamicemb_core.storage.contract.adapter import AnyStorage, as_storage
from dynamicemb_core.types import MemoryType, Storage

__all__ = ["FAULTABLE", "FaultyStorage", "InjectedStorageFault"]

FAULTABLE = ("find", "insert", "erase", "sizes", "export", "dump", "load", "flush")


class InjectedStorageFault(ConnectionError):
    """The failure :class:`FaultyStorage` injected (a ``ConnectionError``, like a store outage)."""


class FaultyStorage(Storage):
    """``inner`` with injected failures (see the module docstring).

    Args:
        inner: the storage to wrap (its tables and device are this storage's); a
            ``PerTableStorage`` is wrapped in the per-table adapter first.
        fail_nth: per method name, the call number(s) (1-based) that fail.
        rate: probability that any faultable call fails.
        seed: seed of the random failures.
        when: ``"before"`` (the call is not forwarded) or ``"after"`` (forwarded, then raises).
        methods: the methods ``rate`` and :meth:`down` apply to (default: all of :data:`FAULTABLE`).

    Attributes:
        calls: per method, calls since the last :meth:`arm`.
        injected: failures raised so far, as ``(method, call number)``.
    """

    def __init__(
        self,
        inner: AnyStorage,
        *,
        fail_nth: Optional[Mapping[str, Union[int, Iterable[int]]]] = None,
        rate: float = 0.0,
        seed: int = 0,
        when: str = "before",
        methods: Iterable[str] = FAULTABLE,
    ) -> None:
        super().__init__(inner.tables, inner.device)
        self.inner = as_storage(inner)
        self.methods = _check_methods(methods)
        self.injected: list[Tuple[str, int]] = []
        self._down = False
        self.arm(fail_nth, rate=rate, seed=seed, when=when)

    def arm(
        self,
        fail_nth: Optional[Mapping[str, Union[int, Iterable[int]]]] = None,
        *,
        rate: float = 0.0,
        seed: int = 0,
        when: str = "before",
    ) -> None:
        """Set new failures and restart the per-method call counts."""
        if when not in ("before", "after"):
            raise ValueError(f"FaultyStorage: when must be 'before' or 'after', got {when!r}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"FaultyStorage: rate must be in [0, 1], got {rate}")
        nth: Dict[str, Set[int]] = {}
        for name, which in (fail_nth or {}).items():
            _check_methods([name])
            nth[name] = {which} if isinstance(which, int) else set(which)
        self._nth, self._rate, self._when = nth, float(rate), when
        self._rng = random.Random(seed)
        self.calls: Dict[str, int] = {m: 0 for m in FAULTABLE}

    def disarm(self) -> None:
        """No more failures (the store is healthy)."""
        self.arm(None)
        self._down = False

    def down(self) -> None:
        """Every faultable call fails until :meth:`up`."""
        self._down = True

    def up(self) -> None:
        self._down = False

    def _fails(self, method: str) -> bool:
        self.calls[method] += 1
        n = self.calls[method]
        fail = n in self._nth.get(method, ())
        if method in self.methods:
            fail = fail or self._down
            if self._rate > 0.0:  # drawn on every call, so a seed gives one sequence
                fail = (self._rng.random() < self._rate) or fail
        if fail:
            self.injected.append((method, n))
        return fail

    def _call(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        if not self._fails(method):
            return fn(*args)
        n = self.calls[method]
        if self._when == "after":
            fn(*args)
            raise InjectedStorageFault(
                f"injected fault: {method} call {n} on {type(self.inner).__name__} took effect, "
                "then failed (lost acknowledgement)"
            )
        raise InjectedStorageFault(
            f"injected fault: {method} call {n} on {type(self.inner).__name__} refused"
        )

    # ---- Storage ABC, faulted ------------------------------------------------------------------
    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._call("find", self.inner.find, keys, table_ids)

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        self._call("insert", self.inner.insert, keys, table_ids, rows, scores)

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        self._call("erase", self.inner.erase, keys, table_ids)

    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        return list(self._call("sizes", self.inner.sizes, table_ids))

    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        # The whole export is one call: it fails before its first batch (or, "after", once drained).
        batches = self._call("export", lambda: list(self.inner.export(table_ids, batch_size)))
        yield from batches

    def dump(self, path: str) -> None:
        self._call("dump", self.inner.dump, path)

    def load(self, path: str) -> None:
        self._call("load", self.inner.load, path)

    def flush(self) -> None:
        self._call("flush", self.inner.flush)

    # ---- passed through ------------------------------------------------------------------------
    def close(self) -> None:
        self.inner.close()

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        return self.inner.memory_usage(mem_type)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class lacks: the wrapped object's own extras.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _check_methods(methods: Iterable[str]) -> Tuple[str, ...]:
    methods = tuple(methods)
    unknown = [m for m in methods if m not in FAULTABLE]
    if unknown:
        raise ValueError(
            f"FaultyStorage: no faultable method(s) {unknown}; choose from {FAULTABLE}"
        )
    return methods
