"""Conformance tests every :class:`~dynamicemb_core.types.Storage` must pass.

Subclass in a test module whose class name starts with ``Test`` and implement
:meth:`StorageSuite.make_storage`; pytest then collects the inherited tests. ``make_storage`` may
return a multi-table :class:`~dynamicemb_core.types.Storage` or a per-table
:class:`~dynamicemb_core.types.PerTableStorage` (tested through the core's adapter, as the core
uses it)::

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

from dynamicemb_core.storage.contract.adapter import AnyStorage, as_storage, insert_in_table
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


# Calls keep their table ids in a mixed order, as a grouped lookup sends them.
def interleaved_ids(num_tables: int, n: int, seed: int) -> torch.Tensor:
    """(n,) int64 table ids in ``[0, num_tables)``, shuffled (every table present when n allows)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(n, dtype=torch.int64) % num_tables
    return ids[torch.randperm(n, generator=g)]


def default_tables(dtype: torch.dtype = torch.float32) -> List[StorageTableSpec]:
    """Three tables of ``dtype`` that differ in every other field a backend must keep apart."""
    return [
        StorageTableSpec("t_wide", dim=4, row_width=12, dtype=dtype, num_scores=1),
        StorageTableSpec("t_two_scores", dim=3, row_width=3, dtype=dtype, num_scores=2),
        StorageTableSpec("t_mid", dim=5, row_width=10, dtype=dtype, num_scores=1),
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
    """The contract as a dict: table id -> key -> (row at the table's width, scores)."""

    def __init__(self, num_tables: int) -> None:
        self.data: List[Dict[int, Tuple[torch.Tensor, torch.Tensor]]] = [
            {} for _ in range(num_tables)
        ]

    def insert(self, t: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor) -> None:
        for i, k in enumerate(keys.tolist()):
            self.data[t][k] = (rows[i].cpu().clone(), scores[i].cpu().clone())

    def erase(self, t: int, keys: torch.Tensor) -> None:
        for k in keys.tolist():
            self.data[t].pop(k, None)


def put(
    storage: Storage,
    model: _Model,
    t: int,
    keys: torch.Tensor,
    rows: torch.Tensor,
    scores: torch.Tensor,
) -> None:
    """One table's rows into the storage (padded into one multi-table call) and the model."""
    insert_in_table(storage, t, keys, rows, scores)
    model.insert(t, keys, rows, scores)


def wide_rows(
    storage: Storage,
    table_ids: torch.Tensor,
    per_table: Sequence[Tuple[torch.Tensor, torch.Tensor]],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (n, max_row_width) rows and (n, max_num_scores) scores of a mixed call.

    ``per_table[t]`` holds table t's rows and scores for its positions in ``table_ids``, in order.
    """
    n = table_ids.numel()
    rows = torch.zeros(n, storage.max_row_width, dtype=storage.row_dtype)
    scores = torch.zeros(n, storage.max_num_scores, dtype=torch.int64)
    for t, (r, s) in enumerate(per_table):
        pos = (table_ids == t).nonzero().squeeze(1)
        rows[pos, : r.shape[1]] = r.to(storage.row_dtype)
        scores[pos, : s.shape[1]] = s
    return rows, scores


def assert_pairs_match(
    storage: Storage, model: _Model, keys: torch.Tensor, table_ids: torch.Tensor
) -> None:
    """Check one multi-table ``find`` against the model, bit for bit, with the contract's shapes
    (padding columns zero)."""
    found, rows, scores = storage.find(keys, table_ids)
    n = keys.numel()
    assert found.dtype == torch.bool and tuple(found.shape) == (n,)
    assert rows.dtype == storage.row_dtype
    assert tuple(rows.shape) == (n, storage.max_row_width)
    assert scores.dtype == torch.int64 and tuple(scores.shape) == (n, storage.max_num_scores)
    for i, (k, t) in enumerate(zip(keys.tolist(), table_ids.tolist())):
        spec = storage.tables[t]
        expected = model.data[t].get(k)
        assert bool(found[i]) == (expected is not None), f"table {t} key {k}"
        if expected is None:
            continue
        got = rows[i, : spec.row_width].to(spec.dtype)
        assert torch.equal(bits(got), bits(expected[0])), f"table {t} key {k} row"
        assert torch.equal(scores[i, : spec.num_scores].cpu(), expected[1]), f"table {t} key {k}"
        assert not bool(rows[i, spec.row_width :].any()), f"table {t} key {k}: padding not zero"
        assert not bool(scores[i, spec.num_scores :].any()), f"table {t} key {k}: padding"


def assert_matches(storage: Storage, model: _Model, t: int, keys: torch.Tensor) -> None:
    """Check ``keys`` of table ``t`` (one ``find`` naming only that table) against the model."""
    assert_pairs_match(storage, model, keys, torch.full_like(keys, t))


def stored_sizes(storage: Storage) -> List[int]:
    sizes = storage.sizes()
    assert len(sizes) == len(storage.tables) and all(isinstance(x, int) for x in sizes), sizes
    return sizes


class StorageSuite:
    """The behaviour every Storage shares. Override :meth:`make_storage`."""

    device = torch.device("cpu")

    def make_storage(self, tables: Sequence[StorageTableSpec], device: torch.device) -> AnyStorage:
        """Return a new, empty storage holding ``tables``."""
        raise NotImplementedError(
            "subclass StorageSuite and implement make_storage(tables, device)"
        )

    @pytest.fixture
    def make(self) -> Iterator[StorageFactory]:
        """Factory fixture: builds storages (per-table ones behind the adapter), closes them after."""
        made: List[Storage] = []

        def build(tables: Sequence[StorageTableSpec] | None = None) -> Storage:
            storage = as_storage(self.make_storage(list(tables or default_tables()), self.device))
            made.append(storage)
            return storage

        yield build
        for storage in made:
            storage.close()

    # -- one table per call --------------------------------------------------------------------

    def test_find_on_empty_storage_finds_nothing(self, make: StorageFactory) -> None:
        storage = make()
        for t in range(len(storage.tables)):
            found, _, _ = storage.find(torch.tensor(EDGE_KEYS), torch.full((7,), t))
            assert not found.any()
        assert stored_sizes(storage) == [0] * len(storage.tables)

    def test_insert_then_find_returns_rows_and_scores_bitwise(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor(EDGE_KEYS + [123456789, -987654321])
        for t, spec in enumerate(storage.tables):
            put(storage, model, t, keys, *make_rows(spec, keys.numel(), seed=t))
        for t in range(len(storage.tables)):
            assert_matches(storage, model, t, torch.cat([keys, torch.tensor([42, 43])]))

    def test_find_returns_tensors_on_the_storage_device(self, make: StorageFactory) -> None:
        storage = make()
        put(storage, _Model(3), 0, torch.tensor([1, 2, 3]), *make_rows(storage.tables[0], 3, 1))
        for tensor in storage.find(torch.tensor([1, 5]), torch.tensor([0, 1])):
            assert tensor.device.type == self.device.type

    def test_insert_overwrites_existing_key(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor([5, 6, 7])
        for seed in (1, 2):
            put(storage, model, 0, keys, *make_rows(storage.tables[0], 3, seed=seed))
        assert_matches(storage, model, 0, keys)
        assert storage.sizes([0]) == [3]

    def test_same_key_in_two_tables_is_two_entries(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.tensor([11, 12])
        for t, spec in enumerate(storage.tables):
            put(storage, model, t, keys, *make_rows(spec, 2, seed=10 + t))
        storage.erase(torch.tensor([11]), torch.tensor([1]))
        model.erase(1, torch.tensor([11]))
        for t in range(len(storage.tables)):
            assert_matches(storage, model, t, keys)
        assert stored_sizes(storage) == [2, 1, 2]

    def test_erase_removes_only_given_keys_and_ignores_missing(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.arange(20)
        put(storage, model, 0, keys, *make_rows(storage.tables[0], 20, seed=3))
        gone = torch.tensor([0, 5, 19, 1000, -3])  # 1000 and -3 were never inserted
        storage.erase(gone, torch.zeros_like(gone))
        model.erase(0, gone)
        assert_matches(storage, model, 0, torch.cat([keys, gone]))
        assert storage.sizes([0]) == [17]

    def test_empty_batches_are_accepted(self, make: StorageFactory) -> None:
        storage = make()
        empty = torch.empty(0, dtype=torch.int64)
        storage.insert(
            empty,
            empty,
            torch.empty(0, storage.max_row_width, dtype=storage.row_dtype),
            torch.empty(0, storage.max_num_scores, dtype=torch.int64),
        )
        found, rows, scores = storage.find(empty, empty)
        assert found.numel() == 0 and tuple(rows.shape) == (0, storage.max_row_width)
        assert tuple(scores.shape) == (0, storage.max_num_scores)
        storage.erase(empty, empty)
        assert stored_sizes(storage) == [0, 0, 0]

    def test_export_yields_every_key_once_with_its_row(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            keys = torch.arange(t * 1000, t * 1000 + 23) * 7919 - 50_000
            put(storage, model, t, keys, *make_rows(spec, keys.numel(), seed=20 + t))
        for which in ([0], [2, 1], None):
            wanted = [0, 1, 2] if which is None else which
            seen: Dict[Tuple[int, int], int] = {}
            for keys, tids, rows, scores in storage.export(which, batch_size=5):
                n = keys.numel()
                assert 0 < n <= 5 and tuple(tids.shape) == (n,) and tids.dtype == torch.int64
                assert tuple(rows.shape) == (n, storage.max_row_width)
                assert rows.dtype == storage.row_dtype
                assert tuple(scores.shape) == (n, storage.max_num_scores)
                for i, (k, t) in enumerate(zip(keys.tolist(), tids.tolist())):
                    spec = storage.tables[t]
                    seen[(t, k)] = seen.get((t, k), 0) + 1
                    row, score = model.data[t][k]
                    assert torch.equal(bits(rows[i, : spec.row_width].to(spec.dtype)), bits(row))
                    assert torch.equal(scores[i, : spec.num_scores].cpu(), score)
            assert seen == {(t, k): 1 for t in wanted for k in model.data[t]}, which

    def test_export_of_empty_table_yields_nothing(self, make: StorageFactory) -> None:
        storage = make()
        assert list(storage.export([0])) == [] and list(storage.export()) == []

    def test_large_batch_round_trips(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        g = torch.Generator().manual_seed(5)
        keys = torch.unique(torch.randint(INT64_MIN, INT64_MAX, (5000,), generator=g))
        put(storage, model, 0, keys, *make_rows(storage.tables[0], keys.numel(), seed=6))
        assert storage.sizes([0]) == [keys.numel()]
        assert_matches(storage, model, 0, keys)

    def test_flush_keeps_data(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        put(storage, model, 2, torch.tensor([1, 2, 3, 4]), *make_rows(storage.tables[2], 4, 8))
        storage.flush()
        assert_matches(storage, model, 2, torch.tensor([1, 2, 3, 4, 5]))

    # -- several tables per call ---------------------------------------------------------------

    def test_interleaved_tables_in_one_call_round_trip(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        T = len(storage.tables)
        # the same key in every table of one call (pairs, not keys, are unique), then more keys
        keys = torch.cat([torch.tensor(EDGE_KEYS * T), torch.arange(39) * 104729 - 7])
        tids = torch.cat([torch.arange(T).repeat_interleave(7), interleaved_ids(T, 39, seed=1)])
        order = torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(3))
        keys, tids = keys[order], tids[order]
        n = keys.numel()
        per_table = []
        for t, spec in enumerate(storage.tables):
            mine = (tids == t).nonzero().squeeze(1)
            rows, scores = make_rows(spec, mine.numel(), seed=60 + t)
            per_table.append((rows, scores))
            model.insert(t, keys[mine], rows, scores)
        pairs = set(zip(keys.tolist(), tids.tolist()))
        assert len(pairs) == n, "the test's pairs must be unique"
        storage.insert(keys, tids, *wide_rows(storage, tids, per_table))
        assert stored_sizes(storage) == [len(d) for d in model.data]
        probe_keys = torch.cat([keys, torch.tensor([42, 42, 42])])
        probe_ids = torch.cat([tids, torch.tensor([0, 1, 2])])
        order = torch.randperm(probe_keys.numel(), generator=torch.Generator().manual_seed(2))
        assert_pairs_match(storage, model, probe_keys[order], probe_ids[order])

    def test_padding_columns_are_ignored_on_insert(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys, tids = torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2])
        per_table = [make_rows(spec, 1, seed=70 + t) for t, spec in enumerate(storage.tables)]
        rows, scores = wide_rows(storage, tids, per_table)
        rows[1, storage.tables[1].row_width :] = 99.0  # garbage past table 1's width
        scores[0, storage.tables[0].num_scores :] = 99
        storage.insert(keys, tids, rows, scores)
        for t, (r, s) in enumerate(per_table):
            model.insert(t, keys[t : t + 1], r, s)
        assert_pairs_match(storage, model, keys, tids)

    def test_mixed_erase_removes_only_named_pairs(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        keys = torch.arange(10)
        for t, spec in enumerate(storage.tables):
            put(storage, model, t, keys, *make_rows(spec, 10, seed=80 + t))
        gone_keys, gone_ids = torch.tensor([3, 3, 4, 9, 500]), torch.tensor([0, 2, 1, 0, 1])
        storage.erase(gone_keys, gone_ids)
        for k, t in zip(gone_keys.tolist(), gone_ids.tolist()):
            model.erase(t, torch.tensor([k]))
        assert stored_sizes(storage) == [8, 9, 9]
        all_keys = keys.repeat(3)
        all_ids = torch.arange(3).repeat_interleave(10)
        assert_pairs_match(storage, model, all_keys, all_ids)

    def test_sizes_follow_the_asked_order(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            put(storage, model, t, torch.arange(t + 1), *make_rows(spec, t + 1, seed=t))
        assert storage.sizes([2, 0, 1]) == [3, 1, 2] and storage.sizes() == [1, 2, 3]
        assert storage.sizes([]) == []

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
    def test_each_row_dtype_round_trips_bitwise(
        self, make: StorageFactory, dtype: torch.dtype
    ) -> None:
        storage = make(default_tables(dtype))
        assert storage.row_dtype == dtype
        model = _Model(len(storage.tables))
        keys = torch.tensor(EDGE_KEYS).repeat(3)
        tids = torch.arange(3).repeat_interleave(len(EDGE_KEYS))
        per_table = []
        for t, spec in enumerate(storage.tables):
            rows, scores = make_rows(spec, len(EDGE_KEYS), seed=100 + t)
            per_table.append((rows, scores))
            model.insert(t, torch.tensor(EDGE_KEYS), rows, scores)
        storage.insert(keys, tids, *wide_rows(storage, tids, per_table))
        assert_pairs_match(storage, model, keys.flip(0), tids.flip(0))

    def test_tables_of_two_dtypes_are_rejected(self, make: StorageFactory) -> None:
        mixed = default_tables()[:2] + [
            StorageTableSpec("t_half", dim=2, row_width=2, dtype=torch.float16)
        ]
        with pytest.raises(ValueError, match="one dtype"):
            make(mixed)

    # -- bad input ----------------------------------------------------------------------------

    BAD_INSERTS = [
        "table_id_out_of_range",
        "table_id_negative",
        "table_ids_int32",
        "table_ids_shorter",
        "keys_int32",
        "keys_2d",
        "rows_wrong_width",
        "rows_one_table_width",
        "rows_wrong_dtype",
        "scores_wrong_shape",
        "scores_wrong_dtype",
        "rows_fewer_than_keys",
    ]

    @pytest.mark.parametrize("case", BAD_INSERTS)
    def test_bad_insert_raises_before_writing(self, make: StorageFactory, case: str) -> None:
        storage = make()
        tids = torch.tensor([0, 1, 2, 0, 1, 2])
        keys = torch.tensor([1, 1, 1, 2, 2, 2])
        per_table = [make_rows(spec, 2, seed=90 + t) for t, spec in enumerate(storage.tables)]
        rows, scores = wide_rows(storage, tids, per_table)
        args: Dict[str, Any] = {"keys": keys, "table_ids": tids, "rows": rows, "scores": scores}
        bad_ids = tids.clone()
        bad_ids[4] = len(storage.tables)  # one bad id after good ones: still nothing written
        neg_ids = tids.clone()
        neg_ids[5] = -1
        width, words = storage.max_row_width, storage.max_num_scores
        cases: Dict[str, Dict[str, Any]] = {
            "table_id_out_of_range": {"table_ids": bad_ids},
            "table_id_negative": {"table_ids": neg_ids},
            "table_ids_int32": {"table_ids": tids.to(torch.int32)},
            "table_ids_shorter": {"table_ids": tids[:5]},
            "keys_int32": {"keys": keys.to(torch.int32)},
            "keys_2d": {"keys": keys.view(6, 1)},
            "rows_wrong_width": {"rows": torch.zeros(6, width + 1, dtype=storage.row_dtype)},
            "rows_one_table_width": {
                "rows": torch.zeros(6, storage.tables[1].row_width, dtype=storage.row_dtype)
            },
            "rows_wrong_dtype": {"rows": rows.to(torch.float64)},
            "scores_wrong_shape": {"scores": torch.zeros(6, words + 1, dtype=torch.int64)},
            "scores_wrong_dtype": {"scores": scores.to(torch.int32)},
            "rows_fewer_than_keys": {"rows": rows[:5]},
        }
        bad = cases[case]
        with pytest.raises((ValueError, TypeError, IndexError)) as info:
            storage.insert(**{**args, **bad})
        message = str(info.value)
        named = [name for name in ("keys", "table_ids", "rows", "scores") if name in message]
        assert named, f"the error names no argument: {message}"
        if case.startswith("rows") and case != "rows_wrong_dtype":
            assert any(spec.name in message for spec in storage.tables), message
        assert stored_sizes(storage) == [0] * len(storage.tables), "a bad insert wrote"

    def test_bad_find_and_erase_name_the_problem(self, make: StorageFactory) -> None:
        storage = make()
        put(storage, _Model(3), 0, torch.tensor([1]), *make_rows(storage.tables[0], 1, 1))
        with pytest.raises(IndexError, match="table_ids holds 99"):
            storage.find(torch.tensor([1, 1]), torch.tensor([0, 99]))
        with pytest.raises(TypeError, match="keys must be a 1-D int64"):
            storage.find(torch.tensor([1.0]), torch.tensor([0]))
        with pytest.raises(TypeError, match="table_ids must be a 1-D int64"):
            storage.find(torch.tensor([1]), 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="one table per key"):
            storage.find(torch.tensor([1, 2]), torch.tensor([0]))
        with pytest.raises(TypeError, match="int64"):
            storage.erase(torch.tensor([1], dtype=torch.int32), torch.tensor([0]))
        with pytest.raises(IndexError, match="table_ids holds -1"):
            storage.erase(torch.tensor([1, 1]), torch.tensor([0, -1]))
        assert storage.sizes([0]) == [1], "a rejected erase removed a key"
        with pytest.raises(IndexError, match="table_id 5 out of range"):
            storage.sizes([5])
        with pytest.raises(IndexError, match="table_id 3 out of range"):
            list(storage.export([0, 3]))
        with pytest.raises(ValueError, match="batch_size"):
            list(storage.export(None, batch_size=0))

    def test_random_operations_match_dict_model(self, make: StorageFactory) -> None:
        storage = make()
        T = len(storage.tables)
        model = _Model(T)
        rng = random.Random(1234)
        pool = EDGE_KEYS + [rng.randrange(INT64_MIN, INT64_MAX) for _ in range(120)]
        for step in range(40):
            pairs = rng.sample([(k, t) for k in pool for t in range(T)], rng.randrange(0, 40))
            keys = torch.tensor([k for k, _ in pairs], dtype=torch.int64)
            tids = torch.tensor([t for _, t in pairs], dtype=torch.int64)
            op = rng.random()
            if op < 0.55:
                per_table = []
                for t, spec in enumerate(storage.tables):
                    mine = (tids == t).nonzero().squeeze(1)
                    rows, scores = make_rows(spec, mine.numel(), seed=step * 10 + t)
                    per_table.append((rows, scores))
                    model.insert(t, keys[mine], rows, scores)
                storage.insert(keys, tids, *wide_rows(storage, tids, per_table))
            elif op < 0.8:
                storage.erase(keys, tids)
                for k, t in pairs:
                    model.erase(t, torch.tensor([k]))
            probe = rng.sample([(k, t) for k in pool for t in range(T)], 40)
            assert_pairs_match(
                storage,
                model,
                torch.tensor([k for k, _ in probe], dtype=torch.int64),
                torch.tensor([t for _, t in probe], dtype=torch.int64),
            )
            assert stored_sizes(storage) == [len(d) for d in model.data]


class StoragePersistenceSuite:
    """For backends whose data outlives the object: a new instance over the same place sees it."""

    def reopen_storage(self, storage: Storage) -> AnyStorage:
        """Close ``storage`` and return a new instance over the same data (same tables)."""
        raise NotImplementedError("implement reopen_storage(storage)")

    def test_reopened_storage_sees_previous_writes(self, make: StorageFactory) -> None:
        storage = make()
        model = _Model(len(storage.tables))
        for t, spec in enumerate(storage.tables):
            keys = torch.tensor(EDGE_KEYS)
            put(storage, model, t, keys, *make_rows(spec, keys.numel(), seed=40 + t))
        storage.erase(torch.tensor([0, 1]), torch.tensor([0, 2]))
        model.erase(0, torch.tensor([0]))
        model.erase(2, torch.tensor([1]))
        storage.flush()
        reopened = as_storage(self.reopen_storage(storage))
        try:
            for t in range(len(reopened.tables)):
                assert_matches(reopened, model, t, torch.tensor(EDGE_KEYS))
            assert stored_sizes(reopened) == [len(d) for d in model.data]
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
            put(storage, model, t, keys, *make_rows(spec, 30, seed=50 + t))
        storage.dump(str(tmp_path))
        fresh = make()
        fresh.load(str(tmp_path))
        assert stored_sizes(fresh) == [len(d) for d in model.data]
        for t in range(len(fresh.tables)):
            assert_matches(fresh, model, t, torch.arange(-10, 100))
