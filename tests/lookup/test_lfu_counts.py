"""LFU counts every occurrence of a key (issue 28, item 4).

NVIDIA's DynamicEmb adds each key's occurrence count in a batch to its LFU score; the grouped lookup
deduplicates its batch first, so it passes each unique key's count to the table's kernels
(``counts`` of find / insert / find_or_insert / insert_and_evict, ``touch_count`` in
csrc/include/dynamicemb/score_policy.h). Checked against counts taken by hand and against the
reference model of the table.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbScoreStrategy
from dynamicemb_core.ops import table_ops
from dynamicemb_core.table import ScoredHashTable, TableSpec
from tests.lookup import oracle
from tests.table.reference_model import LFU, RefScoredHashTable, RefSpec

COMPOUND = (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)


def _module(device, strategy, **kw):
    opts = oracle.debug_options(
        4, max_capacity=1024, bucket_capacity=128, score_strategy=strategy, **kw
    )
    return oracle.one_table_module(
        opts, device, EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.SUM, learning_rate=0.1
    )


def _counts(m, keys) -> Dict[int, int]:
    """Each key's LFU count as the table holds it (the LFU column of its scores)."""
    table = m.tables[0].device_table()
    res = table.find(torch.tensor(keys, device=m.device), 0)
    assert bool(res.found.all())
    column = res.scores[:, -1]  # LFU alone: its one column; (TIMESTAMP, LFU): the second
    return dict(zip(keys, column.tolist()))


@pytest.mark.parametrize("strategy", ["lfu", "timestamp_lfu"])
def test_lfu_counts_every_occurrence_within_and_across_batches(device, strategy):
    m = _module(device, DynamicEmbScoreStrategy.LFU if strategy == "lfu" else COMPOUND)
    # the case: 3 times in one batch, once in the next -> 4
    for keys in ([7, 7, 7, 3], [7]):
        out = m(torch.tensor(keys, device=device), torch.tensor([0, len(keys)], device=device))
        out.sum().backward()
    assert _counts(m, [7, 3]) == {7: 4, 3: 1}
    # random batches with many repeats (several bags), against a hand count
    g = torch.Generator().manual_seed(0)
    seen: Counter = Counter({7: 4, 3: 1})
    for _ in range(4):
        keys = torch.randint(1, 40, (64,), generator=g)
        seen.update(keys.tolist())
        offsets = torch.tensor([0, 10, 30, 64], device=device)
        m(keys.to(device), offsets).sum().backward()
    assert _counts(m, sorted(seen)) == dict(seen)


def test_lfu_eval_forward_counts_nothing(device):
    m = _module(device, DynamicEmbScoreStrategy.LFU)
    keys, offsets = torch.tensor([5, 5], device=device), torch.tensor([0, 2], device=device)
    m(keys, offsets).sum().backward()
    m.eval()
    m(keys, offsets)
    assert _counts(m, [5]) == {5: 2}


def test_counts_argument_matches_the_reference_model(device, monkeypatch):
    """find_or_insert_counted with per-key counts, in a small LFU table that evicts by count,
    against the model given the same counts: the same slots, the same counts per key. Slots are
    comparable with the model only under the deterministic CUDA engine (the key-parallel one picks
    free slots by schedule; test_cuda_engines_count_like_the_cpu_kernel covers its counts)."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")  # read when the table is built
    spec = dict(init_capacity=32, max_capacity=32, bucket_capacity=16, max_load_factor=1.0)
    real = ScoredHashTable(
        [TableSpec("t", row_width=0, score_strategy=DynamicEmbScoreStrategy.LFU, **spec)], device
    )
    ref = RefScoredHashTable([RefSpec("t", LFU, ("LFU",), **spec)])
    g = torch.Generator().manual_seed(3)
    for step in range(12):
        keys = torch.randperm(60, generator=g)[:20] + 1  # distinct, as a deduplicated batch
        counts = torch.randint(1, 5, (20,), generator=g)
        tids = torch.zeros_like(keys)
        res = real.find_or_insert_counted(
            keys.to(device),
            tids.to(device),
            [20],
            [real.size(0)],
            counts=counts.to(device),
        )
        want = ref.find_or_insert(keys.tolist(), 0, counts=counts.tolist())
        assert res.slots.tolist() == want.slots, step
        assert res.is_new.tolist() == want.is_new, step
        stored = real.export(0)
        model = ref.export(0)
        got = dict(zip(stored.keys.tolist(), stored.scores[:, 0].tolist()))
        assert got == dict(zip(model.keys, (s[0] for s in model.scores))), step


def test_a_prefetch_counts_no_access(device):
    """A prefetch places the batch's keys; its forward counts their accesses, once."""
    m = _module(device, DynamicEmbScoreStrategy.LFU)
    keys, offsets = torch.tensor([4, 4, 9], device=device), torch.tensor([0, 3], device=device)
    for _ in range(2):
        m.prefetch(keys, offsets)
        m(keys, offsets).sum().backward()
    assert _counts(m, [4, 9]) == {4: 4, 9: 2}


def test_negative_counts_are_refused():
    table = ScoredHashTable(
        [TableSpec("t", row_width=0, score_strategy=DynamicEmbScoreStrategy.LFU)], "cpu"
    )
    keys = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"counts\[1\] must be >= 0"):
        table_ops.find_or_insert(
            keys,
            torch.zeros_like(keys),
            table.state,
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
            counts=torch.tensor([1, -1]),
        )
    assert table.size(0) == 0  # refused before anything was written


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "key_parallel"])
@pytest.mark.parametrize("op", ["find", "insert", "find_or_insert", "insert_and_evict"])
def test_cuda_engines_count_like_the_cpu_kernel(op, deterministic):
    """Every touching op with counts (0 included) and repeated keys, on both CUDA engines: each
    key's count equals the CPU kernel's and the hand count (1 from the first insert + its counts)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    g = torch.Generator().manual_seed(11)
    keys = torch.randint(0, 50, (300,), generator=g)
    counts = torch.randint(0, 4, (300,), generator=g)
    first = torch.unique(keys)
    want = Counter({int(k): 1 for k in first})
    for k, c in zip(keys.tolist(), counts.tolist()):
        want[k] += c
    got = {}
    for device in ("cpu", "cuda"):
        table = ScoredHashTable(
            [TableSpec("t", row_width=0, score_strategy=DynamicEmbScoreStrategy.LFU)], device
        )
        table.insert(first.to(device))
        k, c = keys.to(device), counts.to(device)
        tids = torch.zeros_like(k)
        zero = torch.zeros(1, dtype=torch.int64, device=device)
        fns = torch.zeros(1, dtype=torch.int64)
        if op == "find":
            table_ops.find(k, tids, table.state, zero, True, counts=c)
        else:
            call = getattr(table_ops, op)
            extra = () if op == "find_or_insert" else (None,)
            call(k, tids, table.state, fns, zero, *extra, deterministic=deterministic, counts=c)
        out = table.export(0)
        got[device] = dict(zip(out.keys.tolist(), out.scores[:, 0].tolist()))
    assert got["cuda"] == got["cpu"] == dict(want)
