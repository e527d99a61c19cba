"""The built-in counter and strategy pass the plugin conformance suites."""

from __future__ import annotations

import torch

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.testing.counter_suite import AdmissionStrategySuite, CounterSuite
from dynamicemb_core.types import AdmissionStrategy, Counter


class TestKVCounter(CounterSuite):
    def make_counter(self, device: torch.device) -> Counter:
        return KVCounter(capacity=4096, bucket_capacity=128, device=device)


class TestFrequencyAdmissionStrategy(AdmissionStrategySuite):
    def make_strategy(self) -> AdmissionStrategy:
        return FrequencyAdmissionStrategy(threshold=3)
