"""Admission counts every occurrence, and its refusals are misses (issue 28, items 5 and 6).

A sharded EmbeddingCollection with ``use_index_dedup=True`` deduplicates its ids before the lookup;
the deduplicated ids carry their occurrence counts (``occurrence_counts`` of the batched module), so
the admission counter sees the same frequencies as without dedup: a key seen 3 times in a batch is
admitted at threshold 3 either way. The multi-process test runs the real sharder path. Keys an
admission strategy refuses were looked up and missed: ``hits + misses`` is the unique keys looked up
(docs/lookup.md).
"""

from __future__ import annotations

from typing import Dict, List, Set

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.shard.dedup import dedup_by_table
from tests.lookup import oracle

ROW_BYTES = 4 * 4  # dim 4, EXACT_SGD: the embedding only, float32
# storage-only (device rows), hybrid (a device budget of one 16-row bucket, the rest on the host), a small cache
SETUPS = {
    "storage": {},
    "hybrid": {"local_hbm_for_values": 16 * ROW_BYTES},
    "cache": {"caching": True, "local_hbm_for_values": 16 * ROW_BYTES},
}
# Batches and, by hand, the keys admitted after each at threshold 3 (counts accumulate while a key
# waits): 1 seen 3 times in batch 0; 4 four times and 2 for the third time in batch 1; 3 in batch 2.
BATCHES = [[1, 1, 1, 2, 2, 3], [2, 4, 4, 4, 4, 6], [3, 3, 5, 6]]
ADMITTED = [{1}, {1, 2, 4}, {1, 2, 3, 4}]


def _module(device, setup: str):
    opts = oracle.debug_options(
        4,
        max_capacity=64,
        bucket_capacity=16,
        admit_strategy=FrequencyAdmissionStrategy(3),
        admission_counter=KVCounter(capacity=64, bucket_capacity=16, device=device),
        **SETUPS[setup],
    )
    return oracle.one_table_module(
        opts, device, EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.NONE, learning_rate=0.1
    )


def _stored(m, keys: List[int]) -> Set[int]:
    found = m.tables[0].find(0, torch.tensor(keys, device=m.device))[0]
    return {k for k, f in zip(keys, found.tolist()) if f}


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_occurrence_counts_admit_as_the_raw_batch(device, setup):
    raw, dedup = _module(device, setup), _module(device, setup)
    every = sorted({k for b in BATCHES for k in b})
    for step, batch in enumerate(BATCHES):
        keys = torch.tensor(batch, device=device)
        raw(keys, torch.tensor([0, len(batch)], device=device)).sum().backward()
        unique, counts = torch.unique(keys, return_counts=True)
        out = dedup(
            unique,
            torch.tensor([0, unique.numel()], device=device),
            occurrence_counts=counts.float(),  # as the deduplicated KJT's weights carry them
        )
        out.sum().backward()
        assert _stored(raw, every) == ADMITTED[step], (setup, step)
        assert _stored(dedup, every) == ADMITTED[step], (setup, step)


def test_dedup_weights_each_id_by_its_occurrences(device):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.tensor([7, 3, 7, 7, 5, 3, 7, 7, 9], device=device),
        lengths=torch.tensor([2, 1, 1, 2, 2, 1], device=device),
    )
    dedup, reverse = dedup_by_table(kjt, [2, 1], counts_as_weights=True)
    values, weights = dedup.values(), dedup.weights()
    assert torch.equal(values[reverse], kjt.values())
    got = [(int(v), int(w)) for v, w in zip(values.tolist(), weights.tolist())]
    # table 0 (a, b): 7 x3, 3 x2, 5 x1; table 1 (c): 7 x2, 9 x1
    assert sorted(got[:3]) == [(3, 2), (5, 1), (7, 3)] and sorted(got[3:]) == [(7, 2), (9, 1)]


def test_hits_plus_misses_are_the_unique_keys_looked_up(device):
    """N steps with admission: every unique key of a training lookup is a hit or a miss, refused
    keys included (misses), counted independently from the batches and the table's contents."""
    m = _module(device, "storage")
    g = torch.Generator().manual_seed(5)
    unique_total, hits, refused = 0, 0, 0
    for _ in range(12):
        batch = torch.randint(1, 30, (24,), generator=g)
        distinct = sorted(set(batch.tolist()))
        before = _stored(m, distinct)
        m(batch.to(device), torch.tensor([0, 24], device=device)).sum().backward()
        after = _stored(m, distinct)
        unique_total += len(distinct)
        hits += len(before)
        refused += len(set(distinct) - after)
    metrics: Dict[str, int] = m.metrics()["t"]
    assert refused > 0  # the batches exercise refusals
    assert metrics["hits"] + metrics["misses"] == unique_total
    assert metrics["hits"] == hits
    assert metrics["misses"] == unique_total - hits
    assert metrics["placed"] + metrics["unplaced"] == unique_total - hits - refused
