"""Turning a table option (a name, a class, an instance or None) into the object the core uses.

``DynamicEmbTableOptions`` accepts, for ``external_storage`` / ``admission_counter`` /
``admit_strategy`` / ``score_function``, either what NVIDIA's DynamicEmb accepts (an instance, a
``Storage`` subclass, a function) or a registered name configured by the matching ``*_options``
dict. :func:`resolve` is the one place that rule lives; the ``resolve_*`` helpers are what the
lookup code calls (the batched tables module resolves its admission strategies, counters and score
functions; the table below it takes objects only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from dynamicemb_core.plugins.registry import PluginRegistry, get_registry
from dynamicemb_core.plugins.types import PluginKind, PluginResultError, UnknownPluginError
from dynamicemb_core.redaction import redact_text, redacted_repr
from dynamicemb_core.types import (
    AdmissionStrategy,
    Counter,
    PerTableStorage,
    Storage,
    StorageTableSpec,
)

__all__ = [
    "resolve",
    "resolve_admission_strategy",
    "resolve_counter",
    "resolve_score_function",
    "resolve_storage",
    "with_score_function",
]

# What a factory of each kind must return (score functions: any callable). A storage may implement
# either contract: a PerTableStorage is wrapped in the per-table adapter (see _storage_result).
_EXPECTED: Dict[PluginKind, Any] = {
    PluginKind.STORAGE: (Storage, PerTableStorage),
    PluginKind.COUNTER: Counter,
    PluginKind.ADMISSION_STRATEGY: AdmissionStrategy,
}


def _expected_name(kind: PluginKind) -> str:
    expected = _EXPECTED.get(kind)
    if expected is None:
        return "a callable f(scores, cur_timestamp)"
    if isinstance(expected, tuple):
        return " or ".join(e.__name__ for e in expected)
    return expected.__name__


def _check_result(kind: PluginKind, what: str, obj: Any) -> Any:
    expected = _EXPECTED.get(kind)
    ok = callable(obj) if expected is None else isinstance(obj, expected)
    if not ok:
        raise PluginResultError(
            f"{what} must build {_expected_name(kind)}, got {type(obj).__name__}"
        )
    return _storage_result(obj) if kind is PluginKind.STORAGE else obj


def _storage_result(obj: Any) -> Storage:
    """Every resolved storage speaks the multi-table contract: per-table ones get the adapter."""
    from dynamicemb_core.storage.contract.adapter import as_storage

    return as_storage(obj)


def resolve(
    kind: PluginKind,
    value: Any,
    options: Optional[Dict[str, Any]] = None,
    *args: Any,
    registry: Optional[PluginRegistry] = None,
) -> Any:
    """Resolve one plugin-valued option.

    Args:
        kind: which registry to look names up in.
        value: None, a registered name, an instance of the kind's ABC, a ``Storage`` or
            ``PerTableStorage`` subclass (called as ``cls(*args, **options)``), or for score
            functions a callable.
        options: the matching ``*_options`` dict, passed to the factory as keywords.
        *args: positional arguments of the factory (storages: ``tables, device``; score
            functions: the table's score strategy tuple).
        registry: defaults to the process-wide registry.

    Returns:
        The built object, or None when ``value`` is None. A storage always comes back as a
        multi-table :class:`Storage` (a ``PerTableStorage`` wrapped in ``PerTableAdapter``).

    Raises:
        UnknownPluginError: ``value`` names nothing installed (the message says what to install).
        ValueError: options were given with None or with a ready-made instance.
        TypeError: ``value`` has an unsupported type; PluginResultError when a factory rejects its
            options or returns the wrong type.
    """
    field = kind.option_field
    options = dict(options or {})
    if value is None or not isinstance(value, (str, type)):
        if options:
            raise ValueError(
                f"{field}_options {sorted(options)} given but {field} is "
                f"{'None' if value is None else 'an instance'}; options configure a name or a "
                f"class only (pass {field}='<name>' or configure the instance yourself)"
            )
    if value is None:
        return None
    if isinstance(value, str):
        try:
            entry = (registry or get_registry()).get(kind, value)
        except UnknownPluginError as exc:  # the name may be a URL pasted into the wrong field
            raise UnknownPluginError(redact_text(str(exc))) from None
        what = f"{field} {value!r} from {entry.provider}"
        try:
            obj = entry.factory(*args, **options)
        except TypeError as exc:
            # options and the factory's own message may hold a password (redis://u:PW@h, password=);
            # a cause whose text holds one is not chained (a traceback would print it)
            text = redact_text(str(exc))
            error = PluginResultError(
                f"{what} could not be built with {field}_options={redacted_repr(options)}: {text}"
            )
            raise error from (exc if text == str(exc) else None)
        return _check_result(kind, what, obj)
    if (
        kind is PluginKind.STORAGE
        and isinstance(value, type)
        and issubclass(value, (Storage, PerTableStorage))
    ):
        return _check_result(kind, f"{field} class {value.__name__}", value(*args, **options))
    expected = _EXPECTED.get(kind)
    if expected is not None and isinstance(value, expected):
        return _storage_result(value) if kind is PluginKind.STORAGE else value
    if expected is None and callable(value) and not isinstance(value, type):
        return value
    accepted = "a registered name, None" + (
        f", a {_expected_name(kind)} instance" if expected is not None else ", a function"
    )
    if kind is PluginKind.STORAGE:
        accepted += " or a Storage / PerTableStorage subclass"
    raise TypeError(
        f"{field} must be {accepted}; got {type(value).__name__}: {redacted_repr(value)}"
    )


def resolve_storage(
    options: Any, tables: Sequence[StorageTableSpec], device: torch.device | str
) -> Optional[Storage]:
    """The ``external_storage`` of ``options`` built for ``tables`` on ``device``.

    Args:
        options: the ``DynamicEmbTableOptions`` shared by ``tables``.
        tables: the logical tables the storage will hold, in table-id order.
        device: where ``find`` must return its tensors.

    Returns:
        The storage, or None when ``external_storage`` is None (the core then picks its own tier).
    """
    return resolve(
        PluginKind.STORAGE,
        options.external_storage,
        options.external_storage_options,
        list(tables),
        torch.device(device),
    )


def resolve_counter(options: Any) -> Optional[Counter]:
    """The ``admission_counter`` of ``options`` (None when unset)."""
    return resolve(PluginKind.COUNTER, options.admission_counter, options.admission_counter_options)


def resolve_admission_strategy(options: Any) -> Optional[AdmissionStrategy]:
    """The ``admit_strategy`` of ``options`` (None when unset: every key is admitted)."""
    return resolve(
        PluginKind.ADMISSION_STRATEGY, options.admit_strategy, options.admit_strategy_options
    )


def resolve_score_function(options: Any) -> Optional[Callable[..., float]]:
    """The ``score_function`` of ``options``; a name's factory gets the table's strategy tuple."""
    return resolve(
        PluginKind.SCORE_FUNCTION,
        options.score_function,
        options.score_function_options,
        options.score_strategies,
    )


def with_score_function(options: Any) -> Any:
    """``options`` with a registered ``score_function`` name replaced by the function it names.

    A copy (``dataclasses.replace``) when the option is a name; ``options`` itself when it is None
    or already callable. The table (:meth:`dynamicemb_core.table.TableSpec.from_options`) takes
    functions only, so code that builds tables from options calls this first.
    """
    if options.score_function is None or callable(options.score_function):
        return options
    return dataclasses.replace(options, score_function=resolve_score_function(options))
