"""GroupedRows: the value rows of a group's tables, split by slot between device and host memory.

Table ``t``'s slots ``[0, device_rows[t])`` keep their rows in the device buffer, slots
``[device_rows[t], capacity[t])`` in the host buffer (pinned when the device is CUDA). Each buffer is
flat, of the group's row dtype, with its own (T, 4) meta ``[value_offset, row_width, capacity, dim]``
(the layout of csrc/include/dynamicemb/grouped.h), so the grouped value ops run on either part
unchanged. One rule says which part a slot is in (:meth:`GroupedRows._masks`).

Where the group's kernels address the host part directly (a CPU group; on CUDA the pinned buffer
mapped into the device's address space, as FBGEMM's UVM placement is), every op runs on both
parts on the device, each part seeing the other part's slots as -1 (slots the ops skip or read as
zeros): no host synchronisation, no copies; the host part's rows travel the bus only for the
unique keys that live there. Otherwise (the copy path) the host part runs the CPU kernels on only
its own pairs, compacted: their rows gathered on the host and copied over, their gradients and
new rows copied to the host. Either way a sequence output reads the unique rows once and expands
them on the device, a pooled output pools the unique rows on the device, and the backward reduces
the gradient per unique key on the device, then updates each part's rows in place. A group with
no host rows (every table within its device budget) runs each op once, on the device buffer.

A training step on CUDA over rows without optimizer state (SGD) reads each host row once
(:class:`StagedRows`): its forward reads the host part's rows of its pairs into a device buffer,
the output reads them from there, and its backward updates that buffer on the device and writes it
back: the host rows cross the bus twice a step (read, then written) instead of three times (read by
the forward, read and written by the update). Where anything else wrote the rows between the two,
the backward updates the host part in place as usual.

Row dtype: float32, or float16 / bfloat16 for half-precision tables: the embedding is stored in that
type and the optimizer state stays float32 in the same row (grouped.h: the embedding, padded to an
even count, then the state's float32 words as pairs of 2-byte elements). ``widths`` are always the
*logical* widths (float32 columns of the rows that gather returns and scatter takes); the stored
widths in meta count elements of the row dtype (:func:`stored_width`).

"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch

from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim.layout import stored_width
from dynamicemb_core.table.host_memory import host_zeros
from dynamicemb_core.types import MemoryType

__all__ = ["GroupedRows", "StagedRows"]

_CPU = torch.device("cpu")


def _stage_pays(device: torch.device) -> bool:
    """Whether training forwards stage their host rows (:class:`StagedRows`): on CUDA, where the
    host part is read across the bus, the staging saves the update's read; on a CPU group both
    parts are the same memory and a staged copy would only add work."""
    return device.type == "cuda"


class StagedRows(NamedTuple):
    """A training forward's host rows, read once onto the device for its backward.

    ``rows`` (u, max row width) float32 on the group's device: row i is pair i's whole logical row
    (embedding and optimizer state) where the pair's slot is in the host part, zeros elsewhere. The
    backward's :meth:`GroupedRows.update` updates them there and writes them back (one pass over
    the bus instead of a read and a write) when nothing wrote the rows since: ``token`` names the
    rows object (growth replaces it) and ``writes`` its write count when they were read.
    """

    rows: torch.Tensor
    token: object
    writes: int


class _HostPairs(NamedTuple):
    """The pairs of a batch whose slot is in the host part, compacted: their positions in the
    batch (on the group's device) and their table ids and host-local slots (on the host)."""

    positions: torch.Tensor
    table_ids: torch.Tensor
    slots: torch.Tensor


class _Interface:
    """``__cuda_array_interface__`` of a pinned host buffer's bytes (keeps the buffer alive)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {
            "shape": (host.numel() * host.element_size(),),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def _addressable(host: torch.Tensor, device: torch.device) -> Optional[torch.Tensor]:
    """``host`` as a tensor the group's kernels address directly, or None.

    On a CPU group: ``host`` itself. On CUDA: the pinned buffer as a CUDA tensor over the same
    memory (unified addressing: a pinned allocation's host pointer is valid in kernels, which
    then read and write its rows across the bus, as FBGEMM's UVM placement does), after a round
    trip through it proves the aliasing; None when that fails (the copy path then)."""
    if device.type != "cuda":
        return host
    try:
        view = torch.as_tensor(_Interface(host), device=device).view(host.dtype)
        if view.data_ptr() != host.data_ptr():
            return None
        probe = host[:1].clone()
        host[:1] = 1.5
        seen = (view[:1] * 2).cpu()  # a kernel reads the host memory
        view[:1].mul_(0)  # a kernel writes it
        torch.cuda.current_stream(device).synchronize()
        ok = float(seen[0]) == 3.0 and float(host[0]) == 0.0
        host[:1] = probe
        return view if ok else None
    except Exception:  # any failure to map: the copy path, which always works
        return None


def _meta(widths: Sequence[int], caps: Sequence[int], dims: Sequence[int]) -> List[List[int]]:
    meta, offset = [], 0
    for cap, width, dim in zip(caps, widths, dims):
        meta.append([offset, int(width), int(cap), int(dim)])
        offset += int(cap) * int(width)
    return meta


class GroupedRows:
    """Rows of every table of a group, addressed by ``(table id, slot)``.

    Args:
        device: the group's device.
        widths, dims: per table, logical row width (embedding + optimizer state, float32
            columns) and embedding dim.
        capacities: per table, slots.
        device_rows: per table, how many of its first slots keep their rows in device memory
            (None: all of them).
        dtype: the row dtype (one of ``optim.layout.ROW_DTYPES``): what the embeddings are stored in.
        copy_host: run the host part's ops on the host with copies of its own pairs' rows, even
            where the group's kernels could address the host part directly (tests; the path a
            CUDA device takes when it cannot map the pinned buffer).
    """

    def __init__(
        self,
        device: torch.device,
        widths: Sequence[int],
        dims: Sequence[int],
        capacities: Sequence[int],
        device_rows: Optional[Sequence[Optional[int]]] = None,
        dtype: torch.dtype = torch.float32,
        *,
        copy_host: bool = False,
    ) -> None:
        self.device = device
        self.dtype = dtype
        self.widths = [int(w) for w in widths]
        self.dims = [int(d) for d in dims]
        self.stored = [stored_width(w, d, dtype) for w, d in zip(self.widths, self.dims)]
        self.capacities = [int(c) for c in capacities]
        limits = list(device_rows) if device_rows is not None else [None] * len(self.widths)
        self.device_rows = [
            c if lim is None else min(c, int(lim)) for c, lim in zip(self.capacities, limits)
        ]
        host_caps = [c - d for c, d in zip(self.capacities, self.device_rows)]
        self.meta_host = _meta(self.stored, self.device_rows, self.dims)
        self.host_meta_host = _meta(self.stored, host_caps, self.dims)
        self.values = host_zeros(self._numel(self.meta_host), dtype, device)
        self.meta = torch.tensor(self.meta_host, dtype=torch.int64).to(device)
        self.has_host = any(host_caps)
        self.host_values = torch.zeros(0, dtype=dtype)
        self.host_meta = torch.tensor(self.host_meta_host, dtype=torch.int64)
        self._split = torch.tensor(self.device_rows, dtype=torch.int64).to(device)
        if self.has_host:
            host = host_zeros(self._numel(self.host_meta_host), dtype, _CPU)
            if device.type == "cuda":
                host = host.pin_memory()
            self.host_values = host
        self._host_ops: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if self.has_host and not copy_host:
            mapped = _addressable(self.host_values, device)
            if mapped is not None:
                self._host_ops = (mapped, self.host_meta.to(device))
        self._token = object()
        self._writes = 0  # host-part writes other than new rows' (see StagedRows)
        self._dims_dev = torch.tensor(self.dims, dtype=torch.int64).to(device)
        # Float32 rows only: a half-precision update rounds into the stored dtype, which a float32
        # staging buffer would not. Rows without optimizer state only (SGD): the stage then reads
        # what the forward reads anyway; a row with state would be read whole by the forward (3x
        # the bytes for ADAM) to save the update's read, which the bus carries at the same time
        # as the update's writes (the two directions are apart): a loss.
        self.stages = (
            self._host_ops is not None
            and dtype == torch.float32
            and self.widths == self.dims
            and _stage_pays(device)
        )

    @classmethod
    def shared(
        cls, values: torch.Tensor, num_rows: int, width: int, dims: Sequence[int]
    ) -> "GroupedRows":
        """``num_rows`` device rows of ``width`` in ``values`` that every table's slots address
        (a forward's rows as read, slot i = unique key i): for gathers only."""
        self = cls.__new__(cls)
        T = len(dims)
        self.device = values.device
        self.dtype = values.dtype
        self.widths, self.dims = [int(width)] * T, [int(d) for d in dims]
        self.stored = list(self.widths)
        self.capacities = self.device_rows = [int(num_rows)] * T
        self.meta_host = [[0, int(width), int(num_rows), int(d)] for d in dims]
        self.host_meta_host = [[0, int(width), 0, int(d)] for d in dims]
        self.values = values
        self.meta = torch.tensor(self.meta_host, dtype=torch.int64).to(values.device)
        self.has_host = False
        self.host_values = torch.zeros(0, dtype=torch.float32)
        self.host_meta = torch.tensor(self.host_meta_host, dtype=torch.int64)
        self._split = torch.zeros(0, dtype=torch.int64, device=values.device)
        self._host_ops = None
        self._token, self._writes, self.stages = object(), 0, False
        return self

    def to_host(self) -> "GroupedRows":
        """A copy of these rows with the device part in host memory (the host part shared): what
        growth reads from once the device buffer is released. Its ops take host tensors."""
        if self.device.type == "cpu":
            return self
        self._settle()
        staged = GroupedRows.__new__(GroupedRows)
        staged.__dict__.update(self.__dict__)
        staged.device = _CPU
        staged.values = self.values.to(_CPU)
        staged.meta = self.meta.to(_CPU)
        staged._split = self._split.to(_CPU)
        staged._host_ops = (self.host_values, self.host_meta)  # the CPU kernels address it
        staged.stages = False
        return staged

    @staticmethod
    def _numel(meta: List[List[int]]) -> int:
        return sum(cap * width for _, width, cap, _ in meta)

    # ---- per-table blocks (checkpoints, growth) ----------------------------------------------
    def blocks(self, table_id: int) -> List[Tuple[torch.Tensor, int]]:
        """``[(device rows, 0), (host rows, device_rows)]`` of table ``table_id`` (views), the host
        block only when it has rows. The views are the stored rows: ``(rows, stored width)`` of the
        row dtype, whose first ``dim`` columns are the embeddings. The caller may write them: rows
        staged before are not used after."""
        self._settle()
        self._writes += 1
        off, width, cap, _ = self.meta_host[table_id]
        out = [(self.values[off : off + cap * width].view(cap, width), 0)]
        hoff, _, hcap, _ = self.host_meta_host[table_id]
        if hcap:
            rows = self.host_values[hoff : hoff + hcap * width].view(hcap, width)
            out.append((rows, self.device_rows[table_id]))
        return out

    def memory_usage(self, mem_type: MemoryType, table_id: Optional[int] = None) -> int:
        """Bytes of the device part (DEVICE) or the host part (HOST), of one table or all. On a CPU
        group the device part counts as DEVICE, as it would on an accelerator."""
        meta = self.meta_host if mem_type is MemoryType.DEVICE else self.host_meta_host
        rows = meta if table_id is None else [meta[table_id]]
        return self.values.element_size() * self._numel(rows)

    # ---- the two parts ----------------------------------------------------------------------
    def _settle(self) -> None:
        """Wait for the device's pending ops on a mapped host part before the host reads or
        writes it directly (checkpoints, growth)."""
        if self._host_ops is not None and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _masks(
        self, table_ids: torch.Tensor, slots: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each part's slots of the pairs, the other part's pairs as -1 (slots the ops skip or
        read as zeros). The one rule for which part a slot is in: table ``t``'s slots below
        ``device_rows[t]`` are in the device part, the others in the host part (from 0 there)."""
        split = self._split[table_ids]
        on_device = torch.where(slots < split, slots, -1)
        on_host = torch.where(slots >= split, slots - split, -1)
        return on_device, on_host

    def _split_pairs(
        self, table_ids: torch.Tensor, slots: torch.Tensor
    ) -> Tuple[torch.Tensor, Optional[_HostPairs]]:
        """For the copy path: the device part's slots (see :meth:`_masks`) and the host part's
        own pairs, compacted onto the host (None when no pair is there): one host sync."""
        on_device, on_host = self._masks(table_ids, slots)
        index = (on_host >= 0).nonzero().squeeze(1)
        if index.numel() == 0:
            return on_device, None
        pairs = self._d2h(torch.stack((table_ids[index], on_host[index])))
        return on_device, _HostPairs(index, pairs[0], pairs[1])

    def gather(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        width: int,
        *,
        check: bool = False,
        inverse: Optional[torch.Tensor] = None,
        staged: Optional[StagedRows] = None,
    ) -> torch.Tensor:
        """(n, width) float32 rows at ``(table_ids, slots)`` (zeros for slot -1); with ``inverse``
        (m,), the (m, width) rows of pairs ``inverse[i]``: with host rows, the n rows are read
        once (:meth:`_rows`) and expanded on the device (the host part never sees the m).
        ``staged``: :meth:`stage`'s rows of these pairs, read instead of the host part."""
        if not self.has_host:
            return lookup_ops.grouped_gather(
                self.values, self.meta, table_ids, slots, width, check=check, inverse=inverse
            )
        out = self._rows(table_ids, slots, width, check, staged)
        return out if inverse is None else out.index_select(0, inverse)

    def stage(self, table_ids: torch.Tensor, slots: torch.Tensor) -> Optional[StagedRows]:
        """The host part's whole rows of the pairs on the device (:class:`StagedRows`), for a
        training forward to read its output from and its backward to update; None where this
        group does not stage (:attr:`stages`: a mapped host part of float32 rows without
        optimizer state, on CUDA)."""
        if not self.stages:
            return None
        assert self._host_ops is not None
        host_values, host_meta = self._host_ops
        _, on_host = self._masks(table_ids, slots)
        rows = lookup_ops.grouped_gather(
            host_values, host_meta, table_ids, on_host, max(self.widths), check=False
        )
        return StagedRows(rows, self._token, self._writes)

    def _current(self, staged: Optional[StagedRows]) -> bool:
        """Whether ``staged`` still holds this group's host rows (nothing wrote them since)."""
        return staged is not None and staged.token is self._token and staged.writes == self._writes

    def _rows(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        width: int,
        check: bool,
        staged: Optional[StagedRows] = None,
    ) -> torch.Tensor:
        """(n, width) rows of a group with host rows. Mapped host part: each part's gather on the
        device, each row taken from the part holding it (a select, not a sum: -0.0 + 0.0 would
        lose the sign of a zero), the host part's from ``staged`` when given. Copy path: the
        device part's gather, the host part's own rows gathered on the host, copied over and
        placed by one index_copy."""
        if self._host_ops is not None:
            host_values, host_meta = self._host_ops
            on_device, on_host = self._masks(table_ids, slots)
            out = lookup_ops.grouped_gather(
                self.values, self.meta, table_ids, on_device, width, check=check
            )
            if self._current(staged):
                assert staged is not None
                host_rows = staged.rows[:, :width]
            else:
                host_rows = lookup_ops.grouped_gather(
                    host_values, host_meta, table_ids, on_host, width, check=check
                )
            return torch.where((on_host >= 0).unsqueeze(1), host_rows, out)
        on_device, host = self._split_pairs(table_ids, slots)
        out = lookup_ops.grouped_gather(
            self.values, self.meta, table_ids, on_device, width, check=check
        )
        if host is None:
            return out
        got = lookup_ops.grouped_gather(
            self.host_values, self.host_meta, host.table_ids, host.slots, width, check=check
        )
        return out.index_copy_(0, host.positions, self._h2d(got))

    def _h2d(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the group's device: staged in pinned memory and copied without
        blocking on CUDA (the caching host allocator keeps the staging buffer until the copy ends)."""
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _d2h(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor in host memory, for the host part's kernels: on CUDA copied into a
        pinned buffer (a direct DMA, no staging through pageable memory), waited for here."""
        if t.device.type != "cuda":
            return t
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return out

    def scatter(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        rows: torch.Tensor,
        *,
        check: bool = False,
    ) -> None:
        """In place: ``rows[i]`` at ``(table_ids[i], slots[i])`` (slot -1 skipped), each row in
        its own part (the copy path sends the host part only its own pairs' rows)."""
        if not self.has_host:
            lookup_ops.grouped_scatter(self.values, self.meta, table_ids, slots, rows, check=check)
            return
        self._writes += 1
        if self._host_ops is not None:
            host_values, host_meta = self._host_ops
            on_device, on_host = self._masks(table_ids, slots)
            lookup_ops.grouped_scatter(
                self.values, self.meta, table_ids, on_device, rows, check=check
            )
            lookup_ops.grouped_scatter(
                host_values, host_meta, table_ids, on_host, rows, check=check
            )
            return
        on_device, host = self._split_pairs(table_ids, slots)
        lookup_ops.grouped_scatter(self.values, self.meta, table_ids, on_device, rows, check=check)
        if host is not None:
            lookup_ops.grouped_scatter(
                self.host_values,
                self.host_meta,
                host.table_ids,
                host.slots,
                self._d2h(rows.index_select(0, host.positions.to(rows.device))),
                check=check,
            )

    @property
    def init_in_place(self) -> bool:
        """Whether :meth:`init` runs on the device with no host synchronisation (no host part, or
        a host part the group's kernels address directly)."""
        return not self.has_host or self._host_ops is not None

    def init(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        keys: torch.Tensor,
        init: torch.Tensor,
        seed: int,
        only: Optional[torch.Tensor] = None,
    ) -> None:
        """In place: new rows for ``keys`` at ``(table_ids, slots)`` (slot -1 skipped; with
        ``only``, (n,) bool, only the pairs where it is true), each part its own pairs
        (:func:`lookup_ops.grouped_init_rows`; needs :attr:`init_in_place`)."""
        if not self.has_host:
            lookup_ops.grouped_init_rows(
                self.values, self.meta, table_ids, slots, keys, init, seed, check=False, only=only
            )
            return
        assert self._host_ops is not None, "GroupedRows.init: the host part is not addressable"
        # no write count: new rows go to slots no forward in flight holds (their slots are
        # pinned), so rows staged by those forwards stay current (a prefetch between a forward
        # and its backward keeps the staging)
        host_values, host_meta = self._host_ops
        on_device, on_host = self._masks(table_ids, slots)
        lookup_ops.grouped_init_rows(
            self.values, self.meta, table_ids, on_device, keys, init, seed, check=False, only=only
        )
        lookup_ops.grouped_init_rows(
            host_values, host_meta, table_ids, on_host, keys, init, seed, check=False, only=only
        )

    def pooled_gather(
        self,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        inverse: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor],
        feature_tables: torch.Tensor,
        d_offsets: torch.Tensor,
        mode: int,
        batch_size: int,
        total_dim: int,
        staged: Optional[StagedRows] = None,
    ) -> torch.Tensor:
        """:func:`lookup_ops.grouped_pooled_gather` of the unique keys' rows.

        With host rows, the u unique rows are read first (:meth:`_rows`; the host part's from
        ``staged`` when given) and pooled on the device, so the host part sees each unique key
        once.
        """
        values, meta = self.values, self.meta
        if self.has_host:
            u = slots.numel()
            width = max(self.dims)
            rows = self._rows(table_ids, slots, width, False, staged)
            values, meta = rows.reshape(-1), _shared_meta(u, width, self._dims_dev)
            slots = torch.arange(u, device=self.device)
        return lookup_ops.grouped_pooled_gather(
            values,
            meta,
            slots,
            inverse,
            offsets,
            weights,
            feature_tables,
            d_offsets,
            mode,
            batch_size,
            total_dim,
            check=False,
        )

    def reduce_update(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        grad_out: torch.Tensor,
        inverse: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor],
        feature_tables: torch.Tensor,
        d_offsets: torch.Tensor,
        mode: int,
        batch_size: int,
        max_dim: int,
        optimizer: Tuple[Any, ...],
        frozen: Sequence[int] = (),
        order: Optional[torch.Tensor] = None,
        key_counts: Optional[torch.Tensor] = None,
        staged: Optional[StagedRows] = None,
    ) -> None:
        """The backward's fused update of the unique keys' rows (slots -1 skipped).

        Without host rows: one :func:`lookup_ops.grouped_reduce_update`. With host rows: one
        :func:`lookup_ops.grouped_reduce_grads` on the device, then :func:`lookup_ops.grouped_update`
        on each part, the host part with only its own keys' gradients copied over. ``optimizer``:
        ``(code, lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step, rounding_seed)``
        (grouped_update's arguments; seed < 0: round to nearest). ``keys`` (u,): the pairs' keys,
        which key the stochastic rounding (never the slots: a key rounds the same wherever it
        lives, on the device or the host part). ``frozen``: tables
        that hold no optimizer state (their slots must be -1). ``order`` / ``key_counts``: the
        dedup's grouping of the positions by key (see :func:`lookup_ops.grouped_reduce_update`).
        ``staged``: the forward's :meth:`stage` (see :meth:`update`).
        """
        code, lr, eps, beta1, beta2, weight_decay, weight_decay_mode, step, seed = optimizer
        hyper = (
            int(code),
            float(lr),
            float(eps),
            float(beta1),
            float(beta2),
            float(weight_decay),
            int(weight_decay_mode),
            int(step),
            int(seed),
        )
        if not self.has_host:
            lookup_ops.grouped_reduce_update(
                self.values,
                _frozen(self.meta, frozen, self.dims, self.dtype),
                table_ids,
                slots,
                grad_out,
                inverse,
                offsets,
                weights,
                feature_tables,
                d_offsets,
                mode,
                batch_size,
                max_dim,
                *hyper,
                check=False,
                order=order,
                key_counts=key_counts,
                keys=keys,
            )
            return
        grads = self.reduce_grads(
            grad_out,
            inverse,
            offsets,
            weights,
            feature_tables,
            d_offsets,
            mode,
            batch_size,
            slots.numel(),
            max_dim,
        )
        self.update(keys, table_ids, slots, grads, hyper, frozen, staged)

    def reduce_grads(
        self,
        grad_out: torch.Tensor,
        inverse: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor],
        feature_tables: torch.Tensor,
        d_offsets: torch.Tensor,
        mode: int,
        batch_size: int,
        num_unique: int,
        max_dim: int,
    ) -> torch.Tensor:
        """(u, max_dim) gradient per unique key (:func:`lookup_ops.grouped_reduce_grads`)."""
        return lookup_ops.grouped_reduce_grads(
            grad_out,
            self.meta,
            inverse,
            offsets,
            weights,
            feature_tables,
            d_offsets,
            mode,
            batch_size,
            num_unique,
            max_dim,
            check=False,
        )

    def update(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        slots: torch.Tensor,
        grads: torch.Tensor,
        optimizer: Tuple[Any, ...],
        frozen: Sequence[int] = (),
        staged: Optional[StagedRows] = None,
    ) -> None:
        """The fused optimizer on the rows at ``(table_ids, slots)`` (-1 skipped) with ``grads``
        (u, >= max dim), each part with only its own keys' gradients. ``keys``, ``optimizer``: as
        in :meth:`reduce_update`. ``staged``: the forward's :meth:`stage` of these pairs; while
        current (nothing wrote the rows since), the host part's rows are updated in it on the
        device and written back whole, without being read again; else in place."""
        if not self.has_host:
            lookup_ops.grouped_update(
                self.values,
                _frozen(self.meta, frozen, self.dims, self.dtype),
                table_ids,
                slots,
                grads,
                *optimizer,
                check=False,
                keys=keys,
            )
            return
        # per part: (values, meta, table ids, slots, gradients, keys)
        parts: List[
            Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any]
        ]
        write_back: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if self._host_ops is not None:
            host_values, host_meta = self._host_ops
            on_device, on_host = self._masks(table_ids, slots)
            host_part = (host_values, host_meta, table_ids, on_host, grads, keys)
            if self._current(staged):
                assert staged is not None
                u, width = staged.rows.shape
                mine = torch.arange(u, device=slots.device)
                host_part = (
                    staged.rows.reshape(-1),
                    _shared_meta(u, width, self._dims_dev),
                    table_ids,
                    torch.where(on_host >= 0, mine, -1),
                    grads,
                    keys,
                )
                write_back = (on_host, staged.rows)
            parts = [(self.values, self.meta, table_ids, on_device, grads, keys), host_part]
        else:
            on_device, host = self._split_pairs(table_ids, slots)
            parts = [(self.values, self.meta, table_ids, on_device, grads, keys)]
            if host is not None:
                mine = self._d2h(grads.index_select(0, host.positions))
                # the host pairs' keys, copied over only when they key a stochastic rounding
                rounding = optimizer[-1] >= 0
                own = self._d2h(keys.index_select(0, host.positions)) if rounding else None
                parts.append(
                    (self.host_values, self.host_meta, host.table_ids, host.slots, mine, own)
                )
        for values, meta, tids, part_slots, part_grads, part_keys in parts:
            lookup_ops.grouped_update(
                values,
                _frozen(meta, frozen, self.dims, self.dtype),
                tids,
                part_slots,
                part_grads,
                *optimizer,
                check=False,
                keys=part_keys,
            )
        if write_back is not None:
            assert self._host_ops is not None
            on_host, rows = write_back
            host_values, host_meta = self._host_ops
            lookup_ops.grouped_scatter(
                host_values, host_meta, table_ids, on_host, rows, check=False
            )
        self._writes += 1


def _shared_meta(u: int, width: int, dims: torch.Tensor) -> torch.Tensor:
    """Meta of ``u`` rows of ``width`` that every table's slots address (slot i = row i), built
    where ``dims`` (the tables' dims) lives: no copy from pageable memory, which CUDA may make
    the host wait for."""
    meta = torch.zeros(dims.numel(), 4, dtype=torch.int64, device=dims.device)
    meta[:, 1] = width
    meta[:, 2] = u
    meta[:, 3] = dims
    return meta


def _frozen(
    meta: torch.Tensor, frozen: Sequence[int], dims: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """``meta`` where the ``frozen`` tables show no rows and a row width any optimizer's state
    fits in (the fused update checks every table's width; their slots are -1, nothing is touched)."""
    if not frozen:
        return meta
    out = meta.clone()
    idx = list(frozen)
    # dim + ADAM's 2 dim (or + row-wise Adagrad's 1), as the buffer's dtype stores it.
    widths = [stored_width(3 * dims[t] + 1, dims[t], dtype) for t in idx]
    out[idx, 1] = torch.tensor(widths, dtype=torch.int64).to(out.device)
    out[idx, 2] = 0
    return out
