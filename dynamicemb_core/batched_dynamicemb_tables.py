"""Compatibility module: ``dynamicemb.batched_dynamicemb_tables``'s public names.

``BatchedDynamicEmbeddingTablesV2`` is this project's :class:`BatchedDynamicEmbeddingTables` (the same
class). Its constructor is this project's own (docs/lookup.md), not a copy of NVIDIA's.
"""

from dynamicemb_core.lookup.batched_tables import BatchedDynamicEmbeddingTables

BatchedDynamicEmbeddingTablesV2 = BatchedDynamicEmbeddingTables

__all__ = ["BatchedDynamicEmbeddingTables", "BatchedDynamicEmbeddingTablesV2"]
