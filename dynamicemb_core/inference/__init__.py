"""Serving dynamic tables: inference-only collections, export, AOTInductor packages, replay.

See docs/inference.md for the round trip train -> dump -> export -> serve -> replay.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

_EXPORTS: Dict[str, str] = {
    "InferenceEmbeddingBagCollection": "dynamicemb_core.inference.collection",
    "InferenceEmbeddingCollection": "dynamicemb_core.inference.collection",
    "ServingTable": "dynamicemb_core.inference.tables",
    "ServingTables": "dynamicemb_core.inference.tables",
    "LookupModule": "dynamicemb_core.inference.export",
    "attach": "dynamicemb_core.inference.export",
    "compile_package": "dynamicemb_core.inference.export",
    "export_model": "dynamicemb_core.inference.export",
    "load_package": "dynamicemb_core.inference.runtime",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
