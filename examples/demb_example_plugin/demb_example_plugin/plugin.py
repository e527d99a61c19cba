"""The module the ``dynamicemb`` entry point names: one hook per kind of thing the package provides.

Factories are registered, not instances: the core calls ``ArrayStorage(tables, device, **options)``
only when a table asks for ``"example_array"``. Importing inside the hook keeps ``python -m
dynamicemb_core plugins`` fast even when a plugin has heavy dependencies.
"""

from __future__ import annotations

from dynamicemb_core.plugins import RegisterFn, hookimpl


@hookimpl
def dynamicemb_register_storages(register: RegisterFn) -> None:
    from demb_example_plugin.storage import ArrayStorage

    register("example_array", ArrayStorage, description="example: rows in growable host tensors")


@hookimpl
def dynamicemb_register_admission_strategies(register: RegisterFn) -> None:
    from demb_example_plugin.admission import HashSampleAdmissionStrategy

    register(
        "example_hash_sample",
        HashSampleAdmissionStrategy,
        description="example: admit a fixed hash sample",
    )
