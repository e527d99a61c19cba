"""DynamicEmbParameterSharding: the plan entry of a dynamic table (row-wise, our kernel, its options)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ParameterSharding, ShardingType

from dynamicemb_core.config import DEFAULT_DIST_TYPE, DynamicEmbTableOptions

__all__ = ["DYNAMICEMB_KERNEL", "DynamicEmbParameterSharding", "is_dynamic_sharding"]

# Name of our kernel inside TorchRec's CUSTOMIZED_KERNEL slot.
DYNAMICEMB_KERNEL: str = "DynamicEmb"


@dataclass
class DynamicEmbParameterSharding(ParameterSharding):
    """A ``ParameterSharding`` for a dynamic table.

    TorchRec sees ``compute_kernel == "customized_kernel"``, so it leaves the table's lookup and its
    state_dict to our sharded modules. The prepared per-rank options travel here rather than in
    ``fused_params``: TorchRec groups tables by hashing their fused params, and options are not
    hashable.

    Attributes:
        customized_compute_kernel: always :data:`DYNAMICEMB_KERNEL`.
        dist_type: how keys are routed to ranks (:mod:`dynamicemb_core.table.ownership`).
        dynamicemb_options: the table's options after the planner's preparation.
    """

    compute_kernel: str = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    customized_compute_kernel: Optional[str] = DYNAMICEMB_KERNEL
    dist_type: str = DEFAULT_DIST_TYPE
    dynamicemb_options: DynamicEmbTableOptions = field(default_factory=DynamicEmbTableOptions)

    @classmethod
    def from_torchrec(
        cls, sharding: ParameterSharding, options: DynamicEmbTableOptions, table: str
    ) -> "DynamicEmbParameterSharding":
        """Turn TorchRec's row-wise entry for ``table`` into ours, keeping its ranks and shard spec.

        Raises:
            ValueError: naming the table, if TorchRec planned anything but row-wise.
        """
        if sharding.sharding_type != ShardingType.ROW_WISE.value:
            raise ValueError(
                f"table {table!r}: a dynamic table must be sharded row-wise, but the plan says "
                f"{sharding.sharding_type!r}; use DynamicEmbeddingShardingPlanner with the "
                f"DynamicEmbedding*Sharders"
            )
        base = {
            f.name: getattr(sharding, f.name)
            for f in dataclasses.fields(ParameterSharding)
            if f.name != "compute_kernel"
        }
        return cls(**base, dist_type=options.dist_type, dynamicemb_options=options)


def is_dynamic_sharding(sharding: object) -> bool:
    """True for a plan entry that our kernel serves."""
    return isinstance(sharding, DynamicEmbParameterSharding) or (
        getattr(sharding, "compute_kernel", None) == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
        and getattr(sharding, "customized_compute_kernel", None) == DYNAMICEMB_KERNEL
    )
