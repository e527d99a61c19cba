"""Placement counters of every dynamic table of a model, by collection and table (like ``get_score``).

Each ``BatchedDynamicEmbeddingTables`` counts, per table, ``hits`` / ``misses`` / ``placed`` /
``evicted`` / ``unplaced`` keys on its device (:mod:`dynamicemb_core.table.metrics`); these functions
find the modules inside a model (plain or TorchRec-sharded) and read or reset them. Under sharding each
rank reports its own shard; sum over ranks (``all_reduce``) for a table-wide figure.
"""

from __future__ import annotations

from typing import Any, Dict, List

from torch import nn

__all__ = ["reset_table_metrics", "table_metrics"]


def _owners(model: nn.Module) -> List[Any]:
    from dynamicemb_core.checkpoint.discovery import find_tables

    owners: Dict[int, Any] = {}
    for handle in find_tables(model, None):
        if handle.owner is not None:
            owners.setdefault(id(handle.owner), handle.owner)
    return list(owners.values())


def table_metrics(model: nn.Module, reset: bool = False) -> Dict[str, Dict[str, Dict[str, int]]]:
    """``{collection: {table: {"hits", "misses", "placed", "evicted", "unplaced": int}}}`` on this
    rank, since the start or the last reset; ``reset=True`` zeroes the counters after reading.

    The collection names are those of ``get_score`` and ``incremental_dump``.
    """
    from dynamicemb_core.checkpoint.discovery import find_tables

    read: Dict[int, Dict[str, Dict[str, int]]] = {}
    out: Dict[str, Dict[str, Dict[str, int]]] = {}
    for handle in find_tables(model, None):
        owner = handle.owner
        if owner is None:
            continue
        if id(owner) not in read:
            read[id(owner)] = owner.metrics()
        out.setdefault(handle.collection, {})[handle.name] = read[id(owner)][handle.name]
    if reset:
        reset_table_metrics(model)
    return out


def reset_table_metrics(model: nn.Module) -> None:
    """Zero the placement counters of every dynamic table of ``model`` on this rank."""
    for owner in _owners(model):
        owner.reset_metrics()
