"""bucketize_kjt_by_owner against a pure-Python bucketizer (no process group needed)."""

from __future__ import annotations

from typing import List

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.shard.ownership import owner_rank
from dynamicemb_core.shard.rw_input_dist import FeatureRoute, bucketize_kjt_by_owner


def _model(keys: List[str], lengths: List[int], values: List[int], routes, world: int, batch: int):
    """Per (rank, feature, sample) the routed keys in input order."""
    bags = {}
    pos = 0
    for f, _ in enumerate(keys):
        for b in range(batch):
            n = lengths[f * batch + b]
            for v in values[pos : pos + n]:
                route = routes[f]
                owner = int(
                    owner_rank(
                        torch.tensor([v]),
                        route.dist_type,
                        world,
                        num_embeddings=route.num_embeddings,
                    )
                )
                block = -(-route.num_embeddings // world)
                routed = v - owner * block if route.local_rows else v
                bags.setdefault((owner, f, b), []).append(routed)
            pos += n
    out_lengths, out_values = [], []
    for r in range(world):
        for f in range(len(keys)):
            for b in range(batch):
                bag = bags.get((r, f, b), [])
                out_lengths.append(len(bag))
                out_values.extend(bag)
    return out_lengths, out_values


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_bucketize_matches_model_and_unbucketize_restores_order(world: int, weighted: bool) -> None:
    g = torch.Generator().manual_seed(world)
    keys = ["a", "b", "c"]
    batch = 4
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    n = int(lengths.sum())
    values = torch.randint(-50, 200, (n,), generator=g)
    values[values < 0] = values[values < 0] * (2**40)  # far out-of-range negatives too
    weights = torch.rand(n, generator=g) if weighted else None
    routes = [
        FeatureRoute("roundrobin", 100),
        FeatureRoute("hash_roundrobin", 100),
        FeatureRoute("continuous", 150, local_rows=True),
    ]
    # feature c stands for a native table: its keys are rows in [0, 150), as TorchRec requires
    c_start = int(lengths[: 2 * batch].sum())
    values[c_start:] = values[c_start:].abs() % 150
    kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights)
    out, unbucketize = bucketize_kjt_by_owner(kjt, routes, world)
    exp_lengths, exp_values = _model(keys, lengths.tolist(), values.tolist(), routes, world, batch)
    assert out.keys() == keys * world
    assert out.stride() == batch
    assert out.lengths().tolist() == exp_lengths
    assert out.values().tolist() == exp_values
    if weighted:
        assert torch.equal(out.weights()[unbucketize], weights)
    # every key came back to its place (for in-range / raw-key features)
    restored = out.values()[unbucketize]
    raw = torch.ones(n, dtype=torch.bool)
    start = int(lengths[: 2 * batch].sum())
    raw[start:] = False  # feature c was rewritten to local rows
    assert torch.equal(restored[raw], values[raw])


def test_route_and_kjt_mismatch_raise() -> None:
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="1 features"):
        bucketize_kjt_by_owner(kjt, [], 2)
    with pytest.raises(ValueError, match="local_rows needs dist_type 'continuous'"):
        FeatureRoute("roundrobin", 10, local_rows=True)
    with pytest.raises(ValueError, match="dist_type must be one of"):
        FeatureRoute("random", 10)


_ROUTES = [FeatureRoute("roundrobin", 100), FeatureRoute("hash_roundrobin", 100)]


def test_float_ids_are_refused_not_cast() -> None:
    """TorchRec's own tables refuse float ids; a silent cast would look up other keys."""
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1.5, 2.0, 3.7]), lengths=torch.tensor([1, 1, 1, 0])
    )
    with pytest.raises(TypeError, match=r"integer ids \(int64 or int32\), got torch.float32"):
        bucketize_kjt_by_owner(kjt, _ROUTES, 2)
    ok = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3], dtype=torch.int32),
        lengths=torch.tensor([1, 1, 1, 0]),
    )
    out, _ = bucketize_kjt_by_owner(ok, _ROUTES, 2)
    assert out.values().dtype == torch.int32 and sorted(out.values().tolist()) == [1, 2, 3]


def test_negative_lengths_name_the_feature() -> None:
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 0, 2, -1])
    )
    with pytest.raises(ValueError, match=r"feature 'b' sample 1 has length -1"):
        bucketize_kjt_by_owner(kjt, _ROUTES, 2)


def test_decreasing_offsets_name_the_feature() -> None:
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3, 4]), offsets=torch.tensor([0, 1, 3, 2, 4])
    )
    with pytest.raises(ValueError, match=r"feature 'b' sample 0 has length -1.*must not decrease"):
        bucketize_kjt_by_owner(kjt, _ROUTES, 2)


def test_lengths_that_do_not_sum_to_the_values_are_refused() -> None:
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 2, 1])
    )
    with pytest.raises(
        ValueError, match=r"lengths sum to 5 but there are 3 values.*'a': 2, 'b': 3"
    ):
        bucketize_kjt_by_owner(kjt, _ROUTES, 2)
    short = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 1, 0])
    )
    with pytest.raises(ValueError, match=r"lengths sum to 2 but there are 3 values"):
        bucketize_kjt_by_owner(short, _ROUTES, 2)


@pytest.mark.parametrize("world", [2, 3])
def test_bucketize_tables_of_different_sizes_in_one_pass(world: int) -> None:
    """Features of continuous tables with different num_embeddings (raw keys and native local
    rows) and a roundrobin one: each key routed by its own table's block, in one pass."""
    g = torch.Generator().manual_seed(10 + world)
    keys = ["a", "b", "c", "d"]
    batch = 5
    routes = [
        FeatureRoute("continuous", 40),
        FeatureRoute("continuous", 150, local_rows=True),
        FeatureRoute("roundrobin", 10),
        FeatureRoute("continuous", 7),
    ]
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    per_key = lengths.view(len(keys), batch).sum(1).tolist()
    parts = [
        torch.randint(-5, 90, (per_key[0],), generator=g),  # dynamic: any key, out of range too
        torch.randint(0, 150, (per_key[1],), generator=g),  # native: rows of its table
        torch.randint(0, 1000, (per_key[2],), generator=g),
        torch.randint(0, 30, (per_key[3],), generator=g),
    ]
    values = torch.cat(parts)
    kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    out, unbucketize = bucketize_kjt_by_owner(kjt, routes, world)
    exp_lengths, exp_values = _model(keys, lengths.tolist(), values.tolist(), routes, world, batch)
    assert out.lengths().tolist() == exp_lengths
    assert out.values().tolist() == exp_values
    raw = torch.ones(values.numel(), dtype=torch.bool)
    raw[per_key[0] : per_key[0] + per_key[1]] = False
    assert torch.equal(out.values()[unbucketize][raw], values[raw])
