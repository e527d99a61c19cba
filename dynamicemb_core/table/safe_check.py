"""``safe_check_mode``: what happens when keys of a batch could not be placed (the one rule).

A key is *unplaced* when its bucket is full of keys pinned or written by the same call (or a
NO_EVICTION table cannot grow). It reads as zeros and gets no update (the seed's behaviour).

- ERROR: raise :class:`~dynamicemb_core.types.DynamicEmbError` naming the table and the count.
- WARNING: a ``DynamicEmbWarning`` for every batch that has unplaced keys.
- IGNORE: no check per batch, but the first batch of a table with unplaced keys warns once, so a
  table that silently drops keys is still visible; the counts stay readable as metrics
  (``BatchedDynamicEmbeddingTables.metrics()``).
"""

from __future__ import annotations

import warnings
from typing import Optional, Set

from dynamicemb_core.config import DynamicEmbCheckMode
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

__all__ = ["UnplacedKeyReport", "unplaced_message"]


def unplaced_message(name: str, failed: int, total: Optional[int] = None) -> str:
    """The text every safe_check_mode report uses: what happened and how to avoid it."""
    count = f"{failed} of {total} keys" if total is not None else f"{failed} key(s)"
    return (
        f"table {name!r}: {count} of this batch could not be inserted (their bucket is "
        "full of keys used in the same batch); they read as zeros and get no update. Raise "
        "bucket_capacity or max_capacity to avoid it"
    )


class UnplacedKeyReport:
    """Applies ``safe_check_mode`` to a batch's unplaced-key count, remembering which tables
    already gave their one IGNORE warning."""

    def __init__(self) -> None:
        self._warned: Set[str] = set()

    def __call__(
        self,
        name: str,
        mode: DynamicEmbCheckMode,
        failed: int,
        total: Optional[int] = None,
        *,
        stacklevel: int = 3,
    ) -> None:
        """Raise or warn for ``failed`` unplaced keys of table ``name`` (nothing when 0)."""
        if failed == 0:
            return
        message = unplaced_message(name, failed, total)
        if mode == DynamicEmbCheckMode.ERROR:
            raise DynamicEmbError(message)
        if mode == DynamicEmbCheckMode.WARNING:
            warnings.warn(message, DynamicEmbWarning, stacklevel=stacklevel)
            return
        if name in self._warned:
            return
        self._warned.add(name)
        warnings.warn(
            message + " (safe_check_mode=IGNORE: this warning is given once per table; the "
            "counts are in metrics()['unplaced'])",
            DynamicEmbWarning,
            stacklevel=stacklevel,
        )
