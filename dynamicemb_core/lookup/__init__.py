"""The batched lookup module over dynamic tables and its parts (layout, autograd, initializers)."""

from dynamicemb_core.lookup.batched_tables import BatchedDynamicEmbeddingTables
from dynamicemb_core.lookup.initializers import initialize_embeddings

__all__ = ["BatchedDynamicEmbeddingTables", "initialize_embeddings"]
