"""Checkpoints and online sync for dynamic tables.

- :func:`DynamicEmbDump` / :func:`DynamicEmbLoad`: full checkpoints, one shard file per table per rank,
  loadable into a different number of processes (keys are routed by owner).
- :func:`incremental_dump` / :func:`replay_increment`: what changed since a score threshold, written back
  at its source slots on a replica; :func:`get_score` / :func:`set_score` for the thresholds.
- :func:`pop_evicted_keys` and :func:`erase`: keys that left a table by eviction or by erasure.

File layout and on-disk format: :mod:`dynamicemb_core.checkpoint.format` and ``.manifest``.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

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
    "CheckpointWriteError": "dynamicemb_core.checkpoint.errors",
    "IncompatibleDeltaError": "dynamicemb_core.checkpoint.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
