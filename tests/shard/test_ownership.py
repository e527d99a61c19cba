"""owner_rank: each dist_type against a pure-Python model of its rule, on keys of every sign."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.shard.ownership import DIST_TYPES, owner_rank, validate_dist_type

MASK = (1 << 64) - 1


def _fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finalizer, written here independently of the package (an oracle)."""
    k &= MASK
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & MASK
    k ^= k >> 33
    return k


def _model(key: int, dist_type: str, world: int, num_embeddings: int) -> int:
    u = key & MASK  # the table's unsigned view of an int64 key
    if dist_type == "roundrobin":
        return u % world
    if dist_type == "hash_roundrobin":
        return (_fmix64(u) >> 32) % world
    block = -(-num_embeddings // world)
    return u // block if u < block * world else u % world


KEYS = [
    0,
    1,
    2,
    3,
    7,
    8,
    99,
    100,
    101,
    12345,
    2**31,
    2**62 + 5,
    2**63 - 1,
    -1,
    -2,
    -7,
    -(2**63),
    -(2**40) - 3,
]


@pytest.mark.parametrize("dist_type", DIST_TYPES)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_owner_rank_matches_model(dist_type: str, world: int) -> None:
    keys = torch.tensor(KEYS, dtype=torch.int64)
    got = owner_rank(keys, dist_type, world, num_embeddings=100).tolist()
    assert got == [_model(k, dist_type, world, 100) for k in KEYS]
    assert all(0 <= r < world for r in got)


def test_continuous_matches_torchrec_blocks_for_in_range_keys() -> None:
    keys = torch.arange(0, 10, dtype=torch.int64)
    # ceil(10 / 3) = 4 rows per block: 0-3 -> 0, 4-7 -> 1, 8-9 -> 2
    assert (
        owner_rank(keys, "continuous", 3, num_embeddings=10).tolist() == [0] * 4 + [1] * 4 + [2] * 2
    )


def test_hash_roundrobin_spreads_strided_keys_that_roundrobin_does_not() -> None:
    keys = torch.arange(0, 4000, 4, dtype=torch.int64)  # every key is 0 mod 4
    assert set(owner_rank(keys, "roundrobin", 4).tolist()) == {0}
    counts = torch.bincount(owner_rank(keys, "hash_roundrobin", 4), minlength=4)
    assert counts.min() > 200  # about 250 each


def test_hash_roundrobin_leaves_every_bucket_of_a_rank_usable() -> None:
    """A rank's keys must reach all of its table's buckets (bucket = fmix64 % num_buckets)."""
    from dynamicemb_core.table.hashing import buckets_of_tensor

    keys = torch.arange(20_000, dtype=torch.int64)
    owners = owner_rank(keys, "hash_roundrobin", 2)
    for rank in (0, 1):
        buckets = buckets_of_tensor(keys[owners == rank], 8)
        assert set(buckets.tolist()) == set(range(8))


def test_bad_arguments_raise_clear_errors() -> None:
    keys = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"table 'users': dist_type must be one of .*'mod'"):
        validate_dist_type("mod", table="users")
    with pytest.raises(ValueError, match="needs the table's num_embeddings"):
        owner_rank(keys, "continuous", 2)
    with pytest.raises(TypeError, match="int64"):
        owner_rank(keys.to(torch.int32), "roundrobin", 2)
    with pytest.raises(ValueError, match="world_size"):
        owner_rank(keys, "roundrobin", 0)
