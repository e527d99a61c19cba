"""Test support for dynamicemb-core and its plugins.

- :class:`~dynamicemb_core.testing.dict_storage.PyDictStorage`: the reference dict-backed Storage.
- Conformance suites for third-party implementations (import them in test modules; they need
  pytest): :mod:`~dynamicemb_core.testing.storage_suite` (``StorageSuite``,
  ``StoragePersistenceSuite``, ``StorageDumpSuite``) and :mod:`~dynamicemb_core.testing.counter_suite`
  (``CounterSuite``, ``AdmissionStrategySuite``).

The suites are imported lazily so that importing this package does not import pytest.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PyDictStorage": "dynamicemb_core.testing.dict_storage",
    "StorageSuite": "dynamicemb_core.testing.storage_suite",
    "StoragePersistenceSuite": "dynamicemb_core.testing.storage_suite",
    "StorageDumpSuite": "dynamicemb_core.testing.storage_suite",
    "CounterSuite": "dynamicemb_core.testing.counter_suite",
    "AdmissionStrategySuite": "dynamicemb_core.testing.counter_suite",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dynamicemb_core.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
