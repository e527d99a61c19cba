"""Per-table batches of looked-up keys (and optionally rows), with TorchRec's DeltaStore semantics.

Each table keeps a list of ``(batch_idx, ids, states)`` in batch order. ``compact`` merges a range of
batches into one (unique ids; for each id the state of its first or last occurrence), ``delete`` drops
batches before an index, ``get_unique`` merges everything from an index on. This mirrors
``torchrec.distributed.model_tracker.delta_store.DeltaStoreTrec`` (the tests use it as the oracle), with
one difference: a table with nothing to report gives empty tensors instead of raising on an empty cat.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from dynamicemb_core.tracking.types import UniqueRows, UpdateMode

__all__ = ["KeyDeltaStore", "unique_rows"]


@dataclass
class _Batch:
    batch_idx: int
    ids: torch.Tensor
    states: Optional[torch.Tensor]


def _states(batch: _Batch) -> torch.Tensor:
    assert batch.states is not None, (
        "append() refuses a batch without states outside UpdateMode.NONE"
    )
    return batch.states


def unique_rows(
    ids: List[torch.Tensor], states: Optional[List[torch.Tensor]], mode: UpdateMode
) -> UniqueRows:
    """Merge batches: unique ids, and per id the state of its first (FIRST) or last (LAST) occurrence."""
    if not ids:
        return UniqueRows(ids=torch.empty(0, dtype=torch.int64), states=None)
    cat_ids = torch.cat(ids)
    if mode == UpdateMode.NONE:
        return UniqueRows(ids=torch.unique(cat_ids), states=None)
    assert states is not None, "states are required when the update mode is not NONE"
    cat_states = torch.cat(states)
    if mode == UpdateMode.LAST:
        cat_ids, cat_states = cat_ids.flip(0), cat_states.flip(0)
    uniq, inverse = torch.unique(cat_ids, sorted=False, return_inverse=True)
    position = torch.arange(cat_ids.numel(), device=cat_ids.device)
    first = torch.full((uniq.numel(),), cat_ids.numel(), dtype=torch.int64, device=cat_ids.device)
    first = first.scatter_reduce(0, inverse, position, reduce="amin")
    return UniqueRows(ids=uniq, states=cat_states[first])


class KeyDeltaStore:
    """Looked-up keys per table FQN, indexed by batch.

    Args:
        mode: how a state is chosen for an id seen in several batches (NONE: ids only).
    """

    def __init__(self, mode: UpdateMode = UpdateMode.NONE) -> None:
        self.mode = mode
        self.per_fqn: Dict[str, List[_Batch]] = {}

    def append(
        self, batch_idx: int, fqn: str, ids: torch.Tensor, states: Optional[torch.Tensor] = None
    ) -> None:
        """Record one batch of ids (and their states) for a table."""
        if self.mode != UpdateMode.NONE and states is None:
            raise ValueError(
                f"delta tracker: table '{fqn}': mode {self.mode.name} needs states with the ids"
            )
        self.per_fqn.setdefault(fqn, []).append(_Batch(batch_idx, ids, states))

    def delete(self, up_to_idx: Optional[int] = None) -> None:
        """Drop every batch before ``up_to_idx`` (all batches when None)."""
        if up_to_idx is None:
            self.per_fqn = {}
            return
        for fqn, batches in self.per_fqn.items():
            self.per_fqn[fqn] = [b for b in batches if b.batch_idx >= up_to_idx]

    def compact(self, start_idx: int, end_idx: int) -> None:
        """Merge the batches with ``start_idx <= batch_idx < end_idx`` into one batch at ``start_idx``."""
        if start_idx >= end_idx:
            raise ValueError(
                f"delta tracker: compact needs start_idx < end_idx, got {start_idx} and {end_idx}"
            )
        for fqn, batches in self.per_fqn.items():
            order = [b.batch_idx for b in batches]
            lo, hi = bisect_left(order, start_idx), bisect_left(order, end_idx)
            if hi - lo <= 1:
                continue
            window = batches[lo:hi]
            states = None if self.mode == UpdateMode.NONE else [_states(b) for b in window]
            merged = unique_rows([b.ids for b in window], states, self.mode)
            self.per_fqn[fqn] = (
                batches[:lo] + [_Batch(start_idx, merged.ids, merged.states)] + batches[hi:]
            )

    def get_unique(self, from_idx: int = 0) -> Dict[str, UniqueRows]:
        """Per table, the merged ids (and states) of every batch with ``batch_idx >= from_idx``."""
        out = {}
        for fqn, batches in self.per_fqn.items():
            window = [b for b in batches if b.batch_idx >= from_idx]
            states = None if self.mode == UpdateMode.NONE else [_states(b) for b in window]
            out[fqn] = unique_rows([b.ids for b in window], states, self.mode)
        return out
