"""DynamicEmbeddingEnumerator: TorchRec's enumerator, told which tables are dynamic.

A dynamic table has exactly one way to be sharded: row-wise over every rank, looked up by our
kernel. The enumerator therefore offers TorchRec's search only that option for it, and counts no
memory for its shards: the table's size is set by its own options (``max_capacity``,
``local_hbm_for_values``), not by TorchRec's dense-table estimate of ``num_embeddings x dim``, and
the spec keeps the topology's budget for the native tables ("the memory budget does not include the
consumption of dynamicemb").
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Union

from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Storage,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ShardingType

__all__ = ["DynamicEmbeddingEnumerator", "dynamic_table_names"]

# The kernel TorchRec's estimators price a dynamic table's shards with while planning; the planner
# turns it into our customized kernel in the final plan (DynamicEmbeddingShardingPlanner).
PLANNING_KERNEL: str = EmbeddingComputeKernel.FUSED.value


def dynamic_table_names(constraints: Optional[Dict[str, ParameterConstraints]]) -> Set[str]:
    """Names of the tables whose constraints set ``use_dynamicemb``."""
    return {name for name, c in (constraints or {}).items() if getattr(c, "use_dynamicemb", False)}


def _torchrec_constraints(
    constraints: Optional[Dict[str, ParameterConstraints]],
) -> Optional[Dict[str, ParameterConstraints]]:
    """Constraints as TorchRec should see them: dynamic tables restricted to one row-wise option."""
    if constraints is None:
        return None
    out: Dict[str, ParameterConstraints] = {}
    for name, c in constraints.items():
        if getattr(c, "use_dynamicemb", False):
            c = dataclasses.replace(
                c,
                sharding_types=[ShardingType.ROW_WISE.value],
                compute_kernels=[PLANNING_KERNEL],
            )
        out[name] = c
    return out


class DynamicEmbeddingEnumerator(EmbeddingEnumerator):
    """``EmbeddingEnumerator`` that offers each dynamic table one row-wise option with no memory cost.

    Used exactly like TorchRec's enumerator. The sharders given to :meth:`enumerate` must offer
    row-wise sharding (``DynamicEmbeddingCollectionSharder`` / ``DynamicEmbeddingBagCollectionSharder``
    do, on CPU too).
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: Optional[int] = BATCH_SIZE,
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
        estimator: Optional[Union[ShardEstimator, List[ShardEstimator]]] = None,
    ) -> None:
        self._dynamic_tables: Set[str] = dynamic_table_names(constraints)
        super().__init__(
            topology=topology,
            batch_size=batch_size if batch_size is not None else BATCH_SIZE,
            constraints=_torchrec_constraints(constraints),
            estimator=estimator,
        )

    @property
    def dynamic_tables(self) -> Set[str]:
        """Names of the tables planned as dynamic."""
        return set(self._dynamic_tables)

    def enumerate(
        self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]
    ) -> List[ShardingOption]:
        """TorchRec's options, with every dynamic table's shards costing no HBM/DDR."""
        options = super().enumerate(module, sharders)
        for option in options:
            if option.name not in self._dynamic_tables:
                continue
            for shard in option.shards:
                shard.storage = Storage(hbm=0, ddr=0)
        return options
