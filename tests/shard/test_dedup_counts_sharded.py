"""A sharded EmbeddingCollection with ``use_index_dedup=True`` counts every occurrence (issue 28,
items 4 and 5), and a KJT whose lengths do not fit its features x batch is refused by name (item 10).

Two gloo ranks train the same batches through two models that differ only in ``use_index_dedup``:
each rank's table must hold the same keys with the same LFU counts (hand-counted over the keys the
rank owns), and admission at threshold 3 must admit the same keys: before the fix the deduplicated
ids reached the lookup once each, so their LFU counts and their admission counts lost every repeat.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

import pytest
import torch
from dist_harness import dynamic_kernels, run_workers, shard_model
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard.ownership import owner_rank

CONFIGS = [
    EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=64, feature_names=["f0", "f1"])
]
# per rank, per step: f0's bags then f1's (2 samples each); keys repeat within and across features
BATCHES = [
    ([[3, 3], [3, 8]], [[8, 3], [11]]),
    ([[8], [5, 5, 5]], [[5], [3]]),
    ([[11, 11], [2]], [[11], [2, 2]]),
]


def _kjt(step: int, rank: int) -> KeyedJaggedTensor:
    f0, f1 = BATCHES[step]
    bags = [[k + 100 * rank for k in bag] for bag in f0 + f1]  # ranks send different keys
    return KeyedJaggedTensor(
        keys=["f0", "f1"],
        values=torch.tensor([k for bag in bags for k in bag]),
        lengths=torch.tensor([len(bag) for bag in bags]),
    )


def _model(world: int, dedup: bool, admission: bool):
    options = DynamicEmbTableOptions(
        score_strategy=DynamicEmbScoreStrategy.LFU, dist_type="roundrobin"
    )
    if admission:
        options = DynamicEmbTableOptions(
            score_strategy=DynamicEmbScoreStrategy.LFU,
            dist_type="roundrobin",
            admit_strategy=FrequencyAdmissionStrategy(3),
            admission_counter=KVCounter(capacity=256, bucket_capacity=128, device="cpu"),
        )
    constraints = {
        "t0": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options)
    }
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    dedup_kw = {"use_index_dedup": dedup}
    return shard_model(False, CONFIGS, constraints, fused, world, sharder_kwargs=dedup_kw)


def _scores(model) -> Dict[int, int]:
    kernel, i = dynamic_kernels(model)["t0"]
    stored = list(kernel.emb_module.tables[i].export(0))
    keys = torch.cat([k for k, _, _ in stored]) if stored else torch.empty(0, dtype=torch.int64)
    table = kernel.emb_module.tables[i].device_table()
    res = table.find(keys, 0)
    return dict(zip(keys.tolist(), res.scores[:, 0].tolist()))


def _cases(rank: int, world: int) -> None:
    # every key of every rank's batches, counted on its owner (roundrobin: key % world)
    sent: List[Counter] = [Counter() for _ in range(len(BATCHES))]
    for step in range(len(BATCHES)):
        for r in range(world):
            for k in _kjt(step, r).values().tolist():
                if int(owner_rank(torch.tensor([k]), "roundrobin", world)) == rank:
                    sent[step][k] += 1
    for admission in (False, True):
        models = {dedup: _model(world, dedup, admission) for dedup in (False, True)}
        seen: Counter = Counter()
        for step in range(len(BATCHES)):
            seen.update(sent[step])
            for model in models.values():
                out = model(_kjt(step, rank))
                sum(jt.values().sum() for jt in out.values()).backward()
                model.fused_optimizer.step()
            got = {dedup: _scores(model) for dedup, model in models.items()}
            assert got[True] == got[False], (admission, step, got)
            if admission:  # admitted once seen 3 times; LFU counts from the admitting batch on
                want = {k: n for k, n in seen.items() if n >= 3}
                assert set(got[True]) == set(want), (step, got[True], want)
            else:
                assert got[True] == dict(seen), (step, got[True], dict(seen))
    # item 10: lengths that are not one per feature and sample, refused by name before any work
    model = _model(world, False, False)
    bad = KeyedJaggedTensor(
        keys=["f0", "f1"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1])
    )
    with pytest.raises(ValueError, match=r"3 lengths, but its 2 features \['f0', 'f1'\]"):
        model(bad)


def test_dedup_counts_every_occurrence_and_bad_lengths_are_named():
    run_workers(_cases)
