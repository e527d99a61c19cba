"""The core's own storages, counter and admission strategy, registered like any plugin.

Factories import their classes on first call, so the registry (and ``python -m dynamicemb_core
plugins``) works without building the C++ extension, and a table only pays for what it uses.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dynamicemb_core.plugins.hookspecs import hookimpl
from dynamicemb_core.plugins.registry import RegisterFn
from dynamicemb_core.types import (
    AdmissionStrategy,
    Counter,
    PerTableStorage,
    Storage,
    StorageTableSpec,
)


def device_storage(
    tables: Sequence[StorageTableSpec], device: torch.device, **options: Any
) -> PerTableStorage:
    """Build a :class:`dynamicemb_core.storage.grouped.GroupedDeviceStorage` of ``tables``
    (imported on first use): keys and rows on ``device``."""
    from dynamicemb_core.storage.grouped import GroupedDeviceStorage

    options.setdefault("dims", [t.dim for t in tables])
    return GroupedDeviceStorage(tables, device, **options)


def dict_storage(
    tables: Sequence[StorageTableSpec], device: torch.device, **options: Any
) -> Storage:
    """Build the reference :class:`dynamicemb_core.testing.dict_storage.PyDictStorage`."""
    from dynamicemb_core.testing.dict_storage import PyDictStorage

    return PyDictStorage(tables, device, **options)


def kv_counter(**options: Any) -> Counter:
    """Build :class:`dynamicemb_core.admission.KVCounter` (imported on first use)."""
    from dynamicemb_core.admission import KVCounter

    return KVCounter(**options)


def frequency_admission(**options: Any) -> AdmissionStrategy:
    """Build :class:`dynamicemb_core.admission.FrequencyAdmissionStrategy` (imported on first use)."""
    from dynamicemb_core.admission import FrequencyAdmissionStrategy

    return FrequencyAdmissionStrategy(**options)


@hookimpl
def dynamicemb_register_storages(register: RegisterFn) -> None:
    register("device", device_storage, description="hash table and rows on the table's device")
    register("dict", dict_storage, description="reference Python dict storage (tests, examples)")


@hookimpl
def dynamicemb_register_counters(register: RegisterFn) -> None:
    register("kv", kv_counter, description="bucketed exact counter evicting the lowest count")


@hookimpl
def dynamicemb_register_admission_strategies(register: RegisterFn) -> None:
    register("frequency", frequency_admission, description="admit keys counted >= threshold times")
