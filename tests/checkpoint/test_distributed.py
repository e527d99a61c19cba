"""Checkpoints of row-wise sharded dynamic tables (EmbeddingBagCollection) under DMP, 2 processes (gloo) on CPU.

- DynamicEmbDump by 2 ranks loads into 2 ranks under another dist_type (keys re-routed by owner) and
  into 1 unsharded process: N -> M.
- incremental_dump gathered over WORLD, replayed on a second sharded model: every rank's table comes out
  layout-identical to the source rank's; the same with deltas gathered over singleton groups (ownership
  comes from the global rank and the table's world size, not from the gather group).
- pop_evicted_keys gathered over a group: every rank gets the union, each key once; read-and-clear.
- the delta tracker through TorchRec's post-lookup hook, stepped by DMP: raw keys each rank served.
"""

from __future__ import annotations

import os
from typing import Dict

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad, pop_evicted_keys
from dynamicemb_core.config import EvictedItemMode
from dynamicemb_core.incremental_dump import (
    ReplayContent,
    get_score,
    incremental_dump,
    replay_increment,
)
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank
from tests.checkpoint.helpers import snapshot
from tests.shard.dist_harness import global_batch, rank_slice, run_workers, shard_model

OLDEST = -(2**63)
FEATURES = {"f0": "t0", "f1": "t1"}
KEY_SPACE = 1000


def _configs(rows: int):
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=rows, feature_names=["f0"]),
        EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=rows, feature_names=["f1"]),
    ]


def _model(world: int, dist_type: str, rows: int = KEY_SPACE, **options):
    """A DMP model of two row-wise sharded dynamic tables; ``rows`` sizes them (keys go up to KEY_SPACE)."""
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                dist_type=dist_type, bucket_capacity=16, **options
            ),
        )
        for c in _configs(rows)
    }
    hyper = {"optimizer": _rowwise(), "learning_rate": 0.1, "eps": 1e-3}
    return shard_model(True, _configs(rows), constraints, hyper, world)


def _rowwise():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType.EXACT_ROWWISE_ADAGRAD


def _train(model, rank: int, world: int, steps: int, seed: int = 0) -> None:
    for step in range(steps):
        kjt = global_batch(
            seed * 100 + step, sorted(FEATURES), {f: KEY_SPACE for f in FEATURES}, 8 * world
        )
        model(rank_slice(kjt, rank, world)).pow(2).sum().backward()


def _all_rows(model) -> Dict[str, Dict[int, torch.Tensor]]:
    """Every rank's rows of every table, gathered over WORLD: {table: {key: embedding}}."""
    deltas = incremental_dump(model, OLDEST)
    out = {}
    for collection, d in deltas.items():
        for i, name in enumerate(d.table_names):
            out[f"{collection}/{name}"] = dict(zip(d.keys[i].tolist(), d.values[i], strict=True))
    return out


def _check_owned(model, rank: int, world: int, dist_type: str) -> None:
    for name, snap in snapshot(model).items():
        keys = torch.tensor(snap.keys(), dtype=torch.int64)
        owners = owner_rank(keys, dist_type, world, num_embeddings=KEY_SPACE)
        assert bool((owners == rank).all()), f"{name}: keys stored off their owner rank"


def _dump_and_reload(rank: int, world: int, path: str) -> None:
    src = _model(world, "roundrobin")
    _train(src, rank, world, 4)
    DynamicEmbDump(path, src, optim=True)
    want = _all_rows(src)
    if rank == 0:
        torch.save(want, os.path.join(path, "expected.pt"))
    dst = _model(world, "hash_roundrobin")  # another key -> rank rule: every key must move
    DynamicEmbLoad(path, dst, optim=True)
    _check_owned(dst, rank, world, "hash_roundrobin")
    got = _all_rows(dst)
    assert got.keys() == want.keys()
    for table in want:
        assert got[table].keys() == want[table].keys() and len(want[table]) > 0
        for k, row in want[table].items():
            assert torch.equal(got[table][k], row)


def _replay_across_ranks(rank: int, world: int) -> None:
    src, via_world, via_self = (_model(world, "hash_roundrobin") for _ in range(3))
    singletons = [dist.new_group([r]) for r in range(world)]
    threshold = OLDEST
    for round_ in range(3):
        _train(src, rank, world, 3, seed=round_)
        gathered = incremental_dump(src, threshold)  # every rank gets the union
        local = incremental_dump(src, threshold, pg=singletons[rank])  # this rank's keys only
        threshold = get_score(src)["model.coll"]["t0"]
        assert (
            gathered["model.coll"].meta[0]["world_size"]
            == world
            == local["model.coll"].meta[0]["world_size"]
        )
        replay_increment(via_world, gathered, ReplayContent.ALL)
        replay_increment(via_self, local, ReplayContent.ALL)
        a, b, c = snapshot(src), snapshot(via_world), snapshot(via_self)
        for name in a:
            assert a[name].slots == b[name].slots == c[name].slots, name
            for k in a[name].keys():
                assert torch.equal(a[name].rows[k], b[name].rows[k])
                assert torch.equal(a[name].rows[k], c[name].rows[k])


def _evicted_gathered(rank: int, world: int) -> None:
    model = _model(world, "roundrobin", rows=64, evicted_item_mode=EvictedItemMode.RETAIN_KEY)
    _train(model, rank, world, 10)
    mine = pop_evicted_keys(model)["model.coll"]["t0"]  # pg None: this rank's own, no communication
    assert mine.numel() > 0 and torch.equal(mine, torch.unique(mine))
    assert bool((owner_rank(mine, "roundrobin", world) == rank).all())
    _train(model, rank, world, 10, seed=5)
    union = pop_evicted_keys(model, pg=dist.group.WORLD)["model.coll"]["t0"]
    everyone = [None] * world
    dist.all_gather_object(everyone, union)
    assert all(torch.equal(everyone[0], e) for e in everyone)  # the same union on every rank
    assert torch.equal(union, torch.unique(union))
    assert set(owner_rank(union, "roundrobin", world).tolist()) == set(range(world))
    assert pop_evicted_keys(model)["model.coll"]["t0"].numel() == 0  # read and clear


def _tracker_through_torchrec_hooks(rank: int, world: int) -> None:
    from dynamicemb_core.tracking import DynamicEmbDeltaTracker

    model = _model(world, "hash_roundrobin")
    tracker = DynamicEmbDeltaTracker(model, consumers=["replica"])
    tracker.attach(model)
    assert model.get_delta_tracker() is tracker
    assert tracker.tracked_fqns == ["coll.t0", "coll.t1"]
    served: Dict[str, set] = {"coll.t0": set(), "coll.t1": set()}
    for step in range(3):
        kjt = global_batch(step, sorted(FEATURES), {f: KEY_SPACE for f in FEATURES}, 8 * world)
        for f, t in FEATURES.items():
            keys = kjt[f].values()
            served[f"coll.{t}"] |= set(
                keys[owner_rank(keys, "hash_roundrobin", world) == rank].tolist()
            )
        model(rank_slice(kjt, rank, world)).sum().backward()  # DMP steps the tracker first
    got = tracker.get_unique_ids("replica")
    for fqn, keys in served.items():
        assert sorted(got[fqn].tolist()) == sorted(keys), fqn


def _tracker_embedding_mode_on_sequence_tables(rank: int, world: int) -> None:
    """EMBEDDING mode through the hook of a sharded EmbeddingCollection: each key's row as looked up."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.modules.embedding_configs import EmbeddingConfig

    from dynamicemb_core.tracking import DynamicEmbDeltaTracker, TrackingMode

    configs = [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=KEY_SPACE, feature_names=["f0"])
    ]
    constraints = {
        "t0": DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=16)
        )
    }
    model = shard_model(
        False,
        configs,
        constraints,
        {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5},
        world,
    )
    tracker = DynamicEmbDeltaTracker(model, mode=TrackingMode.EMBEDDING)
    tracker.attach(model)
    full = [global_batch(s, ["f0"], {"f0": 50}, 8 * world) for s in range(2)]
    batches = [rank_slice(kjt, rank, world) for kjt in full]
    out = model(batches[0])
    before = {
        k: r[:4].clone() for k, r in snapshot(model)["model.coll/t0"].rows.items()
    }  # as looked up
    torch.cat([jt.values() for jt in out.values()]).pow(2).sum().backward()  # rows move
    out = model(batches[1])  # keys of both batches are looked up again with their moved rows
    torch.cat([jt.values() for jt in out.values()]).pow(2).sum().backward()
    second = full[1]["f0"].values()
    again = set(second[owner_rank(second, "roundrobin", world) == rank].tolist()) & set(before)
    moved = snapshot(model)["model.coll/t0"].rows
    assert any(
        not torch.equal(moved[k][:4], before[k]) for k in again
    )  # FIRST and LAST differ here
    rows = tracker.get_unique()["coll.t0"]
    assert set(rows.ids.tolist()) >= set(before)  # first batch's keys (plus the second's)
    for key, state in zip(rows.ids.tolist(), rows.states, strict=True):
        if key in before:
            assert torch.equal(state, before[key]), key  # UpdateMode.FIRST: the earliest row


def _all_cases(rank: int, world: int, path: str) -> None:
    import time

    torch.manual_seed(rank)
    for case in (
        _dump_and_reload,
        _replay_across_ranks,
        _evicted_gathered,
        _tracker_through_torchrec_hooks,
        _tracker_embedding_mode_on_sequence_tables,
    ):
        start = time.perf_counter()
        case(rank, world, path) if case is _dump_and_reload else case(rank, world)
        if rank == 0:
            print(f"{case.__name__}: {time.perf_counter() - start:.1f} s", flush=True)


class _Local(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.coll = module


def test_sharded_checkpoints_and_deltas_on_two_processes(tmp_path):
    path = str(tmp_path / "ckpt")
    run_workers(_all_cases, path, timeout=420)
    # N=2 -> M=1: the same checkpoint into one unsharded process
    from tests.checkpoint.helpers import batched

    local = _Local(batched(dims=(4, 4), max_capacity=4096, init_capacity=4096, bucket_capacity=16))
    DynamicEmbLoad(path, local, optim=True)
    want = torch.load(os.path.join(path, "expected.pt"))
    got = snapshot(local)
    for table, rows in want.items():
        assert sorted(got[table].keys()) == sorted(rows)
        for k, row in rows.items():
            assert torch.equal(got[table].rows[k][:4], row)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
