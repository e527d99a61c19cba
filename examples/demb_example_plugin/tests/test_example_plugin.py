"""The example package's own tests: discovered through its entry point, then the core's suites."""

from __future__ import annotations

from typing import Sequence

import torch
from demb_example_plugin import ArrayStorage, HashSampleAdmissionStrategy

from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import (
    PerTableAdapter,
    PluginKind,
    PluginRegistry,
    resolve_admission_strategy,
    resolve_storage,
)
from dynamicemb_core.testing.counter_suite import AdmissionStrategySuite
from dynamicemb_core.testing.storage_suite import StorageSuite
from dynamicemb_core.types import AdmissionStrategy, PerTableStorage, StorageTableSpec


def test_entry_point_is_discovered_by_the_registry() -> None:
    registry = PluginRegistry()
    assert (
        registry.get(PluginKind.STORAGE, "example_array").distribution
        == "demb-example-plugin 0.1.0"
    )
    assert registry.get(PluginKind.ADMISSION_STRATEGY, "example_hash_sample").plugin == "example"


def test_table_options_build_the_example_by_name() -> None:
    options = DynamicEmbTableOptions(
        external_storage="example_array",
        admit_strategy="example_hash_sample",
        admit_strategy_options={"rate": 0.5},
    )
    storage = resolve_storage(options, [StorageTableSpec("t", dim=2, row_width=2)], "cpu")
    # a per-table storage: the core wraps it in the adapter that splits calls by table id
    assert isinstance(storage, PerTableAdapter) and isinstance(storage.inner, ArrayStorage)
    assert resolve_admission_strategy(options).rate == 0.5


class TestArrayStorage(StorageSuite):
    def make_storage(
        self, tables: Sequence[StorageTableSpec], device: torch.device
    ) -> PerTableStorage:
        return ArrayStorage(tables, device)


class TestHashSampleAdmission(AdmissionStrategySuite):
    def make_strategy(self) -> AdmissionStrategy:
        return HashSampleAdmissionStrategy(0.25)


def test_hash_sample_admits_the_same_keys_whatever_their_frequency() -> None:
    keys = torch.arange(100_000)
    strategy = HashSampleAdmissionStrategy(0.25)
    once = strategy.admit(keys, torch.ones_like(keys))
    assert torch.equal(once, strategy.admit(keys, torch.full_like(keys, 50)))
    assert abs(float(once.float().mean()) - 0.25) < 0.01
