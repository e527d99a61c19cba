"""DynamicEmbDeltaTracker: TorchRec's ModelDeltaTracker semantics for dynamic tables, reporting raw keys.

TorchRec's tracker records, per table, the ids each batch looked up, and answers "which ids (and which
embeddings) changed since consumer X last asked". On native tables those ids are shard-local rows; a
dynamic table is keyed by the raw feature id, so this tracker reports raw keys, which is what a replica or
a top-k publisher needs.

Semantics follow ``torchrec.distributed.model_tracker.ModelDeltaTrackerTrec``:

- ``step()`` advances the batch index (DistributedModelParallel calls it before every forward once the
  tracker is attached with :meth:`attach`); lookups are recorded under the current index.
- Each consumer has its own read position: ``get_unique(consumer)`` returns what was recorded since that
  consumer's previous read, compacting the unread window first.
- ``delete_on_read`` drops batches every consumer has read; ``auto_compact`` merges them once per step.
- ``ID_ONLY`` records keys; ``EMBEDDING`` also records each key's embedding as first looked up in the
  window (UpdateMode.FIRST), which needs unpooled lookups, as in TorchRec.
- ``MOMENTUM_LAST`` records, at each lookup, the norm of the key's first optimizer state (Adam's first
  moment, Adagrad's accumulator, row-wise Adagrad's scalar) and keeps the latest per key
  (UpdateMode.LAST). As in TorchRec the value is read at lookup time, so it reflects the updates of the
  batches before the one looking the key up.
- ``MOMENTUM_DIFF`` (and its older name ``ROWWISE_ADAGRAD``) records the row-wise Adagrad accumulator
  at the key's first lookup in the window (UpdateMode.FIRST); :meth:`get_unique` reports how much it
  has grown since (the accumulator now minus then). Needs EXACT_ROWWISE_ADAGRAD, as in TorchRec.

One difference from TorchRec, where rows are shard-local positions: :meth:`get_latest` cannot return
one dense tensor per table indexed by id (a hash table has no such tensor); it returns, per table, the
stored keys (or the keys asked for) with their current first optimizer state.

Recording goes through TorchRec's own hook, ``register_post_lookup_tracker_fn`` of a sharded collection,
where the installed torchrec has it; local ``BatchedDynamicEmbeddingTables`` modules (and sharded ones on a
torchrec without the hook) are recorded with a forward hook on the module.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.tracking.store import KeyDeltaStore
from dynamicemb_core.tracking.types import DeltaTrackerConfig, TrackingMode, UniqueRows, UpdateMode

try:  # TorchRec's abstract tracker: subclassing it makes DMP and TorchRec tools accept ours
    from torchrec.distributed.model_tracker.model_delta_tracker import (
        ModelDeltaTracker as _TrackerBase,
    )
except ImportError:  # pragma: no cover
    _TrackerBase = object

__all__ = ["DynamicEmbDeltaTracker"]

logger = logging.getLogger(__name__)

_UPDATE_MODE = {
    TrackingMode.ID_ONLY: UpdateMode.NONE,
    TrackingMode.EMBEDDING: UpdateMode.FIRST,
    TrackingMode.MOMENTUM_LAST: UpdateMode.LAST,
    TrackingMode.MOMENTUM_DIFF: UpdateMode.FIRST,
    TrackingMode.ROWWISE_ADAGRAD: UpdateMode.FIRST,
}
_OPTIMIZER_STATE_MODES = (
    TrackingMode.MOMENTUM_LAST,
    TrackingMode.MOMENTUM_DIFF,
    TrackingMode.ROWWISE_ADAGRAD,
)
_ROWWISE_MODES = (TrackingMode.MOMENTUM_DIFF, TrackingMode.ROWWISE_ADAGRAD)


class DynamicEmbDeltaTracker(_TrackerBase):
    """Tracks the raw keys (and optionally embeddings) each dynamic table looks up.

    Args:
        model: the model (plain or DMP-wrapped) holding dynamic tables.
        consumers: names of the readers, each with its own read position (default: ``["default"]``).
        delete_on_read: drop batches once every consumer has read them.
        auto_compact: merge unread batches once per step instead of at read time.
        mode: any of TorchRec's ``TrackingMode`` members (see the module docstring).
        fqns_to_skip: module-path components whose tables are not tracked.
        use_torchrec_hooks: record through sharded collections' ``register_post_lookup_tracker_fn`` where
            available (False: always use forward hooks on the dynamic modules).

    Tables are named ``"<collection>.<table>"`` (collection paths as in ``incremental_dump``).
    """

    DEFAULT_CONSUMER: str = "default"

    def __init__(
        self,
        model: nn.Module,
        consumers: Optional[List[str]] = None,
        delete_on_read: bool = True,
        auto_compact: bool = False,
        mode: TrackingMode = TrackingMode.ID_ONLY,
        fqns_to_skip: Iterable[str] = (),
        *,
        use_torchrec_hooks: bool = True,
    ) -> None:
        if mode not in _UPDATE_MODE:
            raise NotImplementedError(
                f"DynamicEmbDeltaTracker: tracking mode {mode} is not supported for dynamic tables; "
                f"supported: {[m.name for m in _UPDATE_MODE]}"
            )
        self._model = model
        self._mode = mode
        self._delete_on_read = delete_on_read
        self._auto_compact = auto_compact
        self._fqns_to_skip = set(fqns_to_skip)
        consumers = list(consumers or [self.DEFAULT_CONSUMER])
        self.per_consumer_batch_idx: Dict[str, int] = dict.fromkeys(consumers, -1)
        self.curr_batch_idx = 0
        self.curr_compact_index = 0
        self.store = KeyDeltaStore(_UPDATE_MODE[mode])
        self.feature_to_fqn: Dict[str, str] = {}
        self.tracked_fqns: List[str] = []
        self._modules: Dict[str, nn.Module] = {}
        self._table_index: Dict[str, int] = {}
        self._fqn_to_features: Dict[str, List[str]] = {}
        self._handles: List[Any] = []
        self._install(use_torchrec_hooks)

    @classmethod
    def from_config(cls, model: nn.Module, config: DeltaTrackerConfig) -> "DynamicEmbDeltaTracker":
        """Build from TorchRec's ``DeltaTrackerConfig``."""
        return cls(
            model,
            consumers=config.consumers,
            delete_on_read=config.delete_on_read,
            auto_compact=config.auto_compact,
            mode=config.tracking_mode,
            fqns_to_skip=config.fqns_to_skip,
        )

    # ---- installation -------------------------------------------------------------------------
    def _skipped(self, fqn: str) -> bool:
        return bool(self._fqns_to_skip.intersection(fqn.split(".")))

    def _install(self, use_torchrec_hooks: bool) -> None:
        from dynamicemb_core.checkpoint.discovery import module_paths
        from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

        # TorchRec's fqns (as its ModelDeltaTracker and state_dict name tables): the collection
        # naming rule of the checkpoint APIs without NVIDIA's "model" root
        paths = module_paths(self._model, root="")

        try:
            from dynamicemb_core.shard.kernel import BatchedDynamicEmbeddingKernel
        except ImportError:  # pragma: no cover
            BatchedDynamicEmbeddingKernel = ()  # type: ignore[assignment,misc]
        covered = set()
        for fqn, module in self._model.named_modules():
            if self._skipped(fqn):
                continue
            kernels = [m for m in module.modules() if isinstance(m, BatchedDynamicEmbeddingKernel)]
            hook = getattr(module, "register_post_lookup_tracker_fn", None)
            if use_torchrec_hooks and kernels and callable(hook):
                collection = paths[id(module)]
                for kernel in kernels:
                    covered.add(id(kernel.emb_module))
                    for t, config in enumerate(kernel.config.embedding_tables):
                        table_fqn = f"{collection}.{config.name}" if collection else config.name
                        self._add_table(table_fqn, kernel.emb_module, t, list(config.feature_names))
                        for feature in config.feature_names:
                            self.feature_to_fqn[feature] = table_fqn
                hook(self.record_lookup)
                if self._auto_compact:
                    getattr(module, "register_post_odist_tracker_fn", lambda fn: None)(
                        self.trigger_compaction
                    )
        for fqn, module in self._model.named_modules():
            if isinstance(module, BatchedDynamicEmbeddingTables) and id(module) not in covered:
                if self._skipped(fqn):
                    continue
                collection = paths[id(module)]  # a local module is its own collection
                fqns = [
                    f"{collection}.{name}" if collection else name for name in module.table_names
                ]
                for t, table_fqn in enumerate(fqns):
                    features = [
                        f"{module.table_names[t]}.feature{f}"
                        for f, owner in enumerate(module.feature_table_map)
                        if owner == t
                    ]
                    self._add_table(table_fqn, module, t, features)
                self._handles.append(module.register_forward_hook(self._forward_hook(fqns)))
        logger.info("delta tracker: tracking %s", self.tracked_fqns)

    def _add_table(self, table_fqn: str, module: Any, index: int, features: List[str]) -> None:
        if (
            self._mode == TrackingMode.EMBEDDING
            and module.pooling_mode != DynamicEmbPoolingMode.NONE
        ):
            raise ValueError(
                f"DynamicEmbDeltaTracker: table '{table_fqn}' is pooled ({module.pooling_mode.name}); "
                f"TrackingMode.EMBEDDING needs unpooled lookups (pooling NONE / EmbeddingCollection)"
            )
        if self._mode in _OPTIMIZER_STATE_MODES:
            from dynamicemb_core.optim import OptimizerKind

            kind = module._kind
            if self._mode in _ROWWISE_MODES and kind is not OptimizerKind.ROWWISE_ADAGRAD:
                raise ValueError(
                    f"DynamicEmbDeltaTracker: table '{table_fqn}': TrackingMode.{self._mode.name} "
                    f"reads the row-wise Adagrad accumulator; the table's optimizer is {kind.name} "
                    f"(use EXACT_ROWWISE_ADAGRAD)"
                )
            if kind is OptimizerKind.SGD or not module.table_options[index].training:
                raise ValueError(
                    f"DynamicEmbDeltaTracker: table '{table_fqn}': TrackingMode.{self._mode.name} "
                    f"reads optimizer state, and the table keeps none (optimizer {kind.name}, "
                    f"training={module.table_options[index].training})"
                )
        if table_fqn not in self.tracked_fqns:
            self.tracked_fqns.append(table_fqn)
        self._modules[table_fqn] = module
        self._table_index[table_fqn] = index
        self._fqn_to_features[table_fqn] = features

    def _forward_hook(
        self, fqns: List[str]
    ) -> Callable[[nn.Module, Tuple[Any, ...], torch.Tensor], None]:
        def hook(module: nn.Module, args: Tuple[Any, ...], output: torch.Tensor) -> None:
            indices, offsets = args[0], args[1]
            self._record_batch(module, fqns, indices, offsets, output)

        return hook

    def detach(self) -> None:
        """Remove the forward hooks this tracker installed."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def attach(self, dmp: nn.Module) -> None:
        """Make DistributedModelParallel step this tracker before each forward and return it from
        ``get_delta_tracker()`` (TorchRec's own slot for its delta tracker).

        Raises:
            TypeError: ``dmp`` has no tracker slot (a torchrec without ModelDeltaTracker support in DMP).
        """
        trackers = getattr(dmp, "model_trackers", None)
        if not isinstance(trackers, dict):
            raise TypeError(
                f"DynamicEmbDeltaTracker.attach: {type(dmp).__name__} has no model_trackers slot; call "
                f"tracker.step() before each forward instead"
            )
        try:
            from torchrec.distributed.model_tracker.types import Trackers

            name = Trackers.DELTA_TRACKER.name
        except ImportError:  # torchrec before the Trackers enum keyed the slot by this name too
            name = "DELTA_TRACKER"
        trackers[name] = self

    # ---- recording ----------------------------------------------------------------------------
    def _append(self, fqn: str, ids: torch.Tensor, states: Optional[torch.Tensor]) -> None:
        self.store.append(
            self.curr_batch_idx, fqn, ids.detach(), None if states is None else states.detach()
        )

    def _record_batch(
        self,
        module: Any,
        fqns: List[str],
        indices: torch.Tensor,
        offsets: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        num_features = len(module.feature_table_map)
        batch = (offsets.numel() - 1) // num_features
        bounds = offsets[::batch].tolist() if batch > 0 else [0] * (num_features + 1)
        per_table: Dict[int, List[Tuple[int, int]]] = {}
        for f, t in enumerate(module.feature_table_map):
            per_table.setdefault(t, []).append((bounds[f], bounds[f + 1]))
        with_rows = self._mode == TrackingMode.EMBEDDING
        for t, ranges in per_table.items():
            ids = torch.cat([indices[lo:hi] for lo, hi in ranges])
            if not ids.numel():
                continue
            if with_rows:
                self._append(fqns[t], ids, torch.cat([output[lo:hi] for lo, hi in ranges]))
            elif self._mode in _OPTIMIZER_STATE_MODES:
                self._append(fqns[t], ids, self._tracked_state(fqns[t], ids))
            else:
                self._append(fqns[t], ids, None)

    def record_lookup(
        self,
        kjt: Any,
        states: torch.Tensor,
        emb_module: Optional[nn.Module] = None,
        raw_ids: Optional[torch.Tensor] = None,
    ) -> None:
        """TorchRec's post-lookup hook: record the lookup as the tracking mode asks.

        Args:
            kjt: the KeyedJaggedTensor the lookup served (raw keys for dynamic tables).
            states: the lookup's output, (n, D) row per id in EMBEDDING mode.
            emb_module: unused: the optimizer state is read from the tracked table itself.
            raw_ids: unused (part of TorchRec's signature).
        """
        if self._mode == TrackingMode.ID_ONLY:
            self.record_ids(kjt)
        elif self._mode == TrackingMode.EMBEDDING:
            self.record_embeddings(kjt, states)
        elif self._mode == TrackingMode.MOMENTUM_LAST:
            self.record_momentum(emb_module, kjt)
        else:
            self.record_rowwise_optim_state(emb_module, kjt)

    def _per_table_ids(
        self, kjt: Any
    ) -> Dict[str, Tuple[List[torch.Tensor], List[Tuple[int, int]]]]:
        """Per tracked table: the KJT's ids of its features and their ranges in ``kjt.values()``."""
        out: Dict[str, Tuple[List[torch.Tensor], List[Tuple[int, int]]]] = {}
        offset = 0
        for key, count in zip(kjt.keys(), kjt.length_per_key()):
            fqn = self.feature_to_fqn.get(key)
            if fqn is not None and count:
                ids, ranges = out.setdefault(fqn, ([], []))
                ids.append(kjt[key].values())
                ranges.append((offset, offset + count))
            offset += count
        return out

    def record_ids(self, kjt: Any) -> None:
        """Record the ids of the KJT's tracked features, per table."""
        for fqn, (ids, _) in self._per_table_ids(kjt).items():
            self._append(fqn, torch.cat(ids), None)

    def record_embeddings(self, kjt: Any, embeddings: torch.Tensor) -> None:
        """Record the ids and their looked-up rows (``embeddings``: one row per id of ``kjt``)."""
        n = kjt.values().numel()
        if embeddings.numel() % max(n, 1) != 0:
            raise ValueError(
                f"DynamicEmbDeltaTracker.record_embeddings: {n} ids and {embeddings.numel()} "
                f"embedding elements do not make one row per id"
            )
        rows = embeddings.reshape(n, -1)
        for fqn, (ids, ranges) in self._per_table_ids(kjt).items():
            self._append(fqn, torch.cat(ids), torch.cat([rows[lo:hi] for lo, hi in ranges]))

    def record_momentum(self, emb_module: Optional[nn.Module], kjt: Any) -> None:
        """Record the ids with the norm of their first optimizer state, read from the table now.

        ``emb_module`` (TorchRec's TBE) is not needed: each table's state is read from the table.
        """
        for fqn, (ids, _) in self._per_table_ids(kjt).items():
            keys = torch.cat(ids)
            self._append(fqn, keys, self._momentum_norm(fqn, keys))

    def record_rowwise_optim_state(self, emb_module: Optional[nn.Module], kjt: Any) -> None:
        """Record the ids with their row-wise Adagrad accumulator, read from the table now."""
        for fqn, (ids, _) in self._per_table_ids(kjt).items():
            keys = torch.cat(ids)
            self._append(fqn, keys, self._rowwise_accumulator(fqn, keys))

    # ---- optimizer state ------------------------------------------------------------------------
    def _first_state(self, fqn: str, keys: torch.Tensor) -> torch.Tensor:
        """(n, w) the first optimizer state block of each key's stored row (zeros when not stored):
        Adam's first moment or Adagrad's accumulator (w = dim), row-wise Adagrad's scalar (w = 1)."""
        from dynamicemb_core.optim import OptimizerKind

        module: Any = self._modules[fqn]
        t = self._table_index[fqn]
        dim = int(module.dims[t])
        width = 1 if module._kind is OptimizerKind.ROWWISE_ADAGRAD else dim
        tier = module.tables[t]
        found, rows, _ = tier.find(0, keys.to(tier.device))
        state = rows[:, dim : dim + width].to(torch.float32)
        return torch.where(found[:, None], state, torch.zeros_like(state)).to(keys.device)

    def _momentum_norm(self, fqn: str, keys: torch.Tensor) -> torch.Tensor:
        return self._first_state(fqn, keys).norm(dim=1)

    def _rowwise_accumulator(self, fqn: str, keys: torch.Tensor) -> torch.Tensor:
        return self._first_state(fqn, keys)[:, 0]

    def _tracked_state(self, fqn: str, keys: torch.Tensor) -> torch.Tensor:
        if self._mode == TrackingMode.MOMENTUM_LAST:
            return self._momentum_norm(fqn, keys)
        return self._rowwise_accumulator(fqn, keys)

    def get_latest(self, ids: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, UniqueRows]:
        """Per tracked table, keys with their current first optimizer state (see ``_first_state``).

        TorchRec returns one dense state tensor per table, indexed by row; a dynamic table has no
        such tensor, so this returns the keys asked for in ``ids`` (``{fqn: keys}``), or every stored
        key of each tracked table when ``ids`` is None.
        """
        out: Dict[str, UniqueRows] = {}
        for fqn in self.tracked_fqns:
            if ids is not None:
                if fqn not in ids:
                    continue
                keys = ids[fqn].to(torch.int64)
            else:
                module: Any = self._modules[fqn]
                tier = module.tables[self._table_index[fqn]]
                parts = [k for k, _, _ in tier.export(0)]
                keys = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
            out[fqn] = UniqueRows(ids=keys, states=self._first_state(fqn, keys))
        return out

    def fqn_to_feature_names(self) -> Dict[str, List[str]]:
        """Per tracked table, the features that look it up (TorchRec's mapping).

        A local ``BatchedDynamicEmbeddingTables`` has no feature names; its features are named
        ``"<table>.feature<i>"`` by their position in ``feature_table_map``.
        """
        return {fqn: list(self._fqn_to_features[fqn]) for fqn in self.tracked_fqns}

    # ---- batch index and compaction --------------------------------------------------------------
    def step(self) -> None:
        """Advance the batch index (compacting the unread window first with ``auto_compact``)."""
        if self._auto_compact:
            self.trigger_compaction()
        self.curr_batch_idx += 1

    def trigger_compaction(self) -> None:
        """Merge every batch since the furthest consumer's position into one (at most once per step)."""
        if self.curr_compact_index >= self.curr_batch_idx:
            return
        start = max(self.per_consumer_batch_idx.values())
        end = self.curr_batch_idx
        if start < end:
            self.compact(start, end)
            self.curr_compact_index = end

    def compact(self, start_idx: int, end_idx: int) -> None:
        """Merge recorded batches with ``start_idx <= batch < end_idx``."""
        self.store.compact(start_idx, end_idx)

    # ---- reading ------------------------------------------------------------------------------
    def _consumer(self, consumer: Optional[str]) -> str:
        consumer = consumer or self.DEFAULT_CONSUMER
        if consumer not in self.per_consumer_batch_idx:
            raise ValueError(
                f"DynamicEmbDeltaTracker: unknown consumer '{consumer}'; consumers are "
                f"{sorted(self.per_consumer_batch_idx)}"
            )
        return consumer

    def get_unique(
        self,
        consumer: Optional[str] = None,
        top_percentage: Optional[float] = 1.0,
        per_table_percentage: Optional[Dict[str, Tuple[float, str]]] = None,
        sorted_by_indices: Optional[bool] = True,
    ) -> Dict[str, UniqueRows]:
        """Per tracked table, the unique raw keys (and rows) recorded since ``consumer``'s last read.

        Tables with nothing new report empty tensors. Top-k arguments are accepted for TorchRec
        compatibility and ignored (every row is returned).
        """
        consumer = self._consumer(consumer)
        end = self.curr_batch_idx + 1
        start = max(self.per_consumer_batch_idx.values())
        if start < end:
            self.compact(start, end)
        rows = self.store.get_unique(from_idx=self.per_consumer_batch_idx[consumer])
        for fqn in self.tracked_fqns:
            rows.setdefault(fqn, UniqueRows(ids=torch.empty(0, dtype=torch.int64), states=None))
        self.per_consumer_batch_idx[consumer] = end
        if self._delete_on_read:
            self.store.delete(up_to_idx=min(self.per_consumer_batch_idx.values()))
        if self._mode in _ROWWISE_MODES:  # growth of the accumulator since the first lookup
            for fqn, unique in rows.items():
                if unique.states is not None and unique.ids.numel():
                    unique.states = self._rowwise_accumulator(fqn, unique.ids) - unique.states
        return rows

    def get_unique_ids(self, consumer: Optional[str] = None) -> Dict[str, torch.Tensor]:
        """Per tracked table, the unique raw keys recorded since ``consumer``'s last read."""
        return {fqn: rows.ids for fqn, rows in self.get_unique(consumer).items()}

    def clear(self, consumer: Optional[str] = None) -> None:
        """Drop recorded batches: all of them (None, or the only consumer)."""
        if consumer is None or len(self.per_consumer_batch_idx) == 1:
            self._consumer(consumer)
            self.store.delete()

    def get_tracked_modules(self) -> Dict[str, nn.Module]:
        """TorchRec API: the tracked tables by name, each with the dynamic module serving it."""
        return dict(self._modules)
