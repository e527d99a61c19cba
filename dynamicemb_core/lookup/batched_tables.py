"""BatchedDynamicEmbeddingTables: FBGEMM TBE's interface over dynamic (hash-table) tables.

One module serves several tables and features, like ``SplitTableBatchedEmbeddingBagsCodegen``:
``forward(indices, offsets, per_sample_weights)`` in TBE's feature-major layout returns
(B, sum of feature dims) for SUM/MEAN or (N, D) for NONE. Keys are deduplicated per table before the
table is touched. Training goes through autograd: the backward reduces gradients per unique key and
applies the fused optimizer in place to the stored rows; there is no dense weight.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.devices import normalize_device
from dynamicemb_core.lookup.features import OffsetsCheck, validate_batch
from dynamicemb_core.lookup.grouped import GroupedLookupFunction, SafeChecks, TableGroup
from dynamicemb_core.lookup.initializers import validate_initializer
from dynamicemb_core.lookup.placement import (
    cached_backings,
    check_row_dtypes,
    table_place,
    tier_kind,
    warn_zero_budget,
)
from dynamicemb_core.lookup.steps import advance_clocks, start_steps, step_clocks
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.optim import (
    OptimizerArgs,
    OptimizerKind,
    optimizer_args_from_kwargs,
    optimizer_kind,
    row_width,
)
from dynamicemb_core.optim.args import output_dtype_from
from dynamicemb_core.storage.grouped import GroupedDeviceStorage
from dynamicemb_core.storage.table_views import CachedTableView, TableView
from dynamicemb_core.table.metrics import METRIC_NAMES
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
            weight_decay, weight_decay_mode, initial_accumulator_value) and FBGEMM's fused
            parameters; ``stochastic_rounding=True`` rounds the updates of half-precision rows
            stochastically (see :attr:`stochastic_rounding_seed`; default: to nearest even).

    Every table of the module lives in one group (:mod:`dynamicemb_core.lookup.grouped`): one
    hash table and one value descriptor for all of them, whether a table is device-resident,
    hybrid (rows beyond its ``local_hbm_for_values`` budget in host memory) or cached (a device
    cache of that budget in front of a host table or an external storage, see
    :mod:`dynamicemb_core.storage.grouped_cache`); one pass per step whatever their number
    (tables that do not train and tables with an admission strategy included).

    Attributes:
        tables: per table, a view of the group holding that table as table id 0 (a
            :class:`~dynamicemb_core.storage.table_views.TableView`; for a cached table a
            :class:`~dynamicemb_core.storage.table_views.CachedTableView`, the union of its cache and
            its backing store).
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
        self._optimizer_args: OptimizerArgs = optimizer_args_from_kwargs(
            optimizer, optimizer_kwargs
        )
        # FBGEMM's flag: half-precision rows round their updates stochastically when it is set.
        stochastic = bool(optimizer_kwargs.get("stochastic_rounding", False))
        self.output_dtype = output_dtype_from(output_dtype)
        self.table_names = list(table_names)
        self.table_options = list(table_options)
        self.feature_table_map = list(feature_table_map)
        self.dims = self._validate_tables()
        self.tables: List[TableView] = []
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
        self._admission = [self._build_admission(opts) for opts in self.table_options]
        self._group = self._build_group(specs)
        self._rounding_seed: Optional[int] = None
        if stochastic and any(spec.dtype != torch.float32 for spec in specs):
            # From torch's default generator: torch.manual_seed before construction fixes the run.
            self.stochastic_rounding_seed = int(torch.randint(0, 2**62, ()).item())
        for tier in self.tables:
            start_steps(tier)
        # the STEP clocks each training forward advances (fixed with the tables)
        self._clocks = step_clocks(self.tables)
        # Autograd calls the backward only if an input requires grad; this one carries no gradient.
        self._dummy = torch.zeros(1, device=self.device, requires_grad=True)
        self._checks = SafeChecks(self.table_names, self.table_options)

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

    def _build_group(self, specs: List[StorageTableSpec]) -> TableGroup:
        """The module's one group: every table, device-resident, hybrid or cached."""
        from dynamicemb_core.plugins import with_score_function

        # names resolve here, as the admission strategies and counters do (_build_admission)
        opts = [with_score_function(o) for o in self.table_options]
        kinds = [tier_kind(o, spec, self.device) for o, spec in zip(opts, specs)]
        warn_zero_budget(opts, specs, self.device)
        check_row_dtypes(self.table_names, specs, kinds)
        places = [
            table_place(o, spec, kind, self.device) for o, spec, kind in zip(opts, specs, kinds)
        ]
        backing = cached_backings(opts, specs, kinds, self.device)
        storage = GroupedDeviceStorage(
            specs,
            self.device,
            dims=self.dims,
            table_options=opts,
            device_rows=[p.device_rows for p in places],
            cache_rows=[p.cache_rows for p in places],
            backing=backing,
        )
        group = TableGroup(
            storage,
            self.feature_table_map,
            self.pooling_mode is not DynamicEmbPoolingMode.NONE,
            self._kind,
            self._optimizer_args,
            [o.initializer_args for o in opts],
            [o.eval_initializer_args for o in opts],
            trains=[o.training for o in opts],
            admission=self._admission,
            # IGNORE asks for no per-batch answer (its one warning comes when the placement's
            # outcome is read, by the step's backward): the forward need not wait for it
            defer_placement=all(o.safe_check_mode == DynamicEmbCheckMode.IGNORE for o in opts),
        )
        self.tables = [
            CachedTableView(storage, t) if storage.is_cached(t) else TableView(storage, t)
            for t in range(len(specs))
        ]
        return group

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

    @property
    def optimizer_args(self) -> OptimizerArgs:
        """The hyper-parameters in force (``set_learning_rate`` changes the rate in place)."""
        return self._optimizer_args

    @optimizer_args.setter
    def optimizer_args(self, args: OptimizerArgs) -> None:
        # a checkpoint load replaces the object: the group reads the new one from its next step
        self._optimizer_args = args
        group = self.__dict__.get("_group")
        if group is not None:
            group.optimizer_args = args

    def get_learning_rate(self) -> float:
        """The current learning rate."""
        return self.optimizer_args.learning_rate

    @property
    def optimizer_kind(self) -> OptimizerKind:
        """The fused optimizer the tables train with (resolved from the FBGEMM EmbOptimType)."""
        return self._kind

    @property
    def stochastic_rounding_seed(self) -> Optional[int]:
        """The seed of the stochastic rounding of half-precision rows (``stochastic_rounding=True``),
        or None when updates round to nearest even (the default, and float32 tables, which are never
        rounded). Each update's random bits are a hash of (seed, step, table, slot, element): the
        same seed, weights and batches give the same rows on the CPU and on CUDA. Drawn from torch's
        default generator at construction; a checkpoint keeps it; it may be set to an int >= 0."""
        return self._rounding_seed

    @stochastic_rounding_seed.setter
    def stochastic_rounding_seed(self, seed: Optional[int]) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"stochastic_rounding_seed must be an int or None, got {seed!r}")
        if seed is not None and not 0 <= seed < 2**63:
            raise ValueError(f"stochastic_rounding_seed must be in [0, 2**63), got {seed}")
        self._rounding_seed = seed
        self._group.rounding_seed = -1 if seed is None else seed

    @property
    def step(self) -> int:
        """Training forwards so far (FBGEMM's ``iter``: Adam's bias-correction step); a
        checkpoint's restore sets it."""
        return int(self._checks.iteration)

    @step.setter
    def step(self, value: int) -> None:
        self._checks.iteration.fill_(int(value))

    def table_stats(self) -> List[Dict[str, Any]]:
        """Per table: ``name``, ``size`` (keys stored), ``capacity`` (device slots), ``evictions``."""
        stats: List[Dict[str, Any]] = []
        for name, tier in zip(self.table_names, self.tables):
            # a cached table: keys in its cache (its size over both tiers would flush it)
            cached = isinstance(tier, CachedTableView)
            size = tier.group.table.size(tier.table_id) if cached else tier.size(0)
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
        """(k, row_width) rows table ``t`` gives new keys: the initializer's embedding, then the
        optimizer's fresh state."""
        tids = torch.full_like(keys, t)
        return self._group.new_rows(keys, tids)[:, : self.tables[t].tables[0].row_width]

    def report_unplaced(self, unplaced: Optional[List[int]]) -> None:
        """Apply each table's safe_check_mode to its count of keys that found no place."""
        self._checks(unplaced, stacklevel=5)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor] = None,
        occurrence_counts: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Look up and pool.

        Args:
            indices: (N,) int64 keys on the module's device, feature after feature.
            offsets: (F*B+1,) int64 bag boundaries, feature-major.
            per_sample_weights: optional (N,) float weights (SUM only); when they require grad,
                the output is differentiable with respect to them (the gradient of weight i is
                the dot product of the row index i read with its bag's output gradient).
            occurrence_counts: optional (N,) counts (any integral-valued dtype) of an
                already-deduplicated batch: index i stands for that many occurrences of its key.
                LFU scores and admission counters count them (a sharded EmbeddingCollection with
                ``use_index_dedup=True`` passes them); gradients are not scaled by them.

        Returns:
            (B, sum of feature dims) for SUM/MEAN, (N, D) for NONE, of ``output_dtype``.
        """
        B, check = validate_batch(
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
        occurrences = None
        if occurrence_counts is not None:
            if occurrence_counts.shape != indices.shape:
                raise ValueError(
                    "BatchedDynamicEmbeddingTables: occurrence_counts must be shaped like indices "
                    f"{tuple(indices.shape)}, got {tuple(occurrence_counts.shape)}"
                )
            occurrences = occurrence_counts.to(self.device).round().to(torch.int64).clamp_(min=1)
        out = self._grouped_forward(
            indices, offsets, per_sample_weights, B, learn_weights, check, occurrences
        )
        if self.training and self._group.any_trains:  # some table's options train
            # FBGEMM counts the step in its training forward; Adam's bias correction reads it.
            self._checks.iteration += 1
            advance_clocks(self._clocks)  # STEP scores: this forward wrote the old step
        return out if self.output_dtype == torch.float32 else out.to(self.output_dtype)

    def _grouped_forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor],
        B: int,
        learn_weights: bool,
        check: OffsetsCheck,
        occurrences: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The forward of a grouped module: one pass for all tables (see lookup/grouped.py)."""
        group = self._group
        assert group is not None
        training = self.training and group.any_trains
        step, rows, slots, unplaced = group.lookup(
            indices, offsets, B, training, check, occurrences
        )
        mode: Optional[int] = None
        if self.pooling_mode is DynamicEmbPoolingMode.SUM:
            mode = lookup_ops.POOL_SUM
        elif self.pooling_mode is DynamicEmbPoolingMode.MEAN:
            mode = lookup_ops.POOL_MEAN
        if per_sample_weights is not None:
            step.weights = per_sample_weights.detach().float()
        # The output first: on CUDA the device reads the rows while the host does the rest (the
        # placement's deferred readback, the slots' hold, the reports, autograd's bookkeeping).
        try:
            out = group.output(step, rows, slots, mode)
        finally:
            group.storage.send_placement()
            if step.slots is not None:
                group.hold(step)
        # earlier steps' deferred outcomes (this step's placement is read later: by its backward,
        # the next step or a counter read)
        self.report_unplaced(group.storage.take_unplaced(settle=False))
        self.report_unplaced(unplaced)
        return GroupedLookupFunction.apply(
            self._dummy,
            per_sample_weights if learn_weights else None,
            group,
            step,
            (rows, slots, out),
            mode,
            self._checks,
        )

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
        B, check = validate_batch(
            indices, offsets, None, len(self.feature_table_map), self.device, True
        )
        if not self.training:
            check.verify()
            return
        with _ordered_with(forward_stream, self.device):
            self._group.prefetch(indices, offsets, B, check)

    def flush(self) -> None:
        """Write cached rows back to their backing stores and flush those."""
        self._group.storage.flush()


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
