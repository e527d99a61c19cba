"""Row-wise sharding of dynamic tables: TorchRec's RW shardings with our input dist and kernel.

Only two things differ from TorchRec's ``RwSequenceEmbeddingSharding`` / ``RwPooledEmbeddingSharding``:
the input dist routes dynamic features by their ``dist_type`` and keeps raw keys
(:mod:`dynamicemb_core.shard.rw_input_dist`), and the lookup builds a
:class:`~dynamicemb_core.shard.kernel.BatchedDynamicEmbeddingKernel` for groups of dynamic tables
while native tables in the same sharding keep TorchRec's kernels. Output dists (sequence all-to-all,
pooled reduce-scatter) are TorchRec's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_lookup import (
    GroupedEmbeddingsLookup,
    GroupedPooledEmbeddingsLookup,
)
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embedding_types import (
    BaseEmbeddingLookup,
    BaseGroupedFeatureProcessor,
    EmbeddingComputeKernel,
    GroupedEmbeddingConfig,
)
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb_core.planner.parameter_sharding import is_dynamic_sharding
from dynamicemb_core.shard.kernel import BatchedDynamicEmbeddingKernel
from dynamicemb_core.shard.rw_input_dist import FeatureRoute, RwDynamicSparseFeaturesDist

__all__ = [
    "RwPooledDynamicEmbeddingSharding",
    "RwSequenceDynamicEmbeddingSharding",
    "has_dynamic_tables",
]


def has_dynamic_tables(sharding_infos: List[EmbeddingShardingInfo]) -> bool:
    """True when any table of the sharding is planned as dynamic."""
    return any(is_dynamic_sharding(info.param_sharding) for info in sharding_infos)


def _routes_by_feature(sharding_infos: List[EmbeddingShardingInfo]) -> Dict[str, FeatureRoute]:
    routes: Dict[str, FeatureRoute] = {}
    for info in sharding_infos:
        config = info.embedding_config
        if is_dynamic_sharding(info.param_sharding):
            route = FeatureRoute(info.param_sharding.dist_type, config.num_embeddings)
        else:
            route = FeatureRoute("continuous", config.num_embeddings, local_rows=True)
        for feature in config.feature_names:
            routes[feature] = route
    return routes


def _options_by_table(
    sharding_infos: List[EmbeddingShardingInfo],
) -> Dict[str, DynamicEmbTableOptions]:
    return {
        info.embedding_config.name: info.param_sharding.dynamicemb_options
        for info in sharding_infos
        if is_dynamic_sharding(info.param_sharding)
    }


class _DynamicKernelFactory:
    """What both lookups need to build our kernel; set before TorchRec's ``__init__`` builds kernels."""

    def _dynamic_setup(
        self,
        table_options: Mapping[str, DynamicEmbTableOptions],
        pooling_mode: DynamicEmbPoolingMode,
        pg: Optional[dist.ProcessGroup],
        device: Optional[torch.device],
    ) -> None:
        # object.__setattr__: nn.Module.__init__ has not run yet when these are set.
        object.__setattr__(self, "_demb_table_options", dict(table_options))
        object.__setattr__(self, "_demb_pooling_mode", pooling_mode)
        object.__setattr__(self, "_demb_pg", pg)
        object.__setattr__(self, "_demb_device", device)

    def _dynamic_kernel(
        self, config: GroupedEmbeddingConfig
    ) -> Optional[BatchedDynamicEmbeddingKernel]:
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return None
        return BatchedDynamicEmbeddingKernel(
            config,
            self._demb_table_options,  # type: ignore[attr-defined]
            self._demb_pooling_mode,  # type: ignore[attr-defined]
            self._demb_device,  # type: ignore[attr-defined]
            self._demb_pg,  # type: ignore[attr-defined]
        )

    def _create_embedding_kernel(
        self, config: GroupedEmbeddingConfig, *args: Any, **kwargs: Any
    ) -> nn.Module:
        # Overrides the TorchRec lookup that follows this class in the MRO.
        kernel = self._dynamic_kernel(config)
        return (
            kernel
            if kernel is not None
            else super()._create_embedding_kernel(config, *args, **kwargs)  # type: ignore[misc]
        )

    def prefetch(
        self, sparse_features: KeyedJaggedTensor, forward_stream: Any = None, **kwargs: Any
    ) -> None:
        """TorchRec's prefetch-pipeline hook: our kernels cache their keys, TorchRec's own groups
        prefetch as TorchRec decides.

        TorchRec's pooled lookup skips groups of the customized kernel; its sequence lookup, once
        one of its native groups caches (``_need_prefetch``), calls every group's
        ``emb_module.prefetch`` itself, ours included (with TBE's signature, which ours takes), so
        then ours are left to it: each batch is prefetched once, as its pins are released once.
        """
        torchrec_calls_ours = isinstance(self, GroupedEmbeddingsLookup) and bool(
            getattr(self, "_need_prefetch", False)
        )
        if not torchrec_calls_ours:
            groups = sparse_features.split(self._feature_splits)  # type: ignore[attr-defined]
            for op, features in zip(self._emb_modules, groups):  # type: ignore[attr-defined]
                if isinstance(op, BatchedDynamicEmbeddingKernel):
                    op.prefetch(features, forward_stream)
        super().prefetch(sparse_features, forward_stream, **kwargs)  # type: ignore[misc]


class DynamicEmbeddingsLookup(_DynamicKernelFactory, GroupedEmbeddingsLookup):
    """TorchRec's sequence lookup; groups of dynamic tables get our kernel."""

    def __init__(
        self,
        grouped_configs: List[GroupedEmbeddingConfig],
        table_options: Mapping[str, DynamicEmbTableOptions],
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        **kwargs: Any,
    ) -> None:
        self._dynamic_setup(table_options, DynamicEmbPoolingMode.NONE, pg, device)
        super().__init__(grouped_configs=grouped_configs, pg=pg, device=device, **kwargs)


class DynamicPooledEmbeddingsLookup(_DynamicKernelFactory, GroupedPooledEmbeddingsLookup):
    """TorchRec's pooled lookup; groups of dynamic tables get our kernel, pooling SUM (row-wise)."""

    def __init__(
        self,
        grouped_configs: List[GroupedEmbeddingConfig],
        table_options: Mapping[str, DynamicEmbTableOptions],
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        **kwargs: Any,
    ) -> None:
        # Row-wise shards hold partial bags: MEAN is applied by TorchRec after the reduce-scatter,
        # exactly as it does for its own row-wise tables (pooling_type_to_pooling_mode).
        self._dynamic_setup(table_options, DynamicEmbPoolingMode.SUM, pg, device)
        super().__init__(grouped_configs=grouped_configs, pg=pg, device=device, **kwargs)


def _check_supported(sharding: Any) -> None:
    if getattr(sharding, "_has_feature_processor", False):
        raise NotImplementedError(
            "dynamic tables: feature processors (position-weighted features) are not supported "
            "with row-wise dynamic sharding"
        )


class _RwDynamicSharding:
    """What both row-wise shardings add to TorchRec's: checks, per-feature routes, dynamic options.

    Listed before the TorchRec sharding in the bases; ``_demb_is_sequence`` picks the input dist's
    output layout (sequence or pooled).
    """

    _demb_is_sequence: bool

    def __init__(
        self, sharding_infos: List[EmbeddingShardingInfo], *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(sharding_infos, *args, **kwargs)  # type: ignore[call-arg]
        _check_supported(self)
        self._demb_routes = _routes_by_feature(sharding_infos)
        self._demb_options = _options_by_table(sharding_infos)

    def create_input_dist(
        self, device: Optional[torch.device] = None
    ) -> RwDynamicSparseFeaturesDist:
        routes = [self._demb_routes[f] for f in self.feature_names()]  # type: ignore[attr-defined]
        return RwDynamicSparseFeaturesDist(
            pg=self._pg,  # type: ignore[attr-defined]
            routes=routes,
            is_sequence=self._demb_is_sequence,
        )


class RwSequenceDynamicEmbeddingSharding(_RwDynamicSharding, RwSequenceEmbeddingSharding):
    """Row-wise sharding of an ``EmbeddingCollection``'s tables, some of them dynamic."""

    _demb_is_sequence = True

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        return DynamicEmbeddingsLookup(
            grouped_configs=self._grouped_embedding_configs,
            table_options=self._demb_options,
            pg=self._pg,
            device=device if device is not None else self._device,
            env=getattr(self, "_env", None),
        )


class RwPooledDynamicEmbeddingSharding(_RwDynamicSharding, RwPooledEmbeddingSharding):
    """Row-wise sharding of an ``EmbeddingBagCollection``'s tables, some of them dynamic."""

    _demb_is_sequence = False

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        from torchrec.distributed.types import ShardingType

        return DynamicPooledEmbeddingsLookup(
            grouped_configs=self._grouped_embedding_configs,
            table_options=self._demb_options,
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            sharding_type=ShardingType.ROW_WISE,
            env=getattr(self, "_env", None),
        )
