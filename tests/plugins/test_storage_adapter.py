"""Per-table storages (the 0.1 contract) keep working: the adapter splits multi-table calls."""

from __future__ import annotations

import warnings
from typing import Dict, Iterator, List, Sequence, Tuple

import pytest
import torch

from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import (
    PerTableAdapter,
    as_storage,
    register_plugin,
    resolve_storage,
    unregister_plugin,
)
from dynamicemb_core.plugins.hookspecs import hookimpl
from dynamicemb_core.plugins.storage_checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
)
from dynamicemb_core.testing.storage_suite import StorageSuite, default_tables
from dynamicemb_core.types import PerTableStorage, Storage, StorageTableSpec

Rows = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _DictTables:
    """Per-table dicts and a log of the calls, shared by the two per-table storages below."""

    def __init__(self, tables: Sequence[StorageTableSpec], device: torch.device | str) -> None:
        super().__init__(tables, device)  # type: ignore[call-arg]
        self.data: List[Dict[int, Tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in tables]
        self.log: List[Tuple[str, int, List[int]]] = []

    def find(self, table_id: int, keys: torch.Tensor) -> Rows:
        spec = check_find(self.tables, table_id, keys)  # type: ignore[attr-defined]
        self.log.append(("find", table_id, keys.tolist()))
        n = keys.numel()
        found = torch.zeros(n, dtype=torch.bool)
        rows = torch.zeros(n, spec.row_width, dtype=spec.dtype)
        scores = torch.zeros(n, spec.num_scores, dtype=torch.int64)
        for i, k in enumerate(keys.tolist()):
            if k in self.data[table_id]:
                found[i] = True
                rows[i], scores[i] = self.data[table_id][k]
        return found, rows, scores

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        check_insert(self.tables, table_id, keys, rows, scores)  # type: ignore[attr-defined]
        self.log.append(("insert", table_id, keys.tolist()))
        for i, k in enumerate(keys.tolist()):
            self.data[table_id][k] = (rows[i].clone(), scores[i].clone())

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        check_erase(self.tables, table_id, keys)  # type: ignore[attr-defined]
        self.log.append(("erase", table_id, keys.tolist()))
        for k in keys.tolist():
            self.data[table_id].pop(k, None)

    def size(self, table_id: int) -> int:
        check_table_id(self.tables, table_id)  # type: ignore[attr-defined]
        return len(self.data[table_id])

    def export(self, table_id: int, batch_size: int = 65536) -> Iterator[Rows]:
        check_table_id(self.tables, table_id)  # type: ignore[attr-defined]
        items = list(self.data[table_id].items())
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            yield (
                torch.tensor([k for k, _ in chunk], dtype=torch.int64),
                torch.stack([r for _, (r, _) in chunk]),
                torch.stack([s for _, (_, s) in chunk]),
            )


class RecordingPerTableStorage(_DictTables, PerTableStorage):
    """A plugin written for the per-table contract (the documented base class)."""


with warnings.catch_warnings(record=True) as _caught:
    warnings.simplefilter("always")

    class LegacyStorage(_DictTables, Storage):  # type: ignore[misc]
        """A plugin written for 0.1, when ``Storage`` itself was the per-table contract."""


LEGACY_WARNINGS = [w for w in _caught if issubclass(w.category, DeprecationWarning)]


class TestPerTableStorageThroughTheAdapter(StorageSuite):
    def make_storage(self, tables, device):
        return RecordingPerTableStorage(tables, device)


class TestLegacyStorageThroughTheAdapter(StorageSuite):
    def make_storage(self, tables, device):
        return LegacyStorage(tables, device)


def test_a_legacy_storage_subclass_is_recognised_and_warned_about() -> None:
    assert LegacyStorage._per_table_contract
    assert not getattr(RecordingPerTableStorage, "_per_table_contract", False)
    assert len(LEGACY_WARNINGS) == 1
    assert "LegacyStorage" in str(LEGACY_WARNINGS[0].message)
    assert "PerTableStorage" in str(LEGACY_WARNINGS[0].message)
    wrapped = as_storage(LegacyStorage(default_tables(), "cpu"))
    assert isinstance(wrapped, PerTableAdapter) and isinstance(wrapped.inner, LegacyStorage)


def test_a_mixed_call_is_one_inner_call_per_table_present_in_table_order() -> None:
    inner = RecordingPerTableStorage(default_tables(), "cpu")
    store = as_storage(inner)
    keys = torch.tensor([5, 1, 9, 5, 2, 7])
    tids = torch.tensor([2, 0, 2, 0, 0, 2])  # table 1 absent
    rows = torch.arange(6 * 12, dtype=torch.float32).view(6, 12)
    scores = torch.arange(6 * 2, dtype=torch.int64).view(6, 2)
    store.insert(keys, tids, rows, scores)
    assert inner.log == [("insert", 0, [1, 5, 2]), ("insert", 2, [5, 9, 7])]
    inner.log.clear()
    found, got, words = store.find(torch.tensor([9, 1, 3]), torch.tensor([2, 0, 1]))
    assert inner.log == [("find", 0, [1]), ("find", 1, [3]), ("find", 2, [9])]
    assert found.tolist() == [True, True, False]
    # each table's width and score words, back in the call's order; padding zero
    assert torch.equal(got[0, :10], rows[2, :10]) and not bool(got[0, 10:].any())
    assert torch.equal(got[1], rows[1]) and torch.equal(words[1, :1], scores[1, :1])
    assert int(words[0, 1]) == 0 and int(words[1, 1]) == 0  # one-word tables pad the second
    assert store.sizes() == [3, 0, 3]


def test_bad_input_in_a_later_table_makes_no_inner_call() -> None:
    inner = RecordingPerTableStorage(default_tables(), "cpu")
    store = as_storage(inner)
    keys, tids = torch.tensor([1, 2]), torch.tensor([0, 3])
    with pytest.raises(IndexError, match="table_ids holds 3"):
        store.insert(keys, tids, torch.zeros(2, 12), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="rows must be torch.float32 of shape \\(2, 12\\)"):
        store.insert(
            keys, torch.tensor([0, 1]), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int64)
        )
    assert inner.log == []


def test_per_table_plugins_resolve_behind_the_adapter() -> None:
    class Provider:
        @hookimpl
        def dynamicemb_register_storages(self, register):
            register("recording_per_table", RecordingPerTableStorage)
            register("legacy_per_table", LegacyStorage)

    register_plugin(Provider(), "adapter_test")
    try:
        spec = [StorageTableSpec("t", dim=2, row_width=3)]
        for name, cls in (
            ("recording_per_table", RecordingPerTableStorage),
            ("legacy_per_table", LegacyStorage),
        ):
            storage = resolve_storage(DynamicEmbTableOptions(external_storage=name), spec, "cpu")
            assert isinstance(storage, PerTableAdapter) and type(storage.inner) is cls
    finally:
        unregister_plugin("adapter_test")
    # an instance and a class given directly take the same path
    instance = RecordingPerTableStorage(spec, "cpu")
    options = DynamicEmbTableOptions(external_storage=instance)
    assert resolve_storage(options, spec, "cpu").inner is instance
    by_class = DynamicEmbTableOptions(external_storage=RecordingPerTableStorage)
    assert type(resolve_storage(by_class, spec, "cpu")) is PerTableAdapter


def test_tables_of_two_dtypes_cannot_share_one_adapter() -> None:
    tables = [
        StorageTableSpec("a", dim=2, row_width=2, dtype=torch.float32),
        StorageTableSpec("b", dim=2, row_width=2, dtype=torch.float16),
    ]
    with pytest.raises(ValueError, match="one dtype"):
        as_storage(RecordingPerTableStorage(tables, "cpu"))
