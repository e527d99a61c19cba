"""TorchRec planning of dynamic tables: constraints, enumerator, planner and the capacity helpers.

Names resolve lazily (PEP 562): importing this package does not import TorchRec's planner until a
name is used, and ``dynamicemb_core.shard`` can import the parts it needs without a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dynamicemb_core.planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return __all__
