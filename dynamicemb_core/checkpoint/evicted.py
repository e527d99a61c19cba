"""Keys that left a table: evictions retained by the table, and erasures retained by :func:`erase`.

The two are kept apart because a replica treats them differently. An eviction made room for another key,
and whoever took the slot is in the same delta, so replaying that key reproduces the eviction; an erase is
a removal the replica must perform itself. Retaining evictions is a table option
(``evicted_item_mode=RETAIN_KEY``, the table keeps them); an erase already holds its keys, so it takes its
own :class:`EvictedItemMode` per call and the keys wait here until the next ``incremental_dump``.
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from dynamicemb_core.checkpoint.collectives import gather_rows
from dynamicemb_core.checkpoint.discovery import find_tables, group_by_collection
from dynamicemb_core.checkpoint.ownership import owned_mask
from dynamicemb_core.checkpoint.types import TableHandle
from dynamicemb_core.config import EvictedItemMode

__all__ = ["erase", "erase_keys", "pop_evicted_keys", "take_erased_keys", "take_evicted_keys"]

# table object -> table_id -> erased key batches; weak so a dropped model frees its buffers
_ERASED: "weakref.WeakKeyDictionary[object, Dict[int, List[torch.Tensor]]]" = (
    weakref.WeakKeyDictionary()
)


def _unique(keys: List[torch.Tensor]) -> torch.Tensor:
    if not keys:
        return torch.empty(0, dtype=torch.int64)
    return torch.unique(torch.cat([k.cpu() for k in keys]))


def erase_keys(
    handle: TableHandle, keys: torch.Tensor, mode: EvictedItemMode = EvictedItemMode.DISCARD
) -> torch.Tensor:
    """Erase the keys this shard owns from one table; with RETAIN_KEY remember the erased ones.

    Args:
        handle: the table.
        keys: (n,) int64 raw keys (any device); keys owned by other shards are ignored.
        mode: ``RETAIN_KEY`` keeps the keys actually erased for the next ``incremental_dump``
            (its ``erased_keys``); ``DISCARD`` forgets them.

    Returns:
        The keys that were present and are now erased, on the CPU.
    """
    mode = EvictedItemMode(mode)
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise TypeError(
            f"erase: table '{handle.qualified_name}': keys must be a 1-D int64 tensor, got "
            f"{keys.dtype} with shape {tuple(keys.shape)}"
        )
    device = handle.device
    keys = keys.to(device)
    keys = keys[owned_mask(keys, handle)]
    if handle.drop_from_cache is not None:
        if handle.flush_cache is not None:
            handle.flush_cache()
        handle.drop_from_cache(keys)
    erased = handle.table.erase(keys, handle.table_id)
    gone = keys[erased].cpu()
    if mode == EvictedItemMode.RETAIN_KEY and gone.numel():
        _ERASED.setdefault(handle.table, {}).setdefault(handle.table_id, []).append(gone)
    return gone


def take_erased_keys(handle: TableHandle) -> torch.Tensor:
    """Read and clear the keys erased with RETAIN_KEY since the last call (deduplicated, CPU int64)."""
    per_table = _ERASED.get(handle.table)
    batches = per_table.pop(handle.table_id, []) if per_table is not None else []
    return _unique(batches)


def take_evicted_keys(handle: TableHandle) -> Optional[torch.Tensor]:
    """Read and clear the table's retained evictions (CPU int64, deduplicated); None unless RETAIN_KEY."""
    if EvictedItemMode(handle.options.evicted_item_mode) != EvictedItemMode.RETAIN_KEY:
        return None
    return torch.unique(handle.table.pop_evicted_keys(handle.table_id).cpu())


def erase(
    model: nn.Module,
    keys: Dict[str, Dict[str, torch.Tensor]],
    evicted_item_mode: EvictedItemMode = EvictedItemMode.DISCARD,
) -> Dict[str, Dict[str, torch.Tensor]]:
    """Erase keys from a model's dynamic tables, choosing per call whether the erasure is retained.

    Args:
        model: the model holding dynamic tables.
        keys: ``{collection_path: {table_name: (n,) int64 keys}}``; each rank erases the keys it owns.
        evicted_item_mode: ``RETAIN_KEY`` reports the erased keys in the next ``incremental_dump``'s
            ``erased_keys`` so a replica removes them too; ``DISCARD`` does not.

    Returns:
        ``{collection_path: {table_name: erased keys}}`` for this rank (keys that were present).
    """
    handles = find_tables(model, {c: list(t) for c, t in keys.items()})
    out: Dict[str, Dict[str, torch.Tensor]] = {}
    for handle in handles:
        gone = erase_keys(handle, keys[handle.collection][handle.name], evicted_item_mode)
        out.setdefault(handle.collection, {})[handle.name] = gone
    return out


def pop_evicted_keys(
    model: nn.Module,
    table_names: Optional[Dict[str, List[str]]] = None,
    pg: Optional[dist.ProcessGroup] = None,
) -> Dict[str, Dict[str, torch.Tensor]]:
    """Return and clear the keys evicted and retained by each RETAIN_KEY table.

    Args:
        model: the model holding dynamic tables.
        table_names: ``{collection_path: [table, ...]}`` filter; None pops every retain-enabled table.
        pg: None returns this rank's keys (row-wise shards are disjoint, so no communication); a group
            all-gathers them so every rank receives the group's union. Clearing affects this rank only.

    Returns:
        ``{collection_path: {table_name: keys}}``, keys a 1-D int64 CPU tensor, unique per table. Tables
        without ``evicted_item_mode=RETAIN_KEY`` are omitted; ``{}`` when there are none.
    """
    out: Dict[str, Dict[str, torch.Tensor]] = {}
    for collection, handles in group_by_collection(find_tables(model, table_names)).items():
        for handle in handles:
            local = take_evicted_keys(handle)
            if local is None:
                continue
            if pg is not None:  # None means this rank's keys only (unlike incremental_dump's WORLD)
                (local,) = gather_rows([local], pg)
            out.setdefault(collection, {})[handle.name] = torch.unique(local)
    return out
