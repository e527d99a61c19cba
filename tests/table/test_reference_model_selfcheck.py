"""Hand-worked checks of the reference model itself, so the oracle is not trusted blindly.

Each case is small enough to verify with pencil and paper against docs/table_design.md; the
randomized tests in test_against_reference.py then compare the real table with this model.
"""

from __future__ import annotations

import math

import pytest
import reference_model as ref


def _spec(policy: int, **kw) -> ref.RefSpec:
    order = kw.pop("order", ("TIMESTAMP", "LFU") if policy == ref.COMPOUND else ("X",))
    base = dict(init_capacity=16, max_capacity=16, bucket_capacity=16, max_load_factor=1.0)
    base.update(kw)
    return ref.RefSpec(name="t", policy=policy, order=order, **base)


def _one(policy: int, **kw) -> ref.RefScoredHashTable:
    return ref.RefScoredHashTable([_spec(policy, **kw)])


# Published MurmurHash3 fmix64 outputs (the same vectors appear in many independent ports).
@pytest.mark.parametrize(
    "x, expected",
    [
        (0, 0),
        (1, 0xB456BCFC34C2CB2C),
        (0xFFFFFFFFFFFFFFFF, 0x64B5720B4B825F21),
        (0x1234567890ABCDEF, 0x0CAE996FEE6BD396),
    ],
)
def test_fmix64_matches_published_vectors(x: int, expected: int) -> None:
    assert ref.fmix64(x) == expected


def test_negative_keys_hash_as_their_bit_pattern() -> None:
    assert ref.key_hash(-1) == ref.fmix64(0xFFFFFFFFFFFFFFFF)
    assert 1 <= ref.digest_of(-1) <= 255
    assert ref.bucket_of(ref.INT64_MIN, 7) == ref.fmix64(1 << 63) % 7


def test_full_bucket_evicts_lowest_score_then_lowest_slot() -> None:
    m = _one(ref.TIMESTAMP)
    assert m.insert(list(range(16)), score=5) == list(range(16))  # first empty slot, in order
    m.find([0, 1], update_score=True, score=9)  # slots 0 and 1 now newer than the rest
    res = m.insert_and_evict([100], score=10)
    assert res.slots == [2] and res.is_new == [True]  # tie among score 5: lowest slot
    assert [(e.key, e.slot, e.scores) for e in res.evicted] == [(2, 2, (5,))]
    res = m.insert_and_evict([101, 102], score=11)
    assert res.slots == [3, 4]


def test_existing_keys_in_the_call_are_protected() -> None:
    m = _one(ref.TIMESTAMP)
    m.insert(list(range(16)), scores=[(i,) for i in range(16)])
    # key 0 holds the lowest score but is touched by this call, so key 1 (slot 1) goes.
    res = m.find_or_insert([200, 0], score=50)
    assert res.slots == [1, 0] and res.is_new == [True, False]
    assert res.evicted[0].key == 1


def test_slot_minus_one_when_every_slot_was_written_in_the_call() -> None:
    m = _one(ref.STEP)
    res = m.find_or_insert(list(range(17)) + [3], score=1)
    assert res.slots == list(range(16)) + [-1, 3]
    assert res.is_new == [True] * 16 + [False, True]
    assert m.size() == 16


def test_lfu_counts_occurrences_and_duplicates_share_a_slot() -> None:
    m = _one(ref.LFU)
    res = m.find_or_insert([7, 7, 8, 7])
    assert res.slots == [0, 0, 1, 0] and res.is_new == [True, True, True, True]
    found = m.find([7, 8, 9], update_score=True)
    assert found.scores == [(4,), (2,), (0,)] and found.found == [True, True, False]


def test_compound_ranks_by_count_then_time_and_exports_in_user_order() -> None:
    m = _one(ref.COMPOUND, order=("LFU", "TIMESTAMP"))
    m.insert(list(range(16)), scores=[(1 + (i % 2), 100 - i) for i in range(16)])
    res = m.insert_and_evict([99], score=200)
    # count 1 at even slots; the oldest of those is slot 14 (time 86).
    assert res.evicted[0].slot == 14 and res.evicted[0].scores == (1, 86)
    assert m.export(0).scores[14] == (1, 200)
    m2 = _one(ref.COMPOUND, order=("TIMESTAMP", "LFU"))
    m2.insert([5], scores=[(123, 4)])
    assert m2.export(0).scores == [(123, 4)]
    assert m2.export(0, threshold=124).keys == []  # COMPOUND exports by its time word


def test_score_function_nan_is_evicted_first() -> None:
    def fn(scores, now):
        return math.nan if scores[1] == 3 else float(scores[1])

    m = _one(ref.COMPOUND, score_function=fn)
    m.insert(list(range(16)), scores=[(0, 1 + (i % 5)) for i in range(16)])
    res = m.insert_and_evict([50], score=1)
    assert res.evicted[0].slot == 2  # first slot whose count is 3


def test_no_eviction_doubles_at_half_load_and_retries_full_buckets() -> None:
    m = _one(ref.NO_EVICTION, init_capacity=16, max_capacity=64)
    m.insert(list(range(8)), score=0)
    assert m.capacity() == 16
    m.insert([8], score=0)  # 8 + 1 > 0.5 * 16
    assert m.capacity() == 32 and m.size() == 9
    assert sorted(m.export(0).keys) == list(range(9))


def test_no_eviction_grows_past_max_capacity() -> None:
    m = _one(ref.NO_EVICTION, init_capacity=16, max_capacity=16)
    m.insert(list(range(8)), score=0)
    m.insert([8], score=0)  # past half load: doubles though at max_capacity (the seed's rule)
    assert m.capacity() == 32 and m.size() == 9
    m.insert(list(range(100, 200)), score=0)
    assert m.size() == 109 and all(s >= 0 for s in m.find(list(range(100, 200))).slots)


def test_expansion_stops_at_max_capacity_and_keeps_keys() -> None:
    m = _one(ref.TIMESTAMP, init_capacity=16, max_capacity=32, max_load_factor=0.5)
    m.insert(list(range(8)), score=0)
    assert m.capacity() == 16
    m.insert([100], score=1)
    assert m.capacity() == 32
    exported = m.export(0)
    for key, slot in zip(exported.keys, exported.slots):
        assert slot in m.tables[0].bucket_slots(key)
    m.insert(list(range(200, 240)), score=2)
    assert m.capacity() == 32


def test_rows_follow_their_keys_through_expansion() -> None:
    m = _one(ref.TIMESTAMP, init_capacity=16, max_capacity=64, max_load_factor=0.5, row_width=2)
    keys = list(range(8))
    m.insert(keys, rows=[(k, -k) for k in keys], score=0)
    m.insert([50, 51, 52], rows=[(0, 0)] * 3, score=1)
    found = m.find(keys)
    assert m.read_rows(0, found.slots) == [(float(k), float(-k)) for k in keys]


def test_retain_key_pops_each_evicted_key_once() -> None:
    m = _one(ref.TIMESTAMP, retain_key=True)
    m.insert(list(range(16)), score=0)
    m.insert([20, 21], score=1)
    m.erase([5])  # erasing is not evicting
    assert m.pop_evicted_keys(0) == [0, 1]
    assert m.pop_evicted_keys(0) == []


def test_erase_frees_slots_and_updates_size() -> None:
    m = _one(ref.CUSTOMIZED)
    m.set_score(0, 3)
    m.insert([1, 2, 3])
    assert m.erase([2, 2, 9]) == [True, True, False]
    assert m.size() == 2
    assert m.insert([9]) == [1]  # the freed slot is the first empty one
    assert m.export(0).scores == [(3,), (3,), (3,)]


def test_insert_at_checks_the_whole_batch_first() -> None:
    m = ref.RefScoredHashTable([_spec(ref.STEP, init_capacity=32, max_capacity=32)])
    table = m.tables[0]
    key_a, key_b = 1, next(k for k in range(2, 100) if ref.bucket_of(k, 2) != ref.bucket_of(1, 2))
    slot_a = table.bucket_slots(key_a)[3]
    wrong = table.bucket_slots(key_a)[0]  # in key_a's bucket, so in the wrong one for key_b
    assert m.insert_at(0, [key_a, key_b], [slot_a, wrong], scores=[(1,), (1,)]) == 1
    assert m.size() == 0
    assert m.insert_at(0, [key_a], [slot_a], scores=[(4,)]) is None
    assert m.find([key_a]).slots == [slot_a]
