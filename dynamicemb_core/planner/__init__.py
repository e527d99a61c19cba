"""TorchRec planning of dynamic tables: constraints, enumerator, planner and the capacity helpers.

Names resolve lazily (PEP 562): importing this package does not import TorchRec's planner until a
name is used, and ``dynamicemb_core.shard`` can import the parts it needs without a cycle.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

_EXPORTS: Dict[str, str] = {
    "DynamicEmbParameterConstraints": "dynamicemb_core.planner.constraints",
    "DynamicEmbeddingEnumerator": "dynamicemb_core.planner.enumerator",
    "DynamicEmbeddingShardingPlanner": "dynamicemb_core.planner.planner",
    "DynamicEmbParameterSharding": "dynamicemb_core.planner.parameter_sharding",
    "get_sharded_table_capacity": "dynamicemb_core.planner.capacity",
    "get_table_value_bytes": "dynamicemb_core.planner.capacity",
    "complete_initializer_args": "dynamicemb_core.planner.table_options",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
