"""Hand-worked behaviours of ScoredHashTable, one per rule of docs/table_design.md.

Expected values are derived in each test from the rule itself (which key shares which bucket comes
from the hashing mirror, checked against the kernel in test_hashing.py); the randomized comparison
with the pure-Python model lives in test_against_reference.py.
"""

from __future__ import annotations

import math
import time
import types
import warnings
from typing import List, Optional

import pytest
import torch

from dynamicemb_core.config import (
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    EvictedItemMode,
)
from dynamicemb_core.config import (
    DynamicEmbScoreStrategy as S,
)
from dynamicemb_core.environment import determinism_mode
from dynamicemb_core.table import ScoredHashTable, TableSpec
from dynamicemb_core.table.hashing import bucket_of
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EDGE_KEYS = [INT64_MIN, INT64_MAX, -1, 0]


def keys_in_bucket(bucket: int, num_buckets: int, count: int, start: int = 0) -> List[int]:
    """The first ``count`` keys >= start whose home bucket is ``bucket``."""
    out, k = [], start
    while len(out) < count:
        if bucket_of(k, num_buckets) == bucket:
            out.append(k)
        k += 1
    return out


def one_bucket(device: torch.device, strategy=S.LFU, **kw) -> ScoredHashTable:
    """A single table of one 16-slot bucket that cannot grow (capacity fixed at 16)."""
    kw.setdefault("init_capacity", 16)
    kw.setdefault("max_capacity", 16)
    spec = TableSpec("t", bucket_capacity=16, score_strategy=strategy, max_load_factor=1.0, **kw)
    return ScoredHashTable([spec], device)


def tensor(values, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


# ------------------------------------------------------------------------------------------------
# Keys, slots, rows
# ------------------------------------------------------------------------------------------------
def test_find_returns_inserted_slots_and_rows_and_misses(device: torch.device) -> None:
    table = ScoredHashTable(
        [TableSpec("t", row_width=3, init_capacity=64, max_capacity=64, bucket_capacity=16)], device
    )
    keys = tensor([10, 20, 30], device)
    rows = torch.arange(9, dtype=torch.float32, device=device).reshape(3, 3)
    slots = table.insert(keys, rows=rows)
    found = table.find(tensor([20, 99, 10], device))
    assert found.found.tolist() == [True, False, True]
    assert found.slots.tolist() == [slots[1].item(), -1, slots[0].item()]
    torch.testing.assert_close(
        table.read_rows(0, found.slots), torch.stack([rows[1], rows[1] * 0, rows[0]])
    )
    assert table.size(0) == 3


def test_every_int64_key_is_valid_including_edges(device: torch.device) -> None:
    table = ScoredHashTable(
        [TableSpec("t", init_capacity=64, max_capacity=64, bucket_capacity=16)], device
    )
    keys = tensor(EDGE_KEYS, device)
    table.insert_and_evict(keys, score=5)
    assert table.find(keys).found.all()
    assert sorted(table.export(0).keys.tolist()) == sorted(EDGE_KEYS)
    assert table.erase(tensor([INT64_MIN, 7], device)).tolist() == [True, False]
    assert table.find(keys).found.tolist() == [False, True, True, True]
    assert table.size(0) == 3


def test_duplicates_in_one_call_share_a_slot_and_are_all_new(device: torch.device) -> None:
    table = one_bucket(device, S.LFU)
    res = table.find_or_insert(tensor([5, 6, 5, 5], device))
    assert res.slots[0] == res.slots[2] == res.slots[3] != res.slots[1]
    assert res.is_new.tolist() == [True, True, True, True]
    # LFU: a new key starts at its number of occurrences; a touch adds them.
    assert table.find(tensor([5, 6], device)).scores.flatten().tolist() == [3, 1]
    res = table.find_or_insert(tensor([6, 6], device))
    assert res.is_new.tolist() == [False, False]
    assert table.find(tensor([6], device), update_score=True).scores.item() == 4


def test_tables_keep_separate_keys_and_local_slots(device: torch.device) -> None:
    specs = [
        TableSpec("a", init_capacity=32, max_capacity=32, bucket_capacity=16),
        TableSpec("b", init_capacity=16, max_capacity=16, bucket_capacity=16),
    ]
    table = ScoredHashTable(specs, device)
    res = table.find_or_insert(tensor([1, 1, 2], device), tensor([0, 1, 1], device), score=3)
    assert res.is_new.all()
    assert table.find(tensor([1, 2], device), 0).found.tolist() == [True, False]
    assert table.size(0) == 1 and table.size(1) == 2
    assert int(res.slots.max()) < 32  # local slots


# ------------------------------------------------------------------------------------------------
# Score strategies
# ------------------------------------------------------------------------------------------------
def test_timestamp_uses_given_score_or_the_clock() -> None:
    table = one_bucket(torch.device("cpu"), S.TIMESTAMP)
    table.find_or_insert(tensor([1], "cpu"), score=5)
    assert table.export(0).scores.tolist() == [[5]]
    before = time.monotonic_ns()
    table.find(tensor([1], "cpu"), update_score=True)
    after = time.monotonic_ns()
    assert before <= table.export(0).scores.item() <= after


# NO_EVICTION scores insertion numbers, not time (tests/checkpoint/test_no_eviction_scores.py)
@pytest.mark.parametrize("strategy", [S.TIMESTAMP, (S.LFU, S.TIMESTAMP)])
def test_get_score_of_a_clock_table_reads_the_kernels_clock(
    device: torch.device, strategy, monkeypatch
) -> None:
    """get_score lies between the times the kernels stamp before and after it on this device (the
    CUDA kernels read %globaltimer, not the host's monotonic clock); Python's clock is not used."""
    monkeypatch.setattr(time, "monotonic_ns", lambda: -12345)
    table = one_bucket(device, strategy)
    table.insert(tensor([1], device))
    score = table.get_score(0)
    table.insert(tensor([2], device))
    exported = table.export(0)
    stamps = dict(zip(exported.keys.tolist(), exported.scores[:, -1].tolist()))
    assert 0 < stamps[1] <= score <= stamps[2]


def test_step_scores_follow_advance_step(device: torch.device) -> None:
    table = one_bucket(device, S.STEP)
    table.find_or_insert(tensor([1], device))
    table.advance_step()
    table.advance_step(0)
    table.find_or_insert(tensor([2], device))
    assert table.get_score(0) == 2
    assert dict(zip(table.export(0).keys.tolist(), table.export(0).scores.flatten().tolist())) == {
        1: 0,
        2: 2,
    }


def test_customized_score_is_written_and_warns_when_it_goes_down(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = one_bucket(device, S.CUSTOMIZED)
    table.set_score(0, 40)
    table.find_or_insert(tensor([1], device))
    assert table.export(0).scores.item() == 40
    with pytest.warns(DynamicEmbWarning, match="goes down from 40 to 30"):
        table.set_score(0, 30)
    monkeypatch.setenv("DYNAMICEMB_CSTM_SCORE_CHECK", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table.set_score(0, 10)
    assert table.get_score(0) == 10


@pytest.mark.parametrize(
    "order", [(S.TIMESTAMP, S.LFU), (S.LFU, S.TIMESTAMP)], ids=["ts_lfu", "lfu_ts"]
)
def test_compound_columns_follow_the_strategy_tuple(device: torch.device, order) -> None:
    table = one_bucket(device, order)
    table.find_or_insert(tensor([7, 7, 7], device), score=100)
    expected = [100, 3] if order[0] == S.TIMESTAMP else [3, 100]
    assert table.export(0).scores.tolist() == [expected]
    assert table.find(tensor([7], device)).scores.tolist() == [expected]
    # Input scores are read in the same user order, and export_if's threshold applies to the time.
    table.insert(tensor([8], device), scores=tensor([expected], device))
    assert table.find(tensor([8], device)).scores.tolist() == [expected]
    assert table.export(0, threshold=101).keys.numel() == 0
    assert sorted(table.export(0, threshold=100).keys.tolist()) == [7, 8]


def test_export_threshold_selects_by_score_in_slot_order(device: torch.device) -> None:
    table = one_bucket(device, S.STEP)
    keys = keys_in_bucket(0, 1, 6)
    table.insert(tensor(keys, device), scores=tensor([[s] for s in range(6)], device))
    out = table.export(0, threshold=3)
    assert sorted(out.keys.tolist()) == keys[3:]
    assert out.slots.tolist() == sorted(out.slots.tolist())
    # each key with its own score (which slot each key got depends on the CUDA engine's schedule)
    assert dict(zip(out.keys.tolist(), out.scores.flatten().tolist())) == {
        k: s for s, k in enumerate(keys) if s >= 3
    }


# ------------------------------------------------------------------------------------------------
# Eviction
# ------------------------------------------------------------------------------------------------
def test_full_bucket_evicts_lowest_score_then_lowest_slot(device: torch.device) -> None:
    table = one_bucket(device, S.CUSTOMIZED)
    old = list(range(100, 116))
    scores = [5] * 16
    scores[9], scores[12] = 1, 1  # two lowest: tie broken by the lower slot
    slots = table.insert(tensor(old, device), scores=tensor([[s] for s in scores], device))
    lowest = min((slots[9].item(), 9), (slots[12].item(), 12))[1]
    res = table.insert_and_evict(tensor([7], device), score=9)
    assert res.evicted.keys.tolist() == [old[lowest]]
    assert res.evicted.slots.tolist() == [slots[lowest].item()] == res.slots.tolist()
    assert res.evicted.scores.tolist() == [[1]]
    res = table.insert_and_evict(tensor([8], device), score=9)
    assert res.evicted.keys.tolist() == [old[21 - lowest]]  # the other score-1 key


def test_eviction_happens_only_in_a_full_bucket(device: torch.device) -> None:
    table = ScoredHashTable(
        [
            TableSpec(
                "t",
                init_capacity=32,
                max_capacity=32,
                bucket_capacity=16,
                max_load_factor=1.0,
                score_strategy=S.LFU,
            )
        ],
        device,
    )
    full = keys_in_bucket(0, 2, 16)
    table.insert(tensor(full, device))
    other = keys_in_bucket(1, 2, 1)
    res = table.insert_and_evict(tensor(other, device))
    assert res.evicted.keys.numel() == 0 and res.is_new.all()
    res = table.insert_and_evict(tensor(keys_in_bucket(0, 2, 1, start=full[-1] + 1), device))
    assert res.evicted.keys.numel() == 1 and res.evicted.keys.item() in full


def test_slots_written_in_a_call_are_protected(device: torch.device) -> None:
    table = one_bucket(device, S.LFU)
    table.insert(tensor(list(range(100, 116)), device))
    new = list(range(16)) + [50, 51, 52, 53]
    res = table.insert_and_evict(tensor(new, device))
    placed = res.slots[res.slots >= 0]
    assert placed.numel() == 16 and placed.unique().numel() == 16
    assert sorted(res.evicted.keys.tolist()) == list(range(100, 116))
    found = table.find(tensor(new, device))
    # the bucket is full of keys written by this call: the 4 left over find no slot
    assert found.found.tolist() == (res.slots >= 0).tolist()
    if device.type == "cpu" or determinism_mode():
        # the deterministic rule: the first 16 new keys in input order win
        assert found.found.tolist() == [True] * 16 + [False] * 4
    # (the key-parallel CUDA engine, DEMB_DETERMINISM_MODE=0, places 16 of the 20 too, chosen by
    # its schedule)


def test_present_key_keeps_its_slot_when_a_new_key_comes_first(device: torch.device) -> None:
    table = one_bucket(device, S.CUSTOMIZED)
    old = list(range(100, 116))
    slots = table.insert(tensor(old, device), scores=tensor([[s] for s in range(16)], device))
    # key 100 has the lowest score, but it is touched by the same call: 101 is evicted instead.
    res = table.insert_and_evict(tensor([7, 100], device), score=50)
    assert res.slots[1] == slots[0]
    assert res.evicted.keys.tolist() == [101]


def test_evicted_rows_are_read_before_new_rows_are_written(device: torch.device) -> None:
    table = one_bucket(device, S.CUSTOMIZED, row_width=2)
    old = list(range(100, 116))
    rows = torch.arange(32, dtype=torch.float32, device=device).reshape(16, 2)
    table.insert(
        tensor(old, device), rows=rows, scores=tensor([[10 + s] for s in range(16)], device)
    )
    new_rows = torch.full((1, 2), -1.0, device=device)
    res = table.insert_and_evict(tensor([1], device), rows=new_rows, score=99)
    torch.testing.assert_close(res.evicted.rows, rows[:1])
    torch.testing.assert_close(table.read_rows(0, res.slots), new_rows)


def test_no_eviction_grows_up_to_max_capacity_instead_of_evicting(device: torch.device) -> None:
    table = ScoredHashTable(
        [
            TableSpec(
                "t",
                init_capacity=16,
                max_capacity=128,
                bucket_capacity=16,
                row_width=1,
                score_strategy=S.NO_EVICTION,
            )
        ],
        device,
    )
    keys = tensor(list(range(40)), device)
    res = table.insert_and_evict(keys, rows=keys.to(torch.float32).unsqueeze(1), score=1)
    assert (res.slots >= 0).all() and res.evicted.keys.numel() == 0
    assert table.size(0) == 40 and table.capacity(0) in (32, 64, 128)  # doubled, never evicted
    found = table.find(keys)
    torch.testing.assert_close(table.read_rows(0, found.slots).squeeze(1), keys.to(torch.float32))


def test_retain_key_collects_evicted_keys_once(device: torch.device) -> None:
    specs = [
        TableSpec(
            "keep",
            init_capacity=16,
            max_capacity=16,
            bucket_capacity=16,
            score_strategy=S.LFU,
            evicted_item_mode=EvictedItemMode.RETAIN_KEY,
        ),
        TableSpec(
            "drop", init_capacity=16, max_capacity=16, bucket_capacity=16, score_strategy=S.LFU
        ),
    ]
    table = ScoredHashTable(specs, device)
    for t in (0, 1):
        table.insert(tensor(list(range(16)), device), t)
        table.insert(tensor(list(range(100, 104)), device), t)  # plain insert also reports
    table.insert(tensor(list(range(200, 202)), device), 0)
    popped = table.pop_evicted_keys(0).tolist()
    assert (
        len(popped) == 6
        and popped == sorted(set(popped))
        and set(popped) <= set(range(16)) | set(range(100, 104))
    )
    assert table.pop_evicted_keys(0).numel() == 0
    assert table.pop_evicted_keys(1).numel() == 0


def test_clear_empties_keys_but_keeps_rows_capacity_step_and_retained_keys(
    device: torch.device,
) -> None:
    table = one_bucket(
        device,
        S.STEP,
        row_width=1,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,
    )
    table.set_score(0, 3)
    keys = list(range(100, 116))
    slots = table.insert(tensor(keys, device), rows=torch.arange(16.0, device=device)[:, None])
    evicted = table.insert_and_evict(tensor([1], device)).evicted.keys.tolist()
    rows_before = table.values(0).clone()
    table.clear(0)
    assert table.size(0) == 0 and table.capacity(0) == 16 and table.get_score(0) == 3
    assert not table.find(tensor(keys + [1], device)).found.any()
    torch.testing.assert_close(table.values(0), rows_before)  # rows stay until overwritten
    assert table.pop_evicted_keys(0).tolist() == evicted  # cleared keys are not "evicted"
    fresh = table.insert(tensor([7], device))
    assert int(fresh) in slots.tolist() and table.size(0) == 1


# ------------------------------------------------------------------------------------------------
# Score functions (compound strategy)
# ------------------------------------------------------------------------------------------------
def keep_old_evict_frequent(scores, cur_timestamp):
    """Lower for higher counts: evicts the most frequent key (the reverse of LFU)."""
    return -1.0 * scores[1]


def nan_for_count_two(scores, cur_timestamp):
    if scores[0] == 2:
        return math.nan
    return 1.0 * scores[0]


def test_score_function_picks_the_victim() -> None:
    table = one_bucket(
        torch.device("cpu"), (S.TIMESTAMP, S.LFU), score_function=keep_old_evict_frequent
    )
    old = list(range(100, 116))
    table.insert(tensor(old, "cpu"), scores=tensor([[1, 1 + (k == 105) * 50] for k in old], "cpu"))
    res = table.insert_and_evict(tensor([1], "cpu"), score=10)
    assert res.evicted.keys.tolist() == [105]


def test_score_function_nan_is_evicted_first() -> None:
    table = one_bucket(torch.device("cpu"), (S.LFU, S.TIMESTAMP), score_function=nan_for_count_two)
    old = list(range(100, 116))
    counts = [1] * 16
    counts[11] = 2  # NaN, although count 1 ranks lower everywhere else
    table.insert(tensor(old, "cpu"), scores=tensor([[c, 5] for c in counts], "cpu"))
    res = table.insert_and_evict(tensor([1], "cpu"), score=10)
    assert res.evicted.keys.tolist() == [111]


def test_score_function_needs_the_compound_strategy() -> None:
    with pytest.raises(ValueError, match="compound"):
        TableSpec("t", score_strategy=S.LFU, score_function=keep_old_evict_frequent)
    from dynamicemb_core.table.score_function import compile_score_function

    with pytest.raises(ValueError, match="compound"):
        compile_score_function(keep_old_evict_frequent, S.TIMESTAMP)


WEIGHT = 1.0  # read by weight_from_globals; each test copy of it gets its own globals


def weight_from_globals(scores, cur_timestamp):
    return WEIGHT * scores[1]


def weighted_by_closure(weight: float):
    def score(scores, cur_timestamp):
        return weight * scores[1]

    return score


def weighted_by_default(weight: float):
    def score(scores, cur_timestamp, weight=weight):
        return weight * scores[1]

    return score


def weighted_by_globals(weight: float):
    return types.FunctionType(weight_from_globals.__code__, {**globals(), "WEIGHT": weight})


@pytest.mark.parametrize("make", [weighted_by_closure, weighted_by_default, weighted_by_globals])
def test_functions_with_one_source_but_other_values_keep_their_own_callback(make) -> None:
    """Two functions of one source (closures, defaults, globals) rank by their own values: -1
    evicts the most frequent key, +1 the least frequent, in two tables built one after the other."""
    old = list(range(100, 116))
    counts = {k: 1 + 50 * (k == 105) - (k == 110) for k in old}
    victims = []
    for weight in (-1.0, 1.0):
        table = one_bucket(torch.device("cpu"), (S.TIMESTAMP, S.LFU), score_function=make(weight))
        table.insert(tensor(old, "cpu"), scores=tensor([[1, counts[k]] for k in old], "cpu"))
        victims.append(table.insert_and_evict(tensor([1], "cpu"), score=10).evicted.keys.tolist())
    assert victims == [[105], [110]]


def test_one_function_object_is_compiled_once_per_column_order() -> None:
    from dynamicemb_core.table.score_function import compile_score_function

    fn = weighted_by_closure(2.0)
    first = compile_score_function(fn, (S.TIMESTAMP, S.LFU))
    assert compile_score_function(fn, (S.TIMESTAMP, S.LFU)) is first
    other_order = compile_score_function(fn, (S.LFU, S.TIMESTAMP))
    assert other_order is not first and not other_order.timestamp_first


def test_cuda_score_function_cache_is_keyed_by_the_function_object(monkeypatch) -> None:
    """The CUDA cache's keying, on CPU: compilation itself is replaced by a recorder (the compiled
    kernels are tested on a GPU in test_cuda_score_function.py)."""
    from dynamicemb_core.table import score_function_cuda

    compiled = []

    def fake_compile(fn, timestamp_first, index, cc):
        compiled.append(fn)
        return score_function_cuda.CompiledCudaScoreFunction(len(compiled), fn, timestamp_first, cc)

    monkeypatch.setattr(score_function_cuda, "_compile", fake_compile)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(score_function_cuda, "_cache", {})
    strategy = (S.TIMESTAMP, S.LFU)
    a, b = weighted_by_closure(-1.0), weighted_by_closure(1.0)
    handle_a = score_function_cuda.score_fn_handle(a, strategy, "cuda:0")
    handle_b = score_function_cuda.score_fn_handle(b, strategy, "cuda:0")
    assert handle_a != handle_b and compiled == [a, b]
    assert score_function_cuda.score_fn_handle(a, strategy, "cuda:0") == handle_a
    assert compiled == [a, b]


# ------------------------------------------------------------------------------------------------
# Expansion
# ------------------------------------------------------------------------------------------------
def test_expansion_doubles_up_to_max_and_keeps_rows(device: torch.device) -> None:
    table = ScoredHashTable(
        [
            TableSpec(
                "t",
                row_width=1,
                init_capacity=16,
                max_capacity=64,
                bucket_capacity=16,
                score_strategy=S.LFU,
            )
        ],
        device,
    )
    keys = tensor(list(range(8)), device)
    table.insert(keys, rows=keys.to(torch.float32).unsqueeze(1))
    assert table.capacity(0) == 16  # 8 <= 0.5 * 16
    more = tensor(list(range(8, 12)), device)
    table.insert(more, rows=more.to(torch.float32).unsqueeze(1))
    assert table.capacity(0) == 32
    table.insert(tensor(list(range(12, 40)), device))
    assert table.capacity(0) == 64
    table.insert(tensor(list(range(40, 200)), device))
    assert table.capacity(0) == 64  # capped
    assert table.bucket_capacity(0) == 16
    found = table.find(tensor(list(range(12)), device))
    rows = table.read_rows(0, found.slots).squeeze(1)
    kept = found.found
    torch.testing.assert_close(
        rows[kept], torch.arange(12, dtype=torch.float32, device=device)[kept]
    )


def test_single_bucket_table_doubles_its_bucket(device: torch.device) -> None:
    table = ScoredHashTable(
        [TableSpec("t", init_capacity=40, max_capacity=160, bucket_capacity=MAX_BUCKET_CAPACITY)],
        device,
    )
    assert (table.capacity(0), table.bucket_capacity(0)) == (40, 40)
    table.insert_and_evict(tensor(list(range(30)), device), score=1)
    assert (table.capacity(0), table.bucket_capacity(0)) == (80, 80)
    assert table.find(tensor(list(range(30)), device)).found.all()


# ------------------------------------------------------------------------------------------------
# Safe check, replay, determinism
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, deterministic",
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        (" False ", False),
        ("1", True),
        ("true", True),
        ("yes", True),
    ],
)
def test_determinism_mode_is_off_unless_set(
    monkeypatch: pytest.MonkeyPatch, value: Optional[str], deterministic: bool
) -> None:
    """DEMB_DETERMINISM_MODE: unset (the default), empty, "0" or "false" select the key-parallel CUDA
    engine; any other value the deterministic one. A table reads it when it is built."""
    if value is None:
        monkeypatch.delenv("DEMB_DETERMINISM_MODE", raising=False)
    else:
        monkeypatch.setenv("DEMB_DETERMINISM_MODE", value)
    assert determinism_mode() is deterministic
    assert one_bucket(torch.device("cpu"), S.LFU)._deterministic is deterministic


@pytest.mark.parametrize("mode", [DynamicEmbCheckMode.WARNING, DynamicEmbCheckMode.ERROR])
def test_safe_check_mode_reports_unplaced_keys(device: torch.device, mode) -> None:
    table = one_bucket(device, S.LFU, safe_check_mode=mode)
    keys = tensor(list(range(20)), device)
    if mode == DynamicEmbCheckMode.ERROR:
        with pytest.raises(DynamicEmbError, match="table 't': 4 of 20 keys"):
            table.insert(keys)
    else:
        with pytest.warns(DynamicEmbWarning, match="table 't': 4 of 20 keys"):
            table.insert(keys)


def test_insert_at_places_exactly_and_rejects_before_writing(device: torch.device) -> None:
    table = ScoredHashTable(
        [
            TableSpec(
                "t",
                row_width=1,
                init_capacity=32,
                max_capacity=32,
                bucket_capacity=16,
                score_strategy=S.STEP,
            )
        ],
        device,
    )
    k0, k1 = keys_in_bucket(0, 2, 1)[0], keys_in_bucket(1, 2, 1)[0]
    table.insert_at(
        0,
        tensor([k0, k1], device),
        tensor([5, 20], device),
        rows=torch.tensor([[1.0], [2.0]], device=device),
        scores=tensor([[3], [4]], device),
    )
    found = table.find(tensor([k0, k1], device))
    assert found.slots.tolist() == [5, 20] and found.scores.flatten().tolist() == [3, 4]
    assert table.size(0) == 2
    before = table.export(0)
    bad = keys_in_bucket(0, 2, 2, start=k0 + 1)
    for slots in ([3, 20], [6, 6], [6, 5]):  # other bucket / claimed twice / held by k0
        with pytest.raises(DynamicEmbError, match=f"key {bad[1]} at slot {slots[1]}"):
            table.insert_at(0, tensor(bad, device), tensor(slots, device))
        after = table.export(0)
        assert (
            after.keys.tolist() == before.keys.tolist()
            and after.slots.tolist() == before.slots.tolist()
        )


def failing_index_model(placed: List[bool], keys: List[int], slots: List[int]):
    """The batch rule of insert_at, entry by entry: the first i the kernel refused, or whose slot an
    earlier entry gave to another key, or whose key an earlier entry put at another slot."""
    for i in range(len(keys)):
        earlier = range(i)
        if (
            not placed[i]
            or any(slots[j] == slots[i] and keys[j] != keys[i] for j in earlier)
            or any(keys[j] == keys[i] and slots[j] != slots[i] for j in earlier)
        ):
            return i
    return None


@pytest.mark.parametrize("seed", range(40))
def test_failing_index_matches_the_entry_by_entry_rule(seed: int) -> None:
    from dynamicemb_core.table.replay import failing_index

    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 60, (1,), generator=gen))
    pool = tensor([INT64_MIN, INT64_MAX, -1, 0, 7, 2**40], "cpu")  # few values: many repeats
    keys = pool[torch.randint(0, 6, (n,), generator=gen)]
    slots = torch.randint(-2, 4 + seed % 5, (n,), generator=gen)
    if seed % 2:  # consistent pairs (key k always at slot k % 4) with one late disagreement
        slots = keys.remainder(4)
        slots[-1] += seed % 3
    placed = torch.rand(n, generator=gen) > 0.02 * (seed % 4)
    expected = failing_index_model(placed.tolist(), keys.tolist(), slots.tolist())
    assert failing_index(placed, keys, slots) == expected


def test_first_occurrence_is_linear_not_a_sort(monkeypatch) -> None:
    """Replay checks millions of rows: the batch check scatters instead of sorting."""
    from dynamicemb_core.table import replay

    def no_sort(*args, **kwargs):
        raise AssertionError("the insert_at batch check must not sort")

    for name in ("argsort", "sort", "unique", "unique_consecutive"):
        monkeypatch.setattr(torch, name, no_sort)
    monkeypatch.setattr(torch.Tensor, "argsort", no_sort)
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-(2**62), 2**62, (5000,), generator=gen)[
        torch.randint(0, 5000, (20000,))
    ]
    for vals in (values, torch.randint(-3, 40, (3000,), generator=gen)):  # hashed, dense
        seen: dict = {}
        expected = [seen.setdefault(v, i) for i, v in enumerate(vals.tolist())]
        assert replay.first_occurrence(vals).tolist() == expected
    assert (
        replay.failing_index(
            torch.ones(4, dtype=torch.bool),
            tensor([1, 2, 1, 3], "cpu"),
            tensor([0, 1, 0, 1], "cpu"),
        )
        == 3
    )


def test_insert_result_does_not_depend_on_thread_count() -> None:
    """CPU inserts are deterministic: 1 and 2 threads give the same slots and evictions."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 6000, (50_000,), generator=gen)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            table = ScoredHashTable(
                [
                    TableSpec(
                        "t",
                        init_capacity=4096,
                        max_capacity=4096,
                        bucket_capacity=16,
                        score_strategy=S.LFU,
                    )
                ]
            )
            res = table.insert_and_evict(keys)
            results.append((res.slots, res.evicted.keys, table.export(0).keys))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_init_capacity_is_rounded_up_to_whole_buckets_with_a_warning() -> None:
    with pytest.warns(DynamicEmbWarning, match="init_capacity 40 rounded up to 48") as caught:
        table = ScoredHashTable(
            [TableSpec("t", init_capacity=40, max_capacity=64, bucket_capacity=16)]
        )
    assert caught[0].filename == __file__  # points at the caller
    assert table.capacity(0) == 48
