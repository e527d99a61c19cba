"""Shared pieces of the reference-model tests: table configurations, the real table behind the
model's interface, and the comparisons.

:class:`RealTable` wraps ``dynamicemb_core.table.ScoredHashTable``: it takes the plain Python inputs
the model takes and returns the model's result types, so a test applies one call to both and
compares with ``==``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import reference_model as ref
import torch
from hypothesis import strategies as st

from dynamicemb_core.config import (
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    EvictedItemMode,
)
from dynamicemb_core.types import DynamicEmbError

INT64_MAX = 2**63 - 1
# Keys no sentinel scheme could hold; the rest come from a small dense range (see key_strategy).
SPECIAL_KEYS = [ref.INT64_MIN, INT64_MAX, -1, 2**40 + 7, -(2**62)]


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
    policy = draw(
        st.sampled_from(
            [ref.COMPOUND, ref.TIMESTAMP, ref.LFU, ref.NO_EVICTION, ref.STEP, ref.CUSTOMIZED]
        )
    )
    if policy == ref.COMPOUND:
        order = draw(st.sampled_from([("TIMESTAMP", "LFU"), ("LFU", "TIMESTAMP")]))
        score_function = draw(
            st.sampled_from([nan_on_multiples_of_three, recency_weighted_count, None])
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


def key_strategy(specs: Sequence[ref.RefSpec]) -> st.SearchStrategy[int]:
    """Keys from a range about 1.5x the largest table's max capacity, so tables fill and evict."""
    top = min(160, max(s.max_capacity for s in specs) * 3 // 2)
    dense = st.integers(-3, top)
    return st.one_of(dense, dense, dense, dense, dense, st.sampled_from(SPECIAL_KEYS))


def key_lists(keys: st.SearchStrategy[int], max_size: int, unique: bool = False):
    """Lists of keys whose length is drawn uniformly (plain st.lists favours very short ones)."""
    return st.integers(0, max_size).flatmap(
        lambda n: (
            st.lists(keys, min_size=n, max_size=n, unique=unique)
            if not unique
            else st.lists(keys, max_size=n, unique=True)
        )
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
        evicted_item_mode=EvictedItemMode.RETAIN_KEY
        if spec.retain_key
        else EvictedItemMode.DISCARD,
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
        assert scores.dim() == 2 and scores.shape[0] == len(tids), (
            f"scores shape {tuple(scores.shape)}"
        )
        rows = scores.tolist()
        return [
            tuple(int(v) for v in row[: self.specs[t].num_scores]) for row, t in zip(rows, tids)
        ]

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
            _ints(res.slots),
            [bool(v) for v in res.found.tolist()],
            self._score_rows(res.scores, tids),
        )

    def insert(self, keys, table_ids=None, *, rows=None, scores=None, score=None) -> List[int]:
        # ScoredHashTable.insert has no score= argument: its touches use the policy default.
        assert score is None
        return _ints(
            self.table.insert(
                self._keys(keys),
                self._tids(table_ids),
                rows=self._rows(rows),
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
                self._keys(keys),
                self._tids(table_ids),
                rows=self._rows(rows),
                scores=self._scores_in(scores),
                score=score,
            )
        )

    def erase(self, keys, table_ids=None) -> List[bool]:
        return [bool(v) for v in self.table.erase(self._keys(keys), self._tids(table_ids)).tolist()]

    def export(self, table_id: int, threshold: Optional[int] = None) -> ref.RefExport:
        res = self.table.export(table_id, threshold)
        keys = _ints(res.keys)
        return ref.RefExport(
            keys, _ints(res.slots), self._score_rows(res.scores, [table_id] * len(keys))
        )

    def insert_at(self, table_id: int, keys, slots, *, rows=None, scores=None) -> Optional[str]:
        """None when placed, else the DynamicEmbError message (it must name the failing key)."""
        try:
            self.table.insert_at(
                table_id,
                self._keys(keys),
                self._keys(slots),
                rows=self._rows(rows),
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

    def pin_slots(self, slots: Sequence[int], table_ids=None) -> None:
        self.table.pin_slots(self._keys(slots), self._tids(table_ids))

    def unpin_slots(self, slots: Sequence[int], table_ids=None) -> None:
        self.table.unpin_slots(self._keys(slots), self._tids(table_ids))

    def pin_counts(self, table_id: int = 0) -> List[int]:
        return _ints(self.table.pin_counts(table_id))


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------
def assert_same(got: Any, expected: Any) -> None:
    assert got == expected, f"\n  got      {got}\n  expected {expected}"


def _evicted_order(e: ref.RefEvicted) -> Tuple[int, int]:
    return (e.table_id, e.slot)  # a slot is evicted at most once per call


def assert_same_insert(
    specs: Sequence[ref.RefSpec], got: ref.RefInsertResult, expected: ref.RefInsertResult
) -> None:
    """Slots, is_new, and the evicted items (any order) with their rows where defined."""
    assert_same(got.slots, expected.slots)
    assert_same(got.is_new, expected.is_new)
    got_ev = sorted(got.evicted, key=_evicted_order)
    exp_ev = sorted(expected.evicted, key=_evicted_order)
    assert_same(
        [(e.table_id, e.slot, e.key, e.scores) for e in got_ev],
        [(e.table_id, e.slot, e.key, e.scores) for e in exp_ev],
    )
    for g, e in zip(got_ev, exp_ev):
        if e.row is not None and specs[e.table_id].row_width > 0:
            assert_same(g.row, e.row)
