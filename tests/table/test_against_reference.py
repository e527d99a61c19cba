"""Randomized op sequences: the real ScoredHashTable against the pure-Python reference model.

A hypothesis state machine builds a few small logical tables (bucket 16 or 32, one to four buckets,
key space of about fifty keys, so full buckets, evictions and doublings happen constantly), then
applies random calls to the real table and to :mod:`reference_model` side by side. After every call
it compares what the call returned (slots, found masks, is_new, scores, evicted items with their
rows) and then the whole state: size, capacity, every exported (key, slot, scores) and the value row
of every slot whose contents the contract defines. Scores are always explicit for clock-based
policies, so the outcome is deterministic and the model predicts exact slots.

Runs on every device of the ``device`` fixture (CUDA exact comparison needs
``DEMB_DETERMINISM_MODE=1``); one more test drives a CPU and a CUDA table with the same sequence.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import reference_model as ref
from dynamicemb_core.config import (
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    EvictedItemMode,
)
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

INT64_MAX = 2**63 - 1


# ----------------------------------------------------------------------------------------------
# Score functions for COMPOUND tables (numba-compilable; exact in float64 for the small scores used)
# ----------------------------------------------------------------------------------------------
def recency_weighted_count(scores, cur_timestamp):
    """Second column weighted up, age of the first column weighted down."""
    return 3.0 * scores[1] - 0.5 * (cur_timestamp - scores[0])


def nan_on_multiples_of_three(scores, cur_timestamp):
    """NaN (evict first) when the second column is a multiple of 3, else the first column."""
    if scores[1] % 3 == 0:
        return math.nan
    return 1.0 * scores[0]


# ----------------------------------------------------------------------------------------------
# Table configurations
# ----------------------------------------------------------------------------------------------
_STRATEGY_BY_POLICY = {
    ref.TIMESTAMP: DynamicEmbScoreStrategy.TIMESTAMP,
    ref.STEP: DynamicEmbScoreStrategy.STEP,
    ref.CUSTOMIZED: DynamicEmbScoreStrategy.CUSTOMIZED,
    ref.LFU: DynamicEmbScoreStrategy.LFU,
    ref.NO_EVICTION: DynamicEmbScoreStrategy.NO_EVICTION,
}


@st.composite
def ref_specs(draw: Callable, index: int) -> ref.RefSpec:
    """One small logical table of any policy."""
    # COMPOUND first: hypothesis draws the early elements of sampled_from more often.
    policy = draw(st.sampled_from([ref.COMPOUND, ref.TIMESTAMP, ref.LFU, ref.NO_EVICTION,
                                   ref.STEP, ref.CUSTOMIZED]))
    if policy == ref.COMPOUND:
        order = draw(st.sampled_from([("TIMESTAMP", "LFU"), ("LFU", "TIMESTAMP")]))
        score_function = draw(
            st.sampled_from([None, recency_weighted_count, nan_on_multiples_of_three])
        )
    else:
        order, score_function = (ref.POLICY_NAMES[policy],), None
    bucket = draw(st.sampled_from([16, 16, 16, 32, MAX_BUCKET_CAPACITY]))
    if bucket == MAX_BUCKET_CAPACITY:
        init = draw(st.sampled_from([16, 32]))
    else:
        init = bucket * draw(st.sampled_from([1, 2]))
    return ref.RefSpec(
        name=f"t{index}_{ref.POLICY_NAMES[policy].lower()}",
        policy=policy,
        order=order,
        init_capacity=init,
        max_capacity=init * draw(st.sampled_from([1, 1, 2, 4])),
        bucket_capacity=bucket,
        max_load_factor=draw(st.sampled_from([0.5, 0.75, 1.0])),
        row_width=draw(st.sampled_from([0, 1, 3])),
        score_function=score_function,
        retain_key=draw(st.booleans()),
    )


@st.composite
def table_sets(draw: Callable) -> List[ref.RefSpec]:
    return [draw(ref_specs(i)) for i in range(draw(st.integers(1, 3)))]


def _key_strategy(specs: Sequence[ref.RefSpec]) -> st.SearchStrategy[int]:
    """Keys from a range about 1.5x the largest table's max capacity, so tables fill and evict."""
    top = min(160, max(s.max_capacity for s in specs) * 3 // 2)
    dense = st.integers(-3, top)
    return st.one_of(dense, dense, dense, dense, dense, st.sampled_from(_SPECIAL_KEYS))


def _key_lists(keys: st.SearchStrategy[int], max_size: int, unique: bool = False):
    """Lists of keys whose length is drawn uniformly (plain st.lists favours very short ones)."""
    return st.integers(0, max_size).flatmap(
        lambda n: st.lists(keys, min_size=n, max_size=n, unique=unique)
        if not unique else st.lists(keys, max_size=n, unique=True)
    )


def real_table_spec(spec: ref.RefSpec) -> Any:
    """The package's TableSpec equivalent to a model spec."""
    from dynamicemb_core.table import TableSpec

    if spec.policy == ref.COMPOUND:
        strategy: Any = tuple(DynamicEmbScoreStrategy[name] for name in spec.order)
    else:
        strategy = _STRATEGY_BY_POLICY[spec.policy]
    return TableSpec(
        name=spec.name,
        row_width=spec.row_width,
        dtype=torch.float32,
        init_capacity=spec.init_capacity,
        max_capacity=spec.max_capacity,
        bucket_capacity=spec.bucket_capacity,
        max_load_factor=spec.max_load_factor,
        score_strategy=strategy,
        score_function=spec.score_function,
        safe_check_mode=DynamicEmbCheckMode.IGNORE,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY if spec.retain_key else EvictedItemMode.DISCARD,
    )


# ----------------------------------------------------------------------------------------------
# The real table behind the model's interface
# ----------------------------------------------------------------------------------------------
def _ints(x: Any) -> List[int]:
    return [int(v) for v in (x.tolist() if torch.is_tensor(x) else x)]


class RealTable:
    """Wraps ``ScoredHashTable``: takes plain Python inputs, returns the model's result types."""

    def __init__(self, specs: Sequence[ref.RefSpec], device: str) -> None:
        from dynamicemb_core.table import ScoredHashTable

        self.specs = list(specs)
        self.device = torch.device(device)
        self.table = ScoredHashTable([real_table_spec(s) for s in specs], device=self.device)

    # -- conversions ---------------------------------------------------------------------------
    def _keys(self, keys: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(keys), dtype=torch.int64, device=self.device)

    def _tids(self, table_ids: Any) -> Any:
        if table_ids is None or isinstance(table_ids, int):
            return table_ids
        return torch.tensor(list(table_ids), dtype=torch.int64, device=self.device)

    def _rows(self, rows: Optional[Sequence[Sequence[float]]]) -> Optional[torch.Tensor]:
        if rows is None:
            return None
        return torch.tensor([list(r) for r in rows], dtype=torch.float32, device=self.device)

    def _scores_in(self, scores: Optional[Sequence[Sequence[int]]]) -> Optional[torch.Tensor]:
        if scores is None:
            return None
        return torch.tensor([list(s) for s in scores], dtype=torch.int64, device=self.device)

    def _score_rows(self, scores: torch.Tensor, tids: Sequence[int]) -> List[Tuple[int, ...]]:
        """(n, k) score tensor -> per-row tuples cut to each row's table's column count."""
        assert scores.dim() == 2 and scores.shape[0] == len(tids), f"scores shape {tuple(scores.shape)}"
        rows = scores.tolist()
        return [tuple(int(v) for v in row[: self.specs[t].num_scores]) for row, t in zip(rows, tids)]

    def _evicted(self, evicted: Any) -> List[ref.RefEvicted]:
        if evicted is None or evicted.keys is None or evicted.keys.numel() == 0:
            return []
        tids = _ints(evicted.table_ids)
        scores = self._score_rows(evicted.scores, tids)
        rows: List[ref.Row] = [None] * len(tids)
        if evicted.rows is not None:
            got = evicted.rows
            rows = [tuple(float(v) for v in got[i].tolist()) for i in range(len(tids))]
        return [
            ref.RefEvicted(k, s, sc, t, r)
            for k, s, sc, t, r in zip(_ints(evicted.keys), _ints(evicted.slots), scores, tids, rows)
        ]

    def _insert_result(self, res: Any) -> ref.RefInsertResult:
        return ref.RefInsertResult(
            _ints(res.slots), [bool(v) for v in res.is_new.tolist()], self._evicted(res.evicted)
        )

    # -- the model's interface -------------------------------------------------------------------
    def find(self, keys, table_ids=None, *, update_score=False, score=None) -> ref.RefFindResult:
        res = self.table.find(
            self._keys(keys), self._tids(table_ids), update_score=update_score, score=score
        )
        tids = ref.per_key_table_ids(keys, table_ids)
        return ref.RefFindResult(
            _ints(res.slots), [bool(v) for v in res.found.tolist()], self._score_rows(res.scores, tids)
        )

    def insert(self, keys, table_ids=None, *, rows=None, scores=None, score=None) -> List[int]:
        # ScoredHashTable.insert has no score= argument: its touches use the policy default.
        assert score is None
        return _ints(
            self.table.insert(
                self._keys(keys), self._tids(table_ids), rows=self._rows(rows),
                scores=self._scores_in(scores),
            )
        )

    def find_or_insert(self, keys, table_ids=None, *, score=None) -> ref.RefInsertResult:
        return self._insert_result(
            self.table.find_or_insert(self._keys(keys), self._tids(table_ids), score=score)
        )

    def insert_and_evict(
        self, keys, table_ids=None, *, rows=None, scores=None, score=None
    ) -> ref.RefInsertResult:
        return self._insert_result(
            self.table.insert_and_evict(
                self._keys(keys), self._tids(table_ids), rows=self._rows(rows),
                scores=self._scores_in(scores), score=score,
            )
        )

    def erase(self, keys, table_ids=None) -> List[bool]:
        return [bool(v) for v in self.table.erase(self._keys(keys), self._tids(table_ids)).tolist()]

    def export(self, table_id: int, threshold: Optional[int] = None) -> ref.RefExport:
        res = self.table.export(table_id, threshold)
        keys = _ints(res.keys)
        return ref.RefExport(keys, _ints(res.slots), self._score_rows(res.scores, [table_id] * len(keys)))

    def insert_at(self, table_id: int, keys, slots, *, rows=None, scores=None) -> Optional[str]:
        """None when placed, else the DynamicEmbError message (it must name the failing key)."""
        try:
            self.table.insert_at(
                table_id, self._keys(keys), self._keys(slots), rows=self._rows(rows),
                scores=self._scores_in(scores),
            )
        except DynamicEmbError as err:
            return str(err)
        return None

    def read_rows(self, table_id: int, slots: Sequence[int]) -> List[ref.Row]:
        got = self.table.read_rows(table_id, self._keys(slots))
        return [tuple(float(v) for v in row) for row in got.tolist()]

    def write_rows(self, table_id: int, slots: Sequence[int], rows) -> None:
        self.table.write_rows(table_id, self._keys(slots), self._rows(rows))

    def size(self, table_id: int = 0) -> int:
        return int(self.table.size(table_id))

    def capacity(self, table_id: int = 0) -> int:
        return int(self.table.capacity(table_id))

    def clear(self, table_id: Optional[int] = None) -> None:
        self.table.clear(table_id)

    def set_score(self, table_id: int, score: int) -> None:
        self.table.set_score(table_id, score)

    def get_score(self, table_id: int) -> int:
        return int(self.table.get_score(table_id))

    def advance_step(self, table_id: Optional[int] = None) -> None:
        self.table.advance_step(table_id)

    def pop_evicted_keys(self, table_id: int) -> List[int]:
        return sorted(_ints(self.table.pop_evicted_keys(table_id)))


# ----------------------------------------------------------------------------------------------
# The state machine
# ----------------------------------------------------------------------------------------------
# Keys no sentinel scheme could hold; the rest come from a small dense range (see _key_strategy).
_SPECIAL_KEYS = [ref.INT64_MIN, INT64_MAX, -1, 2**40 + 7, -(2**62)]
_NON_CLOCK = (ref.STEP, ref.CUSTOMIZED, ref.LFU)


def _evicted_key(e: ref.RefEvicted) -> Tuple[int, int]:
    return (e.table_id, e.slot)


class TableMachine(RuleBasedStateMachine):
    """Applies each random call to the model and to every subject; all must agree."""

    def __init__(self, devices: Sequence[str]) -> None:
        super().__init__()
        self.devices = list(devices)

    @initialize(specs=table_sets())
    def build(self, specs: List[ref.RefSpec]) -> None:
        self.specs = specs
        self.model = ref.RefScoredHashTable(specs)
        self.subjects = [RealTable(specs, d) for d in self.devices]
        self.keys = _key_strategy(specs)
        self.clock = 0
        self.serial = 0

    # -- drawing calls ----------------------------------------------------------------------------
    def _draw_call(
        self, data: Any, *, single: bool = False, unique: bool = False, max_keys: int = 24
    ):
        """Keys and a ``table_ids`` argument (None, an int, or a list) and the per-key table ids."""
        keys = data.draw(_key_lists(self.keys, max_keys, unique), label="keys")
        n_tables = len(self.specs)
        form = "int" if single else data.draw(st.sampled_from(["none", "int", "list"]), label="form")
        if form == "none":
            return keys, None, [0] * len(keys)
        if form == "int":
            t = data.draw(st.integers(0, n_tables - 1), label="table")
            return keys, t, [t] * len(keys)
        tids = data.draw(
            st.lists(st.integers(0, n_tables - 1), min_size=len(keys), max_size=len(keys)),
            label="table_ids",
        )
        if unique:  # unique (table, key) pairs, not only unique keys
            keys, tids = map(list, zip(*dict.fromkeys(zip(keys, tids)))) if keys else ([], [])
        return keys, tids, tids

    def _draw_score(self, data: Any, tids: Sequence[int]) -> Optional[int]:
        """The call's score: the test clock, or None (policy default) when no table needs a clock."""
        self.clock += data.draw(st.integers(0, 2), label="tick")
        if all(self.specs[t].policy in _NON_CLOCK for t in set(tids)) and data.draw(
            st.booleans(), label="default score"
        ):
            return None
        return self.clock

    def _draw_rows(self, data: Any, n: int, table_id: int) -> Optional[List[Tuple[float, ...]]]:
        width = self.specs[table_id].row_width
        if width == 0 or not data.draw(st.booleans(), label="with rows"):
            return None
        self.serial += 1
        return [tuple(float(self.serial * 100 + i * 4 + j) for j in range(width)) for i in range(n)]

    def _draw_scores(self, data: Any, n: int, table_id: int) -> Optional[List[Tuple[int, ...]]]:
        if not data.draw(st.booleans(), label="with scores"):
            return None
        words = st.integers(0, 60)
        k = self.specs[table_id].num_scores
        return [tuple(data.draw(words) for _ in range(k)) for _ in range(n)]

    # -- applying and comparing --------------------------------------------------------------------
    def _apply(self, what: str, call: Callable[[Any], Any], compare: Callable[[Any, Any], None]):
        expected = call(self.model)
        for subject in self.subjects:
            got = call(subject)
            try:
                compare(got, expected)
            except AssertionError as err:
                raise AssertionError(f"{what} on {subject.device}: {err}") from None
        return expected

    @staticmethod
    def _same(got: Any, expected: Any) -> None:
        assert got == expected, f"\n  got      {got}\n  expected {expected}"

    def _same_insert(self, got: ref.RefInsertResult, expected: ref.RefInsertResult) -> None:
        self._same(got.slots, expected.slots)
        self._same(got.is_new, expected.is_new)
        got_ev = sorted(got.evicted, key=_evicted_key)
        exp_ev = sorted(expected.evicted, key=_evicted_key)
        self._same(
            [(e.table_id, e.slot, e.key, e.scores) for e in got_ev],
            [(e.table_id, e.slot, e.key, e.scores) for e in exp_ev],
        )
        for g, e in zip(got_ev, exp_ev):
            if e.row is not None and self.specs[e.table_id].row_width > 0:
                self._same(g.row, e.row)

    # -- rules -----------------------------------------------------------------------------------
    @rule(data=st.data())
    def find(self, data: Any) -> None:
        keys, arg, tids = self._draw_call(data)
        update = data.draw(st.booleans(), label="update_score")
        score = self._draw_score(data, tids)

        def compare(got: ref.RefFindResult, exp: ref.RefFindResult) -> None:
            self._same(got.slots, exp.slots)
            self._same(got.found, exp.found)
            found_scores = [s for s, f in zip(got.scores, exp.found) if f]
            self._same(found_scores, [s for s, f in zip(exp.scores, exp.found) if f])

        self._apply(
            "find", lambda tbl: tbl.find(keys, arg, update_score=update, score=score), compare
        )

    @rule(data=st.data())
    def insert(self, data: Any) -> None:
        with_payload = data.draw(st.booleans(), label="payload")
        keys, arg, tids = self._draw_call(data, single=with_payload, unique=with_payload)
        rows = scores = None
        if with_payload:
            rows = self._draw_rows(data, len(keys), tids[0] if tids else 0) if keys else None
            scores = self._draw_scores(data, len(keys), tids[0] if tids else 0) if keys else None
        # insert takes no score=, so it reads the clock for clock policies (unless given input
        # scores) and for score functions (their `now`): keep it to what is predictable.
        if any(
            (scores is None and self.specs[t].policy not in _NON_CLOCK)
            or self.specs[t].score_function is not None
            for t in tids
        ):
            return
        # Without score= the model uses each table's default (step / custom score; LFU ignores it).
        self._apply(
            "insert", lambda tbl: tbl.insert(keys, arg, rows=rows, scores=scores), self._same
        )

    @rule(data=st.data())
    def find_or_insert(self, data: Any) -> None:
        keys, arg, tids = self._draw_call(data)
        score = self._draw_score(data, tids)
        self._apply(
            "find_or_insert", lambda tbl: tbl.find_or_insert(keys, arg, score=score), self._same_insert
        )

    @rule(data=st.data())
    def find_or_insert_again(self, data: Any) -> None:
        """The op the lookup path uses most, drawn twice as often."""
        self.find_or_insert(data)

    @rule(data=st.data())
    def insert_and_evict(self, data: Any) -> None:
        with_payload = data.draw(st.booleans(), label="payload")
        keys, arg, tids = self._draw_call(data, single=with_payload, unique=with_payload)
        rows = scores = None
        if with_payload and keys:
            rows = self._draw_rows(data, len(keys), tids[0])
            scores = self._draw_scores(data, len(keys), tids[0])
        score = self._draw_score(data, tids)
        self._apply(
            "insert_and_evict",
            lambda tbl: tbl.insert_and_evict(keys, arg, rows=rows, scores=scores, score=score),
            self._same_insert,
        )

    @rule(data=st.data())
    def flood_one_table(self, data: Any) -> None:
        """More distinct keys than a bucket holds in one call: protection, slot -1, NO_EVICTION retry."""
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        n = min(self.model.capacity(t), 32) + 4
        top = max(max(s.max_capacity for s in self.specs), n) * 2
        keys = data.draw(st.lists(st.integers(-3, top), min_size=n, max_size=n, unique=True))
        score = self._draw_score(data, [t])
        self._apply(
            "flood", lambda tbl: tbl.insert_and_evict(keys, t, score=score), self._same_insert
        )

    @rule(data=st.data())
    def erase(self, data: Any) -> None:
        keys, arg, _ = self._draw_call(data, max_keys=6)
        self._apply("erase", lambda tbl: tbl.erase(keys, arg), self._same)

    @rule(data=st.data())
    def export_above_threshold(self, data: Any) -> None:
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        threshold = data.draw(st.integers(-1, self.clock + 2), label="threshold")
        self._apply("export", lambda tbl: tbl.export(t, threshold), self._same)

    @rule(data=st.data())
    def insert_at(self, data: Any) -> None:
        """Slot-exact placement: free slots of the key's bucket or the key's own slot, maybe one bad."""
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        table = self.model.tables[t]
        keys: List[int] = []
        slots: List[int] = []
        for key in data.draw(_key_lists(self.keys, 8, True), label="keys"):
            own = table.locate(key)
            free = [s for s in table.bucket_slots(key) if table.slots[s] is None and s not in slots]
            if own is not None:
                keys.append(key), slots.append(own)
            elif free:
                keys.append(key), slots.append(data.draw(st.sampled_from(free), label="slot"))
        if keys and data.draw(st.booleans(), label="spoil"):
            i = data.draw(st.integers(0, len(keys) - 1), label="spoiled")
            outside = [s for s in range(-1, table.capacity + 1) if s not in table.bucket_slots(keys[i])]
            taken = [s for s in table.bucket_slots(keys[i])
                     if table.slots[s] is not None and table.slots[s].key != keys[i]]
            claimed = [s for j, s in enumerate(slots) if j != i]  # another key of the batch
            moved = [s for s in table.bucket_slots(keys[i])  # a present key sent elsewhere
                     if table.slots[s] is None and table.locate(keys[i]) is not None]
            slots[i] = data.draw(st.sampled_from(outside + taken + claimed + moved), label="bad slot")
        if keys and data.draw(st.booleans(), label="repeat"):  # one key twice (same or other slot)
            i = data.draw(st.integers(0, len(keys) - 1), label="repeated")
            keys.append(keys[i])
            slots.append(data.draw(st.sampled_from([slots[i], slots[-1]]), label="repeat slot"))
        rows = self._draw_rows(data, len(keys), t)
        scores = [tuple(data.draw(st.integers(0, 60)) for _ in range(self.specs[t].num_scores))
                  for _ in keys]

        def compare(got: Optional[str], expected: Optional[int]) -> None:
            if expected is None or got is None:
                self._same(got, expected)
            else:  # the error names the first key that cannot go to its slot
                named = {int(v) for v in re.findall(r"(?<![\w.])-?\d+", got)}
                assert keys[expected] in named, f"{got!r} does not name key {keys[expected]}"

        self._apply(
            "insert_at", lambda tbl: tbl.insert_at(t, keys, slots, rows=rows, scores=scores), compare
        )

    @rule(data=st.data())
    def write_rows(self, data: Any) -> None:
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        occupied = self.model.export(t).slots
        if self.specs[t].row_width == 0 or not occupied:
            return
        slots = data.draw(st.lists(st.sampled_from(occupied + [-1]), max_size=6, unique=True))
        rows = self._draw_rows(data, len(slots), t) or [(0.0,) * self.specs[t].row_width] * len(slots)
        self._apply("write_rows", lambda tbl: tbl.write_rows(t, slots, rows), self._same)

    @rule(data=st.data())
    def set_or_advance_score(self, data: Any) -> None:
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        policy = self.specs[t].policy
        if policy == ref.CUSTOMIZED:
            old = self.model.get_score(t)
            new = data.draw(st.integers(max(0, old - 3), old + 5), label="custom score")
            for subject in self.subjects:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    subject.set_score(t, new)
                went_down = any(issubclass(w.category, DynamicEmbWarning) for w in caught)
                assert went_down == (new < old), f"set_score {old} -> {new}: warned={went_down}"
            self.model.set_score(t, new)
        elif policy == ref.STEP:
            arg = data.draw(st.sampled_from([t, None]), label="advance which")
            self._apply("advance_step", lambda tbl: tbl.advance_step(arg), self._same)
        if policy in (ref.STEP, ref.CUSTOMIZED):
            self._apply("get_score", lambda tbl: tbl.get_score(t), self._same)

    @rule(data=st.data())
    def pop_evicted_keys(self, data: Any) -> None:
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        if self.specs[t].retain_key:
            self._apply("pop_evicted_keys", lambda tbl: tbl.pop_evicted_keys(t), self._same)

    @rule(data=st.data())
    def sometimes_clear(self, data: Any) -> None:
        if data.draw(st.integers(0, 7), label="clear?") == 0:
            arg = data.draw(st.sampled_from([None] + list(range(len(self.specs)))), label="clear")
            self._apply("clear", lambda tbl: tbl.clear(arg), self._same)

    # -- the whole state after every step -----------------------------------------------------------
    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "model"):
            return
        for t in range(len(self.specs)):
            self._apply(f"size({t})", lambda tbl: tbl.size(t), self._same)
            self._apply(f"capacity({t})", lambda tbl: tbl.capacity(t), self._same)
            exported = self._apply(f"export({t})", lambda tbl: tbl.export(t), self._same)
            if self.specs[t].row_width == 0 or not exported.slots:
                continue
            expected_rows = self.model.read_rows(t, exported.slots)
            for subject in self.subjects:
                got_rows = subject.read_rows(t, exported.slots)
                pairs = [(g, e) for g, e in zip(got_rows, expected_rows) if e is not None]
                self._same([g for g, _ in pairs], [e for _, e in pairs])


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------
def _run(devices: Sequence[str], profile: str) -> None:
    run_state_machine_as_test(lambda: TableMachine(devices), settings=settings.get_profile(profile))


@pytest.fixture
def deterministic_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA inserts are exactly reproducible (and comparable with the model) only in this mode."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")


def test_random_ops_match_reference_model(device: str, deterministic_cuda: None) -> None:
    _run([str(device)], "demb-table")


@pytest.mark.slow
def test_random_ops_match_reference_model_long(device: str, deterministic_cuda: None) -> None:
    _run([str(device)], "demb-table-slow")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to compare with CPU")
def test_cpu_and_cuda_tables_agree_op_by_op(deterministic_cuda: None) -> None:
    _run(["cpu", "cuda"], "demb-table")
