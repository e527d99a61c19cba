"""find_or_insert_rows and insert_and_evict_rows (the inserting ops that move value rows, HKV's API
shape) against their composition: the plain op, then the row copies of scatter_rows / gather_rows.

The expected rows come from an independent Python model of the rule, fed with the op's own slots
and the state before the call, so the same check holds for every engine:

* find_or_insert_rows: a key present before the call copies its slot's row out; a key new in this
  call has the row of its FIRST occurrence written to its slot (several tables sharing ``values``
  name one row twice: the first such write in input order wins), and every placed occurrence
  ends with its slot's row; a key not placed (slot -1) keeps its row as given.
* insert_and_evict_rows: each evicted key is reported with its row before the call, then every
  placed key's slot gets the row of its LAST occurrence.

CPU and the deterministic CUDA engine must also equal the plain op slot for slot (state included);
the key-parallel engine (CUDA, deterministic=False) may place new keys in other slots of their
buckets, so there the table is checked by contents: every returned slot holds its key, the sizes
are the deterministic engine's, and the rows follow the rule above.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamicemb_core.ops import table_ops
from dynamicemb_core.ops.table_ops import TableState

LFU, NO_EVICTION, TIMESTAMP = 3, 4, 0
WIDTH = 5
_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _engines(device: torch.device) -> List[bool]:
    """deterministic flags to run: CPU is deterministic always; CUDA runs both engines."""
    return [True] if device.type == "cpu" else [True, False]


def _state(device: torch.device) -> TableState:
    """Table 0: LFU, 4 buckets of 16 (evicts); table 1: NO_EVICTION, 2 buckets of 16."""
    i64 = {"dtype": torch.int64, "device": device}
    return TableState(
        torch.zeros(96, **i64),
        torch.zeros(96, dtype=torch.uint8, device=device),
        torch.zeros(96, 2, **i64),
        torch.tensor([0, 64, 96], **i64),
        torch.tensor([16, 16], **i64),
        torch.tensor([LFU, NO_EVICTION], **i64),
        torch.zeros(2, **i64),
    )


def _clone(state: TableState) -> TableState:
    return TableState(*(t.clone() for t in state))


def _fns(device: torch.device, tables: int = 2) -> Tuple[torch.Tensor, torch.Tensor]:
    i64 = {"dtype": torch.int64, "device": device}
    return torch.zeros(tables, **i64), torch.full((tables,), 5, **i64)


def _found_before(keys: torch.Tensor, tids: torch.Tensor, state: TableState) -> List[bool]:
    cur = torch.zeros(state.bucket_caps.numel(), dtype=torch.int64, device=keys.device)
    return table_ops.find(keys, tids, state, cur, False)[1].tolist()


def _want_find_or_insert(
    keys: List[int],
    tids: List[int],
    slots: List[int],
    found: List[bool],
    values: torch.Tensor,
    rows: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rule of find_or_insert_rows (module docstring), from the op's slots."""
    values, rows = values.clone(), rows.clone()
    cap = values.shape[0]
    seen = set()  # values rows written: the first new occurrence naming a row wins
    for i, s in enumerate(slots):
        if 0 <= s < cap and not found[i] and s not in seen:
            seen.add(s)
            values[s] = rows[i]
    for i, s in enumerate(slots):
        if 0 <= s < cap:
            rows[i] = values[s]
    return values, rows


def _want_insert_and_evict(
    slots: List[int], ev_slots: List[int], values: torch.Tensor, rows: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rule of insert_and_evict_rows: victims' rows first, then the last occurrence wins."""
    cap = values.shape[0]
    ev_rows = torch.zeros(len(ev_slots), values.shape[1], dtype=values.dtype)
    for j, s in enumerate(ev_slots):
        if 0 <= s < cap:
            ev_rows[j] = values[s]
    values = values.clone()
    for i, s in enumerate(slots):
        if 0 <= s < cap:
            values[s] = rows[i]
    return values, ev_rows


def _assert_slots_hold_keys(state: TableState, keys, tids, slots) -> None:
    offsets = state.slot_offsets.tolist()
    table_keys = state.table_keys.tolist()
    digests = state.digests.tolist()
    for k, t, s in zip(keys, tids, slots, strict=True):
        if s >= 0:
            g = offsets[t] + s
            assert digests[g] != 0 and table_keys[g] == k, (k, t, s)


def _check_find_or_insert_rows(
    state: TableState,
    values: torch.Tensor,
    keys: torch.Tensor,
    tids: torch.Tensor,
    rows: torch.Tensor,
    deterministic: bool,
    pins: Optional[torch.Tensor] = None,
    unique_keys: bool = False,
) -> None:
    fns, cur = _fns(keys.device, state.bucket_caps.numel())
    before, values_before, rows_given = _clone(state), values.clone(), rows.clone()
    found = _found_before(keys, tids, before)
    out = rows.clone()
    slots, is_new = table_ops.find_or_insert_rows(
        keys,
        tids,
        state,
        fns,
        cur,
        values,
        out,
        pins=pins,
        deterministic=deterministic,
        unique_keys=unique_keys,
    )
    plain = _clone(before)
    want_slots, want_new = table_ops.find_or_insert(
        keys, tids, plain, fns, cur, pins=pins, deterministic=True
    )
    sl = slots.tolist()
    want_values, want_rows = _want_find_or_insert(
        keys.tolist(), tids.tolist(), sl, found, values_before.cpu(), rows_given.cpu()
    )
    assert torch.equal(values.cpu(), want_values)
    assert torch.equal(out.cpu(), want_rows)
    if deterministic:
        assert torch.equal(slots, want_slots) and torch.equal(is_new, want_new)
        for got, want in zip(state, plain, strict=True):
            assert torch.equal(got, want)
    else:
        _assert_slots_hold_keys(state, keys.tolist(), tids.tolist(), sl)
        assert torch.equal(state.sizes, plain.sizes)


def _check_insert_and_evict_rows(
    state: TableState,
    values: torch.Tensor,
    keys: torch.Tensor,
    tids: torch.Tensor,
    rows: torch.Tensor,
    deterministic: bool,
    pins: Optional[torch.Tensor] = None,
    unique_keys: bool = False,
) -> None:
    fns, cur = _fns(keys.device, state.bucket_caps.numel())
    before, values_before = _clone(state), values.clone()
    given = rows.clone()
    out = table_ops.insert_and_evict_rows(
        keys,
        tids,
        state,
        fns,
        cur,
        values,
        rows,
        pins=pins,
        deterministic=deterministic,
        unique_keys=unique_keys,
    )
    assert torch.equal(rows, given), "insert_and_evict_rows wrote its input rows"
    plain = _clone(before)
    want = table_ops.insert_and_evict(keys, tids, plain, fns, cur, pins=pins, deterministic=True)
    slots, ev_slots, ev_rows = out[0], out[3], out[6]
    want_values, want_ev_rows = _want_insert_and_evict(
        slots.tolist(), ev_slots.tolist(), values_before.cpu(), given.cpu()
    )
    assert torch.equal(values.cpu(), want_values)
    assert torch.equal(ev_rows.cpu(), want_ev_rows)
    if deterministic:
        for got, w in zip(out[:6], want, strict=True):
            assert torch.equal(got, w)
        for got, w in zip(state, plain, strict=True):
            assert torch.equal(got, w)
    else:
        _assert_slots_hold_keys(state, keys.tolist(), tids.tolist(), slots.tolist())
        assert torch.equal(state.sizes, plain.sizes)
        assert out[2].numel() == want[2].numel()
        # each victim is reported with the key that held its slot before the call
        offsets = before.slot_offsets.tolist()
        old_keys = before.table_keys.tolist()
        for k, s, t in zip(out[2].tolist(), ev_slots.tolist(), out[5].tolist(), strict=True):
            assert old_keys[offsets[t] + s] == k


_calls = st.lists(
    st.tuples(
        st.lists(st.integers(-20, 120), min_size=0, max_size=90),  # keys, repeats likely
        st.sampled_from(["t0", "t1", "mixed"]),
        st.booleans(),  # pins
    ),
    min_size=1,
    max_size=6,
)


def _call_inputs(
    device: torch.device, keys: List[int], which: str, seed: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.tensor(keys, dtype=torch.int64)
    if which == "mixed":
        t = torch.randint(0, 2, (len(keys),), generator=g)
    else:
        t = torch.full((len(keys),), int(which[1]), dtype=torch.int64)
    rows = torch.randn(len(keys), WIDTH, generator=g)
    return k.to(device), t.to(device), rows.to(device)


def _pins(state: TableState, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        (torch.rand(state.table_keys.numel(), generator=g) < 0.3)
        .to(torch.int32)
        .to(state.table_keys.device)
    )


@_SETTINGS
@given(calls=_calls)
def test_find_or_insert_rows_is_the_composition(device: torch.device, calls) -> None:
    for deterministic in _engines(device):
        state = _state(device)
        values = torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(3)).to(device)
        for n, (keys, which, pinned) in enumerate(calls):
            k, t, rows = _call_inputs(device, keys, which, n)
            pins = _pins(state, n) if pinned else None
            _check_find_or_insert_rows(state, values, k, t, rows, deterministic, pins)


@_SETTINGS
@given(calls=_calls)
def test_insert_and_evict_rows_is_the_composition(device: torch.device, calls) -> None:
    for deterministic in _engines(device):
        state = _state(device)
        values = torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(4)).to(device)
        for n, (keys, which, pinned) in enumerate(calls):
            k, t, rows = _call_inputs(device, keys, which, n)
            pins = _pins(state, n) if pinned else None
            _check_insert_and_evict_rows(state, values, k, t, rows, deterministic, pins)


@pytest.mark.parametrize(
    "width,dtype",
    [
        (1, torch.float32),
        (8, torch.float32),
        (64, torch.float32),
        (3, torch.float16),
        (7, torch.uint8),
    ],
)
def test_rows_ops_on_contended_calls(device: torch.device, width: int, dtype) -> None:
    """Many keys per bucket, repeats and evictions, at every vector width of the row copies."""
    for deterministic in _engines(device):
        state = _state(device)
        values = (torch.arange(64 * width) % 251).reshape(64, width).to(dtype).to(device)
        g = torch.Generator().manual_seed(width)
        for call in range(4):
            keys = torch.randint(0, 300, (400,), generator=g).to(device)
            tids = torch.zeros_like(keys)
            rows = torch.randint(0, 250, (400, width), generator=g).to(dtype).to(device)
            if call % 2 == 0:
                _check_find_or_insert_rows(state, values, keys, tids, rows, deterministic)
            else:
                _check_insert_and_evict_rows(state, values, keys, tids, rows, deterministic)


@pytest.mark.parametrize(
    "width,dtype", [(1, torch.float32), (8, torch.float32), (64, torch.float32), (3, torch.float16)]
)
def test_rows_ops_with_unique_keys(device: torch.device, width: int, dtype) -> None:
    """Distinct keys of one table told so (``unique_keys``): on the key-parallel engine the rows
    then move without a first / last-write map (one kernel for find_or_insert_rows' both
    directions, insert_and_evict_rows' rows queued before its one wait), and follow the same rule;
    the victims' rows come back in the report's order, also when some pending key found no victim
    (pins). CPU and the deterministic engine ignore the flag."""
    for deterministic in _engines(device):
        state = _one_table(device)
        values = (torch.arange(64 * width) % 251).reshape(64, width).to(dtype).to(device)
        g = torch.Generator().manual_seed(width)
        for call in range(6):
            keys = torch.randperm(300, generator=g)[: 40 + 30 * call].to(device)
            tids = torch.zeros_like(keys)
            rows = torch.randint(0, 250, (keys.numel(), width), generator=g).to(dtype).to(device)
            pins = _pins(state, call) if call >= 4 else None
            check = _check_find_or_insert_rows if call % 2 == 0 else _check_insert_and_evict_rows
            check(state, values, keys, tids, rows, deterministic, pins, unique_keys=True)


def _one_table(device: torch.device) -> TableState:
    """One LFU table of 4 buckets of 16 (the fast row path needs a single table)."""
    i64 = {"dtype": torch.int64, "device": device}
    return TableState(
        torch.zeros(64, **i64),
        torch.zeros(64, dtype=torch.uint8, device=device),
        torch.zeros(64, 2, **i64),
        torch.tensor([0, 64], **i64),
        torch.tensor([16], **i64),
        torch.tensor([LFU], **i64),
        torch.zeros(1, **i64),
    )


def test_no_eviction_full_bucket_leaves_rows(device: torch.device) -> None:
    """NO_EVICTION buckets that are full refuse new keys: slot -1, rows[i] and values untouched."""
    for deterministic in _engines(device):
        state = _state(device)
        values = torch.zeros(64, WIDTH, device=device)
        fns, cur = _fns(device)
        fill = torch.arange(0, 400, dtype=torch.int64, device=device)
        table_ops.insert(fill, torch.ones_like(fill), state, fns, cur, deterministic=True)
        assert int(state.sizes[1]) == 32
        keys = torch.arange(1000, 1010, dtype=torch.int64, device=device)
        rows = torch.full((10, WIDTH), 7.0, device=device)
        slots, is_new = table_ops.find_or_insert_rows(
            keys,
            torch.ones_like(keys),
            state,
            fns,
            cur,
            values,
            rows,
            deterministic=deterministic,
        )
        assert bool((slots == -1).all()) and not bool(is_new.any())
        assert bool((rows == 7.0).all()) and not bool(values.any())
        out = table_ops.insert_and_evict_rows(
            keys,
            torch.ones_like(keys),
            state,
            fns,
            cur,
            values,
            rows,
            deterministic=deterministic,
        )
        assert bool((out[0] == -1).all()) and out[6].shape == (0, WIDTH)
        assert not bool(values.any())


def _snapshot(state: TableState, values: torch.Tensor, rows: torch.Tensor) -> List[torch.Tensor]:
    return [t.clone() for t in (*state, values, rows)]


def test_bad_input_raises_before_writing(device: torch.device) -> None:
    state = _state(device)
    fns, cur = _fns(device)
    values = torch.randn(64, WIDTH, device=device)
    keys = torch.arange(10, dtype=torch.int64, device=device)
    tids = torch.zeros_like(keys)
    rows = torch.randn(10, WIDTH, device=device)
    bad: Dict[str, Tuple[Dict[str, torch.Tensor], type, str]] = {
        "rows shape": ({"rows": torch.randn(9, WIDTH, device=device)}, ValueError, "rows must be"),
        "rows width": ({"rows": torch.randn(10, 4, device=device)}, ValueError, "rows must be"),
        "rows dtype": ({"rows": rows.double()}, TypeError, "dtype of values"),
        "rows strided": (
            {"rows": torch.randn(WIDTH, 10, device=device).t()},
            ValueError,
            "contiguous",
        ),
        "values 1-D": ({"values": torch.randn(64, device=device)}, ValueError, "values must be"),
        "values short": ({"values": values[:40]}, ValueError, "capacity 64"),
        "table id": ({"tids": torch.full_like(keys, 2)}, IndexError, "table_ids"),
    }
    if device.type == "cuda":
        bad["rows device"] = ({"rows": rows.cpu()}, ValueError, "rows must be")
        bad["values device"] = ({"values": values.cpu()}, ValueError, "values must be on")
    for name, (change, err, text) in bad.items():
        args = {"keys": keys, "tids": tids, "values": values, "rows": rows, **change}
        for op in ("find_or_insert_rows", "insert_and_evict_rows"):
            snap = _snapshot(state, values, rows)
            with pytest.raises(err, match=text):
                getattr(table_ops, op)(
                    args["keys"],
                    args["tids"],
                    state,
                    fns,
                    cur,
                    args["values"],
                    args["rows"],
                    deterministic=device.type == "cpu",
                )
            for got, want in zip(_snapshot(state, values, rows), snap, strict=True):
                assert torch.equal(got, want), (name, op)


def test_values_of_one_table_serve_its_keys(device: torch.device) -> None:
    """values need only hold the slots of the tables the keys name (table 1 has 32)."""
    for deterministic in _engines(device):
        state = _state(device)
        values = torch.randn(32, WIDTH, device=device)
        keys = torch.arange(50, dtype=torch.int64, device=device)
        rows = torch.randn(50, WIDTH, device=device)
        _check_find_or_insert_rows(state, values, keys, torch.ones_like(keys), rows, deterministic)
