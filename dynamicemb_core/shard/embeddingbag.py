"""Compatibility module: ``dynamicemb.shard.embeddingbag``'s public names (:mod:`.sharders`)."""

from dynamicemb_core.shard.sharders import (
    DynamicEmbeddingBagCollectionSharder,
    ShardedDynamicEmbeddingBagCollection,
)

__all__ = ["DynamicEmbeddingBagCollectionSharder", "ShardedDynamicEmbeddingBagCollection"]
