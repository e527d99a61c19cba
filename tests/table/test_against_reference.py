"""Randomized op sequences: the real ScoredHashTable against the pure-Python reference model.

A hypothesis state machine builds one to three small logical tables of any policy (buckets of 16 or
32 slots, or one whole-table bucket; one or two buckets, growing up to 4x; keys from a range about
1.5x the largest table, plus INT64_MIN/INT64_MAX/-1), so full buckets, evictions, slot -1 and
doublings happen constantly. It applies random calls to the real table and to
:mod:`reference_model` side by side and compares what each call returned (slots, found masks,
is_new, scores, evicted keys/slots/scores/table ids/rows, insert_at errors), then after every step
the whole state: size, capacity, every exported (key, slot, scores), the flat layout (keys and
digests per slot, sizes, bucket widths) and every value row whose contents the contract defines.
Scores are explicit wherever a policy would read the clock, so the model predicts exact slots.

A second, focused test fills single tables with random score words (many ties, NaN scores) and
checks which slot every insert evicts.

Both run on every device of the ``device`` fixture. CUDA results are compared with the same model
exactly, under ``DEMB_DETERMINISM_MODE=1`` (the contract promises determinism there); one more test
drives a CPU and a CUDA table with the same sequence and compares them with each other in full.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import pytest
import reference_model as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from reference_harness import (
    RealTable,
    assert_same,
    assert_same_insert,
    key_lists,
    key_strategy,
    nan_on_multiples_of_three,
    recency_weighted_count,
    table_sets,
)

from dynamicemb_core.types import DynamicEmbWarning

# Policies whose call score is not a clock reading: their default score (None) is predictable.
_NON_CLOCK = (ref.STEP, ref.CUSTOMIZED, ref.LFU)


# ----------------------------------------------------------------------------------------------
# The state machine
# ----------------------------------------------------------------------------------------------


# Positions of up to 6 picks among a list that the table's state gives (occupied or pinned slots).
# They are drawn before that list is known, in a fixed range, so that the draws of a step never
# depend on the state: under the key-parallel engine the state depends on the schedule, and
# hypothesis replays a choice sequence expecting the same draws (FlakyStrategyDefinition otherwise).
_PICKS = st.lists(st.integers(0, 255), max_size=6)


def _picked(positions: List[int], options: List[int], unique: bool) -> List[int]:
    """``options[p % len(options)]`` for each position, first occurrences only when ``unique``."""
    out: List[int] = []
    for p in positions:
        v = options[p % len(options)]
        if not unique or v not in out:
            out.append(v)
    return out


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
        self.keys = key_strategy(specs)
        self.clock = 0
        self.serial = 0
        self.last_call: Tuple[List[int], List[int]] = ([], [])

    # -- drawing calls ----------------------------------------------------------------------------
    def _draw_call(
        self, data: Any, *, single: bool = False, unique: bool = False, max_keys: int = 24
    ):
        """Keys and a ``table_ids`` argument (None, an int, or a list) and the per-key table ids.
        The keys and per-key table ids are also kept in ``last_call`` (machines that compare by
        key read them)."""
        keys = data.draw(key_lists(self.keys, max_keys, unique), label="keys")
        n_tables = len(self.specs)
        form = (
            "int" if single else data.draw(st.sampled_from(["none", "int", "list"]), label="form")
        )
        arg: Any
        if form == "none":
            arg, tids = None, [0] * len(keys)
        elif form == "int":
            arg = data.draw(st.integers(0, n_tables - 1), label="table")
            tids = [arg] * len(keys)
        else:
            tids = data.draw(
                st.lists(st.integers(0, n_tables - 1), min_size=len(keys), max_size=len(keys)),
                label="table_ids",
            )
            if unique:  # unique (table, key) pairs, not only unique keys
                keys, tids = map(list, zip(*dict.fromkeys(zip(keys, tids)))) if keys else ([], [])
            arg = tids
        self.last_call = (list(keys), list(tids))
        return keys, arg, tids

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
        results = []
        for subject in self.subjects:
            got = call(subject)
            results.append(got)
            try:
                compare(got, expected)
            except AssertionError as err:
                raise AssertionError(f"{what} on {subject.device}: {err}") from None
        # Several devices: also equal to each other in full, including what the model leaves
        # unspecified (scores of missing keys, evicted rows the contract does not define).
        for subject, got in zip(self.subjects[1:], results[1:]):
            try:
                assert_same(got, results[0])
            except AssertionError as err:
                raise AssertionError(
                    f"{what}: {subject.device} vs {self.subjects[0].device}: {err}"
                ) from None
        return expected

    @staticmethod
    def _same(got: Any, expected: Any) -> None:
        assert_same(got, expected)

    def _same_insert(self, got: ref.RefInsertResult, expected: ref.RefInsertResult) -> None:
        assert_same_insert(self.specs, got, expected)

    def _same_layout(self, t: int) -> None:
        """The flat state itself: each table's region holds its keys and their digests, and
        ``digests`` is zero exactly at the empty slots (docs/table_design.md, Layout)."""
        table = self.model.tables[t]
        expected_digests = [0 if e is None else ref.digest_of(e.key) for e in table.slots]
        for subject in self.subjects:
            state = subject.table.state
            begin, end = state.slot_offsets[t : t + 2].tolist()
            self._same(int(state.bucket_caps[t]), table.bucket_cap)
            digests = state.digests[begin:end].tolist()
            keys = state.table_keys[begin:end].tolist()
            self._same(digests, expected_digests)
            occupied = [s for s, e in enumerate(table.slots) if e is not None]
            self._same([keys[s] for s in occupied], [table.slots[s].key for s in occupied])
            self._same(int(state.sizes[t]), table.size)

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
            "find_or_insert",
            lambda tbl: tbl.find_or_insert(keys, arg, score=score),
            self._same_insert,
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
        self.last_call = (list(keys), [t] * n)
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
        for key in data.draw(key_lists(self.keys, 8, True), label="keys"):
            own = table.locate(key)
            free = [s for s in table.bucket_slots(key) if table.slots[s] is None and s not in slots]
            if own is not None:
                keys.append(key), slots.append(own)
            elif free:
                keys.append(key), slots.append(data.draw(st.sampled_from(free), label="slot"))
        if keys and data.draw(st.booleans(), label="spoil"):
            i = data.draw(st.integers(0, len(keys) - 1), label="spoiled")
            outside = [
                s for s in range(-1, table.capacity + 1) if s not in table.bucket_slots(keys[i])
            ]
            taken = [
                s
                for s in table.bucket_slots(keys[i])
                if table.slots[s] is not None and table.slots[s].key != keys[i]
            ]
            claimed = [s for j, s in enumerate(slots) if j != i]  # another key of the batch
            moved = [
                s
                for s in table.bucket_slots(keys[i])  # a present key sent elsewhere
                if table.slots[s] is None and table.locate(keys[i]) is not None
            ]
            slots[i] = data.draw(
                st.sampled_from(outside + taken + claimed + moved), label="bad slot"
            )
        if keys and data.draw(st.booleans(), label="repeat"):  # one key twice (same or other slot)
            i = data.draw(st.integers(0, len(keys) - 1), label="repeated")
            keys.append(keys[i])
            slots.append(data.draw(st.sampled_from([slots[i], slots[-1]]), label="repeat slot"))
        rows = self._draw_rows(data, len(keys), t)
        scores = [
            tuple(data.draw(st.integers(0, 60)) for _ in range(self.specs[t].num_scores))
            for _ in keys
        ]

        def compare(got: Optional[str], expected: Optional[int]) -> None:
            if expected is None or got is None:
                self._same(got, expected)
            else:  # the error names the first key that cannot go to its slot
                named = {int(v) for v in re.findall(r"(?<![\w.])-?\d+", got)}
                assert keys[expected] in named, f"{got!r} does not name key {keys[expected]}"

        self._apply(
            "insert_at",
            lambda tbl: tbl.insert_at(t, keys, slots, rows=rows, scores=scores),
            compare,
        )

    @rule(data=st.data())
    def write_rows(self, data: Any) -> None:
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        picks = data.draw(_PICKS, label="slots")
        occupied = self.model.export(t).slots
        if self.specs[t].row_width == 0 or not occupied:
            return
        slots = _picked(picks, occupied + [-1], unique=True)
        rows = self._draw_rows(data, len(slots), t) or [(0.0,) * self.specs[t].row_width] * len(
            slots
        )
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
    def pin_or_unpin(self, data: Any) -> None:
        """Pins (slots never evicted): on occupied slots, or off slots that hold pins."""
        t = data.draw(st.integers(0, len(self.specs) - 1), label="table")
        unpin = data.draw(st.booleans(), label="unpin")
        picks = data.draw(_PICKS, label="slots")
        counts = self.model.pin_counts(t)
        pinned = [s for s, c in enumerate(counts) if c > 0]
        if pinned and unpin:
            slots = _picked(picks[:4], pinned, unique=True)
            self._apply("unpin", lambda tbl: tbl.unpin_slots(slots, t), self._same)
            return
        occupied = self.model.export(t).slots
        if occupied:
            slots = _picked(picks, occupied + [-1], unique=False)
            self._apply("pin", lambda tbl: tbl.pin_slots(slots, t), self._same)

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
            self._apply(f"size({t})", lambda tbl, t=t: tbl.size(t), self._same)
            self._apply(f"capacity({t})", lambda tbl, t=t: tbl.capacity(t), self._same)
            self._apply(f"pin_counts({t})", lambda tbl, t=t: tbl.pin_counts(t), self._same)
            exported = self._apply(f"export({t})", lambda tbl, t=t: tbl.export(t), self._same)
            self._same_layout(t)
            if self.specs[t].row_width == 0 or not exported.slots:
                continue
            expected_rows = self.model.read_rows(t, exported.slots)
            for subject in self.subjects:
                got_rows = subject.read_rows(t, exported.slots)
                pairs = [(g, e) for g, e in zip(got_rows, expected_rows) if e is not None]
                self._same([g for g, _ in pairs], [e for _, e in pairs])
        if len(self.subjects) > 1:  # whole value buffers, defined rows or not, across devices
            for t in range(len(self.specs)):
                first = self.subjects[0].table.values(t).cpu()
                for subject in self.subjects[1:]:
                    assert torch.equal(subject.table.values(t).cpu(), first), f"values({t})"


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


# ----------------------------------------------------------------------------------------------
# Eviction choice under many score mixes (the state machine reaches these less often)
# ----------------------------------------------------------------------------------------------
@st.composite
def evicting_specs(draw: Callable) -> ref.RefSpec:
    """One full-size table of an evicting policy (no growth), with a row to follow the keys."""
    policy = draw(st.sampled_from([ref.COMPOUND, ref.TIMESTAMP, ref.STEP, ref.CUSTOMIZED, ref.LFU]))
    order: Tuple[str, ...] = (ref.POLICY_NAMES[policy],)
    score_function = None
    if policy == ref.COMPOUND:
        order = draw(st.sampled_from([("TIMESTAMP", "LFU"), ("LFU", "TIMESTAMP")]))
        score_function = draw(
            st.sampled_from([nan_on_multiples_of_three, recency_weighted_count, None])
        )
    capacity = draw(st.sampled_from([16, 32]))
    return ref.RefSpec(
        name="evicting",
        policy=policy,
        order=order,
        init_capacity=capacity,
        max_capacity=capacity,
        bucket_capacity=16,
        max_load_factor=1.0,
        row_width=1,
        score_function=score_function,
        retain_key=True,
    )


def _check_eviction_choice(device: str, spec: ref.RefSpec, data: Any) -> None:
    """Fill a table in small calls with random score words (many ties, NaNs for the NaN score
    function), then touch and insert more keys; every call must evict what the model evicts."""
    model, real = ref.RefScoredHashTable([spec]), RealTable([spec], str(device))
    words = st.integers(0, 8)
    keys = data.draw(st.permutations(range(-3, 3 * spec.init_capacity)), label="keys")
    for step, start in enumerate(range(0, len(keys), 5)):
        chunk = keys[start : start + 5]
        scores = [tuple(data.draw(words) for _ in range(spec.num_scores)) for _ in chunk]
        rows = [(float(k),) for k in chunk]
        if data.draw(st.booleans(), label="touch first"):
            touched = data.draw(st.lists(st.sampled_from(keys[: start + 1]), max_size=4))
            assert_same(
                real.find(touched, update_score=True, score=step),
                model.find(touched, update_score=True, score=step),
            )
        assert_same_insert(
            [spec],
            real.insert_and_evict(chunk, 0, rows=rows, scores=scores, score=step),
            model.insert_and_evict(chunk, 0, rows=rows, scores=scores, score=step),
        )
        if data.draw(st.booleans(), label="default scores"):
            more = data.draw(st.lists(st.sampled_from(keys), max_size=6), label="more")
            assert_same_insert(
                [spec],
                real.find_or_insert(more, 0, score=step),
                model.find_or_insert(more, 0, score=step),
            )
    assert_same(real.export(0), model.export(0))
    assert_same(real.pop_evicted_keys(0), model.pop_evicted_keys(0))


@settings(
    settings.get_profile("demb-table"),
    max_examples=80,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=evicting_specs(), data=st.data())
def test_eviction_choice_matches_model(
    device: str, deterministic_cuda: None, spec: ref.RefSpec, data: Any
) -> None:
    _check_eviction_choice(device, spec, data)


@pytest.mark.slow
@settings(
    settings.get_profile("demb-table-slow"),
    max_examples=3000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=evicting_specs(), data=st.data())
def test_eviction_choice_matches_model_long(
    device: str, deterministic_cuda: None, spec: ref.RefSpec, data: Any
) -> None:
    _check_eviction_choice(device, spec, data)
