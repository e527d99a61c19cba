"""CachedStorage: a device cache table in front of a next tier (a host table or any Storage).

Training lookups make keys resident in the cache in one table call (hits keep their slots); misses
are read from the next tier, or initialized when no tier has them. Keys the cache evicts to make
room are written to the next tier with their rows and scores (spill), so only the last tier ever
drops a key. A key the cache cannot place (its bucket is taken by this batch) lives in the next tier
for this step and is updated there. ``flush()`` writes every cached row back, pinned rows included.
``prefetch`` pins keys in the cache until the forward that consumes them (see the class docstring).

The next tier is addressed only through the multi-table :class:`~dynamicemb_core.types.Storage`
contract (a per-table storage, such as a host table, through ``as_storage``'s adapter), so any
third-party storage works here.

**Failure atomicity.** The next tier may fail (a Redis server killed, a disk full). Every call that
moves keys between the tiers either completes or leaves both tiers as they were for every row: a
placement changes the cache first (one hash-table call gives the slots and the victims), then reads
the misses from the next tier and writes the victims and the keys without a cache slot there in one
call; when any of those next-tier calls raises, the placement is undone (the new keys are erased
from the cache, each victim is put back at its slot with its row and scores) before the error
propagates as :class:`StorageTierError`. Updates write the next tier first and the cache only after
it acknowledged; ``insert``/``erase`` change the next tier before dropping the cache's copy; ``load``
clears the cache only after the next tier loaded. So the cache never points a key at another key's
row and a row the cache held is never dropped before the next tier holds it. What a failed call may
leave behind: the hit keys' scores touched, and rows the next tier wrote before it failed (the same
values the cache holds, or a new key's initial row).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbTableOptions, EvictedItemMode
from dynamicemb_core.plugins.storage_adapter import (
    AnyStorage,
    as_storage,
    erase_in_table,
    export_table,
    find_in_table,
    insert_in_table,
    size_of_table,
)
from dynamicemb_core.plugins.storage_checks import (
    check_erase,
    check_find,
    check_insert,
    check_table_id,
)
from dynamicemb_core.storage.device import DeviceStorage
from dynamicemb_core.storage.pins import PinCounts
from dynamicemb_core.storage.tier import (
    HOME_BACKING,
    HOME_NONE,
    LookupTier,
    RowInit,
    RowUpdate,
    TierRows,
)
from dynamicemb_core.table.hashing import buckets_of_tensor
from dynamicemb_core.table.results import InsertResult
from dynamicemb_core.types import (
    DynamicEmbError,
    DynamicEmbWarning,
    MemoryType,
    StorageTableSpec,
)

__all__ = ["CachedStorage", "StorageTierError"]


class StorageTierError(DynamicEmbError):
    """A call to a cache's next tier failed; the cache was left as it was before the call.

    The next tier's own exception is the ``__cause__``. Once the store is back, the same call can be
    repeated (the module keeps working); rows acknowledged before the failure are intact.
    """


class CachedStorage(LookupTier):
    """A cache of ``cache_capacities[t]`` rows per table on ``device`` over ``backing``.

    **Prefetch pinning.** A pipelined trainer prefetches batches i+1, i+2 while batch i runs
    (TorchRec's prefetch pipeline); a key a prefetch brought in must still be cached when its
    forward runs. Each table keeps per-key pin counts (:class:`PinCounts`): ``prefetch`` adds one
    to each of its keys, the training lookup (``acquire``, the forward) takes one off each of its
    keys. Every call that places keys in the cache passes the pinned keys along with its own: the
    hash table never evicts a key present in the call (table_design.md, rules 2 and 4), so pinned
    keys are never eviction candidates, whatever the score policy or score function. The touch this
    gives them is undone: their score words are read before the call and written back after it
    (``insert`` with ``scores``), so a pinned key keeps its true score for when it is released.
    Cost: a placing call carries the pinned keys too (a few batches' unique keys).

    A prefetch is checked before anything is written: per cache bucket, the pinned keys plus the
    prefetch's new keys must fit in ``bucket_capacity`` slots. When they do not, the default
    **degrades explicitly**: the keys that fit are pinned (in input order per bucket), the others
    are left to the forward, which reads them from the next tier like any cache miss; a
    ``DynamicEmbWarning`` names the table and the shortfall, and :meth:`prefetch_skipped` counts
    them. With ``strict_prefetch=True`` the prefetch raises ``DynamicEmbError`` instead, before
    writing. A forward's own keys that find no room beside pinned keys are served by the next tier
    for that step (as before), never by evicting a pinned key.

    A training forward releases the pins of the prefetched batch it consumes: the oldest
    outstanding prefetch whose pinned keys all appear among the forward's (TorchRec's pipeline
    consumes them in order). A forward that was not prefetched matches none and releases nothing,
    so the pins later batches hold on shared keys stay (see
    :class:`~dynamicemb_core.storage.pins.PinCounts`). :meth:`release_pins` drops all pins (e.g.
    when prefetched batches are abandoned). ``insert``/``erase`` through the Storage ABC unpin
    their keys and ``load`` unpins everything. A prefetch between a forward and its backward that
    evicted (spilled) some of the batch's keys moves the cache's ``placement_epoch``, so the batched
    module looks the keys up again before ``update``, which never writes another key's row.

    Args:
        tables: the logical tables, in table-id order (same rows as in ``backing``).
        device: the cache's device.
        backing: the next tier; ``backing_ids[t]`` is table t's id in it.
        cache_capacities: slots of the cache per table (0: no cache, every key goes to ``backing``).
        table_options: per table options for the cache's bucket layout and score strategy.
        backing_ids: table ids in ``backing`` (default: the same ids).
        strict_prefetch: raise instead of degrading when a prefetch's keys cannot all be pinned.
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str,
        backing: AnyStorage,
        cache_capacities: Sequence[int],
        *,
        table_options: Optional[Sequence[Optional[DynamicEmbTableOptions]]] = None,
        backing_ids: Optional[Sequence[int]] = None,
        strict_prefetch: bool = False,
    ) -> None:
        super().__init__(tables, device)  # Storage names the device
        self.strict_prefetch = bool(strict_prefetch)
        n = len(self.tables)
        self.backing = backing
        self.backing_ids = list(backing_ids) if backing_ids is not None else list(range(n))
        self.cache_capacities = [int(c) for c in cache_capacities]
        if len(self.cache_capacities) != n or len(self.backing_ids) != n:
            raise ValueError(
                f"CachedStorage: cache_capacities and backing_ids need one entry per table ({n})"
            )
        self.cache: Optional[DeviceStorage] = None
        if all(c > 0 for c in self.cache_capacities):
            self.cache = DeviceStorage(
                tables,
                self.device,
                table_options=table_options,
                evicted_item_mode=EvictedItemMode.DISCARD,
                capacities=self.cache_capacities,
            )
        elif any(c > 0 for c in self.cache_capacities):
            raise ValueError(
                "CachedStorage: either every table has a cache (capacity > 0) or none, got "
                f"{self.cache_capacities}"
            )
        self._spilled = [0] * n
        self._pins: List[PinCounts] = [PinCounts(self.device) for _ in range(n)]
        self._prefetch_skipped = [0] * n

    # ---- helpers -----------------------------------------------------------------------------
    @property
    def backing(self) -> AnyStorage:
        """The next tier as given (a plugin Storage, or a per-table storage such as a host table)."""
        return self._backing

    @backing.setter
    def backing(self, value: AnyStorage) -> None:
        self._backing = value
        self._store = as_storage(value)  # what the calls go through: the multi-table contract

    def _tier_error(self, table_id: int, what: str, exc: BaseException) -> StorageTierError:
        name = self.tables[table_id].name
        return StorageTierError(
            f"table {name!r}: the next tier ({type(self.backing).__name__}) failed to {what}: "
            f"{type(exc).__name__}: {exc}. The cache and the rows acknowledged before this call "
            "are unchanged; retry once the store is back"
        )

    def _backing_find(
        self, table_id: int, keys: torch.Tensor, what: str = "find keys"
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bid = self.backing_ids[table_id]
        found, rows, scores = self._backing_call(
            what, find_in_table, self._store, bid, keys.to(self._store.device), table_id=table_id
        )
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def _backing_insert(
        self,
        table_id: int,
        keys: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
        what: str = "write rows",
    ) -> None:
        if keys.numel() == 0:
            return
        dev, bid = self.backing.device, self.backing_ids[table_id]
        args = (self._store, bid, keys.to(dev), rows.to(dev), scores.to(dev))
        what = f"{what} ({keys.numel()} keys)"
        self._backing_call(what, insert_in_table, *args, table_id=table_id)

    def _backing_call(
        self, what: str, fn: Callable[..., Any], *args: Any, table_id: int = 0
    ) -> Any:
        """``fn(*args)`` on the next tier, its failure raised as :class:`StorageTierError`."""
        try:
            return fn(*args)
        except StorageTierError:
            raise
        except Exception as exc:
            raise self._tier_error(table_id, what, exc) from exc

    def _now_scores(self, table_id: int, n: int) -> torch.Tensor:
        """Scores for rows written straight to the next tier: the cache's current score, else 0."""
        num = self.tables[table_id].num_scores
        value = 0
        if self.cache is not None:
            value = int(self.cache.table.get_score(table_id))
        return torch.full((n, num), value, dtype=torch.int64, device=self.device)

    # ---- LookupTier -------------------------------------------------------------------------
    def lookup(self, table_id: int, keys: torch.Tensor, *, touch: bool) -> TierRows:
        n = keys.numel()
        spec = self.tables[table_id]
        rows = torch.zeros((n, spec.row_width), dtype=spec.dtype, device=self.device)
        homes = torch.full((n,), HOME_NONE, dtype=torch.int64, device=self.device)
        found = torch.zeros(n, dtype=torch.bool, device=self.device)
        if self.cache is not None:
            hit = self.cache.lookup(table_id, keys, touch=touch)
            rows, found = hit.full_rows(), hit.found.clone()
            homes = torch.where(hit.found, hit.homes, HOME_NONE)
        miss = (~found).nonzero().squeeze(1)
        if miss.numel():
            bfound, brows, _ = self._backing_find(table_id, keys[miss])
            got = miss[bfound]
            rows[got] = brows[bfound].to(rows.dtype)
            found[got] = True
            homes[got] = HOME_BACKING
        return TierRows(homes=homes, found=found, rows=rows)

    def acquire(
        self, table_id: int, keys: torch.Tensor, init: RowInit, *, with_rows: bool = True
    ) -> TierRows:
        """Make the forward's unique keys resident, then release one pin of each (see class)."""
        if self.cache is None:
            return self._acquire_in_backing(table_id, keys, init)
        placed = self._place(table_id, keys, init)
        self._pins[table_id].consume(keys)
        return placed

    def _place(self, table_id: int, keys: torch.Tensor, init: RowInit) -> TierRows:
        """Place unique keys in the cache (pinned keys protected); misses read or initialized.

        Failure-atomic (see the module docstring): when the next tier raises, the placement is
        undone before the error propagates.
        """
        assert self.cache is not None
        res = self._find_or_insert_protected(table_id, keys)
        try:
            return self._fill_placed(table_id, keys, init, res)
        except BaseException:
            self._undo_place(table_id, keys, res)
            raise

    def _fill_placed(
        self, table_id: int, keys: torch.Tensor, init: RowInit, res: InsertResult
    ) -> TierRows:
        """Rows of the placed keys; victims and keys without a cache slot go to the next tier."""
        assert self.cache is not None
        slots, is_new = res.slots, res.is_new
        rows = self.cache.read_rows(table_id, slots)
        found = ~is_new
        need = (is_new | (slots < 0)).nonzero().squeeze(1)
        homes = slots.clone()
        unplaced = need[:0]
        if need.numel():
            # Read misses from the next tier before spilling, so a spill that makes the next tier
            # evict cannot drop a key this call is about to read.
            bfound, brows, _ = self._backing_find(table_id, keys[need], "read the batch's misses")
            fresh_idx = need[~bfound]
            need_rows = brows.to(rows.dtype)
            if fresh_idx.numel():
                need_rows[~bfound] = init(keys[fresh_idx]).to(rows.dtype)
            rows[need] = need_rows
            found[need] = bfound
            placed = slots[need] >= 0
            self.cache.write_rows(table_id, slots[need][placed], need_rows[placed])
            unplaced = need[~placed]
        # One write to the next tier: the victims (spill) and the keys the cache had no room for
        # (they stay in, or enter, the next tier for this step). Keys of one call never evict
        # each other, so a spill cannot push out a key this call leaves in the next tier.
        ev = res.evicted
        victims = int(ev.keys.numel())
        if victims or unplaced.numel():
            out_keys, out_rows = [keys[unplaced]], [rows[unplaced]]
            out_scores = [self._now_scores(table_id, unplaced.numel())]
            if victims:
                assert isinstance(ev.rows, torch.Tensor)
                out_keys.append(ev.keys)
                out_rows.append(ev.rows.to(rows.dtype))
                out_scores.append(ev.scores)
            self._backing_insert(
                table_id,
                torch.cat(out_keys),
                torch.cat(out_rows),
                torch.cat(out_scores),
                "write the evicted rows and the rows without a cache slot",
            )
        if unplaced.numel():
            homes[unplaced] = HOME_BACKING
            # The next tier may have had no room either (a full host bucket): those keys have
            # no home at all, which the lookup reports through safe_check_mode.
            stored, _, _ = self._backing_find(
                table_id, keys[unplaced], "confirm the rows it stored"
            )
            homes[unplaced[~stored]] = HOME_NONE
            rows[unplaced[~stored]] = 0  # a key no tier could hold reads as zeros (the seed)
        self._spilled[table_id] += victims
        return TierRows(homes=homes, found=found, rows=rows)

    def _undo_place(self, table_id: int, keys: torch.Tensor, res: InsertResult) -> None:
        """Undo one ``_find_or_insert_protected``: erase its new keys, put its victims back.

        Each victim returns to the slot it had (its new key was just erased from it) with the row
        and scores it had, so every key the cache held before the call reads the same row again.
        """
        assert self.cache is not None
        table = self.cache.table
        new = keys[res.is_new & (res.slots >= 0)]
        if new.numel():
            table.erase(new, table_id)
        ev = res.evicted
        if ev.keys.numel():
            assert isinstance(ev.rows, torch.Tensor)  # one table, one row width
            table.insert_at(table_id, ev.keys, ev.slots, rows=ev.rows, scores=ev.scores)

    def _find_or_insert_protected(self, table_id: int, keys: torch.Tensor) -> InsertResult:
        """``find_or_insert`` of unique ``keys`` with every pinned key in the call, scores kept.

        Keys present in a call are never evicted by it, so adding the pinned keys that are not
        already among ``keys`` takes them out of the eviction candidates; their score words are
        restored afterwards so the extra touch leaves no trace. Only the first ``n`` results (the
        caller's keys) are returned, with everything the call evicted.
        """
        assert self.cache is not None
        table, pins = self.cache.table, self._pins[table_id]
        others = pins.keys[~torch.isin(pins.keys, keys)] if len(pins) else pins.keys
        if others.numel() == 0:
            return table.find_or_insert(keys, table_id)
        held = table.find(others, table_id)
        if not bool(held.found.all()):  # left the cache another way: nothing to protect
            pins.drop(others[~held.found])
        others, saved = others[held.found], held.scores[held.found]
        res = table.find_or_insert(torch.cat([keys, others]), table_id)
        table.insert(others, table_id, scores=saved)
        table.counters.discount_hits(table_id, others.numel())  # stored, along for protection
        n = keys.numel()
        return InsertResult(res.slots[:n], res.is_new[:n], res.evicted)

    def _acquire_in_backing(self, table_id: int, keys: torch.Tensor, init: RowInit) -> TierRows:
        found, rows, _ = self._backing_find(table_id, keys)
        fresh = (~found).nonzero().squeeze(1)
        rows = rows.clone()
        if fresh.numel():
            new_rows = init(keys[fresh]).to(rows.dtype)
            rows[fresh] = new_rows
            self._backing_insert(
                table_id, keys[fresh], new_rows, self._now_scores(table_id, fresh.numel())
            )
        homes = torch.full_like(keys, HOME_BACKING)
        return TierRows(homes=homes, found=found, rows=rows)

    def update(
        self,
        table_id: int,
        keys: torch.Tensor,
        homes: torch.Tensor,
        grads: torch.Tensor,
        apply: RowUpdate,
    ) -> None:
        # The next tier's rows first: when it fails, no row of this update has been written.
        backed = (homes == HOME_BACKING).nonzero().squeeze(1)
        if backed.numel():
            bkeys = keys[backed]
            found, rows, scores = self._backing_find(table_id, bkeys, "read rows to update")
            ok = found.nonzero().squeeze(1)
            if ok.numel():
                rows = rows[ok].contiguous()
                idx = torch.arange(ok.numel(), device=self.device)
                apply(rows, idx, grads[backed][ok].contiguous())
                self._backing_insert(table_id, bkeys[ok], rows, scores[ok], "write updated rows")
        if self.cache is not None:
            # ``homes`` are current: the caller looked the keys up again if the cache's placement
            # epoch moved since it got them (a prefetch in between may have spilled some keys to
            # the next tier, or cached keys the forward read from there).
            self.cache.update(
                table_id, keys, torch.where(homes >= 0, homes, HOME_NONE), grads, apply
            )

    def placement_epoch(self, table_id: int) -> Optional[int]:
        # Cache slots go stale only through cache calls; next-tier homes are looked up by key.
        return self.cache.placement_epoch(table_id) if self.cache is not None else None

    def prefetch(self, table_id: int, keys: torch.Tensor, init: RowInit) -> None:
        """Cache ``keys`` and pin each until the forward that consumes it (see the class).

        Raises:
            DynamicEmbError: with ``strict_prefetch``, when some cache bucket cannot hold its
                pinned keys and this prefetch's keys; nothing is written then.
        """
        if self.cache is None:
            self._acquire_in_backing(table_id, keys, init)
            return
        keys = self._pinnable(table_id, torch.unique(keys))
        if keys.numel() == 0:
            self._pins[table_id].add(keys)  # an outstanding batch all the same (see PinCounts)
            return
        placed = self._place(table_id, keys, init)
        self._pins[table_id].add(keys[placed.homes >= 0])

    def _pinnable(self, table_id: int, keys: torch.Tensor) -> torch.Tensor:
        """The keys of a prefetch that fit beside the pinned keys in their cache buckets.

        Raises (``strict_prefetch``) or warns and drops the rest; see the class docstring.
        """
        assert self.cache is not None
        pins = self._pins[table_id]
        fresh_idx = (~pins.is_pinned(keys)).nonzero().squeeze(1)
        if fresh_idx.numel() == 0:
            return keys
        width = self.cache.table.bucket_capacity(table_id)
        num_buckets = self.cache.table.capacity(table_id) // width
        buckets = buckets_of_tensor(keys[fresh_idx], num_buckets)
        pinned = torch.bincount(buckets_of_tensor(pins.keys, num_buckets), minlength=num_buckets)
        fits = _rank_in_group(buckets) < (width - pinned)[buckets]
        if bool(fits.all()):
            return keys
        wanted = pinned + torch.bincount(buckets, minlength=num_buckets)
        worst = int(torch.argmax(wanted))
        short = int((~fits).sum())
        name = self.tables[table_id].name
        message = (
            f"table {name!r}: prefetch of {keys.numel()} keys needs {int(wanted[worst])} pinned "
            f"rows in cache bucket {worst}, which has {width} slots ({int(pinned[worst])} pinned "
            f"by earlier prefetches; cache capacity {self.cache.table.capacity(table_id)}); "
            f"{short} keys cannot be pinned. Run the forwards of earlier prefetched batches "
            "first, prefetch fewer batches ahead, or raise the cache size (local_hbm_for_values)"
        )
        if self.strict_prefetch:
            raise DynamicEmbError(message)
        warnings.warn(
            message + "; those keys are not prefetched (the forward reads them as misses)",
            DynamicEmbWarning,
            stacklevel=4,
        )
        self._prefetch_skipped[table_id] += short
        keep = torch.ones_like(keys, dtype=torch.bool)
        keep[fresh_idx[~fits]] = False
        return keys[keep]

    def pin_counts(self, table_id: int, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64: outstanding prefetches holding each key (0: not pinned)."""
        check_table_id(self.tables, table_id)
        return self._pins[table_id].count(keys.to(self.device))

    def pinned(self, table_id: int) -> int:
        """Number of keys of the table pinned in the cache now."""
        check_table_id(self.tables, table_id)
        return len(self._pins[table_id])

    def release_pins(self, table_id: Optional[int] = None) -> None:
        """Drop every pin of one table (or all): the keys stay cached but may be evicted."""
        for t in range(len(self.tables)) if table_id is None else [table_id]:
            check_table_id(self.tables, t)
            self._pins[t].clear()

    def prefetch_skipped(self, table_id: int) -> int:
        """Prefetched keys left unpinned so far because their cache bucket was full of pins."""
        return self._prefetch_skipped[table_id]

    def flush(self) -> None:
        """Write every cached row back to the next tier, then flush it."""
        if self.cache is not None:
            for t in range(len(self.tables)):
                for keys, rows, scores in self.cache.export(t):
                    self._backing_insert(t, keys, rows, scores, "write back the cached rows")
        self._backing_call("flush", self._store.flush)

    def evictions(self, table_id: int) -> int:
        counter = getattr(self.backing, "evictions", None)
        return int(counter(self.backing_ids[table_id])) if callable(counter) else 0

    def metrics(self, table_id: int) -> Optional[torch.Tensor]:
        """Hits and misses of the cache; placed / evicted / unplaced of the next tier when it
        keeps counters (a host table), else of the cache."""
        from dynamicemb_core.table.metrics import EVICTED, PLACED, UNPLACED

        own = self.cache.metrics(table_id) if self.cache is not None else None
        reader = getattr(self.backing, "metrics", None)
        last = reader(self.backing_ids[table_id]) if callable(reader) else None
        if own is None:
            return last
        if last is not None:
            cols = [PLACED, EVICTED, UNPLACED]
            own[cols] = last[cols].to(own.device)
        return own

    def reset_metrics(self, table_id: int) -> None:
        if self.cache is not None:
            self.cache.reset_metrics(table_id)
        reset = getattr(self.backing, "reset_metrics", None)
        if callable(reset):
            reset(self.backing_ids[table_id])

    def spills(self, table_id: int) -> int:
        """Keys the cache has written to the next tier to make room."""
        return self._spilled[table_id]

    def capacity(self, table_id: int) -> int:
        return self.cache.capacity(table_id) if self.cache is not None else 0

    def pop_evicted_keys(self, table_id: int) -> torch.Tensor:
        pop = getattr(self.backing, "pop_evicted_keys", None)
        if callable(pop):
            return pop(self.backing_ids[table_id])
        return super().pop_evicted_keys(table_id)

    def device_table(self) -> Any:
        return self.cache.table if self.cache is not None else None

    # ---- Storage ABC (the union of both tiers; the cache holds the fresher row) --------------
    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_find(self.tables, table_id, keys)
        keys = keys.to(self.device)
        num = self.tables[table_id].num_scores
        res = self.lookup(table_id, keys, touch=False)
        scores = torch.zeros((keys.numel(), num), dtype=torch.int64, device=self.device)
        if bool(res.found.any()):
            # next tier first, then the cache's fresher words where it holds the key
            _, _, bscores = self._backing_find(table_id, keys)
            scores = torch.where(res.found.unsqueeze(1), bscores, scores)
        if self.cache is not None:
            c = self.cache.table.find(keys, table_id)
            scores[c.found] = c.scores[c.found]
        return res.found, res.full_rows(), scores

    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        check_insert(self.tables, table_id, keys, rows, scores)
        keys = keys.to(self.device)
        # The next tier first: when it fails, the cache still holds its (fresher) copies.
        self._backing_insert(table_id, keys, rows, scores)
        if self.cache is not None:
            self.cache.erase(table_id, keys)
            self._pins[table_id].drop(keys)

    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        check_erase(self.tables, table_id, keys)
        keys = keys.to(self.device)
        # The next tier first: a key erased from the cache only could read a stale row from it.
        bid, bkeys = self.backing_ids[table_id], keys.to(self.backing.device)
        self._backing_call("erase keys", erase_in_table, self._store, bid, bkeys, table_id=table_id)
        if self.cache is not None:
            self.cache.erase(table_id, keys)
            self._pins[table_id].drop(keys)

    def size(self, table_id: int) -> int:
        """Distinct keys over both tiers (flushes the cache's view into the count)."""
        check_table_id(self.tables, table_id)
        self.flush()
        bid = self.backing_ids[table_id]
        return int(
            self._backing_call("count keys", size_of_table, self._store, bid, table_id=table_id)
        )

    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        check_table_id(self.tables, table_id)
        self.flush()
        try:
            yield from export_table(self._store, self.backing_ids[table_id], batch_size)
        except StorageTierError:
            raise
        except Exception as exc:
            raise self._tier_error(table_id, "export rows", exc) from exc

    def dump(self, path: str) -> None:
        """Write cached rows back, then let the next tier dump itself."""
        self.flush()
        self._backing_call("dump", self._store.dump, path)

    def load(self, path: str) -> None:
        """Load the next tier; the cache starts empty and fills on lookups.

        The cache is cleared only once the next tier has loaded: when the load fails, the cached
        rows (possibly fresher than the next tier's) are kept.
        """
        self._backing_call("load", self._store.load, path)
        if self.cache is not None:
            self.cache.table.clear()
            self.release_pins()

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        mine = self.cache.memory_usage(mem_type) if self.cache is not None else 0
        return mine + self._store.memory_usage(mem_type)

    def close(self) -> None:
        self._store.close()


def _rank_in_group(groups: torch.Tensor) -> torch.Tensor:
    """(n,) int64: how many earlier entries (in input order) have the same group value."""
    order = torch.argsort(groups, stable=True)
    ordered = groups[order]
    first = torch.searchsorted(ordered, ordered)  # leftmost position of each value
    rank = torch.empty_like(groups)
    rank[order] = torch.arange(groups.numel(), device=groups.device) - first
    return rank
