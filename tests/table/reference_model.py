"""A pure-Python model of the scored hash table contract (docs/table_design.md).

The model is the oracle the randomized tests compare ``ScoredHashTable`` against. It is written to be
read, not to be fast: plain lists and dicts, one explicit loop per rule, no torch. It reimplements the
hash/bucket/digest rule on its own (it does not import the package's mirror) so that a mistake there
shows up as a disagreement instead of being shared.

Because the CPU kernels process a call's keys in input order, the model predicts exact slots, not just
contents. Where the contract leaves a choice open the model makes one and says so in a comment marked
``CHOICE:``; the report that accompanies these tests lists them.

Layers:
    * :class:`RefTable` holds one logical table: buckets of slots, each slot ``None`` (empty) or a
      :class:`RefEntry`, plus the value rows indexed by local slot.
    * :class:`RefScoredHashTable` mirrors the public Python class: several logical tables, default
      scores (step / custom score), user-order score columns, expansion, RETAIN_KEY buffers.

Accesses: an LFU (or COMPOUND) count grows by every access of a key, and an occurrence of a key in a
call is one access unless the call gives ``counts`` (a lookup that deduplicated its batch passes each
key's occurrences in it): then occurrence ``i`` is ``counts[i]`` accesses.

NO_EVICTION growth: a NO_EVICTION table doubles past ``max_capacity`` whenever a key finds no slot
(the model assumes memory never runs out; the real table stops at its memory headroom).
"""

from __future__ import annotations

import math
from collections import Counter as _Multiset
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

MASK64 = (1 << 64) - 1
INT64_MIN = -(1 << 63)
# The sentinel ``bucket_capacity`` meaning "one bucket spanning the whole table" (seed API value).
MAX_BUCKET_CAPACITY = (1 << 63) - 1

# Policy codes, as the contract numbers them (``policies[t]``).
TIMESTAMP, STEP, CUSTOMIZED, LFU, NO_EVICTION, COMPOUND = 0, 1, 2, 3, 4, 5
POLICY_NAMES = ("TIMESTAMP", "STEP", "CUSTOMIZED", "LFU", "NO_EVICTION", "COMPOUND")
# Policies whose (first or only) time word reads the clock when the call's score is negative.
_TIME_BASED = (TIMESTAMP, COMPOUND)

Row = Optional[Tuple[float, ...]]  # None: contents the contract leaves unspecified


# ----------------------------------------------------------------------------------------------
# Hash, bucket, digest
# ----------------------------------------------------------------------------------------------
def fmix64(x: int) -> int:
    """The MurmurHash3 64-bit finalizer on an unsigned 64-bit value."""
    x &= MASK64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    x ^= x >> 33
    return x


def key_hash(key: int) -> int:
    """Hash of an int64 key: fmix64 of its two's-complement bit pattern."""
    return fmix64(key & MASK64)


def bucket_of(key: int, num_buckets: int) -> int:
    """The only bucket ``key`` may live in."""
    return key_hash(key) % num_buckets


def digest_of(key: int) -> int:
    """The key's one-byte digest, 1..255 (0 marks an empty slot)."""
    return 1 + ((key_hash(key) >> 56) % 255)


def per_key_table_ids(keys: Sequence[int], table_ids) -> List[int]:
    """The table id of each key from a ``table_ids`` argument: None (table 0), an int, or a list."""
    if table_ids is None:
        return [0] * len(keys)
    if isinstance(table_ids, int):
        return [table_ids] * len(keys)
    return [int(t) for t in table_ids]


# ----------------------------------------------------------------------------------------------
# Specs and results
# ----------------------------------------------------------------------------------------------
@dataclass
class RefSpec:
    """What the model needs to know about one logical table.

    Attributes:
        name: table name.
        policy: one of the policy codes above.
        order: user column order of the score words, a tuple of strategy names:
            ``("TIMESTAMP", "LFU")`` or ``("LFU", "TIMESTAMP")`` for COMPOUND, one name otherwise.
        init_capacity, max_capacity, bucket_capacity, max_load_factor: as in ``TableSpec``.
        row_width: elements per value row.
        score_function: COMPOUND only: ``f(user_order_scores, now) -> float``, or None.
        retain_key: True for ``EvictedItemMode.RETAIN_KEY``.
    """

    name: str
    policy: int
    order: Tuple[str, ...]
    init_capacity: int
    max_capacity: int
    bucket_capacity: int
    max_load_factor: float = 0.5
    row_width: int = 0
    score_function: Optional[Callable[[Sequence[int], int], float]] = None
    retain_key: bool = False

    @property
    def num_scores(self) -> int:
        return 2 if self.policy == COMPOUND else 1


@dataclass
class RefEntry:
    """An occupied slot: the key and its two internal score words."""

    key: int
    s0: int  # eviction score: time / step / custom / count (count for COMPOUND)
    s1: int = 0  # COMPOUND: timestamp; otherwise 0


@dataclass
class RefEvicted:
    """One key an inserting call evicted: what it had, where it was."""

    key: int
    slot: int
    scores: Tuple[int, ...]  # user order
    table_id: int
    row: Row


@dataclass
class RefInsertResult:
    slots: List[int]
    is_new: List[bool]
    evicted: List[RefEvicted] = field(default_factory=list)


@dataclass
class RefFindResult:
    slots: List[int]
    found: List[bool]
    scores: List[Tuple[int, ...]]  # user order; zeros for keys not found


@dataclass
class RefExport:
    keys: List[int]
    slots: List[int]
    scores: List[Tuple[int, ...]]  # user order


# ----------------------------------------------------------------------------------------------
# One logical table
# ----------------------------------------------------------------------------------------------
class RefTable:
    """One logical table: ``num_buckets`` buckets of ``bucket_cap`` slots and their value rows."""

    def __init__(self, spec: RefSpec) -> None:
        self.spec = spec
        if spec.bucket_capacity == MAX_BUCKET_CAPACITY:
            self.num_buckets, self.bucket_cap = 1, spec.init_capacity
        else:
            # init_capacity is rounded up to a whole number of buckets.
            self.num_buckets = -(-spec.init_capacity // spec.bucket_capacity)
            self.bucket_cap = spec.bucket_capacity
        self.slots: List[Optional[RefEntry]] = [None] * self.capacity
        self.rows: List[Row] = [None] * self.capacity
        self.pins: Dict[int, int] = {}  # local slot -> pin count (> 0: never a victim)

    @property
    def capacity(self) -> int:
        return self.num_buckets * self.bucket_cap

    @property
    def size(self) -> int:
        return sum(entry is not None for entry in self.slots)

    def bucket_slots(self, key: int) -> range:
        """Local slot indices of the bucket ``key`` hashes to."""
        b = bucket_of(key, self.num_buckets)
        return range(b * self.bucket_cap, (b + 1) * self.bucket_cap)

    def locate(self, key: int) -> Optional[int]:
        """The local slot holding ``key``, or None."""
        for s in self.bucket_slots(key):
            entry = self.slots[s]
            if entry is not None and entry.key == key:
                return s
        return None

    # -- scores ---------------------------------------------------------------------------------
    def user_scores(self, entry: RefEntry) -> Tuple[int, ...]:
        """The entry's score words in the user's column order."""
        if self.spec.policy != COMPOUND:
            return (entry.s0,)
        by_name = {"LFU": entry.s0, "TIMESTAMP": entry.s1}
        return tuple(by_name[name] for name in self.spec.order)

    def internal_scores(self, user: Sequence[int]) -> Tuple[int, int]:
        """User-order score words -> internal ``(s0, s1)``."""
        if self.spec.policy != COMPOUND:
            return int(user[0]), 0
        by_name = dict(zip(self.spec.order, (int(v) for v in user)))
        return by_name["LFU"], by_name["TIMESTAMP"]

    def _require_time(self, now: Optional[int]) -> int:
        if now is None:
            raise ValueError(
                f"table {self.spec.name!r}: the model needs an explicit score= for "
                f"{POLICY_NAMES[self.spec.policy]} tables (it cannot predict the clock)"
            )
        return now

    def new_entry_scores(self, occurrences: int, now: Optional[int]) -> Tuple[int, int]:
        """Scores of a key this call places (no input scores)."""
        p = self.spec.policy
        if p == NO_EVICTION:
            return 0, 0  # numbered after the call (RefScoredHashTable._number_new_keys)
        if p != LFU:
            now = self._require_time(now)
        if p == LFU:
            return occurrences, 0
        if p == COMPOUND:
            return occurrences, now
        return now, 0  # TIMESTAMP: time; STEP / CUSTOMIZED: the call's score

    def touch(self, entry: RefEntry, occurrences: int, now: Optional[int]) -> None:
        """Write the policy's score into an existing key's slot."""
        p = self.spec.policy
        if p == NO_EVICTION:
            return  # a key keeps its insertion number
        if p != LFU:
            now = self._require_time(now)
        if p == LFU:
            entry.s0 += occurrences
        elif p == COMPOUND:
            entry.s0 += occurrences
            entry.s1 = now
        else:
            entry.s0 = now

    def eviction_rank(self, slot: int, now: Optional[int]) -> Tuple:
        """Sort key of an occupied slot for eviction: lowest first, ties by lowest slot."""
        entry = self.slots[slot]
        assert entry is not None
        if self.spec.policy == COMPOUND:
            if self.spec.score_function is not None:
                now = self._require_time(now)
                value = float(self.spec.score_function(list(self.user_scores(entry)), now))
                # NaN ranks before every number ("evict first").
                return (0, 0.0, slot) if math.isnan(value) else (1, value, slot)
            return (entry.s0, entry.s1, slot)  # (count, timestamp)
        return (entry.s0, slot)

    # -- expansion --------------------------------------------------------------------------------
    def double(self) -> Dict[int, int]:
        """Double the table and rehash; return ``{old slot: new slot}`` of every key.

        Rehash is ``export_if`` (ascending slot order) followed by ``insert`` with input scores into
        the empty, doubled region: each key takes the first empty slot of its new bucket.
        """
        old_slots, old_rows, old_pins = self.slots, self.rows, self.pins
        if self.num_buckets == 1 and self.spec.bucket_capacity == MAX_BUCKET_CAPACITY:
            self.bucket_cap *= 2
        else:
            # CHOICE: a table whose bucket_capacity is a real bucket width keeps that width and
            # doubles its bucket count, even when it happens to have a single bucket.
            self.num_buckets *= 2
        self.slots = [None] * self.capacity
        self.rows = [None] * self.capacity
        self.pins = {}
        moved: Dict[int, int] = {}
        for old, entry in enumerate(old_slots):
            if entry is None:
                continue
            new = next(s for s in self.bucket_slots(entry.key) if self.slots[s] is None)
            self.slots[new] = RefEntry(entry.key, entry.s0, entry.s1)
            self.rows[new] = old_rows[old]
            moved[old] = new
            # CHOICE: pins follow their slot's key; pins of empty slots are dropped.
            if old_pins.get(old, 0) > 0:
                self.pins[new] = old_pins[old]
        return moved


# ----------------------------------------------------------------------------------------------
# The class model
# ----------------------------------------------------------------------------------------------
class RefScoredHashTable:
    """Model of ``dynamicemb_core.table.ScoredHashTable``; same method names, plain Python values.

    ``keys`` and ``table_ids`` are lists of ints (``table_ids`` may also be None or one int, as in
    the real class). ``score`` is the call's score; None means the policy default, which the model
    supports for STEP and CUSTOMIZED (and LFU, which ignores it) but not for clock-based policies.
    """

    def __init__(self, specs: Sequence[RefSpec]) -> None:
        self.tables = [RefTable(spec) for spec in specs]
        # CHOICE: the step and the custom score both start at 0.
        self.steps = [0] * len(specs)
        self.custom_scores = [0] * len(specs)
        # NO_EVICTION: the next insertion number of each table (the score of its next new key)
        self.next_numbers = [0] * len(specs)
        self.evicted_buffers: List[Set[int]] = [set() for _ in specs]

    # -- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _table_ids(keys: Sequence[int], table_ids) -> List[int]:
        return per_key_table_ids(keys, table_ids)

    def _now(self, t: int, score: Optional[int]) -> Optional[int]:
        """The call's score for table ``t`` (``cur_scores[t]``); None for "read the clock"."""
        policy = self.tables[t].spec.policy
        if score is not None:
            return int(score)
        if policy == STEP:
            return self.steps[t]
        if policy == CUSTOMIZED:
            return self.custom_scores[t]
        if policy in (LFU, NO_EVICTION):
            return 0  # ignored
        return None  # the model cannot predict a clock: using it raises (see _require_time)

    @staticmethod
    def _unique_in_order(pairs: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
        seen: Dict[Tuple[int, int], None] = {}
        for pair in pairs:
            seen.setdefault(pair, None)
        return list(seen)

    # -- the kernel semantics shared by every inserting op ----------------------------------------
    @staticmethod
    def _accesses(
        pairs: Sequence[Tuple[int, int]], counts: Optional[Sequence[int]]
    ) -> "_Multiset[Tuple[int, int]]":
        """Accesses of each pair in a call: its occurrences, each ``counts[i]`` when given."""
        if counts is None:
            return _Multiset(pairs)
        total: "_Multiset[Tuple[int, int]]" = _Multiset()
        for pair, c in zip(pairs, counts):
            total[pair] += int(c)
        return total

    def _upsert(
        self,
        pairs: List[Tuple[int, int]],
        nows: Dict[int, Optional[int]],
        input_scores: Optional[List[Tuple[int, int]]],
        counts: Optional[Sequence[int]] = None,
    ) -> Tuple[List[int], List[bool], List[RefEvicted]]:
        """One kernel call of insert / find_or_insert / insert_and_evict.

        Existing keys keep their slots and are touched first; they and every slot placed by this
        call are protected. New keys are then placed in order of their first occurrence: the first
        empty slot of the bucket, else (unless NO_EVICTION) the unprotected slot of lowest rank.
        """
        occurrences = self._accesses(pairs, counts)
        order = self._unique_in_order(pairs)
        # CHOICE: with input scores, a duplicated key takes the scores of its last occurrence.
        given = {} if input_scores is None else dict(zip(pairs, input_scores))
        slot_of: Dict[Tuple[int, int], int] = {}
        protected: Dict[int, Set[int]] = {t: set() for t, _ in order}
        placed_now: Set[Tuple[int, int]] = set()
        evicted: List[RefEvicted] = []

        for t, key in order:  # rule 2: present keys keep (and protect) their slots
            table = self.tables[t]
            s = table.locate(key)
            if s is None:
                continue
            slot_of[(t, key)] = s
            protected[t].add(s)
            entry = table.slots[s]
            if (t, key) in given:
                entry.s0, entry.s1 = given[(t, key)]
            else:
                table.touch(entry, occurrences[(t, key)], nows[t])

        for t, key in order:  # rules 3-6: place new keys in input order
            if (t, key) in slot_of:
                continue
            table = self.tables[t]
            bucket = table.bucket_slots(key)
            target = next((s for s in bucket if table.slots[s] is None), None)
            if target is None and table.spec.policy != NO_EVICTION:
                victims = [s for s in bucket if s not in protected[t] and table.pins.get(s, 0) == 0]
                if victims:
                    target = min(victims, key=lambda s: table.eviction_rank(s, nows[t]))
                    old = table.slots[target]
                    evicted.append(
                        RefEvicted(old.key, target, table.user_scores(old), t, table.rows[target])
                    )
            if target is None:
                slot_of[(t, key)] = -1
                continue
            if (t, key) in given:
                s0, s1 = given[(t, key)]
            else:
                s0, s1 = table.new_entry_scores(occurrences[(t, key)], nows[t])
            table.slots[target] = RefEntry(key, s0, s1)
            protected[t].add(target)
            slot_of[(t, key)] = target
            placed_now.add((t, key))

        slots = [slot_of[p] for p in pairs]
        is_new = [p in placed_now for p in pairs]
        return slots, is_new, evicted

    def _expand_before_insert(self, pairs: List[Tuple[int, int]]) -> None:
        """Double every table this insert would push past its load factor (contract: Expansion)."""
        # CHOICE: "k candidate keys" = distinct keys of the call for the table, present or not.
        candidates = _Multiset(t for t, _ in self._unique_in_order(pairs))
        # CHOICE: a table without keys in the call (k = 0) is not inserted into and does not grow,
        # even when it is already above its load factor.
        for t, k in sorted(candidates.items()):
            table = self.tables[t]
            no_eviction = table.spec.policy == NO_EVICTION
            load_factor = 0.5 if no_eviction else table.spec.max_load_factor
            below_cap = no_eviction or table.capacity < table.spec.max_capacity
            if table.size + k > load_factor * table.capacity and below_cap:
                table.double()

    def _insert_call(
        self,
        keys: Sequence[int],
        table_ids,
        rows: Optional[Sequence[Sequence[float]]],
        user_scores: Optional[Sequence[Sequence[int]]],
        score: Optional[int],
        counts: Optional[Sequence[int]] = None,
    ) -> RefInsertResult:
        """insert / find_or_insert / insert_and_evict as the Python class runs them."""
        tids = self._table_ids(keys, table_ids)
        pairs = list(zip(tids, (int(k) for k in keys)))
        self._expand_before_insert(pairs)
        nows = {t: self._now(t, score) for t in set(tids)}
        internal = None
        if user_scores is not None:
            internal = [self.tables[t].internal_scores(u) for t, u in zip(tids, user_scores)]
        slots, is_new, evicted = self._upsert(pairs, nows, internal, counts)

        # NO_EVICTION: keys that found a full bucket trigger a doubling and a retry, past
        # max_capacity (memory is the real table's bound; the model has none).
        while True:
            retry = sorted(
                {
                    t
                    for (t, _), s in zip(pairs, slots)
                    if s == -1 and self.tables[t].spec.policy == NO_EVICTION
                }
            )
            if not retry:
                break
            for t in retry:
                moved = self.tables[t].double()
                slots = [moved[s] if tt == t and s >= 0 else s for tt, s in zip(tids, slots)]
            idx = [i for i, (t, s) in enumerate(zip(tids, slots)) if s == -1 and t in retry]
            sub_pairs = [pairs[i] for i in idx]
            sub_scores = None if internal is None else [internal[i] for i in idx]
            sub_counts = None if counts is None else [counts[i] for i in idx]
            sub_slots, sub_new, _ = self._upsert(sub_pairs, nows, sub_scores, sub_counts)
            for i, s, n in zip(idx, sub_slots, sub_new):
                slots[i], is_new[i] = s, n

        self._number_new_keys(tids, slots, is_new, internal)
        for ev in evicted:
            if self.tables[ev.table_id].spec.retain_key:
                self.evicted_buffers[ev.table_id].add(ev.key)
        if rows is not None:
            for t, s, row in zip(tids, slots, rows):
                if s >= 0:
                    self.tables[t].rows[s] = tuple(float(v) for v in row)
        return RefInsertResult(slots, is_new, evicted)

    def _number_new_keys(self, tids, slots, is_new, internal) -> None:
        """NO_EVICTION: the keys a call placed score their table's next insertion numbers, in
        ascending slot order; placed with given scores, they keep them and the numbering passes
        the largest."""
        for t, table in enumerate(self.tables):
            if table.spec.policy != NO_EVICTION:
                continue
            placed = [i for i, (tt, s, n) in enumerate(zip(tids, slots, is_new)) if tt == t and n]
            if internal is not None:
                for i in placed:
                    self.next_numbers[t] = max(self.next_numbers[t], internal[i][0] + 1)
                continue
            for s in sorted({slots[i] for i in placed}):
                table.slots[s].s0 = self.next_numbers[t]
                self.next_numbers[t] += 1

    # -- public API, mirroring ScoredHashTable ----------------------------------------------------
    def find(
        self, keys, table_ids=None, *, update_score=False, score=None, counts=None
    ) -> RefFindResult:
        tids = self._table_ids(keys, table_ids)
        pairs = list(zip(tids, (int(k) for k in keys)))
        occurrences = self._accesses(pairs, counts)
        slot_of: Dict[Tuple[int, int], int] = {}
        for t, key in self._unique_in_order(pairs):
            table = self.tables[t]
            s = table.locate(key)
            slot_of[(t, key)] = -1 if s is None else s
            if s is not None and update_score:
                table.touch(table.slots[s], occurrences[(t, key)], self._now(t, score))
        slots = [slot_of[p] for p in pairs]
        scores = []
        for (t, _), s in zip(pairs, slots):
            table = self.tables[t]
            scores.append(
                table.user_scores(table.slots[s]) if s >= 0 else (0,) * table.spec.num_scores
            )
        return RefFindResult(slots, [s >= 0 for s in slots], scores)

    def insert(self, keys, table_ids=None, *, rows=None, scores=None, score=None) -> List[int]:
        return self._insert_call(keys, table_ids, rows, scores, score).slots

    def find_or_insert(self, keys, table_ids=None, *, score=None, counts=None) -> RefInsertResult:
        return self._insert_call(keys, table_ids, None, None, score, counts)

    def insert_and_evict(
        self, keys, table_ids=None, *, rows=None, scores=None, score=None
    ) -> RefInsertResult:
        return self._insert_call(keys, table_ids, rows, scores, score)

    def erase(self, keys, table_ids=None) -> List[bool]:
        tids = self._table_ids(keys, table_ids)
        pairs = list(zip(tids, (int(k) for k in keys)))
        present = {p: self.tables[p[0]].locate(p[1]) for p in self._unique_in_order(pairs)}
        for (t, _), s in present.items():
            if s is not None:
                self.tables[t].slots[s] = None
        return [present[p] is not None for p in pairs]

    def export(self, table_id: int, threshold: Optional[int] = None) -> RefExport:
        """Occupied slots in ascending order whose score passes ``threshold``.

        The compared word is the timestamp for COMPOUND (time-based export) and the only word
        otherwise.
        """
        table = self.tables[table_id]
        limit = INT64_MIN if threshold is None else int(threshold)
        out = RefExport([], [], [])
        for s, entry in enumerate(table.slots):
            if entry is None:
                continue
            word = entry.s1 if table.spec.policy == COMPOUND else entry.s0
            if word >= limit:
                out.keys.append(entry.key)
                out.slots.append(s)
                out.scores.append(table.user_scores(entry))
        return out

    def insert_at(self, table_id: int, keys, slots, *, rows=None, scores=None) -> Optional[int]:
        """Slot-exact placement; returns None, or the index of the first key that cannot go there.

        On failure nothing is written (the real class raises DynamicEmbError).
        """
        table = self.tables[table_id]
        claimed: Dict[int, int] = {}  # slot -> key of this batch
        claims: Dict[int, int] = {}  # key -> slot of this batch
        for i, (key, s) in enumerate(zip(keys, slots)):
            if not (0 <= s < table.capacity) or s not in table.bucket_slots(key):
                return i
            entry = table.slots[s]
            if entry is not None and entry.key != key:
                return i
            # CHOICE: a key already present in its bucket may not be put at another slot (that
            # would store it twice), and a batch may not give one slot to two keys or one key to
            # two slots: the later entry fails.
            own = table.locate(key)
            if own is not None and own != s:
                return i
            if claimed.setdefault(s, key) != key or claims.setdefault(key, s) != s:
                return i
        for i, (key, s) in enumerate(zip(keys, slots)):
            s0, s1 = table.internal_scores(scores[i]) if scores is not None else (0, 0)
            table.slots[s] = RefEntry(int(key), s0, s1)
            if table.spec.policy == NO_EVICTION:
                self.next_numbers[table_id] = max(self.next_numbers[table_id], s0 + 1)
            if rows is not None:
                table.rows[s] = tuple(float(v) for v in rows[i])
        return None

    def pin_slots(self, slots: Sequence[int], table_ids=None) -> None:
        """One more pin on each slot (-1 skipped): a pinned slot is never a victim."""
        for t, s in zip(self._table_ids(slots, table_ids), slots):
            if s >= 0:
                pins = self.tables[t].pins
                pins[s] = pins.get(s, 0) + 1

    def unpin_slots(self, slots: Sequence[int], table_ids=None) -> None:
        """One pin less on each slot (-1 skipped); the caller never removes more than it added."""
        for t, s in zip(self._table_ids(slots, table_ids), slots):
            if s >= 0:
                pins = self.tables[t].pins
                assert pins.get(s, 0) > 0, f"unpin of slot {s} of table {t} without a pin"
                pins[s] -= 1

    def pin_counts(self, table_id: int = 0) -> List[int]:
        table = self.tables[table_id]
        return [table.pins.get(s, 0) for s in range(table.capacity)]

    def read_rows(self, table_id: int, slots: Sequence[int]) -> List[Row]:
        width = self.tables[table_id].spec.row_width
        rows = self.tables[table_id].rows
        return [rows[s] if s >= 0 else (0.0,) * width for s in slots]

    def write_rows(self, table_id: int, slots: Sequence[int], rows) -> None:
        for s, row in zip(slots, rows):
            if s >= 0:
                self.tables[table_id].rows[s] = tuple(float(v) for v in row)

    def size(self, table_id: int = 0) -> int:
        return self.tables[table_id].size

    def capacity(self, table_id: int = 0) -> int:
        return self.tables[table_id].capacity

    def clear(self, table_id: Optional[int] = None) -> None:
        for t in range(len(self.tables)) if table_id is None else [table_id]:
            table = self.tables[t]
            table.slots = [None] * table.capacity

    def set_score(self, table_id: int, score: int) -> None:
        self.custom_scores[table_id] = int(score)

    def get_score(self, table_id: int) -> Optional[int]:
        if self.tables[table_id].spec.policy == NO_EVICTION:
            return self.next_numbers[table_id]
        return self._now(table_id, None)

    def advance_step(self, table_id: Optional[int] = None) -> None:
        for t in range(len(self.tables)) if table_id is None else [table_id]:
            if self.tables[t].spec.policy == STEP:
                self.steps[t] += 1

    def pop_evicted_keys(self, table_id: int) -> List[int]:
        """Keys evicted since the last pop, deduplicated, sorted (the real order is not specified)."""
        keys = sorted(self.evicted_buffers[table_id])
        self.evicted_buffers[table_id] = set()
        return keys
