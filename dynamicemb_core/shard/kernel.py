"""The compute kernel TorchRec's lookups call for a group of dynamic tables, and its fused optimizer.

:class:`BatchedDynamicEmbeddingKernel` is a TorchRec ``BaseEmbedding`` over one
``BatchedDynamicEmbeddingTables`` (all dynamic tables of one group on this rank). It exposes no dense
parameters and no state_dict entries: dynamic weights live in hash tables and travel through
``DynamicEmbDump`` / ``DynamicEmbLoad``. TorchRec skips state_dict handling for the customized kernel,
so ``model.state_dict()`` holds native tables and dense weights only.

:class:`DynamicEmbFusedOptimizer` is the ``KeyedOptimizer`` TorchRec collects from every
``FusedOptimizerModule`` into ``DistributedModelParallel.fused_optimizer``: the update itself happens in
backward; ``step()`` pushes ``param_groups[0]["lr"]`` to the tables, as TorchRec's own fused optimizer
does, so learning-rate schedulers work unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.optim.fused import FusedOptimizerModule
from torchrec.optim.keyed import KeyedOptimizer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.config import DynamicEmbPoolingMode, DynamicEmbTableOptions

__all__ = ["BatchedDynamicEmbeddingKernel", "DynamicEmbFusedOptimizer"]


class DynamicEmbFusedOptimizer(KeyedOptimizer):
    """The fused optimizer of one dynamic kernel, keyed ``<table>.weight`` like TorchRec's.

    Args:
        module: the batched tables; must offer ``set_learning_rate(lr)``.
        table_names: tables the module holds.
        learning_rate: initial ``param_groups[0]["lr"]``.
    """

    def __init__(self, module: nn.Module, table_names: List[str], learning_rate: float) -> None:
        self._module: Any = module
        # Placeholders: the rows live in hash tables, there is no dense tensor to expose.
        params = {f"{name}.weight": torch.empty(0) for name in table_names}
        super().__init__(params, {}, [{"params": list(params.values()), "lr": learning_rate}])

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Nothing to clear: gradients are applied to the rows inside backward."""

    def step(self, closure: Any = None) -> None:
        """Send the (possibly scheduled) learning rate to the tables for the next backward."""
        self._module.set_learning_rate(float(self.param_groups[0]["lr"]))


def _optimizer_kwargs(
    fused_params: Mapping[str, Any], tables: List[str]
) -> Tuple[Any, Dict[str, Any], torch.dtype]:
    """The ``optimizer``, its hyper-parameters and the output dtype, from TorchRec fused params."""
    from dynamicemb_core.optim.args import split_fused_params

    optimizer, kwargs, output_dtype = split_fused_params(fused_params)
    if optimizer is None:
        raise ValueError(
            f"dynamic tables {tables}: the sharder's fused_params must name an 'optimizer' "
            f"(fbgemm_gpu EmbOptimType: EXACT_SGD, ADAM, EXACT_ADAGRAD or EXACT_ROWWISE_ADAGRAD)"
        )
    return optimizer, kwargs, output_dtype


class BatchedDynamicEmbeddingKernel(BaseEmbedding, FusedOptimizerModule):
    """TorchRec kernel over one group of dynamic tables on this rank.

    Args:
        config: TorchRec's group (tables, features, pooling, fused params).
        table_options: prepared options by table name (from the plan).
        pooling_mode: SUM for pooled row-wise sharding (TorchRec applies MEAN's divisor after the
            reduce-scatter), NONE for sequence sharding.
        device: where the tables live.
        pg: the sharding's process group (for ``world_size`` / ``rank`` that dump and load read).
    """

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        table_options: Mapping[str, DynamicEmbTableOptions],
        pooling_mode: DynamicEmbPoolingMode,
        device: Optional[torch.device],
        pg: Optional[dist.ProcessGroup] = None,
    ) -> None:
        super().__init__()
        from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

        self._config = config
        self.table_names: List[str] = [t.name for t in config.embedding_tables]
        feature_table_map: List[int] = []
        for index, table in enumerate(config.embedding_tables):
            feature_table_map.extend([index] * table.num_features())
        fused = dict(config.fused_params or {})
        optimizer, optimizer_kwargs, output_dtype = _optimizer_kwargs(fused, self.table_names)
        options = [table_options[name] for name in self.table_names]
        self.world_size: int = dist.get_world_size(pg) if dist.is_initialized() else 1
        self.rank: int = dist.get_rank(pg) if dist.is_initialized() else 0
        self.dist_types: List[str] = [o.dist_type for o in options]
        self._emb_module = BatchedDynamicEmbeddingTables(
            table_options=options,
            table_names=self.table_names,
            feature_table_map=feature_table_map,
            pooling_mode=pooling_mode,
            optimizer=optimizer,
            device=device if device is not None else torch.device("cpu"),
            output_dtype=output_dtype,
            **optimizer_kwargs,
        )
        # the weights of the features are occurrence counts of deduplicated ids (forward)
        self.weights_are_counts = False
        self._optim = DynamicEmbFusedOptimizer(
            self._emb_module, self.table_names, float(optimizer_kwargs.get("learning_rate", 0.01))
        )

    @property
    def emb_module(self) -> nn.Module:
        """The ``BatchedDynamicEmbeddingTables`` this kernel drives."""
        return self._emb_module

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    @property
    def fused_optimizer(self) -> KeyedOptimizer:
        return self._optim

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Look up the features' raw keys: (B, sum D) pooled or (n, D) sequence.

        With :attr:`weights_are_counts` (set by a sharded EmbeddingCollection that deduplicates
        its ids, ``use_index_dedup=True``), the weights are each id's occurrence count in the
        batch before deduplication, passed on as ``occurrence_counts``.
        """
        if self.weights_are_counts:
            return self._emb_module(
                features.values().to(torch.int64),
                features.offsets().to(torch.int64),
                occurrence_counts=features.weights_or_none(),
            )
        return self._emb_module(
            features.values().to(torch.int64),
            features.offsets().to(torch.int64),
            features.weights_or_none(),
        )

    def prefetch(self, features: KeyedJaggedTensor, forward_stream: Any = None) -> None:
        """Cache the features' keys ahead of their forward (tables with a device cache only)."""
        if self._needs_prefetch:
            self._emb_module.prefetch(
                features.values().to(torch.int64),
                features.offsets().to(torch.int64),
                forward_stream=forward_stream,
            )

    @property
    def _needs_prefetch(self) -> bool:
        """Some table keeps a device cache over a next tier (caching or external storage)."""
        return any(
            o.caching or o.external_storage is not None for o in self._emb_module.table_options
        )

    # Dynamic weights are not module state: see the module docstring.
    def state_dict(
        self,
        destination: Optional[Dict[str, Any]] = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> Dict[str, Any]:
        return destination if destination is not None else OrderedDict()

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[Tuple[str, nn.Parameter]]:
        return iter(())

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[Tuple[str, torch.Tensor]]:
        return iter(())

    def named_parameters_by_table(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """No dense weights to expose per table."""
        return iter(())

    def flush(self) -> None:
        """Write cached rows back to their storage tier (a no-op without caching)."""
        flush = getattr(self._emb_module, "flush", None)
        if flush is not None:
            flush()

    def purge(self) -> None:
        """Nothing to purge: the tables keep no TorchRec cache."""
