"""The grouped step: all device-only tables of a batched module in one pass.

Forward: table ids are expanded from the batch's feature offsets on the device, one segmented unique
dedups ``(table id, key)`` pairs of every table, one find-or-insert places them in the group's one
hash table, one scatter initialises the new rows, one pooled gather (or, for a sequence output, one
gather) reads them. Backward: one op reduces the output gradient per unique key and applies the
fused optimizer to the rows in place. The number of ops and of host synchronisations does not grow
with the number of tables (three syncs in a training forward: the batch's offsets check, the unique
count, the placement counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.lookup.initializers import initialize_embeddings
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim import OptimizerArgs, OptimizerKind, initial_state_value
from dynamicemb_core.storage.grouped import GroupAcquire, GroupedDeviceStorage

__all__ = ["GroupStep", "GroupedLookupFunction", "TableGroup"]


@dataclass
class GroupStep:
    """One forward's state kept for its backward.

    Attributes:
        keys, table_ids: (u,) the unique pairs.
        inverse: (n,) unique pair of each index.
        slots: (u,) their slots at the forward (None: nothing trains in this forward).
        epoch: the hash table's placement epoch at the forward (slots are current while it holds).
        offsets: (F*B+1,) the batch's bags; weights: (n,) float32 per-sample weights or None.
        batch_size: B.
        weight_rows: (u, max_dim) rows as read, kept only when the weights learn.
    """

    keys: torch.Tensor
    table_ids: torch.Tensor
    inverse: torch.Tensor
    slots: Optional[torch.Tensor]
    epoch: int
    offsets: torch.Tensor
    weights: Optional[torch.Tensor]
    batch_size: int
    weight_rows: Optional[torch.Tensor] = None


def _initializer_groups(
    args: Sequence[DynamicEmbInitializerArgs], device: torch.device
) -> List[Tuple[DynamicEmbInitializerArgs, torch.Tensor]]:
    """Tables sharing one initializer, so new rows take one initializer call per distinct one."""
    groups: List[Tuple[DynamicEmbInitializerArgs, List[int]]] = []
    for t, a in enumerate(args):
        for known, tables in groups:
            if known == a:
                tables.append(t)
                break
        else:
            groups.append((a, [t]))
    return [(a, torch.tensor(ts, dtype=torch.int64, device=device)) for a, ts in groups]


class TableGroup:
    """The tables of a batched module that share one :class:`GroupedDeviceStorage`.

    Args:
        storage: the group's storage (table ids = the module's table indices).
        feature_table_map: table of each feature.
        pooled: SUM/MEAN output (else a sequence output).
        kind: the fused optimizer.
        optimizer_args: returns the module's hyper-parameters now (a checkpoint load may replace
            them; the learning rate may change between steps).
        initializers, eval_initializers: per table, the initializer of new rows in training and of
            missing rows read in eval.
    """

    def __init__(
        self,
        storage: GroupedDeviceStorage,
        feature_table_map: Sequence[int],
        pooled: bool,
        kind: OptimizerKind,
        optimizer_args: Callable[[], OptimizerArgs],
        initializers: Sequence[DynamicEmbInitializerArgs],
        eval_initializers: Sequence[DynamicEmbInitializerArgs],
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
        self._init = _initializer_groups(initializers, device)
        self._eval_init = _initializer_groups(eval_initializers, device)

    # ---- new rows ---------------------------------------------------------------------------------
    def _embeddings(
        self,
        groups: List[Tuple[DynamicEmbInitializerArgs, torch.Tensor]],
        keys: torch.Tensor,
        tids: torch.Tensor,
    ) -> torch.Tensor:
        """(m, max_dim) initial embeddings, each row by its table's initializer."""
        emb: Optional[torch.Tensor] = None
        for args, tables in groups:
            e = initialize_embeddings(args, keys, self.max_dim)
            if emb is None:
                emb = e
            else:
                emb = torch.where(torch.isin(tids, tables).unsqueeze(1), e, emb)
        assert emb is not None
        return emb

    def new_rows(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(m, max row_width) rows of new keys: the embedding, then the fresh optimizer state."""
        state_init = float(initial_state_value(self.kind, self.optimizer_args()))
        rows = torch.full((keys.numel(), self.storage.max_width), state_init, device=self.device)
        if keys.numel():
            emb = self._embeddings(self._init, keys, tids)
            inside = self._cols.unsqueeze(0) < self._dims_dev[tids].unsqueeze(1)
            rows[:, : self.max_dim] = torch.where(inside, emb, state_init)
        return rows

    # ---- forward --------------------------------------------------------------------------------
    def table_ids(self, offsets: torch.Tensor, n: int, batch_size: int) -> torch.Tensor:
        """(n,) table of each index, from the feature-major offsets (on the device, no sync)."""
        if batch_size == 0 or n == 0:
            return torch.zeros(n, dtype=torch.int64, device=self.device)
        lengths = offsets[::batch_size].diff()
        return torch.repeat_interleave(self.feature_tables, lengths, output_size=n)

    def lookup(
        self, indices: torch.Tensor, offsets: torch.Tensor, batch_size: int, training: bool
    ) -> Tuple[GroupStep, torch.Tensor, torch.Tensor, torch.Tensor, Optional[GroupAcquire]]:
        """Resolve the batch's unique pairs: ``(step, values, meta, slots, acquire)``.

        ``values``/``meta``/``slots`` is what the output reads: the group's own buffer, or, when
        some rows are not stored (eval misses, keys that found no room), a (u, max_dim) buffer of
        the rows as they read with ``slots = arange(u)``.
        """
        tids = self.table_ids(offsets, indices.numel(), batch_size)
        keys, utids, inverse, _, counts = lookup_ops.segmented_unique(
            indices, tids, self.num_tables
        )
        storage = self.storage
        fresh_index: Optional[torch.Tensor] = None
        fresh: Optional[torch.Tensor] = None
        acquire: Optional[GroupAcquire] = None
        if training:
            acquire = storage.acquire_all(keys, utids, counts.tolist(), self.new_rows)
            slots = acquire.slots
            if acquire.unplaced:
                fresh_index, fresh = acquire.fresh_index, acquire.fresh_rows
        else:
            slots, found = storage.find_all(keys, utids)
            missing = (~found).nonzero().squeeze(1)
            if missing.numel():
                fresh_index = missing
                fresh = self._embeddings(self._eval_init, keys[missing], utids[missing])
        step = GroupStep(
            keys=keys,
            table_ids=utids,
            inverse=inverse,
            slots=slots if training else None,
            epoch=storage.table.placement_epoch,
            offsets=offsets,
            weights=None,
            batch_size=batch_size,
        )
        if fresh_index is None:
            return step, storage.values, storage.meta, slots, acquire
        assert fresh is not None
        rows = lookup_ops.grouped_gather(
            storage.values, storage.meta, utids, slots, self.max_dim, check=False
        )
        rows[fresh_index] = fresh[:, : self.max_dim]
        u = keys.numel()
        meta = torch.tensor(
            [[0, self.max_dim, u, d] for d in self.dims], dtype=torch.int64, device=self.device
        )
        return step, rows.reshape(-1), meta, torch.arange(u, device=self.device), acquire

    def output(
        self,
        step: GroupStep,
        values: torch.Tensor,
        meta: torch.Tensor,
        slots: torch.Tensor,
        mode: Optional[int],
    ) -> torch.Tensor:
        """The pooled (B, total_dim) or sequence (n, D) output."""
        if mode is None:
            return lookup_ops.grouped_gather(
                values,
                meta,
                step.table_ids[step.inverse],
                slots[step.inverse],
                self.dims[0],
                check=False,
            )
        return lookup_ops.grouped_pooled_gather(
            values,
            meta,
            slots,
            step.inverse,
            step.offsets,
            step.weights,
            self.feature_tables,
            self.d_offsets,
            mode,
            step.batch_size,
            self.total_dim,
            check=False,
        )

    # ---- backward -------------------------------------------------------------------------------
    def apply_grads(
        self, step: GroupStep, grad_out: torch.Tensor, mode: Optional[int], it: int
    ) -> None:
        """One reduction and fused update of every trained row (keys since evicted are skipped)."""
        assert step.slots is not None
        storage = self.storage
        slots = step.slots
        if storage.table.placement_epoch != step.epoch:
            # another forward or a prefetch placed keys in between: slots may have moved
            slots = storage.find_all(step.keys, step.table_ids)[0]
        a = self.optimizer_args()
        lookup_ops.grouped_reduce_update(
            storage.values,
            storage.meta,
            step.table_ids,
            slots,
            grad_out.float().contiguous(),
            step.inverse,
            step.offsets,
            step.weights,
            self.feature_tables,
            self.d_offsets,
            lookup_ops.POOL_NONE if mode is None else mode,
            step.batch_size,
            self.max_dim,
            lookup_ops.OPTIMIZER_CODES[self.kind.value],
            float(a.learning_rate),
            float(a.eps),
            float(a.beta1),
            float(a.beta2),
            float(a.weight_decay),
            int(a.weight_decay_mode),
            max(1, int(it)),
            check=False,
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


class GroupedLookupFunction(torch.autograd.Function):
    """Forward: the group's output. Backward: the fused update, and the weights' gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        dummy: torch.Tensor,
        weights: Optional[torch.Tensor],
        group: TableGroup,
        step: GroupStep,
        source: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mode: Optional[int],
        module: Any,
    ) -> torch.Tensor:
        values, meta, slots = source
        out = group.output(step, values, meta, slots, mode)
        if weights is not None:
            # the rows as this forward read them (the backward's update changes them in place)
            step.weight_rows = lookup_ops.grouped_gather(
                values, meta, step.table_ids, slots, group.max_dim, check=False
            )
        ctx.group, ctx.step, ctx.mode, ctx.module = group, step, mode, module
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
            group.apply_grads(step, grad_out, ctx.mode, ctx.module.step)
        ctx.step = None
        return None, grad_w, None, None, None, None, None
