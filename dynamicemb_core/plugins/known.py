"""Names the core knows about without importing them, and the package that provides each.

Used only to improve the unknown-name error: a user who writes ``external_storage="redis"`` without
demb-redis installed is told what to install. Kept alphabetical (checked at import), as fsspec keeps
its ``known_implementations``; add a row when a first-party plugin ships a new name.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from dynamicemb_core.plugins.types import PluginKind

__all__ = ["CORE_DISTRIBUTION", "KNOWN_PLUGINS", "install_hint"]

CORE_DISTRIBUTION = "dynamicemb-core"

# (kind, name) -> distribution that registers it
KNOWN_PLUGINS: Dict[Tuple[str, str], str] = {
    ("admission_strategies", "frequency"): CORE_DISTRIBUTION,
    ("admission_strategies", "probabilistic"): "demb-policies",
    ("counters", "counting_bloom"): "demb-policies",
    ("counters", "kv"): CORE_DISTRIBUTION,
    ("score_functions", "decayed_lfu"): "demb-policies",
    ("storages", "device"): CORE_DISTRIBUTION,
    ("storages", "dict"): CORE_DISTRIBUTION,
    ("storages", "redis"): "demb-redis",
    ("storages", "rocksdb"): "demb-rocksdb",
}

assert list(KNOWN_PLUGINS) == sorted(KNOWN_PLUGINS), "KNOWN_PLUGINS must stay alphabetical"
assert {kind for kind, _ in KNOWN_PLUGINS} <= {k.value for k in PluginKind}


def install_hint(kind: PluginKind, name: str) -> Optional[str]:
    """The sentence telling where ``name`` comes from, or None when the core does not know it."""
    dist = KNOWN_PLUGINS.get((kind.value, name))
    if dist is None:
        return None
    if dist == CORE_DISTRIBUTION:
        return f"{name!r} is built into {dist}; its module failed to register (see the log)"
    return f"{name!r} comes from {dist} (pip install {dist})"
