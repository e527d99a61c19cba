"""Inference-only EmbeddingBagCollection / EmbeddingCollection over read-only dynamic tables.

Built from the training side's own description (TorchRec ``EmbeddingBagConfig`` / ``EmbeddingConfig``
and one ``DynamicEmbTableOptions`` per table), holding keys, slots and embedding rows only: no
optimizer state, no admission, no insert on lookup. ``forward`` takes a ``KeyedJaggedTensor`` like
TorchRec's collections; :meth:`lookup` takes the KJT's plain tensors and is what ``torch.export``
traces (a package whose inputs are tensors loads without TorchRec).

Three ways to fill the tables, all going through the checkpoint code (one reader of each format):
:meth:`from_dump` (a ``DynamicEmbDump`` folder of any world size), :meth:`from_model` (the tables of
a trained model in this process, slot for slot) and :meth:`replay` (``incremental_dump`` deltas,
applied in place).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb_core.inference.tables import ServingTable, ServingTables

__all__ = ["InferenceEmbeddingBagCollection", "InferenceEmbeddingCollection"]

TableOptions = Union[Mapping[str, DynamicEmbTableOptions], Sequence[DynamicEmbTableOptions]]


def _pooling_of(config: Any, sequence: bool) -> DynamicEmbPoolingMode:
    if sequence:
        return DynamicEmbPoolingMode.NONE
    name = getattr(getattr(config, "pooling", None), "name", "SUM")
    if name not in ("SUM", "MEAN"):
        raise ValueError(f"table {config.name!r}: pooling must be SUM or MEAN, got {name}")
    return DynamicEmbPoolingMode[name]


def _options_list(
    configs: Sequence[Any], table_options: TableOptions
) -> List[DynamicEmbTableOptions]:
    if isinstance(table_options, Mapping):
        missing = [c.name for c in configs if c.name not in table_options]
        if missing:
            raise ValueError(f"table_options: no DynamicEmbTableOptions for tables {missing}")
        return [table_options[c.name] for c in configs]
    options = list(table_options)
    if len(options) != len(configs):
        raise ValueError(
            f"table_options: {len(options)} options for {len(configs)} tables; give one per table"
        )
    return options


class _InferenceCollection(nn.Module):
    """The shared body of both collections (``sequence`` selects EmbeddingCollection semantics)."""

    _sequence = False

    def __init__(
        self,
        tables: Sequence[Any],
        table_options: TableOptions,
        device: torch.device | str = "cpu",
        *,
        num_shards: Optional[Mapping[str, int]] = None,
        shard_capacity: Optional[Mapping[str, int]] = None,
        collection: str = "model",
        validate: bool = True,
    ) -> None:
        """
        Args:
            tables: TorchRec ``EmbeddingBagConfig`` (bag collection) or ``EmbeddingConfig``s.
            table_options: one ``DynamicEmbTableOptions`` per table (by name or in order), the
                training ones: score strategy, ``bucket_capacity``, ``max_capacity`` (slots per shard,
                as the planner set it), ``eval_initializer_args`` (what a missing key reads),
                ``dist_type``.
            device: where the tables live.
            num_shards: ``{table: world size}`` of a row-wise sharded trainer (default 1).
            shard_capacity: ``{table: slots per shard}`` overriding ``max_capacity``.
            collection: the trainer's collection name (the key of its deltas and dump entries):
                ``"model"`` for a model that is the collection, else ``"model.<path>"``.
            validate: check offsets in the bag op (one device sync per batch on CUDA).
        """
        super().__init__()
        configs = list(tables)
        options = _options_list(configs, table_options)
        num_shards = dict(num_shards or {})
        shard_capacity = dict(shard_capacity or {})
        serving, feature_names, feature_table_map = [], [], []
        for i, (config, opts) in enumerate(zip(configs, options)):
            capacity = shard_capacity.get(config.name, opts.max_capacity)
            if not capacity:
                raise ValueError(
                    f"table {config.name!r}: max_capacity (slots per shard) must be set, got "
                    f"{capacity}"
                )
            serving.append(
                ServingTable(
                    name=config.name,
                    dim=int(config.embedding_dim),
                    options=opts,
                    pooling=_pooling_of(config, self._sequence),
                    num_shards=int(num_shards.get(config.name, 1)),
                    shard_capacity=int(capacity),
                    bucket_capacity=int(opts.bucket_capacity),
                    num_embeddings=getattr(config, "num_embeddings", None),
                )
            )
            feature_names.extend(config.feature_names)
            feature_table_map.extend([i] * len(config.feature_names))
        if self._sequence and len({t.dim for t in serving}) != 1:
            raise ValueError(
                "InferenceEmbeddingCollection: every table needs one embedding dim, got "
                f"{ {t.name: t.dim for t in serving} }"
            )
        self.collection = collection
        self.embeddings = ServingTables(
            serving, feature_names, feature_table_map, device, validate=validate
        )

    # ---- construction from trained state ------------------------------------------------------
    @classmethod
    def _build(
        cls,
        serving: List[ServingTable],
        feature_names: List[str],
        feature_table_map: List[int],
        device: torch.device | str,
        collection: str,
        validate: bool,
    ) -> Any:
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.collection = collection
        module.embeddings = ServingTables(
            serving, feature_names, feature_table_map, device, validate=validate
        )
        return module

    @classmethod
    def from_dump(
        cls,
        path: str,
        tables: Sequence[Any],
        table_options: TableOptions,
        device: torch.device | str = "cpu",
        *,
        collection: Optional[str] = None,
        shard_capacity: Optional[Mapping[str, int]] = None,
        validate: bool = True,
    ) -> Any:
        """Build the collection and load a ``DynamicEmbDump`` folder into it.

        The dump's world size becomes each table's shard count: shard ``r`` takes the keys rank ``r``
        owns under the table's ``dist_type``, so the served tables keep the trainer's layout and
        accept its deltas. Each key goes back to the slot the dump recorded when its shard has the
        trainer's capacity and bucket width (else the shard is packed and marked; see
        ``replay_increment``).

        Args:
            path: the dump folder (its ``MANIFEST.json`` lists the files).
            tables, table_options, device, shard_capacity, validate: as the constructor.
            collection: the collection path inside the dump; None picks the one holding the tables.

        Raises:
            CheckpointCorruptError / CheckpointMismatchError: a bad folder, or a table of another
                dim or score strategy (the tables stay empty).
            ValueError: a table missing from the dump, or keys that found no slot.
        """
        from dynamicemb_core.checkpoint.dump import load_tables
        from dynamicemb_core.checkpoint.manifest import entries_by_table, read_manifest

        grouped = entries_by_table(read_manifest(path))
        names = [c.name for c in tables]
        if collection is None:
            holding = sorted({c for c, t in grouped if t in names})
            complete = [c for c in holding if all((c, n) in grouped for n in names)]
            candidates = complete or holding
            if len(candidates) != 1:
                raise ValueError(
                    f"from_dump: {path} holds tables of {names} in collections {candidates}; "
                    "pass collection= to pick one"
                )
            collection = candidates[0]
        missing = [n for n in names if (collection, n) not in grouped]
        if missing:
            have = sorted(f"{c}/{t}" for c, t in grouped)
            raise ValueError(
                f"from_dump: {path} has no table {missing} in '{collection}'; it has {have}"
            )
        shards = {n: grouped[(collection, n)][0].world_size for n in names}
        module = cls(
            tables,
            table_options,
            device,
            num_shards=shards,
            shard_capacity=shard_capacity,
            collection=collection,
            validate=validate,
        )
        # load_tables refuses, before writing, a shard whose keys would not all find a slot, and
        # raises for a key missing after the write: nothing is dropped silently here
        load_tables(path, module.embeddings.handles(collection), show_progress=False)
        module.embeddings._sync_state()
        return module

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        collection: Optional[str] = None,
        device: Optional[torch.device | str] = None,
        *,
        validate: bool = True,
    ) -> Any:
        """Copy the dynamic tables of a trained model in this process, slot for slot.

        Args:
            model: a module holding a ``BatchedDynamicEmbeddingTables`` or a TorchRec collection
                sharded onto dynamic tables (world size 1: a process holds only its own shard of a
                wider job; dump that job with ``DynamicEmbDump`` and use :meth:`from_dump`).
            collection: the collection's path in the model; None when the model has exactly one.
            device: where the served tables live (default: the trained tables' device).
        """
        from dynamicemb_core.checkpoint.discovery import find_tables, group_by_collection

        grouped = group_by_collection(find_tables(model))
        if collection is None:
            if len(grouped) != 1:
                raise ValueError(
                    f"from_model: the model has dynamic collections {sorted(grouped)}; pass "
                    "collection= to pick one"
                )
            collection = next(iter(grouped))
        if collection not in grouped:
            raise ValueError(
                f"from_model: the model has no dynamic collection '{collection}'; it has "
                f"{sorted(grouped)}"
            )
        handles = grouped[collection]
        wide = [h.qualified_name for h in handles if h.world_size > 1]
        if wide:
            raise NotImplementedError(
                f"from_model: tables {wide} are sharded over several processes and this one holds "
                "only its shard; dump them with DynamicEmbDump and build with from_dump"
            )
        names, feature_names, feature_table_map, pooling = _features_of(model, collection, handles)
        by_name = {h.name: h for h in handles}
        serving = []
        for name in names:
            h = by_name[name]
            serving.append(
                ServingTable(
                    name=name,
                    dim=h.dim,
                    options=h.options,
                    pooling=DynamicEmbPoolingMode.NONE if cls._sequence else pooling[name],
                    num_shards=1,
                    shard_capacity=int(h.table.capacity(h.table_id)),
                    bucket_capacity=int(h.table.bucket_capacity(h.table_id)),
                    num_embeddings=h.num_embeddings,
                )
            )
        device = device if device is not None else handles[0].device
        module = cls._build(serving, feature_names, feature_table_map, device, collection, validate)
        targets = {h.name: h for h in module.embeddings.handles(collection)}
        for name in names:
            _copy_slots(by_name[name], targets[name])
        return module

    # ---- freshness ----------------------------------------------------------------------------
    def replay(self, deltas: Mapping[str, Any], content: Any = None) -> None:
        """Apply ``incremental_dump`` deltas in place (the served buffers keep their storage).

        Only this collection's entry of ``deltas`` is read. Every table is checked before any is
        written (layout, shapes, slots); see ``replay_increment``.

        Raises:
            IncompatibleDeltaError: the delta does not fit, or a shard that ``from_dump`` had to
                pack gets a delta that does not report evictions (nothing was written).
        """
        from dynamicemb_core.checkpoint.replay import apply_replay, plan_replay
        from dynamicemb_core.checkpoint.types import ReplayContent

        if self.collection not in deltas:
            raise ValueError(
                f"replay: deltas hold collections {sorted(deltas)}, not '{self.collection}'"
            )
        content = ReplayContent.EMBEDDING_ONLY if content is None else content
        before = self.embeddings.state_identity()
        handles = self.embeddings.handles(self.collection)
        jobs = plan_replay(
            handles, {self.collection: deltas[self.collection]}, content, every_shard=True
        )
        for job in jobs:
            apply_replay(job)
        self.embeddings._sync_state()
        if self.embeddings.state_identity() != before:  # pragma: no cover - insert_at never grows
            raise RuntimeError("replay: a served buffer was replaced; re-attach compiled models")

    # ---- lookup -------------------------------------------------------------------------------
    @property
    def feature_names(self) -> List[str]:
        return self.embeddings.feature_names

    def lookup(
        self, values: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None
    ) -> Tensor:
        """The tensor form of :meth:`forward` (``torch.export``'s entry): see ServingTables.lookup."""
        return self.embeddings.lookup(values, offsets, per_sample_weights)

    def _kjt_tensors(self, features: Any) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        from dynamicemb_core.lookup.features import check_kjt_shape

        check_kjt_shape(features, type(self).__name__)
        keys = list(features.keys())
        if keys != self.feature_names:
            absent = [f for f in self.feature_names if f not in keys]
            if absent:
                raise ValueError(f"{type(self).__name__}: the batch has no feature {absent}")
            features = features.permute([keys.index(f) for f in self.feature_names])
        return features.values(), features.offsets(), features.weights_or_none()


def _copy_slots(source: Any, target: Any) -> None:
    """Put every key of ``source`` at its own slot of ``target`` (same layout), with its row."""
    from dynamicemb_core.checkpoint.scores import clock_columns, from_ages
    from dynamicemb_core.checkpoint.table_io import export_rows, table_now

    if source.flush_cache is not None:
        source.flush_cache()
    rows = export_rows(source)
    device = target.device
    scores = from_ages(rows.scores.to(device), clock_columns(target.options), table_now(target))
    keys, slots = rows.keys.to(device), rows.slots.to(device)
    target.table.insert_at(target.table_id, keys, slots, scores=scores)
    target.storage.write_rows(target.table_id, slots, rows.embeddings.to(device, torch.float32))


def _features_of(
    model: nn.Module, collection: str, handles: Sequence[Any]
) -> Tuple[List[str], List[str], List[int], Dict[str, DynamicEmbPoolingMode]]:
    """Table order, feature names, feature -> table map and pooling of a trained collection."""
    from dynamicemb_core.checkpoint.discovery import _unwrap, module_paths
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    module = None
    paths = module_paths(model)
    for _, sub in model.named_modules():
        if paths.get(id(sub)) == collection:
            module = _unwrap(sub)  # the collection itself, not a DMP/DDP wrapper of it
            break
    if isinstance(module, BatchedDynamicEmbeddingTables):
        names = list(module.table_names)
        fmap = list(module.feature_table_map)
        features = [f"{names[t]}.{j}" for j, t in enumerate(fmap)]
        mode = module.pooling_mode
        return names, features, fmap, {n: mode for n in names}
    configs = None
    for attr in ("_embedding_bag_configs", "_embedding_configs"):
        configs = getattr(module, attr, None) or configs
    if not configs:
        raise NotImplementedError(
            f"from_model: collection '{collection}' is a {type(module).__name__}; expected a "
            "BatchedDynamicEmbeddingTables or a sharded TorchRec collection"
        )
    dynamic = {h.name for h in handles}
    static = [c.name for c in configs if c.name not in dynamic]
    if static:
        raise NotImplementedError(
            f"from_model: tables {static} of '{collection}' are not dynamic; serve them with TorchRec"
        )
    names, features, fmap, pooling = [], [], [], {}
    for i, c in enumerate(configs):
        names.append(c.name)
        features.extend(c.feature_names)
        fmap.extend([i] * len(c.feature_names))
        pooling[c.name] = (
            _pooling_of(c, False) if hasattr(c, "pooling") else DynamicEmbPoolingMode.NONE
        )
    return names, features, fmap, pooling


class InferenceEmbeddingBagCollection(_InferenceCollection):
    """TorchRec ``EmbeddingBagCollection`` semantics over read-only dynamic tables.

    ``forward(kjt)`` returns a ``KeyedTensor`` (B, sum of dims) with one block per feature, SUM or
    MEAN per table, optional per-sample weights (SUM).
    """

    def forward(self, features: Any) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        out = self.lookup(*self._kjt_tensors(features))
        return KeyedTensor(
            keys=list(self.feature_names),
            length_per_key=list(self.embeddings.feature_dims),
            values=out,
        )


class InferenceEmbeddingCollection(_InferenceCollection):
    """TorchRec ``EmbeddingCollection`` semantics (sequence output, one row per id).

    ``forward(kjt)`` returns ``{feature: JaggedTensor}``; all tables share one embedding dim.
    """

    _sequence = True

    def forward(self, features: Any) -> Dict[str, Any]:
        from torchrec.sparse.jagged_tensor import JaggedTensor

        values, offsets, _ = self._kjt_tensors(features)
        rows = self.lookup(values, offsets)
        batch = (offsets.numel() - 1) // len(self.feature_names)
        bounds = offsets[::batch].tolist() if batch else [0] * (len(self.feature_names) + 1)
        out = {}
        for f, name in enumerate(self.feature_names):
            lo, hi = bounds[f], bounds[f + 1]
            lengths = (
                offsets[f * batch + 1 : (f + 1) * batch + 1] - offsets[f * batch : (f + 1) * batch]
            )
            out[name] = JaggedTensor(values=rows[lo:hi], lengths=lengths)
        return out
