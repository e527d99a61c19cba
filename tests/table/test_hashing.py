"""hashing.py mirrors hashing.h: Python scalar, Python tensor and kernel agree on bucket and digest."""

from __future__ import annotations

import random

import torch

from dynamicemb_core.table import ScoredHashTable, TableSpec
from dynamicemb_core.table.hashing import (
    bucket_of,
    buckets_of_tensor,
    digest_of,
    digests_of_tensor,
    hash_key,
    murmur3_fmix64,
)

EDGE_KEYS = [-(2**63), 2**63 - 1, -1, 0, 1, 2**32, -(2**40) + 3]


def _keys() -> list:
    rng = random.Random(7)
    return EDGE_KEYS + [rng.randint(-(2**63), 2**63 - 1) for _ in range(200)]


def test_mirror_matches_the_reference_models_independent_hash() -> None:
    """reference_model.py re-derives fmix64 / bucket / digest on its own: both must agree."""
    import reference_model as ref

    assert murmur3_fmix64(0) == 0
    for key in _keys():
        assert hash_key(key) == ref.key_hash(key)
        assert bucket_of(key, 97) == ref.bucket_of(key, 97)
        assert digest_of(key) == ref.digest_of(key)
    assert len({hash_key(k) for k in _keys()}) == len(set(_keys()))  # a bijection: no collisions


def test_tensor_mirror_matches_scalar_mirror() -> None:
    keys = _keys()
    t = torch.tensor(keys, dtype=torch.int64)
    for num_buckets in (1, 3, 16, 1000, 2**40 + 1):
        assert buckets_of_tensor(t, num_buckets).tolist() == [
            bucket_of(k, num_buckets) for k in keys
        ]
    assert digests_of_tensor(t).tolist() == [digest_of(k) for k in keys]
    assert all(1 <= digest_of(k) <= 255 for k in keys)


def test_kernel_places_keys_in_the_mirrors_bucket_with_its_digest(device: torch.device) -> None:
    """The C++ rule (hashing.h) and the Python mirror pick the same bucket and digest."""
    num_buckets, cap = 64, 16
    table = ScoredHashTable(
        [
            TableSpec(
                "h",
                init_capacity=num_buckets * cap,
                max_capacity=num_buckets * cap,
                bucket_capacity=cap,
                max_load_factor=1.0,
            )
        ],
        device,
    )
    keys = _keys()
    slots = table.insert(torch.tensor(keys, dtype=torch.int64, device=device)).tolist()
    assert min(slots) >= 0
    digests = table.state.digests.cpu().tolist()
    for key, slot in zip(keys, slots):
        assert slot // cap == bucket_of(key, num_buckets), key
        assert digests[slot] == digest_of(key), key
