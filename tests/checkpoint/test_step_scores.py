"""STEP scores through a row-wise sharded model (DMP, 2 processes, gloo on CPU).

The seed: a STEP table's step starts at 1 and grows by one per training forward; every key a forward
touches scores that forward's step; ``get_score`` returns the step the next forward writes. So:

- each stored key scores the last training step that touched it on its owner rank; eval forwards
  neither count nor re-score;
- ``incremental_dump(model, get_score(model))`` taken later returns exactly the keys touched since;
- a full table evicts the keys of the oldest steps first.

And a checkpoint of such a sharded model (Adam, admission) resumes it exactly (the one-process, fresh-
process test of every optimizer is tests/checkpoint/test_resume.py).
"""

from __future__ import annotations

from typing import Dict, List, Set

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.config import DynamicEmbScoreStrategy
from dynamicemb_core.incremental_dump import get_score, incremental_dump
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank
from tests.checkpoint.helpers import snapshot
from tests.shard.dist_harness import dynamic_kernels, run_workers, shard_model

TABLES = ("t0", "t1")
KEY_SPACE = 400


def _model(world: int, rows: int, bucket_capacity: int, admission: bool = False, **hyper):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    extra = {}
    if admission:
        extra = dict(
            admit_strategy=FrequencyAdmissionStrategy(threshold=2),
            admission_counter=KVCounter(capacity=1024, bucket_capacity=16),
        )
    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, t in enumerate(TABLES)
    ]
    constraints = {
        t: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                dist_type="roundrobin",
                bucket_capacity=bucket_capacity,
                score_strategy=DynamicEmbScoreStrategy.STEP,
                **extra,
            ),
        )
        for t in TABLES
    }
    hyper = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1, **hyper}
    return shard_model(True, configs, constraints, hyper, world)


def _batch(keys: List[List[int]]) -> KeyedJaggedTensor:
    """One sample per feature holding ``keys[i]`` (every rank feeds the same batch)."""
    lengths = torch.tensor([len(k) for k in keys], dtype=torch.int64)
    values = torch.tensor([k for ks in keys for k in ks], dtype=torch.int64)
    return KeyedJaggedTensor(
        keys=[f"f{i}" for i in range(len(keys))], values=values, lengths=lengths
    )


def _step(model, keys: List[List[int]], train: bool = True) -> None:
    out = model(_batch(keys))
    if train:
        out.pow(2).sum().backward()


def _random_keys(step: int, key_range: int = KEY_SPACE) -> List[List[int]]:
    g = torch.Generator().manual_seed(step)
    return [torch.randint(0, key_range, (12,), generator=g).tolist() for _ in TABLES]


def _scores_follow_steps(rank: int, world: int) -> None:
    model = _model(world, KEY_SPACE, 16)
    assert get_score(model) == {"model.coll": {t: 1 for t in TABLES}}  # the step starts at 1
    last: List[Dict[int, int]] = [{} for _ in TABLES]  # key -> last step that touched it
    for step in range(1, 5):
        keys = _random_keys(step)
        _step(model, keys)
        for i, ks in enumerate(keys):
            last[i].update((k, step) for k in ks)
        assert get_score(model) == {"model.coll": {t: step + 1 for t in TABLES}}
    model.eval()
    _step(model, [[0, 1, 2, 3]] * len(TABLES), train=False)  # an eval forward: no step, no score
    model.train()
    assert get_score(model) == {"model.coll": {t: 5 for t in TABLES}}
    snap = snapshot(model)
    for i, t in enumerate(TABLES):
        keys = torch.tensor(sorted(last[i]), dtype=torch.int64)
        mine = keys[owner_rank(keys, "roundrobin", world) == rank].tolist()
        want = {k: (last[i][k],) for k in mine}
        assert snap[f"model.coll/{t}"].scores == want, t

    # incremental_dump from an earlier get_score: exactly the keys touched since (all ranks' union)
    since = get_score(model)
    assert all(d.keys[0].numel() == 0 for d in incremental_dump(model, since).values())
    touched: List[Set[int]] = [set() for _ in TABLES]
    for step in range(5, 7):
        keys = _random_keys(step)
        _step(model, keys)
        for i, ks in enumerate(keys):
            touched[i] |= set(ks)
    delta = incremental_dump(model, since)["model.coll"]
    for i, t in enumerate(TABLES):
        assert delta.table_names[i] == t
        assert sorted(delta.keys[i].tolist()) == sorted(touched[i]), t
        assert delta.meta[i]["current_score"] == 7


def _oldest_steps_are_evicted(rank: int, world: int) -> None:
    model = _model(world, 16 * world, 16)
    kernel, index = dynamic_kernels(model)["t0"]
    cap = kernel.emb_module.tables[index].capacity(0)
    assert cap == 16, f"the test needs one bucket of 16 slots per rank, got {cap}"
    # roundrobin: key k lives on rank k % world as that rank's (k // world)-th key
    _step(model, [list(range(16 * world)), [0]])  # step 1: 16 keys per rank fill its one bucket
    _step(model, [list(range(8 * world, 16 * world)), [0]])  # step 2: re-touch the last 8
    _step(model, [list(range(16 * world, 24 * world)), [0]])  # step 3: 8 new keys per rank
    stored = set(snapshot(model)["model.coll/t0"].keys())
    want = {k for k in range(8 * world, 24 * world) if k % world == rank}  # step-1-only keys left
    assert stored == want, (sorted(stored), sorted(want))


def _resumed_sharded_model_trains_on_identically(rank: int, world: int, path: str) -> None:
    """DynamicEmbDump(optim, counter) of a sharded Adam model with admission, loaded into one built
    with default hyper-parameters: the step, the rate (also in the fused optimizer's param_groups,
    which DMP's fused_optimizer.step() pushes to the tables), the STEP clock and the counters come
    back, and both models then train to the same rows."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    adam = EmbOptimType.ADAM

    def train(model, steps) -> None:
        for step in steps:
            torch.manual_seed(step)  # new keys' initial rows: the same draws for both models
            _step(model, _random_keys(step, key_range=40))

    src = _model(world, KEY_SPACE, 16, True, optimizer=adam, learning_rate=0.05, beta1=0.8)
    train(src, range(1, 4))
    DynamicEmbDump(path, src, optim=True, counter=True)
    dst = _model(world, KEY_SPACE, 16, True, optimizer=adam)  # default rate and betas
    DynamicEmbLoad(path, dst, optim=True, counter=True)
    kernel, _ = dynamic_kernels(dst)["t0"]
    assert kernel.emb_module.step == 3 and get_score(dst) == {"model.coll": {t: 4 for t in TABLES}}
    dst.fused_optimizer.step()
    assert kernel.emb_module.get_learning_rate() == 0.05
    assert kernel.emb_module.optimizer_args.beta1 == 0.8
    train(src, range(4, 7))
    train(dst, range(4, 7))
    a, b = snapshot(src), snapshot(dst)
    for name in a:
        assert a[name].keys() == b[name].keys() and a[name].keys(), name
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k], b[name].rows[k]), (name, k)
            assert a[name].scores[k] == b[name].scores[k], (name, k)


def _cases(rank: int, world: int, path: str) -> None:
    _scores_follow_steps(rank, world)
    _oldest_steps_are_evicted(rank, world)
    _resumed_sharded_model_trains_on_identically(rank, world, path)


def test_step_scores_through_a_sharded_model(tmp_path):
    run_workers(_cases, str(tmp_path / "dump"), timeout=300)
