"""BatchedDynamicEmbeddingTables: FBGEMM TBE's interface over dynamic (hash-table) tables.

One module serves several tables and features, like ``SplitTableBatchedEmbeddingBagsCodegen``:
``forward(indices, offsets, per_sample_weights)`` in TBE's feature-major layout returns
(B, sum of feature dims) for SUM/MEAN or (N, D) for NONE. Keys are deduplicated per table before the
table is touched. Training goes through autograd: the backward reduces gradients per unique key and
applies the fused optimizer in place to the stored rows; there is no dense weight.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.devices import normalize_device
from dynamicemb_core.lookup.autograd import LookupFunction, TableLookup
from dynamicemb_core.lookup.features import split_by_table, validate_inputs
from dynamicemb_core.lookup.grouped import GroupedLookupFunction, TableGroup
from dynamicemb_core.lookup.initializers import initialize_embeddings, validate_initializer
from dynamicemb_core.lookup.steps import advance_steps, start_steps
from dynamicemb_core.lookup.tiers import (
    build_tier,
    check_row_dtypes,
    device_budget_bytes,
    rows_in_budget,
    tier_kind,
)
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim import (
    OptimizerArgs,
    OptimizerKind,
    apply_update,
    initial_state_value,
    optimizer_args_from_kwargs,
    optimizer_kind,
    row_width,
)
from dynamicemb_core.optim.args import output_dtype_from
from dynamicemb_core.storage import HOME_NONE, LookupTier
from dynamicemb_core.storage.grouped import GroupedDeviceStorage, TableView
from dynamicemb_core.table.metrics import METRIC_NAMES
from dynamicemb_core.table.safe_check import UnplacedKeyReport
from dynamicemb_core.types import StorageTableSpec

__all__ = ["BatchedDynamicEmbeddingTables"]


class BatchedDynamicEmbeddingTables(nn.Module):
    """Several dynamic embedding tables behind one TBE-style forward.

    Args:
        table_options: one ``DynamicEmbTableOptions`` per table (``dim`` and ``max_capacity`` set).
        table_names: unique name per table (used in errors, stats and checkpoints).
        feature_table_map: for each feature, the index of its table.
        pooling_mode: SUM, MEAN (mixed dims allowed) or NONE (all dims equal).
        optimizer: an ``fbgemm_gpu`` ``EmbOptimType``: EXACT_SGD, EXACT_ADAGRAD,
            EXACT_ROWWISE_ADAGRAD or ADAM.
        device: where the tables and the outputs live.
        output_dtype: dtype of the output (computation is float32).
        **optimizer_kwargs: FBGEMM-named hyper-parameters (learning_rate, eps, beta1, beta2,
            weight_decay, weight_decay_mode, initial_accumulator_value).

    The tables stored in device memory, whole or hybrid (rows beyond their ``local_hbm_for_values``
    budget in host memory), form one group (:mod:`dynamicemb_core.lookup.grouped`): one hash table,
    one device value buffer and one host value buffer for all of them; one pass per step whatever
    their number (tables that do not train and tables with an admission strategy included). A table
    with a cache in front of a host table or an external storage has its own storage tier, and the
    step loops over those tables; a module with both kinds splits each batch by feature between
    the group and the tiered tables and joins their outputs.

    Attributes:
        tables: per table, its storage (a :class:`~dynamicemb_core.storage.LookupTier`, which is a
            plugin ``Storage`` holding that one table as table id 0; for a grouped table, a
            :class:`~dynamicemb_core.storage.grouped.TableView` of the group).
        optimizer_args: the hyper-parameters; ``set_learning_rate`` changes the rate between steps.
    """

    def __init__(
        self,
        table_options: List[DynamicEmbTableOptions],
        table_names: List[str],
        feature_table_map: List[int],
        pooling_mode: DynamicEmbPoolingMode,
        optimizer: Any,
        device: torch.device | str,
        output_dtype: torch.dtype = torch.float32,
        **optimizer_kwargs: Any,
    ) -> None:
        super().__init__()
        self.device = normalize_device(device)
        self.pooling_mode = DynamicEmbPoolingMode(pooling_mode)
        self.optimizer = optimizer
        self._kind = optimizer_kind(optimizer)
        self.optimizer_args: OptimizerArgs = optimizer_args_from_kwargs(optimizer, optimizer_kwargs)
        self.output_dtype = output_dtype_from(output_dtype)
        self.table_names = list(table_names)
        self.table_options = list(table_options)
        self.feature_table_map = list(feature_table_map)
        self.dims = self._validate_tables()
        self.tables: List[LookupTier] = []
        self._admission: List[Optional[tuple]] = []
        specs = [
            StorageTableSpec(
                name=name,
                dim=self.dims[t],
                row_width=row_width(self._kind, self.dims[t], opts.training),
                dtype=opts.embedding_dtype or torch.float32,
                num_scores=opts.num_scores,
                capacity=int(opts.max_capacity or 0),
            )
            for t, (name, opts) in enumerate(zip(self.table_names, self.table_options))
        ]
        self._group: Optional[TableGroup] = None
        self._group_tables: List[int] = []
        self._admission = [self._build_admission(opts) for opts in self.table_options]
        kinds = [
            tier_kind(opts, spec, self.device) for opts, spec in zip(self.table_options, specs)
        ]
        grouped = [t for t, kind in enumerate(kinds) if kind in ("device", "hybrid")]
        check_row_dtypes(self.table_names, specs, kinds)
        self.tables = [None] * len(specs)  # type: ignore[list-item]
        if grouped:
            self._build_group(grouped, specs, kinds)
        for t, (opts, spec) in enumerate(zip(self.table_options, specs)):
            if t not in grouped:
                self.tables[t] = build_tier(opts, spec, self.device)
        self._parts = _Parts(self.feature_table_map, self.dims, grouped, len(specs), self.device)
        for tier in self.tables:
            start_steps(tier)
        # Autograd calls the backward only if an input requires grad; this one carries no gradient.
        self._dummy = torch.zeros(1, device=self.device, requires_grad=True)
        self._step = 0
        self._unplaced_report = UnplacedKeyReport()

    # ---- construction -------------------------------------------------------------------------
    def _validate_tables(self) -> List[int]:
        n = len(self.table_names)
        if n == 0 or len(self.table_options) != n:
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: table_options ({len(self.table_options)}) and "
                f"table_names ({n}) must be non-empty and of equal length"
            )
        if len(set(self.table_names)) != n:
            raise ValueError(
                f"BatchedDynamicEmbeddingTables: table_names must be unique, got {self.table_names}"
            )
        if not self.feature_table_map:
            raise ValueError("BatchedDynamicEmbeddingTables: feature_table_map is empty")
        for f, t in enumerate(self.feature_table_map):
            if not isinstance(t, int) or not 0 <= t < n:
                raise ValueError(
                    f"BatchedDynamicEmbeddingTables: feature {f} maps to table {t!r}, expected an "
                    f"index in [0, {n})"
                )
        dims = []
        for name, opts in zip(self.table_names, self.table_options):
            if opts.dim is None or opts.dim <= 0:
                raise ValueError(f"table {name!r}: dim must be a positive int, got {opts.dim}")
            if not opts.max_capacity:
                raise ValueError(
                    f"table {name!r}: max_capacity must be set (the planner sets it; got "
                    f"{opts.max_capacity})"
                )
            validate_initializer(opts.initializer_args, f"table {name!r}: initializer_args")
            validate_initializer(
                opts.eval_initializer_args, f"table {name!r}: eval_initializer_args"
            )
            dims.append(int(opts.dim))
        if self.pooling_mode is DynamicEmbPoolingMode.NONE and len(set(dims)) != 1:
            raise ValueError(
                "BatchedDynamicEmbeddingTables: pooling_mode NONE needs one embedding dim for all "
                f"tables, got {dict(zip(self.table_names, dims))}"
            )
        return dims

    def _build_group(
        self, grouped: List[int], specs: List[StorageTableSpec], kinds: List[str]
    ) -> None:
        """One group for the device-resident and hybrid tables (group ids: their order here)."""
        local = {t: i for i, t in enumerate(grouped)}
        opts = [self.table_options[t] for t in grouped]
        storage = GroupedDeviceStorage(
            [specs[t] for t in grouped],
            self.device,
            dims=[self.dims[t] for t in grouped],
            table_options=opts,
            device_rows=[
                rows_in_budget(specs[t], device_budget_bytes(self.table_options[t], specs[t]))
                if kinds[t] == "hybrid"
                else None
                for t in grouped
            ],
        )
        self._group = TableGroup(
            storage,
            [local[t] for t in self.feature_table_map if t in local],
            self.pooling_mode is not DynamicEmbPoolingMode.NONE,
            self._kind,
            self._optimizer_args_now,
            [o.initializer_args for o in opts],
            [o.eval_initializer_args for o in opts],
            trains=[o.training for o in opts],
            admission=[self._admission[t] for t in grouped],
        )
        self._group_tables = list(grouped)
        for t in grouped:
            self.tables[t] = TableView(storage, local[t])

    def _build_admission(self, opts: DynamicEmbTableOptions) -> Optional[tuple]:
        if opts.admit_strategy is None:
            return None
        from dynamicemb_core.plugins import resolve_admission_strategy, resolve_counter

        strategy = resolve_admission_strategy(opts)
        counter = resolve_counter(opts)
        if counter is not None:
            # Each table counts on its own, on the module's device (the seed API's Counter.create).
            counter = counter.create(self.device)
        else:
            from dynamicemb_core.admission import KVCounter

            counter = KVCounter(capacity=int(opts.max_capacity or 0), device=self.device)
        return strategy, counter

    def extra_repr(self) -> str:
        tables = ", ".join(f"{n}(dim={d})" for n, d in zip(self.table_names, self.dims))
        return (
            f"tables=[{tables}], features={len(self.feature_table_map)}, "
            f"pooling={self.pooling_mode.name}, optimizer={self._kind.name}, "
            f"lr={self.optimizer_args.learning_rate}, device={self.device}"
        )

    # ---- hyper-parameters and stats -----------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        """Set the learning rate used by the next backward."""
        if lr < 0:
            raise ValueError(f"BatchedDynamicEmbeddingTables: learning_rate must be >= 0, got {lr}")
        self.optimizer_args.learning_rate = float(lr)

    def _optimizer_args_now(self) -> OptimizerArgs:
        """The hyper-parameters in force (a checkpoint load replaces the object)."""
        return self.optimizer_args

    def get_learning_rate(self) -> float:
        """The current learning rate."""
        return self.optimizer_args.learning_rate

    @property
    def optimizer_kind(self) -> OptimizerKind:
        """The fused optimizer the tables train with (resolved from the FBGEMM EmbOptimType)."""
        return self._kind

    @property
    def step(self) -> int:
        """Training forwards so far (FBGEMM's ``iter``: Adam's bias-correction step)."""
        return self._step

    def table_stats(self) -> List[Dict[str, Any]]:
        """Per table: ``name``, ``size`` (keys stored), ``capacity`` (device slots), ``evictions``."""
        stats: List[Dict[str, Any]] = []
        for name, tier in zip(self.table_names, self.tables):
            table: Any = tier.device_table()
            grouped = isinstance(tier, TableView)
            size = table.size(0) if table is not None and not grouped else tier.size(0)
            stats.append(
                {
                    "name": name,
                    "size": int(size),
                    "capacity": int(tier.capacity(0)),
                    "evictions": int(tier.evictions(0)),
                }
            )
        return stats

    def metrics(self, reset: bool = False) -> Dict[str, Dict[str, int]]:
        """Per table name, its placement counters since the start (or the last reset).

        ``hits`` / ``misses``: unique keys of training lookups found / not found; ``placed``: keys
        stored for the first time; ``evicted``: keys pushed out for new ones; ``unplaced``: keys
        that found no place (read as zeros, no update). For a cached table, hits and misses are
        the cache's, the others the next tier's. Counted on the device; reading copies them to
        the host once. ``reset=True`` zeroes them after reading.
        """
        rows = [tier.metrics(0) for tier in self.tables]
        zeros = torch.zeros(len(METRIC_NAMES), dtype=torch.int64)
        host = torch.stack([zeros if r is None else r.cpu() for r in rows]).tolist()
        if reset:
            self.reset_metrics()
        return {n: dict(zip(METRIC_NAMES, map(int, v))) for n, v in zip(self.table_names, host)}

    def reset_metrics(self) -> None:
        """Zero every table's placement counters."""
        for tier in self.tables:
            tier.reset_metrics(0)

    # ---- forward ------------------------------------------------------------------------------
    def _new_rows(self, t: int, keys: torch.Tensor) -> torch.Tensor:
        """Rows for new keys: embedding from the initializer, then the optimizer's fresh state."""
        opts, dim = self.table_options[t], self.dims[t]
        width = self.tables[t].tables[0].row_width
        rows = torch.full(
            (keys.numel(), width),
            initial_state_value(self._kind, self.optimizer_args),
            dtype=torch.float32,
            device=self.device,
        )
        rows[:, :dim] = initialize_embeddings(opts.initializer_args, keys, dim)
        return rows

    def _safe_check(self, t: int, failed: int) -> None:
        """Apply table ``t``'s safe_check_mode to ``failed`` keys that found no place."""
        self._unplaced_report(
            self.table_names[t], self.table_options[t].safe_check_mode, failed, stacklevel=5
        )

    def _lookup_table(
        self, t: int, keys: torch.Tensor, counts: torch.Tensor, inverse: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Rows to read, the row of each index, and the unique keys' homes (None: no training)."""
        opts, dim, tier = self.table_options[t], self.dims[t], self.tables[t]
        if not (self.training and opts.training):
            res = tier.lookup(0, keys, touch=False)
            emb = res.full_rows()[:, :dim].clone()
            missing = (~res.found).nonzero().squeeze(1)
            if missing.numel():
                emb[missing] = initialize_embeddings(opts.eval_initializer_args, keys[missing], dim)
            return emb, inverse, None
        init = lambda k: self._new_rows(t, k)  # noqa: E731
        if self._admission[t] is None:
            res = tier.acquire(0, keys, init)
            self._safe_check(t, res.count_unplaced())
            return res.full_rows()[:, :dim].contiguous(), inverse, res.homes
        admitted = torch.ones_like(keys, dtype=torch.bool)
        admission = self._admission[t]
        assert admission is not None
        strategy, counter = admission
        missing = (~tier.lookup(0, keys, touch=False).found).nonzero().squeeze(1)
        if missing.numel():
            mkeys = keys[missing]
            freq = counter.add(mkeys, counts[missing], True).to(self.device)
            ok = strategy.admit(mkeys, freq).to(self.device, torch.bool)
            counter.erase(mkeys[ok])
            admitted[missing[~ok]] = False
        take = admitted.nonzero().squeeze(1)
        res = tier.acquire(0, keys[take], init)
        emb = torch.empty((keys.numel(), dim), dtype=torch.float32, device=self.device)
        emb[take] = res.full_rows()[:, :dim].to(torch.float32)
        homes = torch.full_like(keys, HOME_NONE)
        homes[take] = res.homes
        rejected = (~admitted).nonzero().squeeze(1)
        if rejected.numel():
            init_args = strategy.get_initializer_args() or opts.initializer_args
            emb[rejected] = initialize_embeddings(init_args, keys[rejected], dim)
        self._safe_check(t, res.count_unplaced())
        return emb, inverse, homes

    def _grad_applier(
        self, t: int, keys: torch.Tensor, homes: torch.Tensor
    ) -> Callable[[torch.Tensor], None]:
        """The backward's update of table ``t``: the forward's homes while they are current.

        A placing call between the forward and its backward (a pipelined prefetch, another
        forward) may have grown the table or evicted some of these keys, moving or reusing their
        slots; then the keys are looked up again, and keys no longer stored get no update.
        """
        tier = self.tables[t]
        epoch = tier.placement_epoch(0)

        def apply(values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor) -> None:
            apply_update(self._kind, self.optimizer_args, self._step, values, slots, grads)

        def apply_grads(grads: torch.Tensor) -> None:
            current = homes
            if tier.placement_epoch(0) != epoch:
                current = tier.lookup(0, keys, touch=False).homes
            tier.update(0, keys, current, grads, apply)

        return apply_grads

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Look up and pool.

        Args:
            indices: (N,) int64 keys on the module's device, feature after feature.
            offsets: (F*B+1,) int64 bag boundaries, feature-major.
            per_sample_weights: optional (N,) float weights (SUM only); when they require grad,
                the output is differentiable with respect to them (the gradient of weight i is
                the dot product of the row index i read with its bag's output gradient).

        Returns:
            (B, sum of feature dims) for SUM/MEAN, (N, D) for NONE, of ``output_dtype``.
        """
        B = validate_inputs(
            indices,
            offsets,
            per_sample_weights,
            len(self.feature_table_map),
            self.device,
            self.pooling_mode is DynamicEmbPoolingMode.SUM,
        )
        # Weights that learn are an autograd input; their backward needs each index's position.
        learn_weights = (
            per_sample_weights is not None
            and per_sample_weights.requires_grad
            and torch.is_grad_enabled()
        )
        parts = self._parts
        if parts.split is None:
            if parts.grouped:
                out = self._grouped_forward(indices, offsets, per_sample_weights, B, learn_weights)
            else:
                out = self._tiered_forward(
                    indices, offsets, per_sample_weights, B, learn_weights, parts.tiered
                )
        else:
            out = self._split_forward(indices, offsets, per_sample_weights, B, learn_weights)
        if self.training and any(o.training for o in self.table_options):
            # FBGEMM counts the step in its training forward; Adam's bias correction reads it.
            self._step += 1
            advance_steps(self.tables)  # STEP scores: this forward wrote the old step
        return out if self.output_dtype == torch.float32 else out.to(self.output_dtype)

    def _split_forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor],
        B: int,
        learn_weights: bool,
    ) -> torch.Tensor:
        """A module with grouped and tiered tables: each kind's features in its own pass."""
        parts = self._parts
        assert parts.split is not None
        seg_g, seg_t = split_by_table(indices, offsets, None, parts.split, B, True)
        outs, positions = [], []
        for seg, grouped in ((seg_g, True), (seg_t, False)):
            assert seg.positions is not None
            w = None if per_sample_weights is None else per_sample_weights[seg.positions]
            if grouped:
                out = self._grouped_forward(seg.indices, seg.offsets, w, B, learn_weights)
            else:
                out = self._tiered_forward(
                    seg.indices, seg.offsets, w, B, learn_weights, parts.tiered
                )
            outs.append(out)
            positions.append(seg.positions)
        if self.pooling_mode is DynamicEmbPoolingMode.NONE:
            order = torch.argsort(torch.cat(positions))
            return torch.cat(outs)[order]
        return torch.cat(outs, 1)[:, parts.columns]

    def _tiered_forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor],
        B: int,
        learn_weights: bool,
        layout: "_Layout",
    ) -> torch.Tensor:
        """The forward of the tiered tables: one storage pass per table."""
        pooled = self.pooling_mode is not DynamicEmbPoolingMode.NONE
        segments = split_by_table(
            indices,
            offsets,
            None if per_sample_weights is None else per_sample_weights.detach(),
            layout.features_of_table,
            B,
            not pooled or learn_weights,
        )
        parts = []
        for seg in segments:
            t = seg.table
            if seg.indices.numel() == 0:
                continue
            keys, inverse, counts = lookup_ops.unique(seg.indices)
            rows, row_index, homes = self._lookup_table(t, keys, counts, inverse)
            parts.append(
                TableLookup(
                    table=t,
                    rows=rows,
                    row_index=row_index,
                    inverse=inverse,
                    num_unique=keys.numel(),
                    offsets=seg.offsets if pooled else None,
                    weights=seg.weights,
                    positions=seg.positions,
                    columns=layout.columns[t],
                    apply_grads=self._grad_applier(t, keys, homes) if homes is not None else None,
                )
            )
        mode = None
        shape = (indices.numel(), self.dims[0])
        if pooled:
            mode = lookup_ops.POOL_SUM
            if self.pooling_mode is DynamicEmbPoolingMode.MEAN:
                mode = lookup_ops.POOL_MEAN
            shape = (B, layout.total_dim)
        return LookupFunction.apply(
            self._dummy,
            per_sample_weights if learn_weights else None,
            parts,
            mode,
            shape,
            B,
            sum(1 for f in layout.features_of_table if f),
        )

    def _grouped_forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor],
        B: int,
        learn_weights: bool,
    ) -> torch.Tensor:
        """The forward of a grouped module: one pass for all tables (see lookup/grouped.py)."""
        group = self._group
        assert group is not None
        training = self.training and group.any_trains
        step, rows, slots, unplaced = group.lookup(indices, offsets, B, training)
        if unplaced is not None:
            for t, count in zip(self._group_tables, unplaced):
                self._safe_check(t, count)
        mode: Optional[int] = None
        if self.pooling_mode is DynamicEmbPoolingMode.SUM:
            mode = lookup_ops.POOL_SUM
        elif self.pooling_mode is DynamicEmbPoolingMode.MEAN:
            mode = lookup_ops.POOL_MEAN
        if per_sample_weights is not None:
            step.weights = per_sample_weights.detach().float()
        return GroupedLookupFunction.apply(
            self._dummy,
            per_sample_weights if learn_weights else None,
            group,
            step,
            (rows, slots),
            mode,
            self,
        )

    def _grouped_prefetch(self, indices: torch.Tensor, offsets: torch.Tensor, B: int) -> None:
        """Place the batch's keys of every grouped table that trains (as a training forward)."""
        group = self._group
        assert group is not None
        if self.training:
            group.prefetch(indices, offsets, B)

    # ---- cache control ------------------------------------------------------------------------
    def prefetch(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        forward_stream: Optional["torch.cuda.Stream"] = None,
        **_: Any,
    ) -> None:
        """Bring the batch's keys into the device tier ahead of its forward (training tables).

        The signature is TBE's, so TorchRec's lookups can call it as they call FBGEMM's (its
        other keywords are accepted and unused). With a ``forward_stream`` (TorchRec's prefetch
        pipeline runs this on a side stream), the prefetch is ordered after the work already on
        that stream and that stream's later work after the prefetch: the hash table and its rows
        are shared state, so the GPU runs the calls in the order the host made them.
        """
        B = validate_inputs(indices, offsets, None, len(self.feature_table_map), self.device, True)
        parts = self._parts
        with _ordered_with(forward_stream, self.device):
            if parts.split is None:
                if parts.grouped:
                    self._grouped_prefetch(indices, offsets, B)
                else:
                    self._tiered_prefetch(indices, offsets, B, parts.tiered)
                return
            seg_g, seg_t = split_by_table(indices, offsets, None, parts.split, B, False)
            self._grouped_prefetch(seg_g.indices, seg_g.offsets, B)
            self._tiered_prefetch(seg_t.indices, seg_t.offsets, B, parts.tiered)

    def _tiered_prefetch(
        self, indices: torch.Tensor, offsets: torch.Tensor, B: int, layout: "_Layout"
    ) -> None:
        segments = split_by_table(indices, offsets, None, layout.features_of_table, B, False)
        for seg in segments:
            t = seg.table
            if seg.indices.numel() == 0 or not (self.training and self.table_options[t].training):
                continue
            keys = lookup_ops.unique(seg.indices)[0]
            if self._admission[t] is not None:
                # Only keys already stored somewhere: admission decides about new ones later.
                keys = keys[self.tables[t].lookup(0, keys, touch=False).found]
            self.tables[t].prefetch(0, keys, functools.partial(self._new_rows, t))

    def flush(self) -> None:
        """Write cached rows back to their next tier and flush external storages."""
        for tier in self.tables:
            tier.flush()


@contextlib.contextmanager
def _ordered_with(stream: Optional["torch.cuda.Stream"], device: torch.device) -> Iterator[None]:
    """Run the body on the current stream, after ``stream``'s queued work and before its next."""
    if stream is None or device.type != "cuda":
        yield
        return
    current = torch.cuda.current_stream(device)
    if current == stream:
        yield
        return
    current.wait_stream(stream)
    yield
    stream.wait_stream(current)


class _Layout:
    """Which features of a (sub-)batch each tiered table reads and where its columns start.

    Features are numbered as in the (sub-)batch the tiered pass sees; tables read by no feature of
    it (the grouped ones) have none.
    """

    def __init__(
        self, features: Sequence[int], feature_table_map: Sequence[int], dims: Sequence[int], T: int
    ) -> None:
        self.features_of_table: List[List[int]] = [[] for _ in range(T)]
        self.columns: List[List[int]] = [[] for _ in range(T)]
        start = 0
        for i, f in enumerate(features):
            t = feature_table_map[f]
            self.features_of_table[t].append(i)
            self.columns[t].append(start)
            start += dims[t]
        self.total_dim = start


class _Parts:
    """How a batch is cut between the group and the tiered tables.

    Attributes:
        split: ``[group features, tiered features]`` when the module has both kinds (a batch is
            cut by feature, one host sync), else None.
        grouped: every feature reads a grouped table (the group's pass alone serves a batch).
        tiered: the layout of the tiered pass (over the tiered features, or all of them).
        columns: (total_dim,) int64 for a pooled output: column c of the module's output is
            column ``columns[c]`` of the group's output followed by the tiered output.
    """

    def __init__(
        self,
        feature_table_map: Sequence[int],
        dims: Sequence[int],
        grouped: Sequence[int],
        T: int,
        device: torch.device,
    ) -> None:
        F = len(feature_table_map)
        in_group = [feature_table_map[f] in set(grouped) for f in range(F)]
        gf = [f for f in range(F) if in_group[f]]
        tf = [f for f in range(F) if not in_group[f]]
        self.split: Optional[List[List[int]]] = [gf, tf] if gf and tf else None
        self.grouped = not tf  # every feature reads a grouped table
        self.tiered = _Layout(
            tf if self.split is not None else range(F), feature_table_map, dims, T
        )
        cat_start, start = {}, 0
        for f in gf + tf:
            cat_start[f] = start
            start += dims[feature_table_map[f]]
        cols: List[int] = []
        for f in range(F):
            cols.extend(range(cat_start[f], cat_start[f] + dims[feature_table_map[f]]))
        self.columns = torch.tensor(cols, dtype=torch.int64, device=device)
