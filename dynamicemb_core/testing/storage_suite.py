"""Conformance tests every :class:`~dynamicemb_core.types.Storage` must pass.

Subclass in a test module whose class name starts with ``Test`` and implement
:meth:`StorageSuite.make_storage`; pytest then collects the inherited tests::

    class TestRedisStorage(StorageSuite):
        def make_storage(self, tables, device):
            return RedisStorage(tables, device, url=..., model=uuid4().hex)

Backends that persist data add :class:`StoragePersistenceSuite` (reopen and read back) and those that
implement ``dump``/``load`` add :class:`StorageDumpSuite`. The oracle is a plain dict model of the
contract, checked bit for bit (rows are compared as integers, so NaN and -0.0 must survive).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

import pytest
import torch

from dynamicemb_core.types import Storage, StorageTableSpec

__all__ = ["StorageDumpSuite", "StoragePersistenceSuite", "StorageSuite", "default_tables"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EDGE_KEYS = [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX]
_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float64: torch.int64,
}

StorageFactory = Callable[..., Storage]


def default_tables() -> List[StorageTableSpec]:
    """Three tables that differ in every field a backend must keep apart."""
    return [
        StorageTableSpec("t_f32", dim=4, row_width=12, dtype=torch.float32, num_scores=1),
        StorageTableSpec("t_f16", dim=3, row_width=3, dtype=torch.float16, num_scores=2),
        StorageTableSpec("t_bf16", dim=5, row_width=10, dtype=torch.bfloat16, num_scores=1),
    ]


def make_rows(spec: StorageTableSpec, n: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Deterministic random rows (with a NaN and a -0.0 when n allows) and scores for ``spec``."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, spec.row_width, generator=g).to(spec.dtype)
    if n >= 2:
        rows[0, 0] = float("nan")
        rows[1, -1] = -0.0
    scores = torch.randint(-(2**62), 2**62, (n, spec.num_scores), generator=g, dtype=torch.int64)
    return rows, scores


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a float tensor, so equality is bitwise."""
    return t.cpu().contiguous().view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t.cpu()


class _Model:
    """The contract as a dict: table id -> key -> (row, scores)."""

    def __init__(self, num_tables: int) -> None:
        self.data: List[Dict[int, Tuple[torch.Tensor, torch.Tensor]]] = [
            {} for _ in range(num_tables)
        ]

    def insert(self, t: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor) -> None:
        for i, k in enumerate(keys.tolist()):
            self.data[t][k] = (rows[i].clone(), scores[i].clone())

    def erase(self, t: int, keys: torch.Tensor) -> None:
        for k in keys.tolist():
            self.data[t].pop(k, None)


def assert_matches(storage: Storage, model: _Model, t: int, keys: torch.Tensor) -> None:
    """Check ``storage.find(t, keys)`` against the model, bit for bit, with the contract's shapes."""
    found, rows, scores = storage.find(t, keys)
    spec = storage.tables[t]
    assert found.dtype == torch.bool and tuple(found.shape) == (keys.numel(),)
    assert rows.dtype == spec.dtype and tuple(rows.shape) == (keys.numel(), spec.row_width)
    assert scores.dtype == torch.int64 and tuple(scores.shape) == (keys.numel(), spec.num_scores)
    for i, k in enumerate(keys.tolist()):
        expected = model.data[t].get(k)
        assert bool(found[i]) == (expected is not None), f"table {t} key {k}"
        if expected is not None:
            assert torch.equal(bits(rows[i]), bits(expected[0])), f"table {t} key {k} row"
            assert torch.equal(scores[i].cpu(), expected[1]), f"table {t} key {k} scores"


class StorageSuite:
    """The behaviour every Storage shares. Override :meth:`make_storage`."""

    device = torch.device("cpu")

    def make_storage(self, tables: Sequence[StorageTableSpec], device: torch.device) -> Storage:
        """Return a new, empty storage holding ``tables``."""
        raise NotImplementedError(
            "subclass StorageSuite and implement make_storage(tables, device)"
        )

    @pytest.fixture
    def make(self) -> Iterator[StorageFactory]:
        """Factory fixture: builds storages and closes them after the test."""
        made: List[Storage] = []

        def build(tables: Sequence[StorageTableSpec] | None = None) -> Storage:
            storage = self.make_storage(list(tables or default_tables()), self.device)
            made.append(storage)
            return storage

        yield build
        for storage in made:
            storage.close()

    # -- tests ---------------------------------------------------------------------------------

    def test_find_on_empty_storage_finds_nothing(self, make: StorageFactory) -> None:
        storage = make()
        for t in range(len(storage.tables)):
            found, _, _ = storage.find(t, torch.tensor(EDGE_KEYS))
            assert not found.any()
            assert storage.size(t) == 0

    def test_insert_then_find_returns_rows_and_scores_bitwise(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor(EDGE_KEYS + [123456789, -987654321])
        for t, spec in enumerate(storage.tables):
            rows, scores = make_rows(spec, keys.numel(), seed=t)
            storage.insert(t, keys, rows, scores)
            model.insert(t, keys, rows, scores)
        for t in range(len(storage.tables)):
            assert_matches(storage, model, t, torch.cat([keys, torch.tensor([42, 43])]))

    def test_find_returns_tensors_on_the_storage_device(self, make: StorageFactory) -> None:
        storage = make()
        spec = storage.tables[0]
        rows, scores = make_rows(spec, 3, seed=1)
        storage.insert(0, torch.tensor([1, 2, 3]), rows, scores)
        for tensor in storage.find(0, torch.tensor([1, 5])):
            assert tensor.device.type == self.device.type

    def test_insert_overwrites_existing_key(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor([5, 6, 7])
        for seed in (1, 2):
            rows, scores = make_rows(storage.tables[0], 3, seed=seed)
            storage.insert(0, keys, rows, scores)
            model.insert(0, keys, rows, scores)
        assert_matches(storage, model, 0, keys)
        assert storage.size(0) == 3

    def test_same_key_in_two_tables_is_two_entries(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor([11, 12])
        for t, spec in enumerate(storage.tables):
            rows, scores = make_rows(spec, 2, seed=10 + t)
            storage.insert(t, keys, rows, scores)
            model.insert(t, keys, rows, scores)
        storage.erase(1, torch.tensor([11]))
        model.erase(1, torch.tensor([11]))
        for t in range(len(storage.tables)):
            assert_matches(storage, model, t, keys)
        assert [storage.size(t) for t in range(3)] == [2, 1, 2]

    def test_erase_removes_only_given_keys_and_ignores_missing(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.arange(20)
        rows, scores = make_rows(storage.tables[0], 20, seed=3)
        storage.insert(0, keys, rows, scores)
        model.insert(0, keys, rows, scores)
        gone = torch.tensor([0, 5, 19, 1000, -3])  # 1000 and -3 were never inserted
        storage.erase(0, gone)
        model.erase(0, gone)
        assert_matches(storage, model, 0, torch.cat([keys, gone]))
        assert storage.size(0) == 17

    def test_empty_batches_are_accepted(self, make: StorageFactory) -> None:
        storage = make()
        spec = storage.tables[0]
        empty = torch.empty(0, dtype=torch.int64)
        storage.insert(
            0,
            empty,
            torch.empty(0, spec.row_width, dtype=spec.dtype),
            torch.empty(0, 1, dtype=torch.int64),
        )
        found, rows, scores = storage.find(0, empty)
        assert (
            found.numel() == 0 and tuple(rows.shape) == (0, spec.row_width) and scores.shape[0] == 0
        )
        storage.erase(0, empty)
        assert storage.size(0) == 0

    def test_export_yields_every_key_once_with_its_row(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            keys = torch.arange(t * 1000, t * 1000 + 23) * 7919 - 50_000
            rows, scores = make_rows(spec, keys.numel(), seed=20 + t)
            storage.insert(t, keys, rows, scores)
            model.insert(t, keys, rows, scores)
        for t, spec in enumerate(storage.tables):
            seen: Dict[int, int] = {}
            for keys, rows, scores in storage.export(t, batch_size=5):
                assert 0 < keys.numel() <= 5
                assert (
                    tuple(rows.shape) == (keys.numel(), spec.row_width) and rows.dtype == spec.dtype
                )
                assert tuple(scores.shape) == (keys.numel(), spec.num_scores)
                for i, k in enumerate(keys.tolist()):
                    seen[k] = seen.get(k, 0) + 1
                    row, score = model.data[t][k]
                    assert torch.equal(bits(rows[i]), bits(row)) and torch.equal(
                        scores[i].cpu(), score
                    )
            assert seen == {k: 1 for k in model.data[t]}

    def test_export_of_empty_table_yields_nothing(self, make: StorageFactory) -> None:
        assert list(make().export(0)) == []

    def test_large_batch_round_trips(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        g = torch.Generator().manual_seed(5)
        keys = torch.unique(torch.randint(INT64_MIN, INT64_MAX, (5000,), generator=g))
        rows, scores = make_rows(storage.tables[0], keys.numel(), seed=6)
        storage.insert(0, keys, rows, scores)
        model.insert(0, keys, rows, scores)
        assert storage.size(0) == keys.numel()
        assert_matches(storage, model, 0, keys)

    def test_flush_keeps_data(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        rows, scores = make_rows(storage.tables[2], 4, seed=8)
        storage.insert(2, torch.tensor([1, 2, 3, 4]), rows, scores)
        model.insert(2, torch.tensor([1, 2, 3, 4]), rows, scores)
        storage.flush()
        assert_matches(storage, model, 2, torch.tensor([1, 2, 3, 4, 5]))

    @pytest.mark.parametrize(
        "case",
        [
            "table_id_out_of_range",
            "keys_int32",
            "keys_2d",
            "rows_wrong_width",
            "rows_wrong_dtype",
            "scores_wrong_shape",
            "rows_fewer_than_keys",
        ],
    )
    def test_bad_insert_raises_before_writing(self, make: StorageFactory, case: str) -> None:
        storage = make()
        spec = storage.tables[0]
        keys = torch.tensor([1, 2, 3])
        rows, scores = make_rows(spec, 3, seed=9)
        args: Dict[str, Any] = {"table_id": 0, "keys": keys, "rows": rows, "scores": scores}
        cases: Dict[str, Dict[str, Any]] = {
            "table_id_out_of_range": {"table_id": len(storage.tables)},
            "keys_int32": {"keys": keys.to(torch.int32)},
            "keys_2d": {"keys": keys.view(3, 1)},
            "rows_wrong_width": {"rows": torch.zeros(3, spec.row_width + 1, dtype=spec.dtype)},
            "rows_wrong_dtype": {"rows": rows.to(torch.float64)},
            "scores_wrong_shape": {
                "scores": torch.zeros(3, spec.num_scores + 1, dtype=torch.int64)
            },
            "rows_fewer_than_keys": {"rows": rows[:2]},
        }
        bad = cases[case]
        with pytest.raises((ValueError, TypeError, IndexError)) as info:
            storage.insert(**{**args, **bad})
        message = str(info.value)
        assert spec.name in message or "table_id" in message, message
        assert all(storage.size(t) == 0 for t in range(len(storage.tables)))

    def test_bad_find_and_erase_name_the_problem(self, make: StorageFactory) -> None:
        storage = make()
        with pytest.raises(IndexError, match="table_id"):
            storage.find(99, torch.tensor([1]))
        with pytest.raises(TypeError, match="int64"):
            storage.find(0, torch.tensor([1.0]))
        with pytest.raises(TypeError, match="int64"):
            storage.erase(0, torch.tensor([1], dtype=torch.int32))

    def test_random_operations_match_dict_model(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        rng = random.Random(1234)
        pool = EDGE_KEYS + [rng.randrange(INT64_MIN, INT64_MAX) for _ in range(120)]
        for step in range(40):
            t = rng.randrange(len(storage.tables))
            keys = torch.tensor(rng.sample(pool, rng.randrange(0, 30)), dtype=torch.int64)
            op = rng.random()
            if op < 0.55:
                rows, scores = make_rows(storage.tables[t], keys.numel(), seed=step)
                storage.insert(t, keys, rows, scores)
                model.insert(t, keys, rows, scores)
            elif op < 0.8:
                storage.erase(t, keys)
                model.erase(t, keys)
            assert_matches(storage, model, t, torch.tensor(rng.sample(pool, 25)))
            assert storage.size(t) == len(model.data[t])


class StoragePersistenceSuite:
    """For backends whose data outlives the object: a new instance over the same place sees it."""

    def reopen_storage(self, storage: Storage) -> Storage:
        """Close ``storage`` and return a new instance over the same data (same tables)."""
        raise NotImplementedError("implement reopen_storage(storage)")

    def test_reopened_storage_sees_previous_writes(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            keys = torch.tensor(EDGE_KEYS)
            rows, scores = make_rows(spec, keys.numel(), seed=40 + t)
            storage.insert(t, keys, rows, scores)
            model.insert(t, keys, rows, scores)
        storage.erase(0, torch.tensor([0]))
        model.erase(0, torch.tensor([0]))
        storage.flush()
        reopened = self.reopen_storage(storage)
        try:
            for t in range(len(reopened.tables)):
                assert_matches(reopened, model, t, torch.tensor(EDGE_KEYS))
                assert reopened.size(t) == len(model.data[t])
        finally:
            reopened.close()


class StorageDumpSuite:
    """For backends implementing ``dump``/``load``: a dump loaded into a fresh storage round-trips."""

    def test_dump_then_load_into_fresh_storage(
        self, make: StorageFactory, tmp_path: object
    ) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            keys = torch.arange(30) * (t + 1) - 7
            rows, scores = make_rows(spec, 30, seed=50 + t)
            storage.insert(t, keys, rows, scores)
            model.insert(t, keys, rows, scores)
        storage.dump(str(tmp_path))
        fresh = make()
        fresh.load(str(tmp_path))
        for t in range(len(fresh.tables)):
            assert fresh.size(t) == len(model.data[t])
            assert_matches(fresh, model, t, torch.arange(-10, 100))
