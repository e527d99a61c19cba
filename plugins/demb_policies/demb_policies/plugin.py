"""Entry point of demb-policies in the ``dynamicemb`` group."""

from __future__ import annotations

from dynamicemb_core.plugins import RegisterFn, hookimpl


@hookimpl
def dynamicemb_register_admission_strategies(register: RegisterFn) -> None:
    from demb_policies.admission import ProbabilisticAdmissionStrategy

    register(
        "probabilistic",
        ProbabilisticAdmissionStrategy,
        description="admit with probability 1-(1-p)^frequency",
    )


@hookimpl
def dynamicemb_register_counters(register: RegisterFn) -> None:
    from demb_policies.bloom_counter import CountingBloomCounter

    register(
        "counting_bloom", CountingBloomCounter, description="counting Bloom filter (fixed memory)"
    )


@hookimpl
def dynamicemb_register_score_functions(register: RegisterFn) -> None:
    from demb_policies.score_functions import make_decayed_lfu

    register(
        "decayed_lfu", make_decayed_lfu, description="log(count) minus age decay (half_life_s)"
    )
