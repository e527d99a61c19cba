"""ScoredHashTable: ``(table_id, key) -> slot`` for several logical tables, with value rows per slot.

The class is the contract of docs/table_design.md ("The Python class"): it owns the flat state the
ops work on (:class:`~dynamicemb_core.ops.table_ops.TableState`) and one ``(capacity, row_width)``
value buffer per table, validates every input before writing, grows tables (expansion.py), keeps the
per-table step / custom score, applies ``safe_check_mode`` and collects RETAIN_KEY evictions.
Having validated its table ids itself, it calls the key ops with ``check=False`` (no second, device-
synchronising check on CUDA); ``read_rows`` / ``write_rows`` take the caller's slots and keep the
ops' slot check.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from dynamicemb_core.config import DynamicEmbCheckMode, DynamicEmbScoreStrategy, EvictedItemMode
from dynamicemb_core.devices import normalize_device
from dynamicemb_core.environment import custom_score_check_enabled, determinism_mode
from dynamicemb_core.ops import table_ops
from dynamicemb_core.ops.table_ops import TableState
from dynamicemb_core.table import expansion
from dynamicemb_core.table.host_memory import host_zeros
from dynamicemb_core.table.metrics import PlacementCounters
from dynamicemb_core.table.results import EvictedItems, ExportResult, FindResult, InsertResult
from dynamicemb_core.table.safe_check import UnplacedKeyReport
from dynamicemb_core.table.score_columns import score_columns_for_user, score_words_from_user
from dynamicemb_core.table.spec import COMPOUND_POLICY, TableSpec
from dynamicemb_core.table.validation import (
    check_int64_vector,
    check_rows,
    check_user_scores,
    table_ids_tensor,
)
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

__all__ = ["ScoredHashTable"]

TableIds = Union[None, int, Tensor]
# listener(table_id, old_slots (m,), new_slots (m,)): a table doubled and its keys moved.
GrowthListener = Callable[[int, Tensor, Tensor], None]
_STEP = int(DynamicEmbScoreStrategy.STEP)
_CUSTOMIZED = int(DynamicEmbScoreStrategy.CUSTOMIZED)
_LFU = int(DynamicEmbScoreStrategy.LFU)
# A NO_EVICTION insert doubles and retries until every key fits; distinct keys always separate
# within 64 doublings (their 64-bit hashes differ), so more means a bug, not bad luck.
_MAX_RETRIES = 64


class ScoredHashTable:
    """Scored hash table for ``T`` logical tables on one device.

    Args:
        specs: one :class:`TableSpec` per logical table (names unique); table id = position.
        device: where the state and value rows live.
    """

    def __init__(
        self, specs: Sequence[TableSpec], device: Union[torch.device, str] = "cpu"
    ) -> None:
        specs = list(specs)
        if not specs or not all(isinstance(s, TableSpec) for s in specs):
            raise TypeError(
                f"ScoredHashTable: specs must be a non-empty sequence of TableSpec, got {specs!r}"
            )
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"ScoredHashTable: table names must be unique, got {names}")
        self.specs = specs
        self.device = normalize_device(device)
        layouts = []
        for spec in specs:  # a plain loop: the rounding warning points at the caller (stacklevel)
            layouts.append(spec.initial_layout())
        self._caps: List[int] = [cap for _, cap in layouts]
        self._offsets: List[int] = [0]
        for num_buckets, cap in layouts:
            self._offsets.append(self._offsets[-1] + num_buckets * cap)
        dev, i64, total = self.device, torch.int64, self._offsets[-1]
        self._state = TableState(
            torch.zeros(total, dtype=i64, device=dev),
            torch.zeros(total, dtype=torch.uint8, device=dev),
            torch.zeros(total, 2, dtype=i64, device=dev),
            torch.tensor(self._offsets, dtype=i64, device=dev),
            torch.tensor(self._caps, dtype=i64, device=dev),
            torch.tensor([s.policy for s in specs], dtype=i64, device=dev),
            torch.zeros(len(specs), dtype=i64, device=dev),
        )
        self._values = [
            host_zeros((self.capacity(t), s.row_width), s.dtype, dev) for t, s in enumerate(specs)
        ]
        self._reversed = torch.tensor([s.timestamp_first for s in specs], device=dev)
        self._compound = torch.tensor([s.policy == COMPOUND_POLICY for s in specs], device=dev)
        self._no_eviction = torch.tensor([s.no_eviction for s in specs], device=dev)
        # NO_EVICTION: each table's next insertion number (the score of its next new key)
        self._any_no_eviction = any(s.no_eviction for s in specs)
        # what each inserting call reads of every spec, read once (the specs are fixed): policy
        # codes, the growth check's (max_capacity, max_load_factor, no_eviction), RETAIN_KEY
        self._policies = [s.policy for s in specs]
        # whether any table counts accesses (LFU, TIMESTAMP+LFU): only then do the inserting
        # calls of a deduplicated batch pass each key's occurrence counts
        self.counts_accesses = any(p in (_LFU, COMPOUND_POLICY) for p in self._policies)
        self._growth_rules = [
            (s.max_capacity, s.max_load_factor, s.no_eviction, s.grows_past_max_capacity)
            for s in specs
        ]
        self._retains = [s.evicted_item_mode == EvictedItemMode.RETAIN_KEY for s in specs]
        self._max_scores = max(s.num_scores for s in specs)
        self._next_number = torch.zeros(len(specs), dtype=i64, device=dev)
        # on the host on every device: the CUDA kernels read these handles on the host, and a
        # CPU tensor spares each inserting call a device-to-host copy
        self._score_fns = torch.tensor([self._score_fn_address(s) for s in specs], dtype=i64)
        self._steps = [0] * len(specs)
        self._custom_scores = [0] * len(specs)
        self._evicted_keys: List[List[Tensor]] = [[] for _ in specs]
        self._growth_listeners: List[GrowthListener] = []
        self._growth = expansion.GrowthGuard()  # may a table double (cap, memory); warns once
        # bytes a doubling of table t allocates for rows kept outside this table (a grouped
        # storage's flat buffer, moved by its growth listener): counted in the memory check
        self.outside_growth_bytes: Optional[Callable[[int], int]] = None
        self._write_count = 0
        self._cur_scores_host: List[int] = []  # the values of _cur_scores_dev
        self._cur_scores_dev = torch.empty(0, dtype=torch.int64, device=self.device)
        self._empty_evicted: Dict[int, EvictedItems] = {}
        # DEMB_DETERMINISM_MODE, read once: which CUDA insert engine this table's calls run
        self._deterministic = determinism_mode()
        # (total_slots + 1,) int32 pin count per global slot, the last one a sink for slot -1;
        # allocated by the first pin_slots (a table nobody pins passes no pins to the kernels)
        self._pins: Optional[Tensor] = None
        # hits / misses / placed / evicted / unplaced per table, accumulated on the device
        self.counters = PlacementCounters(len(specs), self.device)
        self._report = UnplacedKeyReport()
        # table id -> why its keys do not stand at the slots of the table they were loaded from
        # (a packing load); absent: they do, or the table filled itself (see packed_slots)
        self._packed: Dict[int, str] = {}

    def _score_fn_address(self, spec: TableSpec) -> int:
        """``score_fns[t]``: 0, the CPU callback's address, or the CUDA ranking kernel's handle."""
        from dynamicemb_core.table.score_function_cuda import score_fn_handle

        return score_fn_handle(spec.score_function, spec.strategies, self.device)

    # -- small helpers ---------------------------------------------------------------------------
    @property
    def num_tables(self) -> int:
        return len(self.specs)

    @property
    def state(self) -> TableState:
        """The flat state (for ops-level callers); replaced, not mutated, when a table grows."""
        return self._state

    def _where(self, table_ids: TableIds) -> str:
        if isinstance(table_ids, int) and 0 <= table_ids < self.num_tables:
            return f"table {self.specs[table_ids].name!r}"
        if table_ids is None:
            return f"table {self.specs[0].name!r}"
        return "ScoredHashTable(" + ", ".join(repr(s.name) for s in self.specs) + ")"

    def _table_id(self, table_id: object) -> int:
        if not isinstance(table_id, int) or not 0 <= table_id < self.num_tables:
            raise ValueError(
                f"ScoredHashTable: table_id must be an int in [0, {self.num_tables}) "
                f"(tables: {[s.name for s in self.specs]}), got {table_id!r}"
            )
        return table_id

    def _keys_and_ids(self, keys: object, table_ids: TableIds) -> Tuple[str, Tensor, Tensor]:
        where = self._where(table_ids)
        keys = check_int64_vector(keys, where, "keys", self.device)
        names = [s.name for s in self.specs]
        tids = table_ids_tensor(table_ids, keys.numel(), self.num_tables, names, self.device, where)
        return where, keys, tids

    def _involved(self, table_ids: TableIds, tids: Tensor) -> List[int]:
        if table_ids is None or isinstance(table_ids, int):
            return [int(table_ids or 0)]
        return [int(t) for t in torch.unique(tids).tolist()]

    def _num_columns(self, table_ids: TableIds) -> int:
        if table_ids is None or isinstance(table_ids, int):
            return self.specs[int(table_ids or 0)].num_scores
        return max(s.num_scores for s in self.specs)

    def _shared(self, where: str, involved: List[int], attr: str) -> Any:
        values = {getattr(self.specs[t], attr) for t in involved}
        if len(values) > 1:
            raise ValueError(
                f"{where}: rows/scores need tables with one {attr}, got {sorted(map(str, values))}"
            )
        return values.pop() if values else getattr(self.specs[0], attr)

    def _region(self, t: int) -> TableState:
        return expansion.region_state(self._state, t, self._offsets[t], self._offsets[t + 1])

    def _cur_scores(self, score: Optional[int]) -> Tensor:
        """``cur_scores`` (T,): the call's score, or each table's default (-1 = read the clock)."""
        if score is not None:
            return torch.full((self.num_tables,), int(score), dtype=torch.int64, device=self.device)
        steps, custom = self._steps, self._custom_scores
        values = [
            steps[t] if p == _STEP else custom[t] if p == _CUSTOMIZED else -1
            for t, p in enumerate(self._policies)
        ]
        # Kept on the device while the values stay the same (always, for time policies): a new
        # host-to-device copy each call would synchronise with the device on CUDA.
        if values != self._cur_scores_host:
            self._cur_scores_host = values
            self._cur_scores_dev = torch.tensor(values, dtype=torch.int64).to(
                self.device, non_blocking=True
            )
        return self._cur_scores_dev

    # -- growth ------------------------------------------------------------------------------------
    def _double(self, t: int) -> Optional[Tuple[Tensor, Tensor]]:
        """Double table ``t``; None when :class:`expansion.GrowthGuard` refuses (cap, memory)."""
        spec = self.specs[t]
        row_bytes = spec.row_width * self._values[t].element_size()
        needed = expansion.doubling_bytes(self.capacity(t), self._offsets[-1], row_bytes)
        if self.outside_growth_bytes is not None:
            needed += self.outside_growth_bytes(t) or 0
        if not self._growth.allow(
            spec.name,
            self.capacity(t),
            spec.max_capacity,
            needed,
            self.device,
            spec.no_eviction,
            spec.grows_past_max_capacity,
        ):
            return None
        begin, end = self._offsets[t], self._offsets[t + 1]
        done = expansion.double_table(
            self._state,
            self._offsets,
            t,
            self._caps[t],
            spec.single_bucket,
            self._values[t],
            deterministic=self._deterministic,
        )
        self._pins = _moved_pins(self._pins, begin, end, done.old_slots, done.new_slots)
        self._state, self._offsets, self._caps[t], self._values[t] = (
            done.state,
            done.offsets,
            done.bucket_cap,
            done.values,
        )
        for listener in self._growth_listeners:
            listener(t, done.old_slots, done.new_slots)
        return done.old_slots, done.new_slots

    @property
    def write_count(self) -> int:
        """Counts the calls that may have changed which keys the table holds (inserting calls,
        erase, insert_at, clear). A reader that keeps a host copy of the per-table sizes (the
        grouped storage, which decides growth from them without a readback) reads them again
        when this moved since its copy."""
        return self._write_count

    def add_growth_listener(self, listener: GrowthListener) -> None:
        """Call ``listener(t, old_slots, new_slots)`` each time table ``t`` doubles.

        Called after the new state is in place and before the growing call writes anything, so
        an owner of rows kept outside the table (a group) can move them to the new slots;
        ``old_slots`` / ``new_slots`` are (m,) int64 on the table's device, one pair per key.
        """
        self._growth_listeners.append(listener)

    def reserve(self, table_id: int, capacity: int) -> int:
        """Double table ``table_id`` until it has at least ``capacity`` slots; stops at
        ``max_capacity`` or when memory refuses (the rule inserts grow by,
        :class:`expansion.GrowthGuard`). Keys, rows and scores are kept (a rehash).

        A bulk writer (a checkpoint load) calls it first, so that its keys land in a table already
        as large as they need instead of one doubling per insert call. Returns the capacity reached.
        """
        t = self._table_id(table_id)
        while self.capacity(t) < capacity:
            if self._double(t) is None:
                break
        return self.capacity(t)

    def _grow_for(self, keys: Tensor, tids: Tensor, involved: List[int]) -> None:
        """Double each table this call's distinct keys would push past its load factor."""
        sizes = self._state.sizes.tolist()
        counts = (
            torch.bincount(tids, minlength=self.num_tables).tolist() if len(involved) > 1 else None
        )
        for t in involved:
            spec = self.specs[t]
            args = (
                self.capacity(t),
                spec.max_capacity,
                spec.max_load_factor,
                spec.no_eviction,
                spec.grows_past_max_capacity,
            )
            upper = keys.numel() if counts is None else counts[t]
            if not expansion.needs_growth(sizes[t], upper, *args):
                continue
            distinct = torch.unique(keys if counts is None else keys[tids == t]).numel()
            if expansion.needs_growth(sizes[t], distinct, *args):
                self._double(t)

    # -- lookups -----------------------------------------------------------------------------------
    def find(
        self,
        keys: Tensor,
        table_ids: TableIds = None,
        *,
        update_score: bool = False,
        score: Optional[int] = None,
    ) -> FindResult:
        """Look keys up; with ``update_score`` touch the found ones (score: this call's score)."""
        _, keys, tids = self._keys_and_ids(keys, table_ids)
        slots, found, words = table_ops.find(
            keys, tids, self._state, self._cur_scores(score), update_score, check=False
        )
        scores = score_columns_for_user(words, tids, self._reversed, self._num_columns(table_ids))
        return FindResult(slots, found, scores)

    def insert(
        self,
        keys: Tensor,
        table_ids: TableIds = None,
        *,
        rows: Optional[Tensor] = None,
        scores: Optional[Tensor] = None,
    ) -> Tensor:
        """Insert-or-assign keys (touches use the policy default score); write ``rows``. -> slots (n,)"""
        return self._insert(keys, table_ids, rows, scores, None, want_evicted=False).slots

    def find_or_insert(
        self, keys: Tensor, table_ids: TableIds = None, *, score: Optional[int] = None
    ) -> InsertResult:
        """Find keys, inserting absent ones (their rows are left as they are)."""
        return self._insert(keys, table_ids, None, None, score, want_evicted=True, lookup=True)

    def find_or_insert_counted(
        self,
        keys: Tensor,
        table_ids: Tensor,
        table_counts: Sequence[int],
        sizes: Sequence[int],
        *,
        report_evicted: bool = True,
        counts: Optional[Tensor] = None,
    ) -> InsertResult:
        """:meth:`find_or_insert` for a caller that already knows, on the host, how many distinct
        keys each table receives and how many keys each table holds (a grouped lookup, which
        read both back with its unique and its previous insert).

        Growth is decided from those numbers, so the call reads nothing back from the device
        (except for NO_EVICTION tables, whose retry checks for failed keys). The input is trusted:
        ``keys`` distinct per table, ``table_ids`` (n,) int64 in range on the table's device.
        With ``report_evicted=False`` the evicted keys are not gathered (the insert then needs no
        device sync to size them); RETAIN_KEY tables always report theirs.

        The placement counters are the caller's to add (:meth:`PlacementCounters.add`): it reads
        the per-table outcome back with its sizes anyway, so counting costs no device work here.

        ``counts``: (n,) int64 >= 0, each key's occurrences in the caller's batch before it
        deduplicated them: an LFU (or TIMESTAMP+LFU) count grows by it, as if every occurrence had
        been looked up (NVIDIA's DynamicEmb counts them so); None: 1 per key.
        """
        if counts is not None and counts.dtype != torch.int64:
            counts = counts.to(torch.int64)
        retain = False
        rules, retains = self._growth_rules, self._retains
        for t, count in enumerate(table_counts):
            if not count:
                continue
            retain = retain or retains[t]
            max_capacity, max_load_factor, no_eviction, past_max = rules[t]
            if expansion.needs_growth(
                int(sizes[t]),
                int(count),
                self._offsets[t + 1] - self._offsets[t],
                max_capacity,
                max_load_factor,
                no_eviction,
                past_max,
            ):
                self._double(t)
        cur = self._cur_scores(None)
        if report_evicted or retain:
            slots, is_new, evicted = self._run_insert(
                keys, table_ids, cur, None, True, unique=True, counts=counts
            )
        else:
            self._write_count += 1
            slots, is_new = table_ops.find_or_insert(
                keys,
                table_ids,
                self._state,
                self._score_fns,
                cur,
                check=False,
                pins=self._pin_counts_arg(),
                deterministic=self._deterministic,
                unique_keys=True,
                counts=counts,
            )
            evicted = self._no_evictions(self._max_scores)
        slots, is_new = self._retry_no_eviction(
            keys, table_ids, cur, None, True, slots, is_new, counts
        )
        self._number_new_keys(table_ids, slots, is_new, None)
        self._collect_evicted(evicted)
        assert is_new is not None
        return InsertResult(slots, is_new, evicted)

    def insert_and_evict(
        self,
        keys: Tensor,
        table_ids: TableIds = None,
        *,
        rows: Optional[Tensor] = None,
        scores: Optional[Tensor] = None,
        score: Optional[int] = None,
    ) -> InsertResult:
        """Insert keys and return what they evicted, with the evicted rows read before writing."""
        return self._insert(keys, table_ids, rows, scores, score, want_evicted=True)

    def _insert(
        self,
        keys: Tensor,
        table_ids: TableIds,
        rows: Optional[Tensor],
        scores: Optional[Tensor],
        score: Optional[int],
        want_evicted: bool,
        lookup: bool = False,
    ) -> InsertResult:
        where, keys, tids = self._keys_and_ids(keys, table_ids)
        n = keys.numel()
        involved = self._involved(table_ids, tids)
        if rows is not None:
            width = self._shared(where, involved, "row_width")
            rows = check_rows(
                rows, where, n, width, self._shared(where, involved, "dtype"), self.device
            )
        words = None
        if scores is not None:
            k = self._shared(where, involved, "num_scores")
            scores = check_user_scores(scores, where, n, k, self.device)
            words = score_words_from_user(scores, tids, self._reversed, self._compound)
        # Everything is validated: from here on the table changes.
        self._grow_for(keys, tids, involved)
        cur = self._cur_scores(score)
        retain = any(
            self.specs[t].evicted_item_mode == EvictedItemMode.RETAIN_KEY for t in involved
        )
        # NO_EVICTION tables number their new keys, for which the call must report is_new
        evicting = want_evicted or retain or any(self.specs[t].no_eviction for t in involved)
        sizes_before = self._state.sizes.clone()
        slots, is_new, evicted = self._run_insert(keys, tids, cur, words, evicting, table_ids)
        slots, is_new = self._retry_no_eviction(keys, tids, cur, words, evicting, slots, is_new)
        self._number_new_keys(tids, slots, is_new, words)
        self.counters.record(tids, slots, is_new, sizes_before, self._state.sizes, lookup=lookup)
        self._collect_evicted(evicted)
        if rows is not None:
            self._write_rows_by_table(involved, tids, slots, rows, table_ids)
        self._safe_check(involved, tids, slots)
        if is_new is None:
            is_new = torch.zeros(n, dtype=torch.bool, device=self.device)
        return InsertResult(slots, is_new, evicted)

    def _run_insert(
        self,
        keys: Tensor,
        tids: Tensor,
        cur: Tensor,
        words: Optional[Tensor],
        evicting: bool,
        table_ids: TableIds = None,
        unique: bool = False,
        counts: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor], EvictedItems]:
        """One inserting op on the state; ``unique``: the pairs are distinct (the ops'
        ``unique_keys``, which spares the key-parallel engine its leader map); ``counts``: the
        accesses each key's touch counts (the ops' ``counts``)."""
        self._write_count += 1
        pins, det = self._pin_counts_arg(), self._deterministic
        if not evicting:
            slots = table_ops.insert(
                keys,
                tids,
                self._state,
                self._score_fns,
                cur,
                words,
                check=False,
                pins=pins,
                deterministic=det,
                unique_keys=unique,
                counts=counts,
            )
            return slots, None, self._no_evictions(self._num_columns(table_ids))
        slots, is_new, ek, es, ew, et = table_ops.insert_and_evict(
            keys,
            tids,
            self._state,
            self._score_fns,
            cur,
            words,
            check=False,
            pins=pins,
            deterministic=det,
            unique_keys=unique,
            counts=counts,
        )
        scores = score_columns_for_user(ew, et, self._reversed, self._num_columns(table_ids))
        return slots, is_new, EvictedItems(ek, es, scores, et, self._read_evicted_rows(es, et))

    def _no_evictions(self, columns: int) -> EvictedItems:
        """Empty evicted items (made once per column count: the lookup asks on every step)."""
        made = self._empty_evicted.get(columns)
        if made is None:
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            made = EvictedItems(empty, empty, empty.reshape(0, columns), empty, None)
            self._empty_evicted[columns] = made
        return made

    def _read_evicted_rows(
        self, slots: Tensor, tids: Tensor
    ) -> Optional[Union[Tensor, List[Tensor]]]:
        if slots.numel() == 0:
            return None
        tables = [int(t) for t in torch.unique(tids).tolist()]
        widths = {self.specs[t].row_width for t in tables}
        if widths == {0}:
            return None
        if len(widths) == 1 and len({self.specs[t].dtype for t in tables}) == 1:
            if len(tables) == 1:
                return table_ops.gather_rows(self._values[tables[0]], slots, check=False)
            out = self._values[tables[0]].new_empty((slots.numel(), widths.pop()))
            for t in tables:
                mask = tids == t
                out[mask] = table_ops.gather_rows(self._values[t], slots[mask], check=False)
            return out
        return [
            table_ops.gather_rows(self._values[t], s.reshape(1), check=False)[0]
            for s, t in zip(slots, tids.tolist())
        ]

    def _retry_no_eviction(
        self,
        keys: Tensor,
        tids: Tensor,
        cur: Tensor,
        words: Optional[Tensor],
        evicting: bool,
        slots: Tensor,
        is_new: Optional[Tensor],
        counts: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """NO_EVICTION keys that found their bucket full: double the table, remap, retry them."""
        if not self._any_no_eviction:
            return slots, is_new  # decided on the host: no slots read back
        for _ in range(_MAX_RETRIES):
            failed = (slots < 0) & self._no_eviction[tids]
            if not bool(failed.any()):
                return slots, is_new
            grown = []
            for t in torch.unique(tids[failed]).tolist():
                capacity = self.capacity(t)
                doubled = self._double(t)
                if doubled is None:  # cannot grow: its keys stay unplaced (safe_check_mode)
                    continue
                grown.append(t)
                remap = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)
                remap[doubled[0]] = doubled[1]
                moved = (tids == t) & (slots >= 0)
                slots[moved] = remap[slots[moved]]
            if not grown:
                return slots, is_new
            failed &= torch.isin(tids, torch.tensor(grown, device=self.device))
            idx = failed.nonzero().squeeze(1)
            sub_words = None if words is None else words[idx]
            sub_counts = None if counts is None else counts[idx]
            sub_slots, sub_new, _ = self._run_insert(
                keys[idx], tids[idx], cur, sub_words, evicting, counts=sub_counts
            )
            slots[idx] = sub_slots
            if is_new is not None:
                # is_new is only tracked when evicting, and _run_insert then returns it
                assert sub_new is not None
                is_new[idx] = sub_new
        raise DynamicEmbError(
            "NO_EVICTION insert did not converge after 64 doublings; this is a bug"
        )

    def _number_new_keys(
        self, tids: Tensor, slots: Tensor, is_new: Optional[Tensor], words: Optional[Tensor]
    ) -> None:
        """NO_EVICTION: score each key a call placed with its table's next insertion number.

        The seed thresholds a NO_EVICTION table's incremental dump on this absolute score: keys
        numbered at or above a ``get_score`` taken earlier are the keys inserted since. New keys of
        one call are numbered in slot order (deterministic, one number per key however often it
        occurs); later touches leave the number (score_policy.h, ``policy_keeps_words``). Keys placed
        with given scores (a checkpoint load, a replay) keep them, and the next number passes the
        largest. Device ops only: no host synchronisation.
        """
        if not self._any_no_eviction or is_new is None or tids.numel() == 0:
            return
        placed = is_new & (slots >= 0) & self._no_eviction[tids]
        if words is not None:
            top = torch.where(placed, words[:, 0] + 1, torch.zeros_like(slots))
            self._next_number.scatter_reduce_(0, tids, top, "amax")
            return
        total = self._offsets[-1]
        glob = torch.where(placed, self._state.slot_offsets[tids] + slots, total)
        order_g, order = torch.sort(glob)  # tables are contiguous regions: grouped by table
        order_t = tids[order]
        valid = order_g < total
        first = valid.clone()
        first[1:] &= order_g[1:] != order_g[:-1]
        first_i = first.to(torch.int64)
        per_table = torch.zeros_like(self._next_number).index_add_(0, order_t, first_i)
        before = per_table.cumsum(0) - per_table
        number = self._next_number[order_t] + first_i.cumsum(0) - 1 - before[order_t]
        # every occurrence of a key computes its first's number; amax over new keys' 0 writes it
        column = self._state.scores[:, 0]
        column.scatter_reduce_(
            0,
            torch.where(valid, order_g, torch.zeros_like(order_g)),
            torch.where(valid, number, torch.full_like(number, -(2**63))),
            "amax",
        )
        self._next_number += per_table

    def _collect_evicted(self, evicted: EvictedItems) -> None:
        if evicted.keys.numel() == 0:
            return
        for t, spec in enumerate(self.specs):
            if spec.evicted_item_mode == EvictedItemMode.RETAIN_KEY:
                mine = evicted.keys[evicted.table_ids == t]
                if mine.numel():
                    self._evicted_keys[t].append(mine.clone())

    def _write_rows_by_table(
        self, involved: List[int], tids: Tensor, slots: Tensor, rows: Tensor, table_ids: TableIds
    ) -> None:
        if self.specs[involved[0]].row_width == 0:
            return
        if table_ids is None or isinstance(table_ids, int):
            table_ops.scatter_rows(self._values[involved[0]], slots, rows, check=False)
            return
        for t in involved:
            mask = tids == t
            table_ops.scatter_rows(self._values[t], slots[mask], rows[mask], check=False)

    def _safe_check(self, involved: List[int], tids: Tensor, slots: Tensor) -> None:
        """Apply each table's safe_check_mode to keys left without a slot (IGNORE: no check)."""
        modes = {self.specs[t].safe_check_mode for t in involved}
        if modes == {DynamicEmbCheckMode.IGNORE}:
            return
        failed = torch.bincount(tids[slots < 0], minlength=self.num_tables).tolist()
        totals = torch.bincount(tids, minlength=self.num_tables).tolist()
        for t in involved:
            spec = self.specs[t]
            if spec.safe_check_mode == DynamicEmbCheckMode.IGNORE:
                continue
            self._report(spec.name, spec.safe_check_mode, failed[t], totals[t], stacklevel=5)

    def erase(self, keys: Tensor, table_ids: TableIds = None) -> Tensor:
        """Remove keys. -> erased (n,) bool"""
        _, keys, tids = self._keys_and_ids(keys, table_ids)
        self._write_count += 1
        return table_ops.erase(keys, tids, self._state, check=False)

    def export(self, table_id: int, threshold: Optional[int] = None) -> ExportResult:
        """Keys of one table in slot order whose score passes ``threshold`` (None: all).

        The compared word is the timestamp for the compound strategy, the only word otherwise.
        """
        t = self._table_id(table_id)
        spec = self.specs[t]
        limit = -(2**63) if threshold is None else int(threshold)
        thresholds = torch.full((1,), limit, dtype=torch.int64, device=self.device)
        column = 1 if spec.policy == COMPOUND_POLICY else 0
        keys, slots, words, _ = table_ops.export_if(self._region(t), thresholds, column)
        tids = torch.full_like(keys, t)
        return ExportResult(
            keys, slots, score_columns_for_user(words, tids, self._reversed, spec.num_scores)
        )

    def insert_at(
        self,
        table_id: int,
        keys: Tensor,
        slots: Tensor,
        *,
        rows: Optional[Tensor] = None,
        scores: Optional[Tensor] = None,
        distinct: bool = False,
    ) -> None:
        """Put each key at exactly its given local slot (replay), or raise before writing anything.

        ``distinct=True`` says the caller has already checked that no key and no slot appears
        twice in the batch (a checkpoint load checks a whole file's slots before any table is
        written) and skips that O(n) check; the kernel's dry run still checks every slot against
        the table (home bucket, empty or holding the key) before anything is written.

        Raises:
            DynamicEmbError: naming the first key whose slot is outside its home bucket, held by
                another key, or claimed twice in this batch.
        """
        from dynamicemb_core.table.replay import check_insert_at, failing_index

        t = self._table_id(table_id)
        spec = self.specs[t]
        where = f"table {spec.name!r}"
        keys = check_int64_vector(keys, where, "keys", self.device)
        n = keys.numel()
        slots = check_int64_vector(slots, where, "slots", self.device, n)
        if rows is not None:
            rows = check_rows(rows, where, n, spec.row_width, spec.dtype, self.device)
        tids = torch.full_like(keys, t)
        if scores is None:
            words = torch.zeros(n, 2, dtype=torch.int64, device=self.device)
        else:
            scores = check_user_scores(scores, where, n, spec.num_scores, self.device)
            words = score_words_from_user(scores, tids, self._reversed, self._compound)
        placed = table_ops.insert_at(keys, tids, slots, self._state, words, True)
        if distinct:
            refused = (~placed).nonzero()
            bad = int(refused[0, 0]) if refused.numel() else None
        else:
            bad = failing_index(placed, keys, slots)
        if bad is not None:
            raise DynamicEmbError(
                check_insert_at(
                    where, int(keys[bad]), int(slots[bad]), self.capacity(t), self._caps[t]
                )
            )
        self._write_count += 1
        table_ops.insert_at(keys, tids, slots, self._state, words, False)
        if spec.no_eviction:  # replayed numbers: the next new key numbers past them
            self._number_new_keys(tids, slots, torch.ones_like(keys, dtype=torch.bool), words)
        if rows is not None and spec.row_width:
            table_ops.scatter_rows(self._values[t], slots, rows)

    # -- value rows --------------------------------------------------------------------------------
    def read_rows(self, table_id: int, slots: Tensor) -> Tensor:
        """Rows at local ``slots`` (n,); slot -1 gives zeros. -> (n, row_width)"""
        t = self._table_id(table_id)
        slots = check_int64_vector(slots, f"table {self.specs[t].name!r}", "slots", self.device)
        return table_ops.gather_rows(self._values[t], slots)

    def write_rows(self, table_id: int, slots: Tensor, rows: Tensor) -> None:
        """Write ``rows`` (n, row_width) at local ``slots``; -1 skipped, the last of duplicates wins."""
        t = self._table_id(table_id)
        spec = self.specs[t]
        where = f"table {spec.name!r}"
        slots = check_int64_vector(slots, where, "slots", self.device)
        rows = check_rows(rows, where, slots.numel(), spec.row_width, spec.dtype, self.device)
        table_ops.scatter_rows(self._values[t], slots, rows)

    def values(self, table_id: int) -> Tensor:
        """The table's (capacity, row_width) value buffer itself (replaced when the table grows)."""
        return self._values[self._table_id(table_id)]

    # -- sizes and scores ---------------------------------------------------------------------------
    def size(self, table_id: int = 0) -> int:
        return int(self._state.sizes[self._table_id(table_id)])

    def capacity(self, table_id: int = 0) -> int:
        t = self._table_id(table_id)
        return self._offsets[t + 1] - self._offsets[t]

    def bucket_capacity(self, table_id: int = 0) -> int:
        """Slots per bucket of the table now (a single-bucket table's width grows with it)."""
        return self._caps[self._table_id(table_id)]

    def load_factor(self, table_id: int = 0) -> float:
        return self.size(table_id) / self.capacity(table_id)

    # -- pins --------------------------------------------------------------------------------------
    def pin_slots(self, slots: Tensor, table_ids: TableIds = None, *, check: bool = True) -> None:
        """Add one pin to each slot (slot -1 is skipped; a slot given twice gets two pins).

        A slot whose pin count is above 0 is never chosen as a victim by an inserting call (its
        key stays; a new key that finds only pinned and protected slots gets slot -1), on every
        device and in both CUDA engines. Pins belong to slots, not keys: erase and clear leave them,
        and a growing table moves them with its keys. ``check`` (default True) raises ValueError
        for a slot outside [-1, capacity) first, at the cost of one device synchronisation on CUDA.
        """
        self._add_pins(slots, table_ids, 1, check, "pin_slots")

    def unpin_slots(self, slots: Tensor, table_ids: TableIds = None, *, check: bool = True) -> None:
        """Remove one pin from each slot (-1 skipped). With ``check``, raises ValueError (nothing
        changed) when a slot would go below zero pins; without it, counts stop at zero."""
        self._add_pins(slots, table_ids, -1, check, "unpin_slots")

    def adjust_pins(self, table_ids: Tensor, slots: Tensor, delta: int) -> None:
        """Trusted :meth:`pin_slots` / :meth:`unpin_slots` for the lookup's own slots: ``delta``
        (+1 or -1) on each ``(table id, slot)`` pair (slot -1 skipped), no checks and no device
        synchronisation; counts stop at zero. ``table_ids`` / ``slots`` (n,) int64 on the device."""
        total = self._offsets[-1]
        if self._pins is None:
            if delta < 0:
                return
            self._pins = torch.zeros(total + 1, dtype=torch.int32, device=self.device)
        pins = self._pins
        offsets = self._state.slot_offsets
        g = torch.where(slots >= 0, offsets[table_ids] + slots, torch.full_like(slots, total))
        pins.index_add_(0, g, torch.full(g.shape, delta, dtype=torch.int32, device=self.device))
        if delta < 0:
            pins.index_put_((g,), pins[g].clamp_min(0))
        pins[total] = 0

    def pin_counts(self, table_id: int = 0) -> Tensor:
        """(capacity,) int32 copy of table ``table_id``'s pin count per local slot."""
        t = self._table_id(table_id)
        begin, end = self._offsets[t], self._offsets[t + 1]
        if self._pins is None:
            return torch.zeros(end - begin, dtype=torch.int32, device=self.device)
        return self._pins[begin:end].clone()

    def _pin_counts_arg(self) -> Optional[Tensor]:
        """The ops' ``pins`` argument: (total_slots,) int32, or None while nothing was pinned."""
        return None if self._pins is None else self._pins[: self._offsets[-1]]

    def _add_pins(
        self, slots: Tensor, table_ids: TableIds, delta: int, check: bool, op: str
    ) -> None:
        where = self._where(table_ids)
        slots = check_int64_vector(slots, f"{where}.{op}", "slots", self.device)
        names = [s.name for s in self.specs]
        tids = table_ids_tensor(
            table_ids, slots.numel(), self.num_tables, names, self.device, where
        )
        total = self._offsets[-1]
        offsets = self._state.slot_offsets
        if check and slots.numel() > 0:
            capacity = (offsets[1:] - offsets[:-1])[tids]
            bad = (slots < -1) | (slots >= capacity)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(
                    f"{where}.{op}: slots[{i}] = {int(slots[i])} is outside [-1, "
                    f"{int(capacity[i])}) of table {self.specs[int(tids[i])].name!r}"
                )
        if self._pins is None:
            self._pins = torch.zeros(total + 1, dtype=torch.int32, device=self.device)
        pins = self._pins
        g = torch.where(slots >= 0, offsets[tids] + slots, torch.full_like(slots, total))
        pins.index_add_(0, g, torch.full(g.shape, delta, dtype=torch.int32, device=self.device))
        if delta < 0:
            below = pins[g] < 0
            if check and bool(below.any()):
                pins.index_add_(
                    0, g, torch.full(g.shape, -delta, dtype=torch.int32, device=self.device)
                )
                pins[total] = 0
                i = int(below.nonzero()[0, 0])
                raise ValueError(
                    f"{where}.{op}: slot {int(slots[i])} of table "
                    f"{self.specs[int(tids[i])].name!r} has fewer pins than this call removes"
                )
            pins.index_put_((g,), pins[g].clamp_min(0))
        pins[total] = 0

    def clear(self, table_id: Optional[int] = None) -> None:
        """Empty one table (or all); value rows and RETAIN_KEY buffers are kept."""
        self._write_count += 1
        for t in range(self.num_tables) if table_id is None else [self._table_id(table_id)]:
            self._state.digests[self._offsets[t] : self._offsets[t + 1]].zero_()
            self._state.sizes[t] = 0
            self._packed.pop(t, None)

    # -- where the keys came from --------------------------------------------------------------------
    def packed_slots(self, table_id: int = 0) -> Optional[str]:
        """Why table ``table_id``'s keys do not stand at the slots of the table they were loaded
        from, or None when they do (or the table filled itself, by training or ``insert_at``).

        A checkpoint load that cannot keep the source's slots (another world size, capacity or
        bucket width) packs each bucket and records why here; a replay of a delta that does not
        report its evictions refuses such a table (``replay_increment``), since it cannot tell a
        key the source evicted from one the load put elsewhere.
        """
        return self._packed.get(self._table_id(table_id))

    def set_packed_slots(self, table_id: int, reason: Optional[str]) -> None:
        """Record (``reason``) or clear (None) what :meth:`packed_slots` reports; called by loads."""
        t = self._table_id(table_id)
        if reason is None:
            self._packed.pop(t, None)
        else:
            self._packed[t] = str(reason)

    def set_score(self, table_id: int, score: int) -> None:
        """Set the score of a CUSTOMIZED table (or the step of a STEP table) for later calls.

        Warns (DynamicEmbWarning) when a CUSTOMIZED score goes down, unless
        ``DYNAMICEMB_CSTM_SCORE_CHECK=0``.
        """
        t = self._table_id(table_id)
        spec = self.specs[t]
        if spec.policy not in (_STEP, _CUSTOMIZED):
            raise ValueError(
                f"table {spec.name!r}: set_score needs a CUSTOMIZED or STEP table, got "
                f"{tuple(s.name for s in spec.strategies)}"
            )
        score = int(score)
        if spec.policy == _STEP:
            self._steps[t] = score
            return
        if score < self._custom_scores[t] and custom_score_check_enabled():
            warnings.warn(
                f"table {spec.name!r}: CUSTOMIZED score goes down from {self._custom_scores[t]} to "
                f"{score}; keys touched from now on rank below older ones (set "
                "DYNAMICEMB_CSTM_SCORE_CHECK=0 to silence)",
                DynamicEmbWarning,
                stacklevel=2,
            )
        self._custom_scores[t] = score

    def get_score(self, table_id: int) -> int:
        """The score the next call will use: step, custom score, 0 for LFU, NO_EVICTION's next
        insertion number, or the clock (ns).

        Clock tables (TIMESTAMP, compound) read the clock the kernels stamp on this
        table's device (``device_clock``: steady_clock on CPU, ``%globaltimer`` on CUDA), so the
        value compares with exported timestamps; on CUDA the read waits for the current stream.
        """
        t = self._table_id(table_id)
        policy = self.specs[t].policy
        if policy == _STEP:
            return self._steps[t]
        if policy == _CUSTOMIZED:
            return self._custom_scores[t]
        if policy == _LFU:
            return 0
        if self.specs[t].no_eviction:
            return int(self._next_number[t])
        return table_ops.device_clock(self._state.sizes)

    def advance_step(self, table_id: Optional[int] = None) -> None:
        """Add one to the step of STEP tables (one, or all); the lookup calls it once per forward."""
        for t in range(self.num_tables) if table_id is None else [self._table_id(table_id)]:
            if self.specs[t].policy == _STEP:
                self._steps[t] += 1

    def pop_evicted_keys(self, table_id: int) -> Tensor:
        """RETAIN_KEY tables: keys evicted since the last pop, deduplicated and sorted; then cleared.

        Other tables return an empty tensor.
        """
        t = self._table_id(table_id)
        chunks, self._evicted_keys[t] = self._evicted_keys[t], []
        if not chunks:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return torch.unique(torch.cat(chunks))


def _moved_pins(
    pins: Optional[Tensor], begin: int, end: int, old_slots: Tensor, new_slots: Tensor
) -> Optional[Tensor]:
    """The pin counts after the table at global slots [begin, end) doubled in place: its keys'
    counts follow them from ``old_slots`` to ``new_slots`` (local), other tables' shift with their
    region; None stays None."""
    if pins is None:
        return None
    region = torch.zeros(2 * (end - begin), dtype=pins.dtype, device=pins.device)
    region[new_slots] = pins[begin:end][old_slots]
    return torch.cat([pins[:begin], region, pins[end:]])
