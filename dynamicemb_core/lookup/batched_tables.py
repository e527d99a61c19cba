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
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

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
from dynamicemb_core.lookup.tiers import build_tier, device_budget_bytes, rows_in_budget, tier_kind
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
from dynamicemb_core.storage import HOME_NONE, DeviceStorage, LookupTier
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

    When no table has a cache or an external storage, the tables form one group
    (:mod:`dynamicemb_core.lookup.grouped`): one hash table, one device value buffer and, for hybrid
    tables (rows beyond their ``local_hbm_for_values`` budget), one host value buffer for all of
    them; one pass per step whatever their number (tables that do not train and tables with an
    admission strategy included). Otherwise each table has its own storage tier and
    the step loops over the tables.

    Attributes:
        tables: per table, its storage (a :class:`~dynamicemb_core.storage.LookupTier`, which is a
            plugin ``Storage`` holding that one table as table id 0; for a grouped module, a
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
        self._features_of_table = [
            [f for f, t in enumerate(self.feature_table_map) if t == table]
            for table in range(len(self.table_names))
        ]
        self._columns = self._feature_columns()
        self.tables: List[LookupTier] = []
        self._admission: List[Optional[tuple]] = []
        specs = [
            StorageTableSpec(
                name=name,
                dim=self.dims[t],
                row_width=row_width(self._kind, self.dims[t], opts.training),
                dtype=torch.float32,
                num_scores=opts.num_scores,
                capacity=int(opts.max_capacity or 0),
            )
            for t, (name, opts) in enumerate(zip(self.table_names, self.table_options))
        ]
        self._group: Optional[TableGroup] = None
        self._admission = [self._build_admission(opts) for opts in self.table_options]
        kinds = [
            tier_kind(opts, spec, self.device) for opts, spec in zip(self.table_options, specs)
        ]
        if all(kind in ("device", "hybrid") for kind in kinds):
            storage = GroupedDeviceStorage(
                specs,
                self.device,
                dims=self.dims,
                table_options=self.table_options,
                device_rows=[
                    rows_in_budget(spec, device_budget_bytes(opts, spec))
                    if kind == "hybrid"
                    else None
                    for opts, spec, kind in zip(self.table_options, specs, kinds)
                ],
            )
            self._group = TableGroup(
                storage,
                self.feature_table_map,
                self.pooling_mode is not DynamicEmbPoolingMode.NONE,
                self._kind,
                self._optimizer_args_now,
                [o.initializer_args for o in self.table_options],
                [o.eval_initializer_args for o in self.table_options],
                trains=[o.training for o in self.table_options],
                admission=self._admission,
            )
            self.tables = [TableView(storage, t) for t in range(len(specs))]
        else:
            for opts, spec in zip(self.table_options, specs):
                self.tables.append(build_tier(opts, spec, self.device))
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
            if opts.embedding_dtype not in (None, torch.float32):
                raise ValueError(
                    f"table {name!r}: embedding_dtype must be torch.float32 (or None), got "
                    f"{opts.embedding_dtype}"
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

    def _feature_columns(self) -> List[List[int]]:
        cols: List[List[int]] = [[] for _ in self.table_names]
        start = 0
        for t in self.feature_table_map:
            cols[t].append(start)
            start += self.dims[t]
        self._total_dim = start
        return cols

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
        """Rows to read, the row of each index, and the unique keys' homes (None: no training).

        Fast path (training, one device buffer, no admission, every key placed): the forward reads
        the embedding columns of the table's own rows by slot, so nothing is gathered twice.
        """
        opts, dim, tier = self.table_options[t], self.dims[t], self.tables[t]
        if not (self.training and opts.training):
            res = tier.lookup(0, keys, touch=False)
            emb = res.full_rows()[:, :dim].clone()
            missing = (~res.found).nonzero().squeeze(1)
            if missing.numel():
                emb[missing] = initialize_embeddings(opts.eval_initializer_args, keys[missing], dim)
            return emb, inverse, None
        init = lambda k: self._new_rows(t, k)  # noqa: E731
        view = tier.embedding_rows(0, dim)
        if self._admission[t] is None:
            res = tier.acquire(0, keys, init, with_rows=view is None)
            failed = res.count_unplaced()
            self._safe_check(t, failed)
            view = tier.embedding_rows(0, dim) if res.rows is None else None
            if view is not None and failed == 0:
                return view, res.homes[inverse], res.homes
            rows = res.rows if res.rows is not None else tier.lookup(0, keys, touch=False).rows
            assert rows is not None
            return rows[:, :dim].contiguous(), inverse, res.homes
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

    def _bag_grad_applier(
        self, t: int, homes: torch.Tensor
    ) -> Optional[Callable[[TableLookup, torch.Tensor, int], bool]]:
        """EXACT_SGD on a one-buffer device table: reduce and update in one op, else None.

        Same result as ``reduce_grads`` then the table's ``update`` (which, for one buffer, runs
        ``sgd_update`` on the homes as slots), without the (u, D) gradient tensor in between.
        """
        tier = self.tables[t]
        if self._kind is not OptimizerKind.SGD or not isinstance(tier, DeviceStorage):
            return None
        epoch = tier.placement_epoch(0)

        def apply(part: TableLookup, grad_bags: torch.Tensor, mode: int) -> bool:
            if tier.placement_epoch(0) != epoch:
                return False  # homes may be stale: the two-step path looks the keys up again
            blocks = tier.row_blocks(0)
            if len(blocks) != 1 or part.offsets is None:
                return False
            lookup_ops.sgd_reduce_update(
                blocks[0][0],
                homes,
                grad_bags,
                part.inverse,
                part.offsets,
                part.weights,
                mode,
                float(self.optimizer_args.learning_rate),
                check=False,  # homes from the table, inverse from unique, offsets validated
            )
            return True

        return apply

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
        pooled = self.pooling_mode is not DynamicEmbPoolingMode.NONE
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
        if self._group is not None:
            return self._grouped_forward(indices, offsets, per_sample_weights, B, learn_weights)
        segments = split_by_table(
            indices,
            offsets,
            None if per_sample_weights is None else per_sample_weights.detach(),
            self._features_of_table,
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
                    columns=self._columns[t],
                    apply_grads=self._grad_applier(t, keys, homes) if homes is not None else None,
                    apply_bag_grads=(
                        self._bag_grad_applier(t, homes) if homes is not None and pooled else None
                    ),
                )
            )
        mode = None
        shape = (indices.numel(), self.dims[0])
        if pooled:
            mode = lookup_ops.POOL_SUM
            if self.pooling_mode is DynamicEmbPoolingMode.MEAN:
                mode = lookup_ops.POOL_MEAN
            shape = (B, self._total_dim)
        if self.training and any(o.training for o in self.table_options):
            # FBGEMM counts the step in its training forward; Adam's bias correction reads it.
            self._step += 1
            advance_steps(self.tables)  # STEP scores: this forward wrote the old step
        out = LookupFunction.apply(
            self._dummy,
            per_sample_weights if learn_weights else None,
            parts,
            mode,
            shape,
            B,
            sum(1 for f in self._features_of_table if f),
        )
        return out if self.output_dtype == torch.float32 else out.to(self.output_dtype)

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
            for t, count in enumerate(unplaced):
                self._safe_check(t, count)
        mode: Optional[int] = None
        if self.pooling_mode is DynamicEmbPoolingMode.SUM:
            mode = lookup_ops.POOL_SUM
        elif self.pooling_mode is DynamicEmbPoolingMode.MEAN:
            mode = lookup_ops.POOL_MEAN
        if per_sample_weights is not None:
            step.weights = per_sample_weights.detach().float()
        if training:
            # FBGEMM counts the step in its training forward; Adam's bias correction reads it.
            self._step += 1
            advance_steps(self.tables)  # STEP scores: this forward wrote the old step
        out = GroupedLookupFunction.apply(
            self._dummy,
            per_sample_weights if learn_weights else None,
            group,
            step,
            (rows, slots),
            mode,
            self,
        )
        return out if self.output_dtype == torch.float32 else out.to(self.output_dtype)

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
        if self._group is not None:
            with _ordered_with(forward_stream, self.device):
                self._grouped_prefetch(indices, offsets, B)
            return
        segments = split_by_table(indices, offsets, None, self._features_of_table, B, False)
        with _ordered_with(forward_stream, self.device):
            for seg in segments:
                t = seg.table
                if seg.indices.numel() == 0 or not (
                    self.training and self.table_options[t].training
                ):
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
