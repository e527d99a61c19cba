"""Hook specifications of the ``dynamicemb`` plugin project.

The registry (:mod:`dynamicemb_core.plugins.registry`) calls every hook below once per plugin, the
first time a name is resolved or the plugins are listed. Built-ins answer the same hooks
(:mod:`dynamicemb_core.plugins.builtins`), and third-party packages answer them from a module named
in the ``dynamicemb`` entry-point group of their ``pyproject.toml``::

    [project.entry-points.dynamicemb]
    redis = "demb_redis.plugin"

Each hook receives one argument, ``register(name, factory, *, description="")``. A plugin calls it
once per thing it provides; the registry validates the call at once (a duplicate name raises and
names both plugins) and never calls ``factory`` until a table asks for ``name``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from dynamicemb_core.plugins.registry import RegisterFn

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "dynamicemb"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------------------------
# Storage tiers
# ---------------------------------------------------------------------------------------------


@hookspec
def dynamicemb_register_storages(register: "RegisterFn") -> None:
    """Register :class:`~dynamicemb_core.types.Storage` backends by name.

    :param register: ``register(name, factory, *, description="")``. ``factory(tables, device,
        **external_storage_options)`` must return a ``Storage`` holding ``tables`` (a sequence of
        :class:`~dynamicemb_core.types.StorageTableSpec`) with results on ``device``.

    May be implemented by the core (``device``, ``dict``) and by plugins.
    """


# ---------------------------------------------------------------------------------------------
# Admission: counters and strategies
# ---------------------------------------------------------------------------------------------


@hookspec
def dynamicemb_register_counters(register: "RegisterFn") -> None:
    """Register :class:`~dynamicemb_core.types.Counter` implementations by name.

    :param register: ``register(name, factory, *, description="")``. ``factory(
        **admission_counter_options)`` must return a ``Counter``.

    May be implemented by the core (``kv``) and by plugins.
    """


@hookspec
def dynamicemb_register_admission_strategies(register: "RegisterFn") -> None:
    """Register :class:`~dynamicemb_core.types.AdmissionStrategy` implementations by name.

    :param register: ``register(name, factory, *, description="")``. ``factory(
        **admit_strategy_options)`` must return an ``AdmissionStrategy``.

    May be implemented by the core (``frequency``) and by plugins.
    """


# ---------------------------------------------------------------------------------------------
# Eviction: score functions of the compound (TIMESTAMP, LFU) strategy
# ---------------------------------------------------------------------------------------------


@hookspec
def dynamicemb_register_score_functions(register: "RegisterFn") -> None:
    """Register eviction score functions by name.

    :param register: ``register(name, factory, *, description="")``. ``factory(score_strategy,
        **score_function_options)`` receives the table's strategy tuple (the order in which the
        function will see its two score words) and must return a plain numba-compilable function
        ``f(scores, cur_timestamp) -> float`` (see ``score_function`` in the table options).

    May be implemented by plugins (``decayed_lfu`` comes from demb-policies).
    """
