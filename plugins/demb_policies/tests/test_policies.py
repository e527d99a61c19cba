"""demb-policies: discovery, conformance suites, and what each policy admits or evicts."""

from __future__ import annotations

import ctypes
import math
import random

import pytest
import torch

from demb_policies import (
    CountingBloomCounter,
    ProbabilisticAdmissionStrategy,
    decayed_lfu_count_first,
    decayed_lfu_ts_first,
    make_decayed_lfu,
)
from dynamicemb_core.config import DynamicEmbScoreStrategy as S
from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import (
    KNOWN_PLUGINS,
    PluginKind,
    PluginRegistry,
    resolve_admission_strategy,
    resolve_counter,
    resolve_score_function,
)
from dynamicemb_core.testing.counter_suite import AdmissionStrategySuite, CounterSuite
from dynamicemb_core.types import AdmissionStrategy, Counter, MemoryType

TS_LFU, LFU_TS = (S.TIMESTAMP, S.LFU), (S.LFU, S.TIMESTAMP)
SECOND = 10**9


@pytest.mark.parametrize(
    "kind,name,factory",
    [
        (PluginKind.ADMISSION_STRATEGY, "probabilistic", ProbabilisticAdmissionStrategy),
        (PluginKind.COUNTER, "counting_bloom", CountingBloomCounter),
        (PluginKind.SCORE_FUNCTION, "decayed_lfu", make_decayed_lfu),
    ],
)
def test_entry_point_is_discovered_by_the_registry(
    kind: PluginKind, name: str, factory: object
) -> None:
    entry = PluginRegistry().get(kind, name)
    assert entry.distribution.startswith("demb-policies ") and entry.plugin == "policies"
    assert entry.factory is factory
    assert KNOWN_PLUGINS[(kind.value, name)] == "demb-policies"  # the core's install hint


def test_table_options_resolve_every_policy_by_name() -> None:
    options = DynamicEmbTableOptions(
        score_strategy=LFU_TS,
        score_function="decayed_lfu",
        score_function_options={"half_life_s": 60.0},
        admit_strategy="probabilistic",
        admit_strategy_options={"probability": 0.25, "seed": 1},
        admission_counter="counting_bloom",
        admission_counter_options={"num_counters": 1024},
    )
    fn = resolve_score_function(options)
    assert (
        fn is make_decayed_lfu(LFU_TS, half_life_s=60.0)
        and fn.__name__ == "decayed_lfu_count_first"
    )
    assert resolve_admission_strategy(options).probability == 0.25
    assert resolve_counter(options).num_counters == 1024


# -- counting Bloom filter -------------------------------------------------------------------


class TestCountingBloomCounter(CounterSuite):
    exact = False
    max_overcount_fraction = 0.01

    def make_counter(self, device: torch.device) -> Counter:
        return CountingBloomCounter(num_counters=1 << 16, num_hashes=4, device=device)


def test_bloom_counter_never_undercounts_a_crowded_filter_and_overcounts_as_predicted() -> None:
    counter = CountingBloomCounter(num_counters=2048, num_hashes=3)
    rng = random.Random(0)
    keys = torch.tensor(rng.sample(range(-(10**12), 10**12), 1000))
    truth = torch.tensor([rng.randrange(1, 9) for _ in range(1000)])
    for lo in range(0, 1000, 100):  # several batches, so collisions accumulate across calls
        counter.add(keys[lo : lo + 100], truth[lo : lo + 100], True)
    est = counter.add(keys, torch.zeros_like(keys), False)
    assert bool((est >= truth).all())
    over = float((est > truth).float().mean())
    predicted = (1 - math.exp(-3 * 1000 / 2048)) ** 3  # classic Bloom false-positive rate
    assert 0.3 * predicted < over < 2.0 * predicted, (over, predicted)


def test_bloom_counter_cells_saturate_instead_of_wrapping() -> None:
    counter = CountingBloomCounter(num_counters=64, num_hashes=2)
    key = torch.tensor([5])
    counter.add(key, torch.tensor([2**31 - 10]), True)
    assert int(counter.add(key, torch.tensor([100]), True)) == 2**31 - 1


def test_bloom_counter_memory_is_four_bytes_a_cell() -> None:
    counter = CountingBloomCounter(num_counters=1000)
    assert (
        counter.memory_usage(MemoryType.DEVICE) == 4000
        and counter.memory_usage(MemoryType.HOST) == 0
    )


def test_bloom_counter_load_rejects_a_filter_of_another_size(tmp_path: object) -> None:
    a, b = CountingBloomCounter(num_counters=100), CountingBloomCounter(num_counters=200)
    a.dump(f"{tmp_path}/k", f"{tmp_path}/c")
    with pytest.raises(
        ValueError,
        match=r"\[format, num_counters, num_hashes\] = \[1, 100, 4\], this counter is \[1, 200, 4\]",
    ):
        b.load(f"{tmp_path}/k", f"{tmp_path}/c")


# -- probabilistic admission -----------------------------------------------------------------


class TestProbabilisticAdmission(AdmissionStrategySuite):
    def make_strategy(self) -> AdmissionStrategy:
        return ProbabilisticAdmissionStrategy(0.3, seed=0)


@pytest.mark.parametrize("frequency", [1, 2, 5])
def test_admission_rate_matches_one_minus_miss_probability_to_the_frequency(frequency: int) -> None:
    n, p = 200_000, 0.1
    strategy = ProbabilisticAdmissionStrategy(p, seed=frequency)
    admitted = strategy.admit(torch.arange(n), torch.full((n,), frequency))
    expected = 1 - (1 - p) ** frequency
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(float(admitted.float().mean()) - expected) < 5 * sigma


def test_unseen_keys_are_never_admitted_and_probability_one_admits_every_seen_key() -> None:
    keys = torch.arange(1000)
    assert (
        not ProbabilisticAdmissionStrategy(0.9, seed=0)
        .admit(keys, torch.zeros(1000, dtype=torch.int64))
        .any()
    )
    assert (
        ProbabilisticAdmissionStrategy(1.0, seed=0)
        .admit(keys, torch.ones(1000, dtype=torch.int64))
        .all()
    )


def test_seeded_strategy_is_reproducible() -> None:
    keys, freq = torch.arange(5000), torch.ones(5000, dtype=torch.int64)
    a = ProbabilisticAdmissionStrategy(0.5, seed=7).admit(keys, freq)
    b = ProbabilisticAdmissionStrategy(0.5, seed=7).admit(keys, freq)
    c = ProbabilisticAdmissionStrategy(0.5, seed=8).admit(keys, freq)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5])
def test_probability_out_of_range_is_rejected(p: float) -> None:
    with pytest.raises(ValueError, match="probability must be in"):
        ProbabilisticAdmissionStrategy(p)


# -- decayed LFU -----------------------------------------------------------------------------


def _oracle(count: int, age_s: float, half_life_s: float) -> float:
    """Independent form of the same ranking: count halved per half-life of idleness."""
    return max(count, 1) * 0.5 ** (max(age_s, 0.0) / half_life_s)


def test_decayed_lfu_ranks_like_count_halved_per_half_life() -> None:
    rng = random.Random(3)
    now = 10**6 * SECOND
    fn = make_decayed_lfu(TS_LFU, half_life_s=100.0)
    cases = [(now - rng.randrange(0, 1000 * SECOND), rng.randrange(0, 10_000)) for _ in range(300)]
    ours = sorted(range(300), key=lambda i: fn(cases[i], now))
    theirs = sorted(
        range(300), key=lambda i: _oracle(cases[i][1], (now - cases[i][0]) / SECOND, 100.0)
    )
    assert [round(fn(cases[i], now), 9) for i in ours] == [
        round(fn(cases[i], now), 9) for i in theirs
    ]
    assert ours[0] == min(
        range(300), key=lambda i: _oracle(cases[i][1], (now - cases[i][0]) / SECOND, 100.0)
    )


def test_decayed_lfu_follows_the_strategy_tuple_order() -> None:
    now = 1000 * SECOND
    assert decayed_lfu_ts_first((now, 8), now) == pytest.approx(math.log(8))
    assert decayed_lfu_count_first((8, now), now) == pytest.approx(math.log(8))
    assert (
        make_decayed_lfu(TS_LFU) is decayed_lfu_ts_first
        and make_decayed_lfu(LFU_TS) is decayed_lfu_count_first
    )
    # one half-life of idleness costs exactly ln 2
    assert decayed_lfu_ts_first((now - 3600 * SECOND, 8), now) == pytest.approx(math.log(4))


def test_decayed_lfu_rejects_single_strategies_and_bad_half_life() -> None:
    with pytest.raises(ValueError, match="compound score_strategy"):
        make_decayed_lfu((S.LFU,))
    with pytest.raises(ValueError, match="half_life_s must be a positive number"):
        make_decayed_lfu(TS_LFU, half_life_s=0)


@pytest.mark.parametrize("order", [TS_LFU, LFU_TS], ids=["ts_lfu", "lfu_ts"])
def test_decayed_lfu_compiles_with_numba_and_matches_python(order: tuple) -> None:
    from dynamicemb_core.table.score_function import compile_score_function

    fn = make_decayed_lfu(order, half_life_s=30.0)
    compiled = compile_score_function(fn, order)
    cb = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)(
        compiled.address
    )
    rng = random.Random(1)
    for _ in range(200):
        count, ts, now = rng.randrange(0, 10**6), rng.randrange(0, 10**15), rng.randrange(0, 10**15)
        internal = (ctypes.c_int64 * 2)(count, ts)  # kernels keep [count, timestamp]
        user = (ts, count) if order == TS_LFU else (count, ts)
        assert cb(internal, now) == pytest.approx(fn(user, now), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("order", [TS_LFU, LFU_TS], ids=["ts_lfu", "lfu_ts"])
def test_full_bucket_evicts_the_stale_frequent_key_where_plain_lfu_evicts_the_rare_fresh_one(
    order: tuple,
) -> None:
    from dynamicemb_core.table import ScoredHashTable, TableSpec

    now = 10_000 * SECOND
    # 16 keys fill one 16-slot bucket: key 0 counted 100 times but idle for 10 half-lives, key 1
    # counted twice just now, the rest counted 50 times just now.
    counts = [100, 2] + [50] * 14
    stamps = [now - 10 * 60 * SECOND, now] + [now] * 14

    def evicted(score_function: object) -> int:
        spec = TableSpec(
            "t",
            init_capacity=16,
            max_capacity=16,
            bucket_capacity=16,
            max_load_factor=1.0,
            score_strategy=order,
            score_function=score_function,
        )
        table = ScoredHashTable([spec])
        words = [[t, c] if order == TS_LFU else [c, t] for c, t in zip(counts, stamps)]
        table.insert(torch.arange(16), scores=torch.tensor(words))
        result = table.insert_and_evict(torch.tensor([99]), score=now)
        assert result.evicted.keys.numel() == 1
        return int(result.evicted.keys[0])

    assert evicted(make_decayed_lfu(order, half_life_s=60.0)) == 0
    assert evicted(None) == 1
