"""The grouped step: all device-only tables of a batched module in one pass.

Forward: table ids are expanded from the batch's feature offsets on the device, one segmented unique
dedups ``(table id, key)`` pairs of every table, one find-or-insert places them in the group's one
hash table, one op initialises the new rows in place (masked by the insert's ``is_new``), one
pooled gather (or, for a sequence output, one gather) reads them. Backward: one op reduces the
output gradient per unique key and applies the fused optimizer to the rows in place. The number of
ops and of host synchronisations does not grow with the number of tables: one sync in a training
forward of device tables, the unique count (the offsets check's numbers and the previous step's
placement outcome ride on it); tables whose safe check is ERROR or WARNING, cached tables and
host rows the device cannot address read the placement outcome at once (a second sync).

Tables that do not train (``training=False`` options, or every table in an eval forward) are read
without inserting or touching scores; their missing keys read the eval initializer and get no
update. Tables with an admission strategy count their missing keys (each table its own counter, over
the one segmented-unique output) and only admitted keys are placed; rejected keys read the
strategy's initializer (or the table's) and get no update. Both need one more find and, when
admission runs, one more small readback per forward; the rest of the pass is shared.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.lookup.features import OffsetsCheck
from dynamicemb_core.lookup.initializers import draw_seed, initial_rows, initializer_table
from dynamicemb_core.nvtx import ranged
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim import OptimizerArgs, OptimizerKind, initial_state_value
from dynamicemb_core.storage.grouped import GroupAcquire, GroupedDeviceStorage, GroupInit
from dynamicemb_core.storage.grouped_cache import PinnedPairs
from dynamicemb_core.storage.grouped_rows import GroupedRows, StagedRows
from dynamicemb_core.table.safe_check import UnplacedKeyReport

__all__ = ["GroupStep", "GroupedLookupFunction", "TableGroup"]


@dataclass
class GroupStep:
    """One forward's state kept for its backward.

    Attributes:
        keys, table_ids: (u,) the unique pairs.
        inverse: (n,) unique pair of each index.
        slots: (u,) their slots at the forward for the backward's update, -1 for pairs that get no
            update (None: nothing trains in this forward).
        trained: (u,) bool, the pairs the backward may update (None: all of them).
        offsets: (F*B+1,) the batch's bags; weights: (n,) float32 per-sample weights or None.
        batch_size: B.
        weight_rows: (u, max_dim) rows as read, kept only when the weights learn.
        pins: the forward's held slots (its trained pairs with a slot), pinned by the next call
            that places keys and given back by the backward or when the step is dropped; while
            pinned, no slot is a victim and growth moves ``slots`` with their keys, so the
            backward's slots are current.
        backed: (b,) positions of pairs of cached tables whose home this step is the backing
            store (their backward reads, updates and writes rows there), or None.
        order, key_counts: (n,) the positions grouped by unique pair and (u,) each pair's count,
            from the dedup (training forwards: order from the CUDA sort, so the backward does not
            sort again; on the CPU the counts alone, so its reduction does not count again);
            None elsewhere.
        staged: the host part's rows of the pairs as the forward read them, for the backward
            to update on the device (``GroupedRows.stage``), or None.
    """

    keys: torch.Tensor
    table_ids: torch.Tensor
    inverse: torch.Tensor
    slots: Optional[torch.Tensor]
    trained: Optional[torch.Tensor]
    offsets: torch.Tensor
    weights: Optional[torch.Tensor]
    batch_size: int
    weight_rows: Optional[torch.Tensor] = None
    order: Optional[torch.Tensor] = None
    key_counts: Optional[torch.Tensor] = None
    pins: Optional[PinnedPairs] = None
    backed: Optional[torch.Tensor] = None
    staged: Optional[StagedRows] = None


class TableGroup:
    """The tables of a batched module that share one :class:`GroupedDeviceStorage`.

    Args:
        storage: the group's storage (table ids = the module's table indices).
        feature_table_map: table of each feature.
        pooled: SUM/MEAN output (else a sequence output).
        kind: the fused optimizer.
        optimizer_args: the module's hyper-parameters (the module hands the group the new object
            when a checkpoint load replaces them; the learning rate changes in place). A value,
            not a callback into the module: the group must not keep its module alive.
        initializers, eval_initializers: per table, the initializer of new rows in training and of
            missing rows read in eval.
        trains: per table, whether it trains (its options' ``training``); default: all do.
        admission: per table, ``(strategy, counter)`` or None (every new key admitted).
        defer_placement: a plain training forward does not wait for its placement's outcome
            (``GroupedDeviceStorage.acquire_all(defer=True)``): its unplaced keys are reported
            by the step's backward or the next forward (tables whose safe check asks for no
            per-batch answer).
    """

    def __init__(
        self,
        storage: GroupedDeviceStorage,
        feature_table_map: Sequence[int],
        pooled: bool,
        kind: OptimizerKind,
        optimizer_args: OptimizerArgs,
        initializers: Sequence[DynamicEmbInitializerArgs],
        eval_initializers: Sequence[DynamicEmbInitializerArgs],
        trains: Optional[Sequence[bool]] = None,
        admission: Optional[Sequence[Optional[Tuple[Any, Any]]]] = None,
        defer_placement: bool = False,
    ) -> None:
        self.storage = storage
        device = storage.device
        self.device = device
        self.num_tables = len(storage.tables)
        self.dims = storage.dims
        self.max_dim = storage.max_dim
        self.pooled = pooled
        self.kind = kind
        self.optimizer_args = optimizer_args
        # >= 0: half-precision rows round their updates stochastically from this seed (the lookup
        # module's stochastic_rounding_seed); -1: to nearest even.
        self.rounding_seed = -1
        self.feature_tables = torch.tensor(
            list(feature_table_map), dtype=torch.int64, device=device
        )
        starts = [0]
        for t in feature_table_map:
            starts.append(starts[-1] + self.dims[t])
        self.total_dim = starts[-1]
        self.d_offsets = torch.tensor(starts, dtype=torch.int64, device=device)
        self._dims_dev = torch.tensor(self.dims, dtype=torch.int64, device=device)
        self._cols = torch.arange(self.max_dim, device=device)
        self._initializers = list(initializers)
        self._eval_init = initializer_table(eval_initializers, device)
        # the training initializers' table per optimizer-state value (the optimizer's arguments
        # may change between steps; the table is built once per value)
        self._init_tables: Dict[float, torch.Tensor] = {}
        self.defer_placement = defer_placement
        flags = [True] * self.num_tables if trains is None else [bool(t) for t in trains]
        self.trains = flags
        self._trains_dev = torch.tensor(flags, dtype=torch.bool, device=device)
        self.admission = list(admission) if admission is not None else [None] * self.num_tables
        # The plain training pass: every table trains and admits every key.
        self._plain = all(flags) and all(a is None for a in self.admission)
        self._frozen = [t for t, trains in enumerate(flags) if not trains]

    @property
    def any_trains(self) -> bool:
        """Whether a training forward updates any table of the group."""
        return any(self.trains)

    # ---- new rows ---------------------------------------------------------------------------------
    def _embeddings(
        self, table: torch.Tensor, keys: torch.Tensor, tids: torch.Tensor
    ) -> torch.Tensor:
        """(m, max_dim) initial embeddings, each row by its table's initializer in ``table``."""
        return initial_rows(table, keys, tids, self.max_dim, self.dims, draw_seed())

    def _row_init(self) -> GroupInit:
        """The new rows of one placing call: the training initializers with the optimizer's
        fresh state, and a seed drawn from torch's generator."""
        state = float(initial_state_value(self.kind, self.optimizer_args))
        table = self._init_tables.get(state)
        if table is None:
            table = initializer_table(self._initializers, self.device, state)
            self._init_tables[state] = table
        return GroupInit(table, draw_seed())

    def new_rows(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(m, max row_width) rows of new keys: the embedding, then the fresh optimizer state."""
        init = self._row_init()
        width = self.storage.max_width
        return initial_rows(init.table, keys, tids, width, self.dims, init.seed)

    # ---- forward --------------------------------------------------------------------------------
    @ranged("dynamicemb::unique")
    def _unique(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch_size: int,
        check: Optional[OffsetsCheck],
        ordered: bool,
    ) -> Tuple[Any, ...]:
        """The batch's unique ``(table id, key)`` pairs (``lookup_ops.bag_unique``'s, with
        ``order`` when ``ordered``; the per-table counts as a host list), then ``check``
        verified. The op takes each key's table from the feature-major offsets on the device
        and counts the numbers ``check`` needs in the same pass; they come back in the
        unique's readback (no synchronisation of their own)."""
        n, T = indices.numel(), self.num_tables
        if batch_size == 0 or n == 0:
            tids = torch.zeros(n, dtype=torch.int64, device=self.device)
            unique = lookup_ops.segmented_unique_ordered if ordered else lookup_ops.segmented_unique
            out: Tuple[Any, ...] = unique(indices, tids, T)
            counts = out[4].tolist()
        else:
            out = lookup_ops.bag_unique(
                indices, offsets, self.feature_tables, batch_size, T, ordered
            )
            counts = out[4].tolist()  # one host read for the counts and the check's numbers
            if check is not None:
                check.give(counts[T:])
            counts = counts[:T]
        if check is not None:
            check.verify()
        return out[:4] + (counts,) + out[5:]

    def lookup(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch_size: int,
        training: bool,
        check: Optional[OffsetsCheck] = None,
        occurrences: Optional[torch.Tensor] = None,
    ) -> Tuple[GroupStep, GroupedRows, torch.Tensor, Optional[List[int]]]:
        """Resolve the batch's unique pairs: ``(step, rows, slots, unplaced)``.

        ``rows``/``slots`` is what the output reads: the group's own rows, or, when some rows are
        not stored (eval misses, rejected keys), a (u, max_dim) buffer of the rows as they read
        with ``slots = arange(u)``. A key that should have been placed and found no room has slot
        -1 and reads zeros (the seed); ``unplaced`` counts them per table (None when there were
        none). ``check``: the batch's pending offsets check, verified after the unique's
        readback and before anything is written (the two share one synchronisation).
        ``occurrences``: (n,) int64 >= 1, how many occurrences each index stands for (a batch
        deduplicated before it came here); each pair's accesses are their sum, else its count.
        A pair's accesses are what LFU scores and admission counters count.
        """
        training = training and self.any_trains
        order = None
        if training and self.device.type == "cuda":
            # the dedup's sort grouped the positions by pair: the backward reuses it
            keys, utids, inverse, key_counts, counts, order = self._unique(
                indices, offsets, batch_size, check, True
            )
        else:
            keys, utids, inverse, key_counts, counts = self._unique(
                indices, offsets, batch_size, check, False
            )
        accesses = key_counts
        if occurrences is not None:
            accesses = torch.zeros_like(key_counts).index_add_(
                0, inverse, occurrences.to(key_counts.dtype)
            )
        if not training:
            slots, found = self.storage.find_all(keys, utids)
            idx, rows = self._read_through(keys, utids, found, None)
            step = self._step(keys, utids, inverse, None, None, offsets, batch_size)
            return self._source(step, slots, slots, idx, rows) + (None,)
        if self._plain:
            acquire = self.storage.acquire_all(
                keys,
                utids,
                counts,
                self._row_init(),
                defer=self.defer_placement,
                key_counts=accesses,
            )
            step = self._step(keys, utids, inverse, acquire.slots, None, offsets, batch_size)
            step.backed = acquire.backed
            out = self._source(
                step, acquire.slots, acquire.slots, acquire.backed, acquire.backed_rows
            )
        else:
            step, acquire, out = self._mixed_lookup(
                keys, utids, inverse, accesses, offsets, batch_size
            )
        if order is not None or self.device.type == "cpu":
            # the dedup's order (CUDA) and per-pair counts: the backward need not count again
            step.order, step.key_counts = order, key_counts
        return out + (acquire.unplaced_per_table,)

    def hold(self, step: GroupStep) -> None:
        """Hold a training forward's slots until its backward (or until the step is dropped:
        pinned by the next placing call, see ``GroupedDeviceStorage.hold``) and release the
        prefetch this forward consumes. The caller calls it once the output is launched and
        before any other call places keys (the pins matter only from the next placing call on,
        so the device reads the rows while the host does this)."""
        storage = self.storage
        assert step.slots is not None
        step.pins = storage.hold(step.table_ids, step.slots)
        weakref.finalize(step, storage.unpin, step.pins)
        if storage.has_cache:
            storage.consume_prefetch(step.table_ids, step.slots)

    def _read_through(
        self,
        keys: torch.Tensor,
        utids: torch.Tensor,
        found: torch.Tensor,
        only: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rows of pairs the hash table does not hold, as an eval forward reads them: a cached
        table's from its backing store when it has them, else the eval initializer's. ``only``
        (u,) bool limits the pairs considered. -> (positions, (m, max_dim) rows)"""
        idx, rows = [], []
        if self.storage.has_cache:
            look = found if only is None else found | ~only
            found, got, brows = self.storage.read_through(keys, utids, look)
            if got.numel():
                idx.append(got)
                rows.append(brows[:, : self.max_dim])
        missing = ~found if only is None else ~found & only
        miss = missing.nonzero().squeeze(1)
        if miss.numel() or not idx:
            idx.append(miss)
            rows.append(self._embeddings(self._eval_init, keys[miss], utids[miss]))
        return torch.cat(idx), torch.cat(rows)

    @ranged("dynamicemb::find_or_insert")
    def _mixed_lookup(
        self,
        keys: torch.Tensor,
        utids: torch.Tensor,
        inverse: torch.Tensor,
        accesses: torch.Tensor,
        offsets: torch.Tensor,
        batch_size: int,
    ) -> Tuple[GroupStep, GroupAcquire, Tuple[GroupStep, GroupedRows, torch.Tensor]]:
        """A training forward where some tables do not train or admit keys: one find of every
        pair, admission per table over its missing pairs (counting each pair's ``accesses``),
        then one placement of the pairs that train. Returns the step, the placement and what the
        output reads (:meth:`_source`)."""
        storage = self.storage
        stored, found = storage.find_all(keys, utids)
        frozen = ~self._trains_dev[utids]
        kept, kept_rows = found[:0], None  # frozen pairs read from a backing store
        if storage.has_cache:
            found, got, brows = storage.read_through(keys, utids, found)
            mine = frozen[got]
            kept, kept_rows = got[mine], brows[mine][:, : self.max_dim]
        trained = ~frozen
        rejected = self._admit(keys, utids, accesses, found, trained)
        if rejected is not None:
            trained[rejected] = False
            # refused keys were looked up and missed: hits + misses = unique keys looked up
            storage.count_refused(utids[rejected])
        take = trained.nonzero().squeeze(1)
        take_tids = utids[take]
        table_counts = torch.bincount(take_tids, minlength=self.num_tables).tolist()
        acquire = storage.acquire_all(
            keys[take], take_tids, table_counts, self._row_init(), key_counts=accesses[take]
        )
        slots = torch.full_like(keys, -1)
        slots[take] = acquire.slots
        read = torch.where(trained, slots, stored)
        step = self._step(keys, utids, inverse, slots, trained, offsets, batch_size)
        backed = None if acquire.backed is None else take[acquire.backed]
        step.backed = backed
        # Rows that are not in the hash table: eval-initialised misses of tables that do not
        # train, their rows in a backing store, rows of rejected keys, trained pairs whose home
        # is a backing store (keys that found no room read slot -1: zeros).
        idx, rows = [], []
        still = (~found & frozen).nonzero().squeeze(1)
        if still.numel():
            idx.append(still)
            rows.append(self._embeddings(self._eval_init, keys[still], utids[still]))
        if kept.numel():
            assert kept_rows is not None
            idx.append(kept)
            rows.append(kept_rows)
        if rejected is not None and rejected.numel():
            idx.append(rejected)
            rows.append(self._rejected_rows(keys[rejected], utids[rejected]))
        if backed is not None:
            assert acquire.backed_rows is not None
            idx.append(backed)
            rows.append(acquire.backed_rows[:, : self.max_dim])
        if not idx:
            return step, acquire, self._source(step, read, slots, None, None)
        return step, acquire, self._source(step, read, slots, torch.cat(idx), torch.cat(rows))

    def _admit(
        self,
        keys: torch.Tensor,
        utids: torch.Tensor,
        key_counts: torch.Tensor,
        found: torch.Tensor,
        trained: torch.Tensor,
    ) -> Optional[torch.Tensor]:
        """Count the missing keys of each admission table and return the rejected positions
        (None when no table has a strategy). Each table's counter sees only its own keys."""
        tables = [t for t, a in enumerate(self.admission) if a is not None and self.trains[t]]
        if not tables:
            return None
        missing = ~found & trained
        ids = torch.tensor(tables, dtype=torch.int64, device=self.device)
        candidates = (missing & torch.isin(utids, ids)).nonzero().squeeze(1)
        if candidates.numel() == 0:
            return candidates
        ctids = utids[candidates]
        rejected = []
        # One readback: which admission tables have missing keys in this batch.
        present = torch.bincount(ctids, minlength=self.num_tables).tolist()
        for t in tables:
            if not present[t]:
                continue
            adm = self.admission[t]
            assert adm is not None
            strategy, counter = adm
            idx = candidates[ctids == t]
            mkeys = keys[idx]
            freq = counter.add(mkeys, key_counts[idx], True).to(self.device)
            ok = strategy.admit(mkeys, freq).to(self.device, torch.bool)
            counter.erase(mkeys[ok])
            rejected.append(idx[~ok])
        return torch.cat(rejected) if rejected else candidates[:0]

    def _rejected_rows(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(m, max_dim) rows of rejected keys: the strategy's initializer, else the table's."""
        args = []
        for t in range(self.num_tables):
            adm = self.admission[t]
            own = adm[0].get_initializer_args() if adm is not None else None
            args.append(own or self._initializers[t])
        return self._embeddings(initializer_table(args, self.device), keys, tids)

    def _step(
        self,
        keys: torch.Tensor,
        utids: torch.Tensor,
        inverse: torch.Tensor,
        slots: Optional[torch.Tensor],
        trained: Optional[torch.Tensor],
        offsets: torch.Tensor,
        batch_size: int,
    ) -> GroupStep:
        return GroupStep(
            keys=keys,
            table_ids=utids,
            inverse=inverse,
            slots=slots,
            trained=trained,
            offsets=offsets,
            weights=None,
            batch_size=batch_size,
        )

    def _source(
        self,
        step: GroupStep,
        read: torch.Tensor,
        slots: Optional[torch.Tensor],
        fresh_index: Optional[torch.Tensor],
        fresh: Optional[torch.Tensor],
    ) -> Tuple[GroupStep, GroupedRows, torch.Tensor]:
        """What the output reads: the group's rows at ``read``, or a (u, max_dim) buffer of the
        rows as they read when ``fresh`` rows (not stored) replace some of them."""
        stored = self.storage.rows
        if fresh_index is None or fresh_index.numel() == 0:
            return step, stored, read
        assert fresh is not None
        rows = stored.gather(step.table_ids, read, self.max_dim)
        rows[fresh_index] = fresh[:, : self.max_dim]
        u = step.keys.numel()
        shared = GroupedRows.shared(rows.reshape(-1), u, self.max_dim, self.dims)
        return step, shared, torch.arange(u, device=self.device)

    def prefetch(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch_size: int,
        check: Optional[OffsetsCheck] = None,
    ) -> None:
        """Place the batch's keys of the tables that train, as a training forward would; keys of
        an admission table only when already stored (admission decides about new ones later).
        Keys of cached tables are pinned in the cache until the forward that consumes this
        prefetch (see :mod:`dynamicemb_core.storage.grouped_cache`). ``check``: as in
        :meth:`lookup`."""
        if not self.any_trains:
            if check is not None:
                check.verify()
            return
        storage = self.storage
        keys, utids, _, _, counts = self._unique(indices, offsets, batch_size, check, False)
        storage.pin_pending()  # the forwards in flight first: the bucket check below counts them
        keep: Optional[torch.Tensor] = None
        if not self._plain:
            keep = self._trains_dev[utids]
            gated = [t for t, a in enumerate(self.admission) if a is not None]
            if gated:
                ids = torch.tensor(gated, dtype=torch.int64, device=self.device)
                found = storage.find_all(keys, utids)[1]
                if storage.has_cache:
                    found = storage.read_through(keys, utids, found)[0]
                keep &= found | ~torch.isin(utids, ids)
        if storage.has_cache:
            fits = storage.pinnable(keys, utids)
            keep = fits if keep is None else keep & fits
        if keep is not None:
            idx = keep.nonzero().squeeze(1)
            keys, utids = keys[idx], utids[idx]
            counts = torch.bincount(utids, minlength=self.num_tables).tolist()
        # a prefetch is no access: LFU counts grow by the batch's accesses in its forward
        none = torch.zeros_like(keys) if storage.counts_accesses else None
        acquire = storage.acquire_all(keys, utids, counts, self._row_init(), key_counts=none)
        if storage.has_cache:
            storage.pin_prefetch(utids, acquire.slots)

    @ranged("dynamicemb::gather")
    def output(
        self, step: GroupStep, rows: GroupedRows, slots: torch.Tensor, mode: Optional[int]
    ) -> torch.Tensor:
        """The pooled (B, total_dim) or sequence (n, D) output. A training forward over host
        rows stages them for its backward (``GroupedRows.stage``) and reads them from there."""
        if step.slots is not None and rows.stages:
            step.staged = rows.stage(step.table_ids, slots)
        if mode is None:
            return rows.gather(
                step.table_ids, slots, self.dims[0], inverse=step.inverse, staged=step.staged
            )
        return rows.pooled_gather(
            step.table_ids,
            slots,
            step.inverse,
            step.offsets,
            step.weights,
            self.feature_tables,
            self.d_offsets,
            mode,
            step.batch_size,
            self.total_dim,
            staged=step.staged,
        )

    # ---- backward -------------------------------------------------------------------------------
    @ranged("dynamicemb::reduce_update")
    def apply_grads(
        self, step: GroupStep, grad_out: torch.Tensor, mode: Optional[int], it: int
    ) -> None:
        """One reduction and fused update of every trained row (keys since evicted are skipped)."""
        assert step.slots is not None
        storage = self.storage
        try:
            grads = grad_out if grad_out.dtype == torch.float32 else grad_out.float()
            self._update(step, grads, mode, it)
        finally:
            step.staged = None
            if step.pins is not None:
                storage.unpin(step.pins)

    def _update(
        self, step: GroupStep, grad_out: torch.Tensor, mode: Optional[int], it: int
    ) -> None:
        """The fused update at the forward's slots (pinned since: still the keys' slots); rows of
        backed pairs are read, updated and written in their backing store first."""
        storage = self.storage
        assert step.slots is not None
        a = self.optimizer_args
        hyper = (
            lookup_ops.OPTIMIZER_CODES[self.kind.value],
            float(a.learning_rate),
            float(a.eps),
            float(a.beta1),
            float(a.beta2),
            float(a.weight_decay),
            int(a.weight_decay_mode),
            max(1, int(it)),
            self.rounding_seed,
        )
        pool = lookup_ops.POOL_NONE if mode is None else mode
        bags = (
            grad_out,
            step.inverse,
            step.offsets,
            step.weights,
            self.feature_tables,
            self.d_offsets,
            pool,
            step.batch_size,
        )
        if step.backed is None:
            storage.rows.reduce_update(
                step.keys,
                step.table_ids,
                step.slots,
                *bags,
                self.max_dim,
                hyper,
                frozen=self._frozen,
                order=step.order,
                key_counts=step.key_counts,
                staged=step.staged,
            )
            return
        grads = storage.rows.reduce_grads(
            grad_out.contiguous(), *bags[1:], step.slots.numel(), self.max_dim
        )
        b = step.backed
        # the backing store first: when it fails, no row of this update has been written
        storage.update_backed(step.keys[b], step.table_ids[b], grads[b], hyper, self.dims)
        storage.rows.update(
            step.keys, step.table_ids, step.slots, grads, hyper, self._frozen, step.staged
        )

    def weight_grads(self, step: GroupStep, grad_out: torch.Tensor) -> torch.Tensor:
        """(n,) gradient of each per-sample weight: its row (as read) dotted with its bag's
        output gradient (SUM pooling)."""
        assert step.weight_rows is not None
        n = step.inverse.numel()
        B = step.batch_size
        bags = torch.arange(step.offsets.numel() - 1, device=self.device)
        bag = torch.repeat_interleave(bags, step.offsets.diff(), output_size=n)
        feature = bag // max(B, 1)
        first = self.d_offsets[feature]
        cols = self._cols.unsqueeze(0)
        inside = cols < self._dims_dev[self.feature_tables[feature]].unsqueeze(1)
        padded = torch.nn.functional.pad(grad_out.float(), (0, self.max_dim))
        flat = (bag % max(B, 1)).unsqueeze(1) * padded.size(1) + first.unsqueeze(1) + cols
        grads = padded.reshape(-1)[flat]
        rows = step.weight_rows[step.inverse]
        return torch.where(inside, rows * grads, 0.0).sum(1)


class SafeChecks:
    """What a step's backward needs of its module, as plain values: the optimizer step it reads
    (``iteration``, a 0-d int64 CPU tensor the module counts in, FBGEMM's ``iter``: the value at
    backward time, as FBGEMM's backward reads it) and each table's ``safe_check_mode`` applied to
    the unplaced keys its placement's outcome reports (``__call__``).

    Args:
        names: the tables' names (the module's list).
        options: their options (the module's list: a mode changed there applies).
    """

    def __init__(self, names: List[str], options: List[Any]) -> None:
        self.names = names
        self.options = options
        self.iteration = torch.zeros((), dtype=torch.int64)
        self._report = UnplacedKeyReport()

    def __call__(self, unplaced: Optional[List[int]], stacklevel: int = 4) -> None:
        """Raise or warn (each table's mode) for the unplaced keys per table (None: none)."""
        if unplaced is not None:
            for t, count in enumerate(unplaced):
                mode = self.options[t].safe_check_mode
                self._report(self.names[t], mode, count, stacklevel=stacklevel)


class GroupedLookupFunction(torch.autograd.Function):
    """Forward: the group's output (computed by the caller, :meth:`TableGroup.output`, passed in
    ``source``). Backward: the fused update, and the weights' gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        dummy: torch.Tensor,
        weights: Optional[torch.Tensor],
        group: TableGroup,
        step: GroupStep,
        source: Tuple[GroupedRows, torch.Tensor, torch.Tensor],
        mode: Optional[int],
        checks: "SafeChecks",
    ) -> torch.Tensor:
        # ``out``: group.output(step, rows, slots, mode), launched by the caller before its
        # host-side bookkeeping so that the device reads the rows while the host works
        rows, slots, out = source
        if weights is not None:
            # the rows as this forward read them (the backward's update changes them in place)
            step.weight_rows = rows.gather(step.table_ids, slots, group.max_dim, staged=step.staged)
        ctx.group, ctx.step, ctx.mode, ctx.checks = group, step, mode, checks
        ctx.weights_meta = None if weights is None else weights.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        group, step = ctx.group, ctx.step
        grad_w = None
        if ctx.weights_meta is not None:
            grad_w = group.weight_grads(step, grad_out).to(ctx.weights_meta)
            step.weight_rows = None
        if step.slots is not None:
            group.apply_grads(step, grad_out, ctx.mode, int(ctx.checks.iteration))
            # the forward's placement outcome, when it was not waited for: its copy has long
            # finished by now (the update is queued behind it), the host reads it for the
            # tables' safe check
            ctx.checks(group.storage.take_unplaced())
        ctx.step = None
        return None, grad_w, None, None, None, None, None
