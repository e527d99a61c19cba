"""Compatibility module: ``dynamicemb.planner.enumerators``'s public names (:mod:`.enumerator`)."""

from dynamicemb_core.planner.enumerator import DynamicEmbeddingEnumerator

__all__ = ["DynamicEmbeddingEnumerator"]
