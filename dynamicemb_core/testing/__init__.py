"""Test support for dynamicemb-core and its plugins.

- :class:`~dynamicemb_core.testing.dict_storage.PyDictStorage`: the reference dict-backed Storage.
- Conformance suites for third-party implementations (import them in test modules; they need
  pytest): :mod:`~dynamicemb_core.testing.storage_suite` (``StorageSuite``,
  ``StoragePersistenceSuite``, ``StorageDumpSuite``) and :mod:`~dynamicemb_core.testing.counter_suite`
  (``CounterSuite``, ``AdmissionStrategySuite``).
- :class:`~dynamicemb_core.testing.faults.FaultyStorage`: wraps any Storage and fails chosen calls
  (the Nth of a method, at random with a seed, or all while "down"), raising
  :class:`~dynamicemb_core.testing.faults.InjectedStorageFault`;
  :mod:`~dynamicemb_core.testing.fault_suite` (``FaultInjectionSuite``) trains through a cache over
  it and checks that no acknowledged row is lost.
- :func:`~dynamicemb_core.testing.compare.assert_same_stored_rows`: two storages hold the same keys and
  rows (the oracle of the tier tests).
- :mod:`~dynamicemb_core.testing.row_ledger`: the row ledger, which checks key by key every path that
  moves rows (dump and load, reshard, incremental dump and replay, served collections, exported
  programs) against the source's own rows, and that refused moves change nothing.

The suites are imported lazily so that importing this package does not import pytest.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

_EXPORTS: Dict[str, str] = {
    "PyDictStorage": "dynamicemb_core.testing.dict_storage",
    "StorageSuite": "dynamicemb_core.testing.storage_suite",
    "StoragePersistenceSuite": "dynamicemb_core.testing.storage_suite",
    "StorageDumpSuite": "dynamicemb_core.testing.storage_suite",
    "CounterSuite": "dynamicemb_core.testing.counter_suite",
    "AdmissionStrategySuite": "dynamicemb_core.testing.counter_suite",
    "FaultyStorage": "dynamicemb_core.testing.faults",
    "InjectedStorageFault": "dynamicemb_core.testing.faults",
    "FaultInjectionSuite": "dynamicemb_core.testing.fault_suite",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
