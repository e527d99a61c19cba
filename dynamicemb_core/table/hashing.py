"""Python mirror of ``csrc/include/dynamicemb/hashing.h``: a key's hash, home bucket and digest.

The kernels are the authority; this module reproduces them for host-side code (tests, tools,
debugging a slot layout) and ``tests/table/test_hashing.py`` checks that both agree. Scalar
functions take Python ints; the ``*_tensor`` functions take int64 tensors on any device and emulate
uint64 arithmetic on int64 (multiplication wraps identically; shifts are masked to be logical).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "bucket_of",
    "buckets_of_tensor",
    "digest_of",
    "digests_of_tensor",
    "hash_key",
    "hash_keys_tensor",
    "murmur3_fmix64",
]

_MASK64 = (1 << 64) - 1
# MurmurHash3 fmix64 multipliers (Austin Appleby, MurmurHash3.cpp), as uint64 and as int64 bits.
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53


def _as_int64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def murmur3_fmix64(x: int) -> int:
    """MurmurHash3's 64-bit finalizer on an unsigned 64-bit value (Python int in [0, 2**64))."""
    x &= _MASK64
    x ^= x >> 33
    x = (x * _C1) & _MASK64
    x ^= x >> 33
    x = (x * _C2) & _MASK64
    x ^= x >> 33
    return x


def hash_key(key: int) -> int:
    """Hash of an int64 key: fmix64 of its two's-complement bits (unsigned result)."""
    return murmur3_fmix64(key & _MASK64)


def bucket_of(key: int, num_buckets: int) -> int:
    """The home bucket of ``key`` in a table of ``num_buckets`` buckets."""
    return hash_key(key) % num_buckets


def digest_of(key: int) -> int:
    """The key's digest in 1..255 (0 marks an empty slot)."""
    return 1 + ((hash_key(key) >> 56) % 255)


def _lshr(x: Tensor, n: int) -> Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def hash_keys_tensor(keys: Tensor) -> Tensor:
    """fmix64 of int64 ``keys`` (any shape); the uint64 result is returned as int64 bits."""
    if keys.dtype != torch.int64:
        raise TypeError(f"hash_keys_tensor: keys must be int64, got {keys.dtype}")
    x = keys.clone()
    x ^= _lshr(x, 33)
    x *= _as_int64(_C1)
    x ^= _lshr(x, 33)
    x *= _as_int64(_C2)
    x ^= _lshr(x, 33)
    return x


def _unsigned_mod(h: Tensor, m: int) -> Tensor:
    """(h as uint64) mod m, for 0 < m < 2**63."""
    low = (h & ((1 << 63) - 1)) % m
    high = torch.where(h < 0, (1 << 63) % m, 0)
    return (low + high) % m


def buckets_of_tensor(keys: Tensor, num_buckets: int) -> Tensor:
    """Home bucket of every key (int64 tensor) in a table of ``num_buckets`` buckets."""
    return _unsigned_mod(hash_keys_tensor(keys), num_buckets)


def digests_of_tensor(keys: Tensor) -> Tensor:
    """Digest (1..255) of every key, as uint8."""
    return (1 + _lshr(hash_keys_tensor(keys), 56) % 255).to(torch.uint8)
