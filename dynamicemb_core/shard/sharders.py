"""Sharders for EmbeddingCollection and EmbeddingBagCollection with dynamic tables.

Used exactly like TorchRec's ``EmbeddingCollectionSharder`` / ``EmbeddingBagCollectionSharder``
(``fused_params`` names the optimizer and its hyper-parameters). Each builds TorchRec's sharded module
with one change: a row-wise group that holds a dynamic table is sharded by
:mod:`dynamicemb_core.shard.rw_sharding`. Native tables keep every TorchRec sharding, and the sharders
offer row-wise sharding on CPU too (TorchRec's EBC sharder does not), since that is the only way a
dynamic table is sharded.

state_dict: dynamic tables contribute no entries (they are not dense tensors); save and restore them
with ``DynamicEmbDump`` / ``DynamicEmbLoad``. Native tables and dense weights behave as in TorchRec.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Dict, Iterator, List, Optional, Type

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.types import ModuleSharder, ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynamicemb_core import nvtx
from dynamicemb_core.lookup.features import check_kjt_shape
from dynamicemb_core.planner.parameter_sharding import is_dynamic_sharding
from dynamicemb_core.shard.kernel import BatchedDynamicEmbeddingKernel
from dynamicemb_core.shard.rw_sharding import (
    RwPooledDynamicEmbeddingSharding,
    RwSequenceDynamicEmbeddingSharding,
    has_dynamic_tables,
)

__all__ = [
    "DynamicEmbeddingBagCollectionSharder",
    "DynamicEmbeddingCollectionSharder",
    "ShardedDynamicEmbeddingBagCollection",
    "ShardedDynamicEmbeddingCollection",
    "default_sharders",
]


def _construct(cls: type, base: type, **kwargs: Any) -> Any:
    """Call ``cls`` with the keyword arguments its TorchRec ``base`` accepts (1.6 lacks some)."""
    accepted = inspect.signature(base).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in accepted})


@contextlib.contextmanager
def _without_dynamic_configs(module: nn.Module, attr: str) -> Iterator[None]:
    """Hide dynamic tables from TorchRec code that expects a dense, fixed-size table.

    ``reset_parameters`` re-initializes each table's dense weight; a dynamic table has none (its rows
    are initialized on first lookup from ``initializer_args``), so it is left out for the call. The
    first ``input_dist`` checks ids against ``num_embeddings``, which a dynamic table exceeds by design.
    """
    configs = getattr(module, attr)
    plan: Any = module.module_sharding_plan
    setattr(module, attr, [c for c in configs if not is_dynamic_sharding(plan[c.name])])
    try:
        yield
    finally:
        setattr(module, attr, configs)


def _register_dynamic_kernels(module: nn.Module) -> None:
    """Make the dynamic kernels submodules of the sharded collection.

    TorchRec keeps its lookups in a plain list, out of ``named_modules()``; registering our kernels
    lets code that walks the model (dump, load, incremental dump, the demo's table stats) find every
    dynamic table under its collection's path. They add no parameters, buffers or state_dict keys.
    """
    kernels: List[nn.Module] = []
    lookups: Any = module._lookups
    for lookup in lookups:
        while isinstance(lookup, DistributedDataParallel):
            lookup = lookup.module
        kernels.extend(
            m
            for m in getattr(lookup, "_emb_modules", [])
            if isinstance(m, BatchedDynamicEmbeddingKernel)
        )
    module.dynamic_kernels = nn.ModuleList(kernels)


def _mark_stages(module: nn.Module) -> None:
    """NVTX ranges around the collection's lookup and output dist stages (with CUDA only): hooks
    on TorchRec's lookup and output-dist modules, which the sharded module calls in turn."""
    if not nvtx.NVTX_ENABLED:  # read at construction: tests switch it on
        return
    for attr, name in (
        ("_lookups", "dynamicemb::lookup"),
        ("_output_dists", "dynamicemb::output_dist"),
    ):
        for stage in getattr(module, attr, None) or []:
            stage.register_forward_pre_hook(lambda *_, n=name: nvtx.push(n))
            stage.register_forward_hook(lambda *_: nvtx.pop())


def _dynamic_rw_sharding(
    sharding_cls: type,
    sharding_type: str,
    sharding_infos: List[EmbeddingShardingInfo],
    env: ShardingEnv,
    device: Optional[torch.device],
    qcomm_codecs_registry: Optional[Dict[str, Any]],
) -> Optional[Any]:
    """``sharding_cls`` for a row-wise group holding a dynamic table; None: TorchRec shards it."""
    if sharding_type != ShardingType.ROW_WISE.value or not has_dynamic_tables(sharding_infos):
        return None
    return sharding_cls(
        sharding_infos=sharding_infos,
        env=env,
        device=device,
        qcomm_codecs_registry=qcomm_codecs_registry,
    )


class _DynamicShardedCollection:
    """What both sharded collections add to TorchRec's: kernel registration, dense-only reset.

    Listed before the TorchRec module in the bases; ``_demb_configs_attr`` names the attribute that
    holds its table configs.
    """

    _demb_configs_attr: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _register_dynamic_kernels(self)  # type: ignore[arg-type]
        _mark_stages(self)  # type: ignore[arg-type]

    def reset_parameters(self) -> None:
        with _without_dynamic_configs(self, self._demb_configs_attr):  # type: ignore[arg-type]
            super().reset_parameters()  # type: ignore[misc]

    def input_dist(self, ctx: Any, features: Any) -> Any:
        """TorchRec's input dist, after a shape check of the batch (no readback): lengths that are
        not one per feature and sample raise a ValueError naming the features, where TorchRec's
        split would fail with a bare reshape error. Marked as an NVTX range for profiles."""
        check_kjt_shape(features, type(self).__name__)
        with nvtx.nvtx_range("dynamicemb::input_dist"):
            return super().input_dist(ctx, features)  # type: ignore[misc]


class _RowWiseShardingTypes:
    """Sharder mixin: offer row-wise sharding on every device, as a dynamic table needs it."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        types: List[str] = super().sharding_types(compute_device_type)  # type: ignore[misc]
        if ShardingType.ROW_WISE.value in types:
            return types
        return types + [ShardingType.ROW_WISE.value]


class ShardedDynamicEmbeddingCollection(_DynamicShardedCollection, ShardedEmbeddingCollection):
    """TorchRec's sharded EmbeddingCollection whose row-wise dynamic tables use our sharding.

    Attributes:
        dynamic_kernels: the :class:`BatchedDynamicEmbeddingKernel` of every dynamic group on this rank.
    """

    _demb_configs_attr = "_embedding_configs"

    def _create_hash_size_info(self, feature_names: List[str], ctx: Any = None) -> None:
        """Nothing to prepare: :meth:`_dedup_indices` needs no per-table id bounds."""

    def _dedup_indices(self, ctx: Any, input_feature_splits: List[Any]) -> List[Any]:
        """``use_index_dedup=True``: each table's ids deduplicated with our ``unique`` op.

        Replaces TorchRec's version (FBGEMM's ``jagged_unique_indices``: no CPU kernel, and tables
        told apart by ``num_embeddings``, which does not bound a dynamic table's ids); see
        :mod:`dynamicemb_core.shard.dedup`. The context gets the input features and reverse indices
        TorchRec's output step expands the rows with.
        """
        from dynamicemb_core.shard.dedup import dedup_by_table

        accumulate = bool(getattr(self, "_enable_feature_score_weight_accumulation", False))
        if not accumulate:
            # each distinct id carries its occurrence count to its owner's lookup (dedup.py)
            for kernel in self.dynamic_kernels:
                kernel.weights_are_counts = True
        out = []
        with torch.autograd.profiler.record_function("## dedup_ec_indices ##"):
            for sharding, features in zip(
                self._sharding_type_to_sharding.values(), input_feature_splits
            ):
                per_table = [t.num_features() for t in sharding.embedding_tables()]
                dedup, reverse = dedup_by_table(
                    features, per_table, accumulate, counts_as_weights=not accumulate
                )
                ctx.input_features.append(features)
                ctx.reverse_indices.append(reverse)
                out.append(dedup)
        return out

    @classmethod
    def create_embedding_sharding(
        cls,
        sharding_type: str,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        qcomm_codecs_registry: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Any:
        sharding = _dynamic_rw_sharding(
            RwSequenceDynamicEmbeddingSharding,
            sharding_type,
            sharding_infos,
            env,
            device,
            qcomm_codecs_registry,
        )
        if sharding is not None:
            return sharding
        return super().create_embedding_sharding(
            sharding_type=sharding_type,
            sharding_infos=sharding_infos,
            env=env,
            device=device,
            qcomm_codecs_registry=qcomm_codecs_registry,
            **kwargs,
        )


class ShardedDynamicEmbeddingBagCollection(
    _DynamicShardedCollection, ShardedEmbeddingBagCollection
):
    """TorchRec's sharded EmbeddingBagCollection whose row-wise dynamic tables use our sharding.

    Attributes:
        dynamic_kernels: the :class:`BatchedDynamicEmbeddingKernel` of every dynamic group on this rank.
    """

    _demb_configs_attr = "_embedding_bag_configs"

    def input_dist(self, ctx: Any, features: Any) -> Any:
        """TorchRec's input dist; on the first call, TorchRec's id-range check skips dynamic tables.

        That first call validates the batch against each table's ``num_embeddings`` and warns
        ("Feature ... out of range") for any id beyond it. Ids beyond ``num_embeddings`` are what a
        dynamic table is for, so the dynamic tables are hidden from the check; native tables keep it.
        """
        if not getattr(self, "_has_uninitialized_input_dist", False):
            return super().input_dist(ctx, features)
        with _without_dynamic_configs(self, self._demb_configs_attr):
            return super().input_dist(ctx, features)

    @classmethod
    def create_embedding_bag_sharding(
        cls,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Any:
        sharding = _dynamic_rw_sharding(
            RwPooledDynamicEmbeddingSharding,
            sharding_infos[0].param_sharding.sharding_type,
            sharding_infos,
            env,
            device,
            qcomm_codecs_registry,
        )
        if sharding is not None:
            return sharding
        return super().create_embedding_bag_sharding(
            sharding_infos=sharding_infos,
            env=env,
            device=device,
            permute_embeddings=permute_embeddings,
            qcomm_codecs_registry=qcomm_codecs_registry,
            **kwargs,
        )


class DynamicEmbeddingCollectionSharder(_RowWiseShardingTypes, EmbeddingCollectionSharder):
    """``EmbeddingCollectionSharder`` for collections holding dynamic tables (sequence lookup)."""

    def shard(
        self,
        module: EmbeddingCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> ShardedEmbeddingCollection:
        return _construct(
            ShardedDynamicEmbeddingCollection,
            ShardedEmbeddingCollection,
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            use_index_dedup=getattr(self, "_use_index_dedup", False),
            module_fqn=module_fqn,
        )

    @property
    def sharded_module_type(self) -> Type[ShardedEmbeddingCollection]:
        return ShardedDynamicEmbeddingCollection


class DynamicEmbeddingBagCollectionSharder(_RowWiseShardingTypes, EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollectionSharder`` for collections holding dynamic tables (pooled lookup)."""

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> ShardedEmbeddingBagCollection:
        return _construct(
            ShardedDynamicEmbeddingBagCollection,
            ShardedEmbeddingBagCollection,
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
        )

    @property
    def sharded_module_type(self) -> Type[ShardedEmbeddingBagCollection]:
        return ShardedDynamicEmbeddingBagCollection


def default_sharders(
    fused_params: Optional[Dict[str, Any]] = None,
) -> List[ModuleSharder[nn.Module]]:
    """One EC and one EBC sharder sharing ``fused_params``."""
    return [
        DynamicEmbeddingCollectionSharder(fused_params=fused_params),
        DynamicEmbeddingBagCollectionSharder(fused_params=fused_params),
    ]
