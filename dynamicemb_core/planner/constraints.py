"""DynamicEmbParameterConstraints: TorchRec's per-table constraints plus "make this table dynamic"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torchrec.distributed.planner.types import ParameterConstraints

from dynamicemb_core.config import DynamicEmbTableOptions

__all__ = ["DynamicEmbParameterConstraints"]


@dataclass
class DynamicEmbParameterConstraints(ParameterConstraints):
    """TorchRec ``ParameterConstraints`` with the switch and the options of a dynamic table.

    This is the only place a table is declared dynamic. TorchRec's own fields keep their meaning for
    native tables; a dynamic table is always sharded row-wise with our compute kernel, so its
    ``sharding_types`` / ``compute_kernels`` are set by the planner.

    Attributes:
        use_dynamicemb: shard this table as a dynamic (hash-table-backed) table.
        dynamicemb_options: the table's options; the planner fills the per-rank fields (see
            :func:`dynamicemb_core.planner.table_options.prepare_table_options`). Each constraint gets
            its own default instance, never a shared one.
    """

    use_dynamicemb: Optional[bool] = False
    dynamicemb_options: Optional[DynamicEmbTableOptions] = field(
        default_factory=DynamicEmbTableOptions
    )
