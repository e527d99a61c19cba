"""The plugin host: a pluggy manager over the ``dynamicemb`` entry-point group, and the name tables.

Loading follows pluggy's eggsample and simonw/llm: the built-ins (:mod:`.builtins`) register through
the same hooks as any package, then every module in the ``dynamicemb`` entry-point group is loaded
(unless ``DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD=1``), then ``check_pending()`` rejects hook
implementations that match no spec (a misspelled hook would otherwise be ignored silently).

Each hook implementation is called with its own ``register`` callback, so a duplicate name is
reported with both plugins' names, and a plugin never touches the registry's state directly.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from importlib import metadata
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple

import pluggy

from dynamicemb_core.plugins import hookspecs
from dynamicemb_core.plugins.known import CORE_DISTRIBUTION, install_hint
from dynamicemb_core.plugins.types import (
    DuplicatePluginError,
    PluginEntry,
    PluginKind,
    UnknownPluginError,
)

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "PluginRegistry",
    "RegisterFn",
    "get_registry",
    "register_plugin",
    "unregister_plugin",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dynamicemb"
AUTOLOAD_ENV = "DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD"
BUILTINS_PLUGIN_NAME = "dynamicemb_core"
# Names go into error messages, CLI tables and Redis/RocksDB key prefixes: keep them plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class RegisterFn(Protocol):
    """The callback every registration hook receives."""

    def __call__(
        self, name: str, factory: Callable[..., Any], *, description: str = ""
    ) -> None: ...


@dataclass(frozen=True)
class PluginInfo:
    """One loaded plugin, as ``python -m dynamicemb_core plugins`` prints it."""

    name: str  # pluggy name: the entry-point name for packages
    distribution: str  # distribution name, or a note for plugins registered at runtime
    version: str
    hooks: Tuple[str, ...]  # hook names the plugin implements
    provides: Tuple[Tuple[str, str], ...]  # (kind value, registered name)


def _core_version() -> str:
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree
        import dynamicemb_core

        return dynamicemb_core.__version__


def autoload_disabled() -> bool:
    """True when ``DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value other than 0."""
    return os.environ.get(AUTOLOAD_ENV, "") not in ("", "0")


class PluginRegistry:
    """Named factories for storages, counters, admission strategies and score functions.

    Loads lazily on first use and again after :meth:`add_plugin` / :meth:`remove_plugin`.

    Args:
        autoload: load the ``dynamicemb`` entry-point group. None reads
            ``DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD`` at load time.
    """

    def __init__(self, *, autoload: Optional[bool] = None) -> None:
        self._autoload = autoload
        self._lock = threading.RLock()
        self._pm: Optional[pluggy.PluginManager] = None
        self._entries: Optional[Dict[PluginKind, Dict[str, PluginEntry]]] = None
        self._runtime: List[Tuple[object, str]] = []  # plugins added with add_plugin, in order

    # -- loading ---------------------------------------------------------------------------

    @property
    def manager(self) -> pluggy.PluginManager:
        """The pluggy manager, with built-ins and (unless disabled) entry points loaded."""
        self._ensure_loaded()
        assert self._pm is not None
        return self._pm

    def _ensure_loaded(self) -> Dict[PluginKind, Dict[str, PluginEntry]]:
        with self._lock:
            if self._pm is None:
                self._pm = self._build_manager()
            if self._entries is None:
                self._entries = self._collect(self._pm)
            return self._entries

    def _build_manager(self) -> pluggy.PluginManager:
        from dynamicemb_core.plugins import builtins

        pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        pm.add_hookspecs(hookspecs)
        pm.register(builtins, name=BUILTINS_PLUGIN_NAME)
        autoload = (not autoload_disabled()) if self._autoload is None else self._autoload
        if autoload:
            count = pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            logger.info("loaded %d dynamicemb plugin(s) from entry points", count)
        else:
            logger.info("plugin autoload disabled (%s); built-ins only", AUTOLOAD_ENV)
        for plugin, name in self._runtime:
            pm.register(plugin, name=name)
        pm.check_pending()
        return pm

    def add_plugin(self, plugin: object, name: str) -> None:
        """Register a plugin object (a module or any object with hook methods) at runtime.

        Raises:
            ValueError: ``name`` is taken, or a registered name collides (DuplicatePluginError).
            pluggy.PluginValidationError: a hook implementation matches no spec.
        """
        with self._lock:
            pm = self.manager
            pm.register(plugin, name=name)
            try:
                pm.check_pending()
                self._entries = None
                self._runtime.append((plugin, name))
                self._ensure_loaded()
            except Exception:
                pm.unregister(name=name)
                self._runtime = [(p, n) for p, n in self._runtime if n != name]
                self._entries = None
                raise

    def remove_plugin(self, name: str) -> None:
        """Unregister a plugin added with :meth:`add_plugin` (or any loaded one) by name."""
        with self._lock:
            pm = self.manager
            if pm.get_plugin(name) is None:
                raise ValueError(
                    f"no plugin named {name!r} is registered; loaded: {sorted(self._names(pm))}"
                )
            pm.unregister(name=name)
            self._runtime = [(p, n) for p, n in self._runtime if n != name]
            self._entries = None

    @staticmethod
    def _names(pm: pluggy.PluginManager) -> List[str]:
        return [name for name, plugin in pm.list_name_plugin() if plugin is not None]

    # -- collecting registrations ----------------------------------------------------------

    def _distribution_of(self, pm: pluggy.PluginManager) -> Dict[str, Tuple[str, str]]:
        """pluggy plugin name -> (distribution, version)."""
        out: Dict[str, Tuple[str, str]] = {
            BUILTINS_PLUGIN_NAME: (CORE_DISTRIBUTION, _core_version())
        }
        for plugin, dist in pm.list_plugin_distinfo():
            name = pm.get_name(plugin)
            if name is not None:
                out[name] = (dist.project_name, dist.version)
        return out

    def _collect(self, pm: pluggy.PluginManager) -> Dict[PluginKind, Dict[str, PluginEntry]]:
        dists = self._distribution_of(pm)
        entries: Dict[PluginKind, Dict[str, PluginEntry]] = {kind: {} for kind in PluginKind}
        for kind in PluginKind:
            caller = getattr(pm.hook, kind.hook_name)
            # get_hookimpls() lists implementations in registration order: built-ins first.
            for impl in caller.get_hookimpls():
                dist, version = dists.get(impl.plugin_name, ("registered at runtime", ""))
                label = f"{dist} {version}".strip()
                register = self._register_fn(entries[kind], kind, impl.plugin_name, label)
                try:
                    impl.function(**{arg: register for arg in impl.argnames})
                except Exception as exc:
                    exc.add_note(
                        f"while plugin {impl.plugin_name!r} ({label}) ran {kind.hook_name}"
                    )
                    raise
        return entries

    @staticmethod
    def _register_fn(
        table: Dict[str, PluginEntry], kind: PluginKind, plugin: str, distribution: str
    ) -> RegisterFn:
        def register(name: str, factory: Callable[..., Any], *, description: str = "") -> None:
            where = f"plugin {plugin!r} ({distribution}) in {kind.hook_name}"
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise ValueError(
                    f"{where}: name must be a non-empty string of letters, digits, '_', '.', '-' "
                    f"starting with a letter or digit, got {name!r}"
                )
            if not callable(factory):
                raise TypeError(f"{where}: factory for {name!r} must be callable, got {factory!r}")
            if not isinstance(description, str):
                raise TypeError(
                    f"{where}: description must be a str, got {type(description).__name__}"
                )
            entry = PluginEntry(kind, name, factory, description, plugin, distribution)
            previous = table.get(name)
            if previous is not None:
                raise DuplicatePluginError(
                    f"{kind.option_field} {name!r} is registered twice: by {previous.provider} and by "
                    f"{entry.provider}; uninstall one of them (names are never renamed silently)"
                )
            table[name] = entry

        return register

    # -- queries ---------------------------------------------------------------------------

    def entries(self, kind: PluginKind) -> Mapping[str, PluginEntry]:
        """Read-only view of the names registered for ``kind``."""
        return MappingProxyType(self._ensure_loaded()[kind])

    def get(self, kind: PluginKind, name: str) -> PluginEntry:
        """The entry registered as ``name``.

        Raises:
            UnknownPluginError: listing the installed names and, when the core knows the name,
                the package to install.
        """
        table = self._ensure_loaded()[kind]
        entry = table.get(name)
        if entry is not None:
            return entry
        installed = ", ".join(repr(n) for n in sorted(table)) or "none"
        message = f"unknown {kind.option_field} {name!r}; installed: {installed}"
        hint = install_hint(kind, name)
        if hint is not None:
            message += f"; {hint}"
        if autoload_disabled() and self._autoload is None:
            message += f" ({AUTOLOAD_ENV} is set: third-party plugins were not loaded)"
        raise UnknownPluginError(message)

    def plugins(self) -> List[PluginInfo]:
        """Every loaded plugin with its distribution, version, hooks and registered names."""
        entries = self._ensure_loaded()
        pm = self.manager
        dists = self._distribution_of(pm)
        out = []
        for name, plugin in pm.list_name_plugin():
            if plugin is None:  # blocked
                continue
            dist, version = dists.get(name, ("registered at runtime", ""))
            hooks = tuple(sorted(c.name for c in pm.get_hookcallers(plugin) or ()))
            provides = tuple(
                (kind.value, e.name)
                for kind in PluginKind
                for e in entries[kind].values()
                if e.plugin == name
            )
            out.append(PluginInfo(name, dist, version, hooks, provides))
        return out


_REGISTRY: Optional[PluginRegistry] = None
_REGISTRY_LOCK = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry (created on first use)."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            _REGISTRY = PluginRegistry()
        return _REGISTRY


def register_plugin(plugin: object, name: str) -> None:
    """Add a plugin object to the process-wide registry (tests, notebooks, in-house code)."""
    get_registry().add_plugin(plugin, name)


def unregister_plugin(name: str) -> None:
    """Remove a plugin added with :func:`register_plugin`."""
    get_registry().remove_plugin(name)
