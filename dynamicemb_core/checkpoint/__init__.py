"""Checkpoints and online sync for dynamic tables.

- :func:`DynamicEmbDump` / :func:`DynamicEmbLoad`: full checkpoints, one shard file per table per rank,
  loadable into a different number of processes (keys are routed by owner).
- :func:`incremental_dump` / :func:`replay_increment`: what changed since a score threshold, written back
  at its source slots on a replica; :func:`get_score` / :func:`set_score` for the thresholds.
- :func:`pop_evicted_keys` and :func:`erase`: keys that left a table by eviction or by erasure.

File layout and on-disk format: :mod:`dynamicemb_core.checkpoint.format` and ``.manifest``.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict

_EXPORTS: Dict[str, str] = {
    "DynamicEmbDump": "dynamicemb_core.checkpoint.dump",
    "DynamicEmbLoad": "dynamicemb_core.checkpoint.dump",
    "incremental_dump": "dynamicemb_core.checkpoint.delta",
    "get_score": "dynamicemb_core.checkpoint.delta",
    "set_score": "dynamicemb_core.checkpoint.delta",
    "replay_increment": "dynamicemb_core.checkpoint.replay",
    "pop_evicted_keys": "dynamicemb_core.checkpoint.evicted",
    "erase": "dynamicemb_core.checkpoint.evicted",
    "DeltaDumpResult": "dynamicemb_core.checkpoint.types",
    "ReplayContent": "dynamicemb_core.checkpoint.types",
    "TableHandle": "dynamicemb_core.checkpoint.types",
    "find_tables": "dynamicemb_core.checkpoint.discovery",
    "CheckpointError": "dynamicemb_core.checkpoint.errors",
    "CheckpointCorruptError": "dynamicemb_core.checkpoint.errors",
    "CheckpointMismatchError": "dynamicemb_core.checkpoint.errors",
    "IncompatibleDeltaError": "dynamicemb_core.checkpoint.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dynamicemb_core.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return __all__
