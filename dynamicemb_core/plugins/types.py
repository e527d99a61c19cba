"""Kinds of things plugins provide, the registry's entries, and its errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "DuplicatePluginError",
    "PluginEntry",
    "PluginKind",
    "PluginResultError",
    "UnknownPluginError",
]


class PluginKind(enum.Enum):
    """One registry per kind; the value is the hook suffix (``dynamicemb_register_<value>``)."""

    STORAGE = "storages"  # Storage backends; options field external_storage
    COUNTER = "counters"  # admission Counters; options field admission_counter
    ADMISSION_STRATEGY = "admission_strategies"  # AdmissionStrategy; field admit_strategy
    SCORE_FUNCTION = "score_functions"  # compound-strategy eviction scores; field score_function

    @property
    def hook_name(self) -> str:
        """Name of the hook that registers this kind."""
        return f"dynamicemb_register_{self.value}"

    @property
    def option_field(self) -> str:
        """The ``DynamicEmbTableOptions`` field that names a thing of this kind."""
        return _OPTION_FIELDS[self]


_OPTION_FIELDS = {
    PluginKind.STORAGE: "external_storage",
    PluginKind.COUNTER: "admission_counter",
    PluginKind.ADMISSION_STRATEGY: "admit_strategy",
    PluginKind.SCORE_FUNCTION: "score_function",
}


@dataclass(frozen=True)
class PluginEntry:
    """One registered name.

    Attributes:
        kind: what the factory builds.
        name: the name tables use (``external_storage="redis"``).
        factory: builds the object; called only when a table asks for ``name``.
        description: one line for ``python -m dynamicemb_core plugins``.
        plugin: the pluggy name of the plugin that registered it (entry-point name for packages).
        distribution: the installed distribution providing the plugin, when known.
    """

    kind: PluginKind
    name: str
    factory: Callable[..., Any]
    description: str
    plugin: str
    distribution: str

    @property
    def provider(self) -> str:
        """Human-readable origin: ``plugin 'redis' (demb-redis 0.1.0)``."""
        return f"plugin {self.plugin!r} ({self.distribution})"


class UnknownPluginError(ValueError):
    """A table option names something no installed plugin registered."""


class DuplicatePluginError(ValueError):
    """Two plugins registered the same name for the same kind."""


class PluginResultError(TypeError):
    """A plugin factory returned the wrong kind of object, or rejected its options."""
