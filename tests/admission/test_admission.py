"""KVCounter and FrequencyAdmissionStrategy, alone and inside the batched module."""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
)
from tests.lookup import oracle


def test_kv_counter_accumulates_and_erases(device):
    c = KVCounter(capacity=64, bucket_capacity=16, device=device)
    keys = torch.tensor([1, 2, 3], device=device)
    assert c.add(keys, torch.tensor([1, 2, 3], device=device), True).tolist() == [1, 2, 3]
    assert c.add(keys, torch.tensor([1, 1, 1], device=device), False).tolist() == [2, 3, 4]
    assert c.add(keys, torch.tensor([1, 1, 1], device=device), True).tolist() == [2, 3, 4]
    c.erase(torch.tensor([2], device=device))
    assert c.add(keys, torch.zeros(3, dtype=torch.int64, device=device), False).tolist() == [
        2,
        0,
        4,
    ]


def test_kv_counter_full_bucket_evicts_lowest_count(device):
    c = KVCounter(capacity=16, bucket_capacity=16, device=device)
    keys = torch.arange(16, device=device)
    counts = torch.arange(16, device=device) + 10
    counts[5] = 1  # the lowest count
    c.add(keys, counts, True)
    c.add(torch.tensor([100], device=device), torch.tensor([50], device=device), True)
    after = c.add(
        torch.cat([keys, torch.tensor([100], device=device)]),
        torch.zeros(17, dtype=torch.int64, device=device),
        False,
    )
    assert after[5].item() == 0  # key 5 was evicted
    assert after[16].item() == 50 and bool((after[:5] > 0).all()) and bool((after[6:16] > 0).all())


def test_kv_counter_dump_load_round_trip(tmp_path, device):
    c = KVCounter(capacity=64, bucket_capacity=16, device=device)
    c.add(torch.tensor([7, 8], device=device), torch.tensor([3, 4], device=device), True)
    c.dump(str(tmp_path / "k"), str(tmp_path / "f"))
    d = c.create(torch.device(device))
    d.load(str(tmp_path / "k"), str(tmp_path / "f"))
    got = d.add(
        torch.tensor([7, 8], device=device), torch.zeros(2, dtype=torch.int64, device=device), False
    )
    assert got.tolist() == [3, 4]


def test_frequency_strategy_admits_at_threshold():
    s = FrequencyAdmissionStrategy(threshold=3)
    assert s.admit(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])).tolist() == [False, True, True]
    # the seed allows 0: every key is admitted on first sight
    zero = FrequencyAdmissionStrategy(threshold=0)
    assert zero.admit(torch.tensor([1, 2]), torch.tensor([0, 1])).tolist() == [True, True]
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        FrequencyAdmissionStrategy(threshold=-1)
    with pytest.raises(TypeError, match="threshold must be an int"):
        FrequencyAdmissionStrategy(threshold=2.5)


def _module(device, **kw):
    opts = oracle.debug_options(4, max_capacity=256, bucket_capacity=128, **kw)
    return oracle.one_table_module(
        opts, device, EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.NONE, learning_rate=0.1
    )


def test_key_not_admitted_gets_an_embedding_but_is_not_stored(device):
    reject_init = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.5)
    m = _module(
        device,
        admit_strategy=FrequencyAdmissionStrategy(3, reject_init),
        admission_counter=KVCounter(capacity=64, bucket_capacity=16, device=device),
    )
    keys = torch.tensor([5, 5, 9], device=device)
    offsets = torch.tensor([0, 3], device=device)
    out = m(keys, offsets)  # key 5 counted twice, key 9 once: none reaches 3
    assert torch.all(out == 0.5)
    out.sum().backward()  # no home: no update, no error
    assert m.tables[0].size(0) == 0
    out = m(keys, offsets)  # key 5 now at 4: admitted with the table's initializer (DEBUG: 5.0)
    assert out[0, 0].item() == 5.0 and out[2, 0].item() == 0.5
    assert m.tables[0].size(0) == 1


def test_admission_by_registered_names(device):
    m = _module(device, admit_strategy="frequency", admit_strategy_options={"threshold": 2})
    keys, offsets = torch.tensor([1], device=device), torch.tensor([0, 1], device=device)
    m(keys, offsets)
    assert m.tables[0].size(0) == 0
    m(keys, offsets)
    assert m.tables[0].size(0) == 1
