"""Compatibility module: ``dynamicemb.shard.embedding``'s public names (:mod:`.sharders`)."""

from dynamicemb_core.shard.sharders import (
    DynamicEmbeddingCollectionSharder,
    ShardedDynamicEmbeddingCollection,
)

__all__ = ["DynamicEmbeddingCollectionSharder", "ShardedDynamicEmbeddingCollection"]
