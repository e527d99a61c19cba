"""Plugin host: hook specs, the name registry, and resolution of plugin-valued table options.

Typical use is indirect: ``DynamicEmbTableOptions(external_storage="redis",
external_storage_options={"url": ...})`` and the lookup code calls :func:`resolve_storage`. See
docs/plugins.md for writing a plugin.
"""

from __future__ import annotations

from dynamicemb_core.plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec
from dynamicemb_core.plugins.known import KNOWN_PLUGINS
from dynamicemb_core.plugins.registry import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginInfo,
    PluginRegistry,
    RegisterFn,
    get_registry,
    register_plugin,
    unregister_plugin,
)
from dynamicemb_core.plugins.resolve import (
    resolve,
    resolve_admission_strategy,
    resolve_counter,
    resolve_score_function,
    resolve_storage,
    with_score_function,
)
from dynamicemb_core.plugins.types import (
    DuplicatePluginError,
    PluginEntry,
    PluginKind,
    PluginResultError,
    UnknownPluginError,
)
from dynamicemb_core.storage.contract.adapter import PerTableAdapter, as_storage

__all__ = [
    "AUTOLOAD_ENV",
    "DuplicatePluginError",
    "ENTRY_POINT_GROUP",
    "KNOWN_PLUGINS",
    "PROJECT_NAME",
    "PerTableAdapter",
    "PluginEntry",
    "PluginInfo",
    "PluginKind",
    "PluginRegistry",
    "PluginResultError",
    "RegisterFn",
    "UnknownPluginError",
    "as_storage",
    "get_registry",
    "hookimpl",
    "hookspec",
    "register_plugin",
    "resolve",
    "resolve_admission_strategy",
    "resolve_counter",
    "resolve_score_function",
    "resolve_storage",
    "unregister_plugin",
    "with_score_function",
]
