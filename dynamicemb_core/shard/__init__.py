"""Sharding dynamic tables with TorchRec: sharders, row-wise input distribution, key ownership.

Names resolve lazily (PEP 562), so ``dynamicemb_core.shard.ownership`` (used by dump, load and
replay) imports without pulling in TorchRec's sharding modules.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict

_EXPORTS: Dict[str, str] = {
    "DynamicEmbeddingCollectionSharder": "dynamicemb_core.shard.sharders",
    "DynamicEmbeddingBagCollectionSharder": "dynamicemb_core.shard.sharders",
    "ShardedDynamicEmbeddingCollection": "dynamicemb_core.shard.sharders",
    "ShardedDynamicEmbeddingBagCollection": "dynamicemb_core.shard.sharders",
    "default_sharders": "dynamicemb_core.shard.sharders",
    "BatchedDynamicEmbeddingKernel": "dynamicemb_core.shard.kernel",
    "DIST_TYPES": "dynamicemb_core.shard.ownership",
    "owner_rank": "dynamicemb_core.shard.ownership",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dynamicemb_core.shard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return __all__
