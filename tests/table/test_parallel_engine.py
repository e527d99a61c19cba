"""The key-parallel CUDA insert engine (csrc/cuda/table_upsert_parallel.cuh): what holds whatever the
schedule, and the per-slot pins both engines respect.

Two kinds of checks:

* Invariants on large, contended calls (many keys per bucket, duplicates, several tables), run on
  every device of the ``device`` fixture: on CPU they check the deterministic rules (CI), on CUDA the
  key-parallel engine (DEMB_DETERMINISM_MODE=0). Every key is present at most once; every returned slot holds its
  key; present keys keep their slots and rows; evicted keys are reported once each, with their rows;
  the resident count equals the reference model's; a victim never ranks above a key that survived
  unprotected and unpinned in its bucket; NO_EVICTION grows instead of evicting; pinned slots are
  never victims.
* The state machine of test_against_reference.py on CUDA with the parallel engine, comparing
  contents instead of slots: from the same state a call must evict the same slots (the k
  lowest-ranked unprotected, unpinned slots of each bucket) with the same keys, scores and rows,
  place the same keys, and leave the same contents; only which new key sits in which of those
  slots may differ. After each call the model adopts the real table's slots (a permutation inside
  each bucket), so the next call starts from the same state again. Where a bucket gets more new
  keys than it can take, only how many got in is compared, and the model adopts the real state.
  What follows from the slots is adopted too: NO_EVICTION insertion numbers (handed out in slot
  order: the same numbers, to other keys) and, after a growth, RETAIN_KEY buffers. The same
  machine runs on CPU (in CI) with the inserting ops' new keys shuffled inside their buckets, the
  freedom the key-parallel engine has, so what it compares is checked schedule-free there too.
"""

from __future__ import annotations

import random
import warnings
from typing import Any, Dict, List, Optional, Tuple

import pytest
import reference_model as ref
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from reference_harness import (
    assert_same,
    nan_on_multiples_of_three,
    real_table_spec,
    recency_weighted_count,
)
from test_against_reference import TableMachine

from dynamicemb_core.config import MAX_BUCKET_CAPACITY, DynamicEmbScoreStrategy
from dynamicemb_core.ops import table_ops
from dynamicemb_core.ops.table_ops import TableState
from dynamicemb_core.table import ScoredHashTable, TableSpec
from dynamicemb_core.types import DynamicEmbWarning

_CUDA = torch.cuda.is_available()


@pytest.fixture
def parallel_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key-parallel engine on CUDA (the default; set explicitly so that a run with
    DEMB_DETERMINISM_MODE=1 in its environment still tests it)."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "0")


# ----------------------------------------------------------------------------------------------
# Invariants on contended calls
# ----------------------------------------------------------------------------------------------
def _row_of(keys: torch.Tensor, width: int) -> torch.Tensor:
    """The row a key is written with: a function of the key, so a row shows whose it is."""
    return (
        keys.to(torch.float64)
        .unsqueeze(1)
        .repeat(1, width)
        .add(torch.arange(width, dtype=torch.float64, device=keys.device))
        .to(torch.float32)
    )


def _resident(table: ScoredHashTable, t: int) -> Tuple[List[int], List[int], List[List[int]]]:
    res = table.export(t)
    return res.keys.tolist(), res.slots.tolist(), res.scores.tolist()


class _Checker:
    """Follows one ScoredHashTable through insert_and_evict calls and checks every invariant."""

    def __init__(self, table: ScoredHashTable, width: int) -> None:
        self.table = table
        self.width = width
        self.alive: Dict[Tuple[int, int], int] = {}  # (t, key) -> slot

    def call(self, keys: torch.Tensor, tids: torch.Tensor, score: int) -> Any:
        table, dev = self.table, keys.device
        before = {t: dict(zip(*_resident(table, t)[:2])) for t in range(table.num_tables)}
        before_scores = {
            t: {k: s[0] for k, s in zip(*_resident(table, t)[::2])} for t in range(table.num_tables)
        }
        res = table.insert_and_evict(keys, tids, rows=_row_of(keys, self.width), score=score)
        slots, is_new = res.slots.tolist(), res.is_new.tolist()
        pairs = list(zip(tids.tolist(), keys.tolist()))
        # one slot per (table, key) in the call; present keys kept theirs and are not new
        slot_of: Dict[Tuple[int, int], int] = {}
        for p, s, n in zip(pairs, slots, is_new):
            assert slot_of.setdefault(p, s) == s, f"{p} got two slots"
            if p[1] in before[p[0]]:
                assert s == before[p[0]][p[1]] and not n, f"present {p} moved to {s} / new={n}"
            else:
                assert n == (s >= 0), f"absent {p}: slot {s}, is_new {n}"
        after = {t: _resident(table, t) for t in range(table.num_tables)}
        for t, (ks, _, _) in after.items():
            assert len(set(ks)) == len(ks), f"table {t}: a key is present twice"
            assert int(table.size(t)) == len(ks), f"table {t}: size {table.size(t)} != {len(ks)}"
        where = {t: dict(zip(ks, ss)) for t, (ks, ss, _) in after.items()}
        for (t, k), s in slot_of.items():  # every returned slot holds its key
            if s >= 0:
                assert where[t].get(k) == s, (
                    f"({t}, {k}) returned slot {s}, lives at {where[t].get(k)}"
                )
        # evicted: each once, a key that was present and is gone now, with the slot and row it had
        ev = res.evicted
        ev_pairs = list(zip(ev.table_ids.tolist(), ev.keys.tolist()))
        assert len(set(ev_pairs)) == len(ev_pairs), "a key was reported evicted twice"
        if ev_pairs:
            rows = ev.rows.tolist()
            want = _row_of(ev.keys, self.width).tolist()
            assert rows == want, "an evicted key's reported row is not its row"
        for (t, k), s in zip(ev_pairs, ev.slots.tolist()):
            assert before[t].get(k) == s, f"evicted ({t}, {k}) was not at slot {s}"
            assert k not in where[t], f"evicted ({t}, {k}) is still present"
        gone = {(t, k) for t in before for k in before[t] if k not in where[t]}
        assert gone == set(ev_pairs), "keys vanished without being reported (or vice versa)"
        # every resident key's row is its own row (present keys kept theirs, new ones got theirs)
        for t, (ks, ss, _) in after.items():
            if ks:
                got = table.read_rows(t, torch.tensor(ss, device=dev)).tolist()
                assert got == _row_of(torch.tensor(ks, device=dev), self.width).tolist()
        # victims rank no higher than a surviving, unprotected, unpinned key of their bucket
        written = {p for p in pairs}
        for (t, k), s in zip(ev_pairs, ev.slots.tolist()):
            cap = table.bucket_capacity(t)
            pins = table.pin_counts(t).tolist()
            victim = before_scores[t][k]
            for other, os_ in before[t].items():
                if os_ // cap != s // cap or (t, other) in written or other not in where[t]:
                    continue
                if pins[os_] > 0:
                    continue
                assert before_scores[t][other] >= victim, (
                    f"table {t}: evicted {k} (score {victim}) while {other} "
                    f"(score {before_scores[t][other]}) stayed"
                )
        return res


def pairs_of(keys: torch.Tensor, tids: torch.Tensor) -> List[Tuple[int, int]]:
    return list(zip(tids.tolist(), keys.tolist()))


def _specs(policy: DynamicEmbScoreStrategy, tables: int, capacity: int) -> List[TableSpec]:
    return [
        TableSpec(
            f"t{i}",
            row_width=4,
            init_capacity=capacity,
            max_capacity=capacity,
            bucket_capacity=16,
            score_strategy=policy,
        )
        for i in range(tables)
    ]


@pytest.mark.parametrize(
    "policy", [DynamicEmbScoreStrategy.STEP, DynamicEmbScoreStrategy.LFU], ids=["step", "lfu"]
)
def test_contended_inserts_keep_every_invariant(
    device: torch.device, parallel_engine: None, policy: DynamicEmbScoreStrategy
) -> None:
    """Batches of 4096 keys (half repeats) into 2 tables of 256 slots in 16-slot buckets: about
    130 keys per bucket per call, so every bucket is fought over, evicts and refuses keys."""
    gen = torch.Generator().manual_seed(7)
    table = ScoredHashTable(_specs(policy, 2, 256), device=device)
    checker = _Checker(table, 4)
    model = ref.RefScoredHashTable(
        [
            ref.RefSpec(
                name=f"t{i}",
                policy=ref.STEP if policy == DynamicEmbScoreStrategy.STEP else ref.LFU,
                order=("STEP",) if policy == DynamicEmbScoreStrategy.STEP else ("LFU",),
                row_width=4,
                init_capacity=256,
                max_capacity=256,
                bucket_capacity=16,
            )
            for i in range(2)
        ]
    )
    for step in range(6):
        keys = torch.randint(0, 3000, (2048,), generator=gen)
        keys = torch.cat([keys, keys[torch.randperm(2048, generator=gen)]])
        tids = torch.randint(0, 2, (4096,), generator=gen)
        got = checker.call(keys.to(device), tids.to(device), score=step + 1)
        expected = model.insert_and_evict(keys.tolist(), tids.tolist(), score=step + 1)
        # More new keys than free slots: which ones win depends on the schedule, but not how many
        # are placed, nor which keys are evicted (the lowest-ranked unprotected of each bucket).
        placed = {p for p, s in zip(pairs_of(keys, tids), got.slots.tolist()) if s >= 0}
        assert len(placed) == len(
            {p for p, s in zip(pairs_of(keys, tids), expected.slots) if s >= 0}
        )
        got_ev = sorted(
            zip(
                got.evicted.table_ids.tolist(),
                got.evicted.slots.tolist(),
                got.evicted.keys.tolist(),
            )
        )
        assert_same(got_ev, sorted((e.table_id, e.slot, e.key) for e in expected.evicted))
        for t in range(2):
            assert int(table.size(t)) == model.size(t)
        _adopt_state(model, table)


def test_no_eviction_grows_instead_of_evicting(device: torch.device, parallel_engine: None) -> None:
    """3000 distinct keys into a 64-slot NO_EVICTION table in one call: all placed, none evicted."""
    table = ScoredHashTable(
        [
            TableSpec(
                "ne",
                row_width=2,
                init_capacity=64,
                max_capacity=8192,  # NO_EVICTION grows up to max_capacity (issue 17)
                bucket_capacity=16,
                score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
            )
        ],
        device=device,
    )
    keys = torch.randperm(100_000, generator=torch.Generator().manual_seed(3))[:3000].to(device)
    res = table.insert_and_evict(keys, score=5)
    assert bool((res.slots >= 0).all()) and bool(res.is_new.all())
    assert res.evicted.keys.numel() == 0
    assert int(table.size()) == 3000 and table.capacity() >= 6000
    assert bool(table.find(keys).found.all())
    assert table.export(0).keys.unique().numel() == 3000


@pytest.mark.parametrize("deterministic", ["0", "1"])
def test_pinned_slots_are_never_victims(
    device: torch.device, monkeypatch: pytest.MonkeyPatch, deterministic: str
) -> None:
    """Pin 15 of the 16 slots of a one-bucket table: new keys all fight for the one unpinned slot;
    after unpinning, the pinned keys are evictable again. Both CUDA engines, and CPU."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", deterministic)
    table = ScoredHashTable(
        [
            TableSpec(
                "p",
                row_width=1,
                init_capacity=16,
                max_capacity=16,
                bucket_capacity=16,
                score_strategy=DynamicEmbScoreStrategy.STEP,
            )
        ],
        device=device,
    )
    first = table.insert_and_evict(torch.arange(16, device=device), score=1).slots
    table.pin_slots(first[:15])
    table.pin_slots(first[:3])  # two pins on three slots
    res = table.insert_and_evict(torch.arange(100, 140, device=device), score=2)
    assert res.evicted.keys.tolist() == [15]
    assert int((res.slots >= 0).sum()) == 1  # one key placed, the rest refused (slot -1)
    winner = int(torch.arange(100, 140, device=device)[res.slots >= 0][0])  # the schedule's pick
    assert bool(table.find(torch.arange(15, device=device)).found.all())
    assert table.pin_counts(0)[first[:3]].tolist() == [2, 2, 2]
    table.unpin_slots(first[:15])
    res = table.insert_and_evict(torch.arange(200, 213, device=device), score=3)
    # the 12 unpinned old keys and the one key placed by the call before; 0..2 still pinned
    assert sorted(res.evicted.keys.tolist()) == list(range(3, 15)) + [winner]
    assert bool(table.find(torch.arange(3, device=device)).found.all())
    with pytest.raises(ValueError, match="fewer pins"):
        table.unpin_slots(first[3:4])
    with pytest.raises(ValueError, match="outside"):
        table.pin_slots(torch.tensor([16], device=device))


def test_pins_follow_keys_when_a_table_grows(device: torch.device, parallel_engine: None) -> None:
    table = ScoredHashTable(
        [TableSpec("g", init_capacity=32, max_capacity=256, bucket_capacity=16)], device=device
    )
    keys = torch.arange(10, device=device)
    slots = table.insert(keys)
    table.pin_slots(slots[:4])
    table.insert(torch.arange(100, 160, device=device))  # past the load factor: doubles
    assert table.capacity() > 32
    now = table.find(keys).slots
    counts = table.pin_counts(0)
    assert counts[now[:4]].tolist() == [1, 1, 1, 1]
    assert int(counts.sum()) == 4


# ----------------------------------------------------------------------------------------------
# Both CUDA engines from one state
# ----------------------------------------------------------------------------------------------
def _random_spec(rng: random.Random, i: int) -> ref.RefSpec:
    """A full-size table (no growth during the compared call) of any policy and bucket width."""
    policy = rng.choice(
        [ref.COMPOUND, ref.TIMESTAMP, ref.LFU, ref.NO_EVICTION, ref.STEP, ref.CUSTOMIZED]
    )
    order: Tuple[str, ...] = (ref.POLICY_NAMES[policy],)
    fn = None
    if policy == ref.COMPOUND:
        order = rng.choice([("TIMESTAMP", "LFU"), ("LFU", "TIMESTAMP")])
        fn = rng.choice([nan_on_multiples_of_three, recency_weighted_count, None])
    bucket = rng.choice([16, 16, 32, MAX_BUCKET_CAPACITY])
    init = (
        rng.choice([16, 32, 64])
        if bucket == MAX_BUCKET_CAPACITY
        else bucket * rng.choice([1, 2, 4])
    )
    return ref.RefSpec(f"t{i}", policy, order, init, init, bucket, 1.0, score_function=fn)


def _draw_keys(
    rng: random.Random, n: int, top: int, n_tables: int, device: torch.device
) -> Tuple[torch.Tensor, torch.Tensor]:
    keys = [rng.randint(-3, top) for _ in range(n)]
    tids = [rng.randrange(n_tables) for _ in keys]
    return torch.tensor(keys, device=device), torch.tensor(tids, device=device)


def _engine_outcome(
    table: ScoredHashTable,
    keys: torch.Tensor,
    tids: torch.Tensor,
    deterministic: bool,
    unique_keys: bool = False,
) -> Dict[str, Any]:
    """One insert_and_evict of the table's ops on a copy of its state, summed up schedule-free:
    distinct keys placed per (table, bucket), evicted (table, slot, key, words), present keys'
    slots, the keys resident after, and whether the sizes count them."""
    state = TableState(*[x.clone() for x in table.state])
    pins = table._pin_counts_arg()
    slots, _, ev_keys, ev_slots, ev_words, ev_tids = table_ops.insert_and_evict(
        keys,
        tids,
        state,
        table._score_fns,
        table._cur_scores(10),
        None,
        check=False,
        pins=pins,
        deterministic=deterministic,
        unique_keys=unique_keys,
    )
    offsets, caps = state.slot_offsets.tolist(), state.bucket_caps.tolist()
    answer: Dict[Tuple[int, int], int] = {}
    for k, t, s in zip(keys.tolist(), tids.tolist(), slots.tolist()):
        assert answer.setdefault((t, k), s) == s, f"({t}, {k}) got two answers"
    per_bucket: Dict[Tuple[int, int], int] = {}
    for (t, _), s in answer.items():
        if s >= 0:
            per_bucket[(t, s // caps[t])] = per_bucket.get((t, s // caps[t]), 0) + 1
    occupied = state.digests != 0
    resident = [
        sorted(
            state.table_keys[offsets[t] : offsets[t + 1]][
                occupied[offsets[t] : offsets[t + 1]]
            ].tolist()
        )
        for t in range(len(caps))
    ]
    before = table.state
    present = {
        (t, k): s
        for (t, k), s in answer.items()
        if s >= 0
        and int(before.digests[offsets[t] + s]) != 0
        and int(before.table_keys[offsets[t] + s]) == k
    }
    return dict(
        placed=per_bucket,
        evicted=sorted(
            zip(ev_tids.tolist(), ev_slots.tolist(), ev_keys.tolist(), ev_words.tolist())
        ),
        present=present,
        resident=[len(r) for r in resident],
        sizes_right=state.sizes.tolist() == [len(r) for r in resident],
        oversubscribed=bool((slots < 0).any()),
        keys=resident,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="the key-parallel engine runs on CUDA only")
@pytest.mark.parametrize("seed", range(4))
def test_both_engines_agree_from_one_state(seed: int) -> None:
    """From one table state (filled by earlier calls of either engine, some keys erased, some slots
    pinned), one insert_and_evict with many repeated keys runs on both CUDA engines: each bucket
    takes as many distinct keys, the same slots are evicted with the same keys and words, present
    keys keep their slots, sizes count the residents; and when no bucket is oversubscribed, the
    same keys are resident. (Which new keys win an oversubscribed bucket is the schedule's choice,
    so a key occurring three times may get in where the deterministic engine let in a key
    occurring once: counts of placed occurrences differ, counts of distinct keys do not.) On CPU
    both flags run the same kernel; the CPU twin of this freedom is the permuted-placement test."""
    _compare_engines(torch.device("cuda", torch.cuda.current_device()), seed)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="the key-parallel engine runs on CUDA only")
@pytest.mark.parametrize("seed", range(4))
def test_unique_keys_agree_with_the_deterministic_engine(seed: int) -> None:
    """The same comparison for calls whose (table, key) pairs are distinct, the key-parallel engine
    told so (``unique_keys=True``: it builds no leader map). On CPU the flag changes nothing (the
    CPU kernels have no map): see test_unique_keys_changes_nothing_on_cpu."""
    _compare_engines(torch.device("cuda", torch.cuda.current_device()), seed, unique=True)


def test_unique_keys_changes_nothing_on_cpu() -> None:
    """On CPU ``unique_keys`` is accepted and ignored: the same slots, flags and state."""
    rng = random.Random(7)
    specs = [_random_spec(rng, i) for i in range(2)]
    tables = [ScoredHashTable([real_table_spec(x) for x in specs]) for _ in range(2)]
    top = max(x.max_capacity for x in specs) * 2
    keys, tids = _distinct(*_draw_keys(rng, top, top, 2, torch.device("cpu")))
    outs = [
        table_ops.find_or_insert(
            keys, tids, tbl.state, tbl._score_fns, tbl._cur_scores(3), unique_keys=u
        )
        for tbl, u in zip(tables, (False, True))
    ]
    for a, b in zip(outs[0], outs[1]):
        assert torch.equal(a, b)
    for a, b in zip(tables[0].state, tables[1].state):
        assert torch.equal(a, b)


def _distinct(keys: torch.Tensor, tids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first occurrence of each (table id, key) pair, in input order."""
    seen: Dict[Tuple[int, int], None] = {}
    for k, t in zip(keys.tolist(), tids.tolist()):
        seen.setdefault((t, k), None)
    pairs = list(seen)
    return (
        torch.tensor([k for _, k in pairs], dtype=torch.int64, device=keys.device),
        torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=keys.device),
    )


def _compare_engines(cuda: torch.device, seed: int, unique: bool = False) -> None:
    for trial in range(40):
        rng = random.Random(1000 * seed + trial)
        specs = [_random_spec(rng, i) for i in range(rng.randint(1, 3))]
        table = ScoredHashTable([real_table_spec(s) for s in specs], device=cuda)
        table._deterministic = rng.random() < 0.5  # which engine fills it
        top, n_tables = max(s.max_capacity for s in specs) * 2, len(specs)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DynamicEmbWarning)  # NO_EVICTION at its max_capacity
            for step in range(rng.randint(1, 4)):
                table.insert_and_evict(
                    *_draw_keys(rng, rng.randint(1, top), top, n_tables, cuda), score=step + 1
                )
                if rng.random() < 0.3:
                    table.erase(*_draw_keys(rng, 6, top, n_tables, cuda))
        for t in range(n_tables):
            slots = table.export(t).slots
            if slots.numel() and rng.random() < 0.4:
                table.pin_slots(slots[: rng.randint(1, 4)], t)
        keys, tids = _draw_keys(rng, rng.randint(1, top), top, n_tables, cuda)
        if unique:
            keys, tids = _distinct(keys, tids)
        det = _engine_outcome(table, keys, tids, deterministic=True)
        par = _engine_outcome(table, keys, tids, deterministic=False, unique_keys=unique)
        where = f"trial {1000 * seed + trial}"
        assert par["sizes_right"], where
        for what in ("placed", "evicted", "present", "resident"):
            assert par[what] == det[what], f"{where}: {what}\n  {par[what]}\n  {det[what]}"
        if not det["oversubscribed"]:
            assert par["keys"] == det["keys"], where


# ----------------------------------------------------------------------------------------------
# The state machine, contents instead of slots
# ----------------------------------------------------------------------------------------------
def _adopt_slots(
    model: ref.RefScoredHashTable, real: ScoredHashTable, pre_rows: Optional[List[List[Any]]]
) -> None:
    """Move the model's entries to the slots the real table gave the same keys.

    Both must hold the same keys; each key's real slot must lie in its bucket. Rows: a row this
    call wrote (the model's row at the key's slot changed) follows its key; otherwise a slot keeps
    the row it had before the call (``pre_rows``, the model's rows then), as it does in the real
    table. Pins stay with their slots: a call never moves a pinned key."""
    for t, table in enumerate(model.tables):
        res = real.export(t)
        keys, slots = res.keys.tolist(), res.slots.tolist()
        at = {e.key: s for s, e in enumerate(table.slots) if e is not None}
        assert sorted(at) == sorted(keys), f"table {t}: different keys"
        pre = pre_rows[t] if pre_rows is not None else table.rows
        new_slots: List[Any] = [None] * table.capacity
        new_rows: List[Any] = list(pre)
        for k, s in zip(keys, slots):
            assert s in table.bucket_slots(k), f"table {t}: key {k} at slot {s}, not in its bucket"
            m = at[k]
            new_slots[s] = table.slots[m]
            if table.rows[m] != pre[m]:
                new_rows[s] = table.rows[m]
        table.slots, table.rows = new_slots, new_rows


def _adopt_insertion_numbers(
    model: ref.RefScoredHashTable, real: ScoredHashTable, pre_keys: List[set]
) -> None:
    """NO_EVICTION tables number a call's new keys in ascending slot order (the class's rule), so
    which key gets which number follows which slot each key got, which the schedule chose. The
    call must hand out the same numbers (compared as a multiset); then the model's new keys take
    the numbers the real table gave them. Keys placed with given scores keep them in both."""
    for t, table in enumerate(model.tables):
        if table.spec.policy != ref.NO_EVICTION:
            continue
        res = real.export(t)
        real_number = {
            k: table.internal_scores(sc[: table.spec.num_scores])[0]
            for k, sc in zip(res.keys.tolist(), res.scores.tolist())
        }
        new = [e for e in table.slots if e is not None and e.key not in pre_keys[t]]
        assert_same(sorted(real_number[e.key] for e in new), sorted(e.s0 for e in new))
        for e in new:
            e.s0 = real_number[e.key]


def _adopt_retained_keys(model: ref.RefScoredHashTable, real: ScoredHashTable) -> None:
    """After a call whose victims were not compared (a table grew: rehashed by the schedule, so
    ties may pick other victims), RETAIN_KEY tables' buffers of evicted keys take the real
    table's (read without popping them)."""
    for t, table in enumerate(model.tables):
        if table.spec.retain_key:
            held = real._evicted_keys[t]  # a peek: pop_evicted_keys would clear it
            model.evicted_buffers[t] = set(torch.cat(held).tolist()) if held else set()


class ContentsMachine(TableMachine):
    """TableMachine for the key-parallel engine: inserting calls compare contents, not slots."""

    def _same_insert(self, got: ref.RefInsertResult, expected: ref.RefInsertResult) -> None:
        """Evicted items exactly; the placed keys exactly unless some key found no slot (then
        which ones did depends on the schedule: see _same_placement)."""
        if -1 in expected.slots:
            assert_same(got.is_new, [n and s >= 0 for n, s in zip(got.is_new, got.slots)])
        else:
            assert_same([s >= 0 for s in got.slots], [s >= 0 for s in expected.slots])
            assert_same(got.is_new, expected.is_new)
        key = lambda e: (e.table_id, e.slot)  # noqa: E731
        got_ev, exp_ev = sorted(got.evicted, key=key), sorted(expected.evicted, key=key)
        assert_same(
            [(e.table_id, e.slot, e.key, e.scores) for e in got_ev],
            [(e.table_id, e.slot, e.key, e.scores) for e in exp_ev],
        )
        for g, e in zip(got_ev, exp_ev):
            if e.row is not None and self.specs[e.table_id].row_width > 0:
                assert_same(g.row, e.row)

    def _placed_per_bucket(self, slots: List[int]) -> Dict[Tuple[int, int], int]:
        """Distinct keys of the last call placed, per (table, bucket); checks on the way that all
        occurrences of a key got one answer and that no slot went to two keys."""
        keys, tids = self.last_call
        answer: Dict[Tuple[int, int], int] = {}
        for k, t, s in zip(keys, tids, slots):
            assert answer.setdefault((t, k), s) == s, f"key {k} of table {t}: slots differ"
        placed = [(t, s) for (t, _), s in answer.items() if s >= 0]
        assert len(set(placed)) == len(placed), "a slot went to two keys"
        per_bucket: Dict[Tuple[int, int], int] = {}
        for t, s in placed:
            b = (t, s // self.model.tables[t].bucket_cap)
            per_bucket[b] = per_bucket.get(b, 0) + 1
        return per_bucket

    def _same_placement(self, got: List[int], want: List[int], pre_keys: List[set]) -> None:
        """A call that oversubscribed a bucket: which of its new keys got in is the schedule's
        choice, so keys that occur several times in the call may or may not be among them, and the
        number of placed OCCURRENCES differs with the choice (a key placed three times instead of
        one placed once). What does not depend on it: how many distinct keys each bucket took (the
        new keys fill its empty slots, then take the same victims), and that keys present before
        the call keep their slots."""
        assert_same(self._placed_per_bucket(got), self._placed_per_bucket(want))
        keys, tids = self.last_call
        kept = [(g, w) for k, t, g, w in zip(keys, tids, got, want) if k in pre_keys[t]]
        assert_same([g for g, _ in kept], [w for _, w in kept])

    def insert_at(self, data: Any) -> None:  # type: ignore[override]
        """Not a rule here: which keys an oversubscribed call placed depends on the schedule, and
        insert_at's draws depend on which keys are present (hypothesis needs the same draws for
        the same choices). Slot-exact placement runs on the bucket-ordered engine in every mode;
        TableMachine covers it."""

    def _apply(self, what: str, call: Any, compare: Any) -> Any:
        capacities = [self.model.capacity(t) for t in range(len(self.specs))]
        pre_rows = [list(table.rows) for table in self.model.tables]
        pre_keys = [{e.key for e in table.slots if e is not None} for table in self.model.tables]
        expected = call(self.model)
        grew = [self.model.capacity(t) for t in range(len(self.specs))] != capacities
        subject = self.subjects[0]
        got = call(subject)
        if what in ("insert", "find_or_insert", "insert_and_evict", "flood"):
            if grew:  # rehashed in another order: ties may pick other victims; adopt the state
                now = [self.model.capacity(t) for t in range(len(self.specs))]
                _adopt_state(self.model, subject.table, [a != b for a, b in zip(now, capacities)])
                _adopt_retained_keys(self.model, subject.table)
                return expected
            slots = got if what == "insert" else got.slots
            want = expected if what == "insert" else expected.slots
            if what != "insert":
                self._same_insert(got, expected)
            elif -1 not in want:
                assert_same([s >= 0 for s in slots], [s >= 0 for s in want])
            if -1 in want:  # oversubscribed buckets: the schedule chose which keys got in
                self._same_placement(slots, want, pre_keys)
                _adopt_state(self.model, subject.table)
            else:
                _adopt_slots(self.model, subject.table, pre_rows)
                _adopt_insertion_numbers(self.model, subject.table, pre_keys)
            return expected
        try:
            compare(got, expected)
        except AssertionError as err:
            raise AssertionError(f"{what} on {subject.device}: {err}") from None
        return expected


def _pins_by_key(keys: List[int], slots: List[int], counts: List[int]) -> Dict[int, int]:
    return {k: counts[s] for k, s in zip(keys, slots) if counts[s] > 0}


def _adopt_state(
    model: ref.RefScoredHashTable, real: ScoredHashTable, grown: Optional[List[bool]] = None
) -> None:
    """After a call that grew a table (rehashed in the engine's order) or oversubscribed a bucket
    (the schedule chose which keys got in), the model takes the real table's keys, scores and
    rows as they are; the invariant checks go on from there. Pins belong to slots, which a call
    never moves, except when a table grows: then they follow their keys, so for a grown table
    the pinned keys and their counts are compared (by key, not by slot) and the model takes the
    real table's pinned slots."""
    for t, table in enumerate(model.tables):
        res = real.export(t)
        keys, slots = res.keys.tolist(), res.slots.tolist()
        assert len(set(keys)) == len(keys)
        if grown is not None and grown[t]:
            counts = real.pin_counts(t).tolist()
            want = {
                e.key: table.pins[s]
                for s, e in enumerate(table.slots)
                if e and table.pins.get(s, 0) > 0
            }
            assert_same(_pins_by_key(keys, slots, counts), want)
            assert sum(counts) == sum(want.values()), f"table {t}: pins left on empty slots"
            table.pins = {s: c for s, c in enumerate(counts) if c > 0}
        scores = res.scores.tolist()
        table.slots = [None] * table.capacity
        rows = real.read_rows(t, res.slots).tolist() if table.spec.row_width else []
        old_rows = table.rows
        table.rows = [None] * table.capacity
        for i, (k, s, sc) in enumerate(zip(keys, slots, scores)):
            s0, s1 = table.internal_scores(sc[: table.spec.num_scores])
            table.slots[s] = ref.RefEntry(k, s0, s1)
            table.rows[s] = tuple(rows[i]) if rows else old_rows[s] if s < len(old_rows) else None


def _permute_new_placements(
    state: TableState, before: Tuple[torch.Tensor, torch.Tensor], gen: torch.Generator
) -> torch.Tensor:
    """Shuffle, within each bucket, the slots this call filled with keys that were not there
    before (its new keys' slots): keys, digests and score words move together. Returns the map
    old global slot -> new global slot (identity elsewhere). That is exactly the freedom the
    key-parallel engine has, played on CPU."""
    keys_before, digests_before = before
    filled = (state.digests != 0) & ((digests_before == 0) | (keys_before != state.table_keys))
    where = torch.arange(state.digests.numel())
    offsets, caps = state.slot_offsets.tolist(), state.bucket_caps.tolist()
    groups: Dict[Tuple[int, int], List[int]] = {}
    for g in where[filled].tolist():
        t = next(i for i in range(len(caps)) if offsets[i] <= g < offsets[i + 1])
        groups.setdefault((t, (g - offsets[t]) // caps[t]), []).append(g)
    moved = where.clone()
    for slots in groups.values():
        if len(slots) < 2:
            continue
        order = torch.randperm(len(slots), generator=gen).tolist()
        src = torch.tensor(slots)
        dst = torch.tensor([slots[i] for i in order])
        for tensor in (state.table_keys, state.digests, state.scores):
            tensor[dst] = tensor[src].clone()
        moved[src] = dst
    return moved


def _call_in_order(
    op: Any, order: torch.Tensor, slots_at: Optional[int], keys, table_ids, state, *args, **kwargs
) -> Any:
    """``op`` on the call's keys taken in ``order`` (table ids and input scores with them), its
    per-key outputs put back in the caller's order. The deterministic engine places new keys in
    input order, so when a bucket gets more new keys than it can take, another order lets other
    keys in: the choice the key-parallel engine's schedule makes."""
    args, kwargs = list(args), dict(kwargs)
    if len(args) > 2 and args[2] is not None:  # insert / insert_and_evict: input_scores
        args[2] = args[2][order]
    out = op(keys[order], table_ids[order], state, *args, **kwargs)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel())
    if slots_at is None:
        return out[back]
    per_key = 2 if isinstance(out, tuple) else 0  # (slots, is_new, evicted lists...)
    return (*(x[back] for x in out[:per_key]), *out[per_key:])


@pytest.fixture
def permuted_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU inserting ops that run the call's keys in a random order (so an oversubscribed bucket
    takes other keys) and whose new keys then take their bucket's filled slots in a random order:
    the two freedoms the key-parallel CUDA engine's schedule has. Both shuffles are functions of
    the call's keys, so hypothesis replays a failing case exactly."""

    def wrap(name: str, slots_at: Optional[int]):
        op = getattr(table_ops, name)

        def permuted(keys, table_ids, state, *args, **kwargs):
            before = (state.table_keys.clone(), state.digests.clone())
            gen = torch.Generator().manual_seed(hash(tuple(keys.tolist())) % (1 << 31))
            order = torch.randperm(keys.numel(), generator=gen)
            out = _call_in_order(op, order, slots_at, keys, table_ids, state, *args, **kwargs)
            moved = _permute_new_placements(state, before, gen)
            slots = out if slots_at is None else out[slots_at]
            glob = state.slot_offsets[table_ids.clamp(0, state.bucket_caps.numel() - 1)] + slots
            new = torch.where(slots >= 0, moved[glob.clamp(min=0)] - (glob - slots), slots)
            if slots_at is None:
                return new
            return (*out[:slots_at], new, *out[slots_at + 1 :])

        monkeypatch.setattr(table_ops, name, permuted)

    wrap("insert", None)
    wrap("find_or_insert", 0)
    wrap("insert_and_evict", 0)


def test_contents_machine_holds_under_permuted_placement(permuted_placement: None) -> None:
    """The contents state machine on CPU with new keys placed in shuffled slots of their bucket:
    what it compares must not depend on which new key got which slot (it does not for the
    deterministic engine trivially). Caught: NO_EVICTION insertion numbers follow slot order."""
    run_state_machine_as_test(
        lambda: ContentsMachine(["cpu"]),
        settings=settings(settings.get_profile("demb-table"), max_examples=25),
    )


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="the key-parallel engine runs on CUDA only")
def test_parallel_engine_matches_reference_contents(parallel_engine: None) -> None:
    run_state_machine_as_test(
        lambda: ContentsMachine(["cuda"]), settings=settings.get_profile("demb-table")
    )


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="the key-parallel engine runs on CUDA only")
def test_parallel_engine_matches_reference_contents_long(parallel_engine: None) -> None:
    run_state_machine_as_test(
        lambda: ContentsMachine(["cuda"]), settings=settings.get_profile("demb-table-slow")
    )
