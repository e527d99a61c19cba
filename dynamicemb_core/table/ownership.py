"""Which rank owns a key of a row-wise sharded table: the one definition of every ``dist_type``.

Input distribution, dump, load and replay all call :func:`owner_rank`, so a key is looked up, written
and restored on the same rank. Keys are read as unsigned 64-bit integers (the hash table's view of a
key, docs/table_design.md), so negative keys have an owner like any other. The names of the
``dist_type`` values and their check live with the option (:mod:`dynamicemb_core.config`); the old
path ``dynamicemb_core.shard.ownership`` re-exports this module.

- ``continuous``: TorchRec's row-wise blocks. With ``block = ceil(num_embeddings / world_size)`` a key
  ``k < block * world_size`` belongs to rank ``k // block``; a key past the last block (a dynamic
  table accepts any int64) falls back to ``k % world_size``, as FBGEMM's
  ``block_bucketize_sparse_features`` does, so a native and a dynamic table agree on in-range keys.
- ``roundrobin`` (default): ``k % world_size``.
- ``hash_roundrobin``: ``(murmur3_fmix64(k) >> 32) % world_size``, with the table's own finalizer, so
  that keys sharing low bits (ids with a stride that divides the world size) still spread over the
  ranks. The rank comes from the hash's high half because the table picks a key's bucket from the
  whole hash modulo ``num_buckets`` (docs/table_design.md): were the rank ``hash % world_size``, every
  key of a rank would share ``hash % gcd(world_size, num_buckets)`` and could use only
  ``1 / gcd`` of that rank's buckets (half of them for 2 ranks and an even bucket count), which
  overflows buckets and evicts long before the table is full.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from dynamicemb_core.config import DEFAULT_DIST_TYPE, DIST_TYPES, validate_dist_type
from dynamicemb_core.table.hashing import hash_keys_tensor

__all__ = [
    "DEFAULT_DIST_TYPE",
    "DIST_TYPES",
    "block_size",
    "continuous_owner",
    "owner_rank",
    "validate_dist_type",
]


def block_size(num_embeddings: int, world_size: int) -> int:
    """Rows per rank of TorchRec's row-wise split: ``ceil(num_embeddings / world_size)``."""
    return -(-int(num_embeddings) // world_size)


def _blocks(num_embeddings: Union[int, torch.Tensor], world_size: int) -> Union[int, torch.Tensor]:
    """:func:`block_size` of an int, or of each element of an int64 tensor (one per key)."""
    if isinstance(num_embeddings, torch.Tensor):
        return -torch.div(-num_embeddings, world_size, rounding_mode="floor")
    return block_size(num_embeddings, world_size)


def continuous_owner(
    keys: torch.Tensor, num_embeddings: Union[int, torch.Tensor], world_size: int
) -> Tuple[torch.Tensor, torch.Tensor, Union[int, torch.Tensor]]:
    """``continuous``'s rule: ``(owner, in_range, block)`` of each key (see the module docstring).

    ``num_embeddings``: the table's row count, or an int64 tensor of each key's table's (many
    tables routed in one pass)."""
    block = _blocks(num_embeddings, world_size)
    in_range = (keys >= 0) & (keys < block * world_size)
    owner = torch.where(
        in_range, torch.div(keys, block, rounding_mode="floor"), _unsigned_mod(keys, world_size)
    )
    return owner, in_range, block


def _unsigned_mod(keys: torch.Tensor, m: int) -> torch.Tensor:
    """``uint64(keys) % m`` for an int64 tensor, computed in int64 arithmetic.

    A negative int64 ``k`` is the unsigned value ``k + 2**64``, so its remainder is
    ``(k mod m + 2**64 mod m) mod m`` with Python's (floored) ``mod``.
    """
    rem = torch.remainder(keys, m)
    wrap = (2**64) % m
    if wrap:
        rem = torch.where(keys < 0, torch.remainder(rem + wrap, m), rem)
    return rem


def _fmix64(keys: torch.Tensor) -> torch.Tensor:
    # The table's finalizer, never a copy (ARCHITECTURE.md principle 3).
    return hash_keys_tensor(keys)


def owner_rank(
    keys: torch.Tensor,
    dist_type: str,
    world_size: int,
    *,
    num_embeddings: Optional[Union[int, torch.Tensor]] = None,
) -> torch.Tensor:
    """Rank that owns each key.

    Args:
        keys: (n,) int64, any device.
        dist_type: one of :data:`DIST_TYPES`.
        world_size: ranks the table is sharded over (>= 1).
        num_embeddings: the table's TorchRec ``num_embeddings``; required by ``continuous`` only.
            An int64 tensor shaped like ``keys`` gives each key its own table's (the input dist
            routes many tables' keys in one pass).

    Returns:
        (n,) int64 ranks in ``[0, world_size)``, on the keys' device.

    Raises:
        ValueError: unknown ``dist_type``, a bad ``world_size``, or ``continuous`` without
            ``num_embeddings``.
        TypeError: keys that are not int64.
    """
    validate_dist_type(dist_type)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if keys.dtype != torch.int64:
        raise TypeError(f"owner_rank: keys must be int64, got {keys.dtype}")
    if world_size == 1:
        return torch.zeros_like(keys)
    if dist_type == "roundrobin":
        return _unsigned_mod(keys, world_size)
    if dist_type == "hash_roundrobin":
        high = torch.bitwise_right_shift(_fmix64(keys), 32) & 0xFFFFFFFF  # logical: drop sign bits
        return torch.remainder(high, world_size)
    if num_embeddings is None or (
        not isinstance(num_embeddings, torch.Tensor) and int(num_embeddings) <= 0
    ):
        raise ValueError(
            f"owner_rank: dist_type 'continuous' needs the table's num_embeddings (> 0), "
            f"got {num_embeddings!r}"
        )
    return continuous_owner(keys, num_embeddings, world_size)[0]
