"""Sharding dynamic tables with TorchRec: sharders, row-wise input distribution, key ownership.

Names resolve lazily (PEP 562), so ``dynamicemb_core.shard.ownership`` (the old path of
:mod:`dynamicemb_core.table.ownership`) imports without pulling in TorchRec's sharding modules.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

_EXPORTS: Dict[str, str] = {
    "DynamicEmbeddingCollectionSharder": "dynamicemb_core.shard.sharders",
    "DynamicEmbeddingBagCollectionSharder": "dynamicemb_core.shard.sharders",
    "ShardedDynamicEmbeddingCollection": "dynamicemb_core.shard.sharders",
    "ShardedDynamicEmbeddingBagCollection": "dynamicemb_core.shard.sharders",
    "default_sharders": "dynamicemb_core.shard.sharders",
    "BatchedDynamicEmbeddingKernel": "dynamicemb_core.shard.kernel",
    "DIST_TYPES": "dynamicemb_core.table.ownership",
    "owner_rank": "dynamicemb_core.table.ownership",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
