"""What ScoredHashTable calls return. Tensors are on the table's device; scores in user order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from torch import Tensor

__all__ = ["EvictedItems", "ExportResult", "FindResult", "InsertResult"]


@dataclass
class FindResult:
    """Attributes:
    slots: (n,) int64 local slots, -1 where missing.
    found: (n,) bool.
    scores: (n, k) int64 in user order (after the touch when ``update_score``), zeros where
        missing; k is the table's score count, or the largest over all tables when the call's
        ``table_ids`` is a tensor.
    """

    slots: Tensor
    found: Tensor
    scores: Tensor


@dataclass
class EvictedItems:
    """Keys an inserting call evicted (all fields have m = 0 rows when nothing was evicted).

    Attributes:
        keys: (m,) int64.
        slots: (m,) int64: the local slot each key had (now held by the new key that took it).
        scores: (m, k) int64 the evicted keys' scores, user order.
        table_ids: (m,) int64.
        rows: the evicted keys' value rows read before the new keys' rows were written: an
            (m, row_width) tensor when the evicting tables share a row width, a list of m
            (row_width,) tensors when they do not, None when row_width is 0.
    """

    keys: Tensor
    slots: Tensor
    scores: Tensor
    table_ids: Tensor
    rows: Optional[Union[Tensor, List[Tensor]]] = None

    def __len__(self) -> int:
        return int(self.keys.numel())


@dataclass
class InsertResult:
    """Attributes:
    slots: (n,) int64 local slots, -1 for keys that could not be placed.
    is_new: (n,) bool, true for keys this call placed (every occurrence).
    evicted: the keys this call evicted.
    """

    slots: Tensor
    is_new: Tensor
    evicted: EvictedItems


@dataclass
class ExportResult:
    """Attributes:
    keys: (m,) int64, in slot order.
    slots: (m,) int64 local slots.
    scores: (m, num_scores) int64, user order.
    """

    keys: Tensor
    slots: Tensor
    scores: Tensor
