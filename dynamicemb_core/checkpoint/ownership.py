"""Which of a table's keys this process owns, by the table's own sharding (never by a gather group).

The key -> rank rule itself lives in one place, :func:`dynamicemb_core.table.ownership.owner_rank`; this
module only applies it to a table handle: the rank is the table's shard index (the global rank under
TorchRec row-wise sharding) and the world size is the number of shards the table is split into.
"""

from __future__ import annotations

import torch

from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["check_dist_type_supported", "owned_mask"]

SUPPORTED_FOR_REPLAY = ("roundrobin", "hash_roundrobin")


def owned_mask(keys: torch.Tensor, handle: TableHandle) -> torch.Tensor:
    """(n,) bool on ``keys``' device: true for the keys ``handle``'s shard owns."""
    if handle.world_size == 1:
        return torch.ones(keys.shape[0], dtype=torch.bool, device=keys.device)
    from dynamicemb_core.table.ownership import owner_rank

    owners = owner_rank(
        keys, handle.dist_type, handle.world_size, num_embeddings=handle.num_embeddings
    )
    return torch.as_tensor(owners, device=keys.device) == handle.rank


def check_dist_type_supported(handle: TableHandle, what: str) -> None:
    """Raise NotImplementedError for ``dist_type="continuous"`` (slot replay needs a key -> rank rule).

    ``replay_increment`` reconstructs each key's owner as ``(key or hash(key)) % world_size``; continuous
    sharding maps ranges of keys to ranks, which that path does not implement.
    """
    if handle.dist_type not in SUPPORTED_FOR_REPLAY:
        raise NotImplementedError(
            f"{what}: table '{handle.qualified_name}' uses dist_type={handle.dist_type!r}; only "
            f"{list(SUPPORTED_FOR_REPLAY)} are supported (slot_index replay reconstructs owners as "
            f"(key or hash(key)) % world_size). Shard the table with roundrobin or hash_roundrobin."
        )
