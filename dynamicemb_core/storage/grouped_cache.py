"""The cached tables of a group: a device cache in the group's hash table over a backing store.

A cached table (``caching=True``, or ``external_storage``) is a table of the group like the others:
its keys live in the group's one :class:`~dynamicemb_core.table.ScoredHashTable` (capacity = the
cache's rows, never grown, evictions reported) and its cached rows in the group's
:class:`~dynamicemb_core.storage.grouped_rows.GroupedRows`. What makes it a cache is
:class:`CacheTier`, which the group's ``acquire_all`` calls once per step for all cached tables:

- the misses of the step (new keys of the cache, and keys the cache had no room for) are read from
  the backing store in one call (:class:`~dynamicemb_core.storage.backing.BackingStores`);
- the keys the insert evicted from the cache (victims) and the new keys the cache had no room for
  are written to the backing store in one call, so only the backing store ever drops a key;
- keys without a cache slot live in the backing store for this step (``backed``): the forward reads
  their rows from there, the backward updates them there (read, update, write).

A table with no cache (``external_storage`` with ``local_hbm_for_values=0``) never enters the hash
table: all its keys are backed.

**Failure atomicity.** The backing store may fail (a Redis server killed, a disk full). The step
changes the cache first (one insert gives slots and victims); the victims' rows are still in the
buffer, untouched, while the backing store is read and written. When a backing call raises, the
cache placement is undone (the new cached keys erased, each victim put back at its slot with its
scores; its row never moved) before :class:`StorageTierError` propagates; device tables of the same
group keep their placement, with their new rows initialised. The backward writes the backing store
first and the cache only after it acknowledged.

**Pins.** Prefetched pairs are pinned in the hash table (a per-slot count the insert kernels
respect: a pinned slot is never a victim) until the forward that consumes the prefetch: the oldest
outstanding prefetch whose pinned pairs all appear among the forward's pairs (TorchRec's pipeline
consumes prefetches in order); a forward that matches none releases none.
"""

from __future__ import annotations

import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Optional, Sequence, Tuple

import torch

from dynamicemb_core.storage.backing import BackingStores, fit_columns
from dynamicemb_core.table.hashing import buckets_of_tensor
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning

__all__ = ["CacheTier", "PinnedPairs", "Placement"]


class PinnedPairs:
    """``(table id, slot)`` pairs holding one pin each; the group remaps their slots on growth.

    Attributes:
        table_ids, slots: (p,) int64 on the device (slot -1: nothing pinned there).
        pinned: the pins are in the table (a forward's pairs wait for the next placing call).
        released: the pins were given back (or will never be taken).
    """

    def __init__(self, table_ids: torch.Tensor, slots: torch.Tensor, pinned: bool = True) -> None:
        self.table_ids = table_ids
        self.slots = slots
        self.pinned = pinned
        self.released = False

    def ids(self, slot_ids: torch.Tensor) -> torch.Tensor:
        """(p,) int64 one number per pair: ``slot_ids`` is the (T,) first global id of each
        table (pairs of one table and slot get one number); -1 for slot -1."""
        return torch.where(self.slots >= 0, slot_ids[self.table_ids] + self.slots, -1)


@dataclass
class Placement:
    """What a step's insert did, as the cache needs it (u unique pairs).

    Attributes:
        keys, table_ids: (u,) the pairs; slots: (u,) their cache slots (-1: none);
        is_new: (u,) placed by this call; evicted: the insert's evicted items.
    """

    keys: torch.Tensor
    table_ids: torch.Tensor
    slots: torch.Tensor
    is_new: torch.Tensor
    evicted: Any


class CacheTier:
    """The cache side of a group: backing stores, spills, prefetch pins.

    Args:
        group: the :class:`~dynamicemb_core.storage.grouped.GroupedDeviceStorage`.
        backing: the group's backing stores.
        cached, direct: per group table, whether it is cached / has no cache at all.
        strict_prefetch: raise instead of degrading when a prefetch's keys cannot all be pinned.
    """

    def __init__(
        self,
        group: Any,
        backing: BackingStores,
        cached: Sequence[bool],
        direct: Sequence[bool],
        strict_prefetch: bool = False,
    ) -> None:
        # a proxy: the group owns this tier, and a strong reference back would be a cycle that
        # keeps the group's rows allocated after ``del`` until the cycle collector runs
        self.group = weakref.proxy(group)
        self.backing = backing
        self.device = group.device
        T = len(cached)
        self.cached = [bool(c) for c in cached]
        self.direct = [bool(d) for d in direct]
        self.any_direct = any(self.direct)
        self.cached_dev = torch.tensor(self.cached, dtype=torch.bool, device=self.device)
        self.direct_dev = torch.tensor(self.direct, dtype=torch.bool, device=self.device)
        self.strict_prefetch = bool(strict_prefetch)
        self.spills = [0] * T
        self.prefetch_skipped = [0] * T
        self.outstanding: Deque[PinnedPairs] = deque()

    # ---- helpers ---------------------------------------------------------------------------
    def now_scores(self, table_ids: torch.Tensor) -> torch.Tensor:
        """(n, max words) scores of rows written straight to the backing store: each table's
        current score in every word."""
        table = self.group.table
        now = [int(table.get_score(t)) if self.cached[t] else 0 for t in range(len(self.cached))]
        per = torch.tensor(now, dtype=torch.int64, device=self.device)[table_ids]
        return per.unsqueeze(1).expand(-1, self.backing.max_scores).contiguous()

    def read_through(
        self, keys: torch.Tensor, table_ids: torch.Tensor, found: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pairs of cached tables not in the cache, read from the backing store:
        ``(found in either, positions found in the backing store, their rows)``."""
        miss = ((~found) & self.cached_dev[table_ids]).nonzero().squeeze(1)
        if miss.numel() == 0:
            return found, miss, torch.zeros(0, self.backing.max_width, device=self.device)
        bfound, rows, _ = self.backing.find(keys[miss], table_ids[miss])
        got = miss[bfound]
        found = found.clone()
        found[got] = True
        return found, got, rows[bfound]

    # ---- the step ----------------------------------------------------------------------------
    def complete(
        self, place: Placement, fill_index: torch.Tensor, fill_rows: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """After the insert: read the cached misses from the backing store, write the victims and
        the new keys without a cache slot there; undo the cache placement when it fails.

        Args:
            place: the insert's result.
            fill_index: (m,) positions that got initial rows (new placed pairs, and every cached
                pair without a cache slot); ``fill_rows`` (m, max width) those rows, overwritten
                here by the backing store's rows for the pairs it holds.

        Returns:
            ``(fill_rows, backed, homeless)``: the rows to write; (b,) positions of pairs whose
            home for this step is the backing store; (u,) bool pairs with no home at all.
        """
        keys, tids, slots = place.keys, place.table_ids, place.slots
        ev = place.evicted
        homeless = slots < 0
        victims = None
        if ev is not None and ev.keys.numel():
            vic = self.cached_dev[ev.table_ids].nonzero().squeeze(1)
            if vic.numel():
                vt, vs = ev.table_ids[vic], ev.slots[vic]
                rows = self.group.rows.gather(vt, vs, self.group.max_width)
                victims = (ev.keys[vic], vt, vs, rows, ev.scores[vic])
        ftids = tids[fill_index]
        need = self.cached_dev[ftids].nonzero().squeeze(1)  # fill positions of cached pairs
        try:
            backed = fill_index[:0]
            out_keys, out_tids, out_rows, out_scores = [], [], [], []
            if need.numel():
                at = fill_index[need]
                bfound, brows, _ = self.backing.find(keys[at], tids[at], "read the batch's misses")
                fill_rows[need[bfound]] = brows[bfound]
                nocache = slots[at] < 0
                backed = at[nocache]
                fresh = nocache & ~bfound  # new keys the cache had no room for
                if bool(fresh.any()):
                    idx = need[fresh]
                    out_keys.append(keys[fill_index[idx]])
                    out_tids.append(ftids[idx])
                    out_rows.append(fill_rows[idx])
                    out_scores.append(self.now_scores(ftids[idx]))
            if victims is not None:
                vk, vt, _, vr, vw = victims
                out_keys.append(vk)
                out_tids.append(vt)
                out_rows.append(vr)
                out_scores.append(fit_columns(vw, self.backing.max_scores))
            if out_keys:
                self.backing.insert(
                    torch.cat(out_keys),
                    torch.cat(out_tids),
                    torch.cat(out_rows),
                    torch.cat(out_scores),
                    "write the evicted rows and the keys without a cache slot",
                )
            if backed.numel():
                # A backing store that evicts may have dropped some of them: those have no home.
                stored, _, _ = self.backing.find(
                    keys[backed], tids[backed], "confirm the rows it stored"
                )
                gone = backed[~stored]
                homeless = homeless.clone()
                homeless[backed] = False
                homeless[gone] = True
                backed = backed[stored]
            else:
                homeless = homeless & ~self.cached_dev[tids]
        except BaseException:
            self._undo(place, victims)
            raise
        if victims is not None:
            per = torch.bincount(victims[1], minlength=len(self.cached)).tolist()
            for t, c in enumerate(per):
                self.spills[t] += int(c)
        return fill_rows, backed, homeless

    def _undo(self, place: Placement, victims: Optional[tuple]) -> None:
        """Erase the step's new cached keys, put each victim back at its slot with its scores
        (its row was never overwritten)."""
        table = self.group.table
        new = (place.is_new & (place.slots >= 0) & self.cached_dev[place.table_ids]).nonzero()
        new = new.squeeze(1)
        if new.numel():
            table.erase(place.keys[new], place.table_ids[new])
        if victims is None:
            return
        vk, vt, vs, _, vw = victims
        for t in torch.unique(vt).tolist():
            mine = (vt == t).nonzero().squeeze(1)
            words = table.specs[int(t)].num_scores
            table.insert_at(int(t), vk[mine], vs[mine], scores=vw[mine, :words].contiguous())

    # ---- the backward of backed pairs -----------------------------------------------------------
    def update_backed(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        grads: torch.Tensor,
        optimizer: Tuple[Any, ...],
        dims: Sequence[int],
    ) -> None:
        """Read, update and write back the rows of pairs whose home is the backing store."""
        from dynamicemb_core.ops import lookup_ops

        found, rows, scores = self.backing.find(keys, table_ids, "read rows to update")
        ok = found.nonzero().squeeze(1)
        if ok.numel() == 0:
            return
        rows = rows[ok].contiguous()
        tids = table_ids[ok]
        m, width = rows.shape
        meta = torch.tensor([[0, width, m, d] for d in dims], dtype=torch.int64).to(self.device)
        flat = rows.reshape(-1)
        lookup_ops.grouped_update(
            flat,
            meta,
            tids,
            torch.arange(m, device=self.device),
            grads[ok].contiguous(),
            *optimizer,
            check=False,
            keys=keys[ok],
        )
        self.backing.insert(keys[ok], tids, flat.view(m, width), scores[ok], "write updated rows")

    # ---- prefetch pins -------------------------------------------------------------------------
    def pinnable(
        self, keys: torch.Tensor, table_ids: torch.Tensor, found: torch.Tensor
    ) -> torch.Tensor:
        """(u,) bool: the pairs of a prefetch that fit beside the pinned slots of their cache
        buckets (pairs already pinned always fit). Raises (``strict_prefetch``) or warns and counts
        the rest, before anything is written."""
        table = self.group.table
        keep = torch.ones_like(keys, dtype=torch.bool)
        pinned_now = self._pinned_mask(keys, table_ids, found)
        for t in range(len(self.cached)):
            if not self.cached[t] or self.direct[t]:
                continue
            idx = ((table_ids == t) & ~pinned_now).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            width = table.bucket_capacity(t)
            num_buckets = table.capacity(t) // width
            buckets = buckets_of_tensor(keys[idx], num_buckets)
            taken = (table.pin_counts(t) > 0).view(num_buckets, width).sum(1).to(torch.int64)
            fits = _rank_in_group(buckets) < (width - taken)[buckets]
            if bool(fits.all()):
                continue
            wanted = taken + torch.bincount(buckets, minlength=num_buckets)
            worst = int(torch.argmax(wanted))
            short = int((~fits).sum())
            name = self.group.tables[t].name
            message = (
                f"table {name!r}: prefetch of {int((table_ids == t).sum())} keys needs "
                f"{int(wanted[worst])} pinned rows in cache bucket {worst}, which has {width} slots "
                f"({int(taken[worst])} pinned by earlier prefetches or forwards in flight; cache "
                f"capacity {table.capacity(t)}); {short} keys cannot be pinned. Run the forwards of "
                "earlier prefetched batches first, prefetch fewer batches ahead, or raise the cache "
                "size (local_hbm_for_values)"
            )
            if self.strict_prefetch:
                raise DynamicEmbError(message)
            warnings.warn(
                message + "; those keys are not prefetched (the forward reads them as misses)",
                DynamicEmbWarning,
                stacklevel=5,
            )
            self.prefetch_skipped[t] += short
            keep[idx[~fits]] = False
        return keep

    def _pinned_mask(
        self, keys: torch.Tensor, table_ids: torch.Tensor, found: torch.Tensor
    ) -> torch.Tensor:
        """(u,) bool: pairs stored in a slot that holds a pin now."""
        slots, _ = self.group.find_all(keys, table_ids)
        table = self.group.table
        pins = table._pin_counts_arg()
        if pins is None:
            return torch.zeros_like(found)
        offsets = table.state.slot_offsets
        g = torch.where(slots >= 0, offsets[table_ids] + slots, 0)
        return (slots >= 0) & (pins[g] > 0)

    def add_prefetch(self, pairs: PinnedPairs) -> None:
        """One more outstanding prefetch, its pairs already pinned."""
        self.outstanding.append(pairs)

    def consume(self, table_ids: torch.Tensor, slots: torch.Tensor) -> None:
        """A forward placed these pairs: release the oldest outstanding prefetch they cover."""
        if not self.outstanding:
            return
        slot_ids = self.group.table.state.slot_offsets
        ids = PinnedPairs(table_ids, slots).ids(slot_ids)
        for i, pinned in enumerate(self.outstanding):
            mine = pinned.ids(slot_ids)
            if bool(torch.isin(mine, ids).all()):
                del self.outstanding[i]
                self.group.unpin(pinned)
                return

    def pin_counts(self, table_id: int, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64: outstanding prefetches holding each key of table ``table_id``."""
        tids = torch.full_like(keys, table_id)
        slots, _ = self.group.find_all(keys, tids)
        slot_ids = self.group.table.state.slot_offsets
        ids = PinnedPairs(tids, slots).ids(slot_ids)
        counts = torch.zeros_like(keys)
        for pinned in self.outstanding:
            counts += (torch.isin(ids, pinned.ids(slot_ids)) & (slots >= 0)).to(torch.int64)
        return counts

    def pinned(self, table_id: int) -> int:
        """Distinct keys of table ``table_id`` held by outstanding prefetches."""
        slot_ids = self.group.table.state.slot_offsets
        ids = [
            p.ids(slot_ids)[(p.table_ids == table_id) & (p.slots >= 0)] for p in self.outstanding
        ]
        return int(torch.unique(torch.cat(ids)).numel()) if ids else 0

    def release_pins(self, table_id: Optional[int] = None) -> None:
        """Drop the outstanding prefetches' pins (of one table, or all)."""
        kept: Deque[PinnedPairs] = deque()
        for pinned in self.outstanding:
            if table_id is None:
                self.group.unpin(pinned)
                continue
            mine = pinned.table_ids == table_id
            self.group.unpin(PinnedPairs(pinned.table_ids[mine], pinned.slots[mine]))
            rest = PinnedPairs(pinned.table_ids[~mine], pinned.slots[~mine])
            self.group.track(rest)
            kept.append(rest)
            pinned.released = True
        self.outstanding = kept

    def drop_pins(self, table_id: int, slots: torch.Tensor) -> None:
        """Unpin these slots of ``table_id`` in every outstanding prefetch (their keys left the
        cache through the Storage API)."""
        if not self.outstanding or slots.numel() == 0:
            return
        kept: Deque[PinnedPairs] = deque()
        for pinned in self.outstanding:
            hit = (pinned.table_ids == table_id) & torch.isin(pinned.slots, slots)
            hit &= pinned.slots >= 0
            if bool(hit.any()):
                self.group.unpin(PinnedPairs(pinned.table_ids[hit], pinned.slots[hit]))
                rest = PinnedPairs(pinned.table_ids[~hit], pinned.slots[~hit])
                self.group.track(rest)
                pinned.released = True
                kept.append(rest)
            else:
                kept.append(pinned)
        self.outstanding = kept


def _rank_in_group(groups: torch.Tensor) -> torch.Tensor:
    """(n,) int64: how many earlier entries (in input order) have the same group value."""
    order = torch.argsort(groups, stable=True)
    ordered = groups[order]
    first = torch.searchsorted(ordered, ordered)  # leftmost position of each value
    rank = torch.empty_like(groups)
    rank[order] = torch.arange(groups.numel(), device=groups.device) - first
    return rank
