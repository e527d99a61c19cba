"""The plugin host: built-ins, runtime plugins, duplicates, unknown names, autoload switch."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from typing import Any, Iterator

import pluggy
import pytest
import torch

from dynamicemb_core.config import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynamicemb_core.plugins import (
    KNOWN_PLUGINS,
    DuplicatePluginError,
    PerTableAdapter,
    PluginKind,
    PluginRegistry,
    PluginResultError,
    UnknownPluginError,
    hookimpl,
    register_plugin,
    resolve,
    resolve_admission_strategy,
    resolve_counter,
    resolve_score_function,
    resolve_storage,
    unregister_plugin,
)
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.types import AdmissionStrategy, StorageTableSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLES = [StorageTableSpec("t", dim=2, row_width=2)]


class _Everything(AdmissionStrategy):
    def __init__(self, initializer_args: Any = None) -> None:
        self.initializer_args = initializer_args

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(keys, dtype=torch.bool)

    def get_initializer_args(self) -> Any:
        return self.initializer_args


def _plugin(**hooks: Any) -> types.SimpleNamespace:
    """A plugin object whose hook implementations register the given (kind -> {name: factory})."""
    ns = types.SimpleNamespace()
    for kind, names in hooks.items():

        def impl(register: Any, _names: Any = names) -> None:
            for name, factory in _names.items():
                register(name, factory, description=f"test {name}")

        impl.__name__ = f"dynamicemb_register_{kind}"
        setattr(ns, impl.__name__, hookimpl(impl))
    return ns


@pytest.fixture
def registry() -> PluginRegistry:
    """A private registry with built-ins only (the installed plugins do not leak into these tests)."""
    return PluginRegistry(autoload=False)


@pytest.fixture
def everything_plugin() -> Iterator[None]:
    """Registers 'everything' in the process-wide registry and removes it afterwards."""
    register_plugin(_plugin(admission_strategies={"everything": _Everything}), "test-everything")
    try:
        yield
    finally:
        unregister_plugin("test-everything")


def test_builtins_register_through_the_hooks(registry: PluginRegistry) -> None:
    assert set(registry.entries(PluginKind.STORAGE)) >= {"device", "dict"}
    assert set(registry.entries(PluginKind.COUNTER)) == {"kv"}
    assert set(registry.entries(PluginKind.ADMISSION_STRATEGY)) == {"frequency"}
    info = {p.name: p for p in registry.plugins()}["dynamicemb_core"]
    assert info.distribution == "dynamicemb-core"
    assert "dynamicemb_register_storages" in info.hooks
    assert ("storages", "dict") in info.provides


def test_unknown_name_lists_installed_names_and_the_package_to_install(
    registry: PluginRegistry,
) -> None:
    with pytest.raises(UnknownPluginError) as info:
        registry.get(PluginKind.STORAGE, "redis")
    assert str(info.value) == (
        "unknown external_storage 'redis'; installed: 'device', 'dict'; "
        "'redis' comes from demb-redis (pip install demb-redis)"
    )
    assert isinstance(info.value, ValueError)


def test_unknown_name_without_a_known_package_lists_installed_only(
    registry: PluginRegistry,
) -> None:
    with pytest.raises(
        UnknownPluginError, match=r"^unknown admit_strategy 'nope'; installed: 'frequency'$"
    ):
        registry.get(PluginKind.ADMISSION_STRATEGY, "nope")


def test_known_plugins_table_is_alphabetical_and_names_real_kinds() -> None:
    assert list(KNOWN_PLUGINS) == sorted(KNOWN_PLUGINS)
    assert {kind for kind, _ in KNOWN_PLUGINS} <= {k.value for k in PluginKind}


def test_duplicate_name_raises_naming_both_plugins(registry: PluginRegistry) -> None:
    with pytest.raises(DuplicatePluginError) as info:
        registry.add_plugin(_plugin(storages={"dict": PyDictStorage}), "shadow")
    message = str(info.value)
    assert "'dict' is registered twice" in message
    assert "plugin 'dynamicemb_core' (dynamicemb-core" in message and "plugin 'shadow'" in message
    # the failed plugin is not left half-registered
    assert registry.entries(PluginKind.STORAGE)["dict"].plugin == "dynamicemb_core"
    assert "shadow" not in {p.name for p in registry.plugins()}


def test_hook_with_no_spec_is_rejected_by_check_pending(registry: PluginRegistry) -> None:
    bogus = types.SimpleNamespace(dynamicemb_register_storage=hookimpl(lambda register: None))
    with pytest.raises(pluggy.PluginValidationError, match="dynamicemb_register_storage"):
        registry.add_plugin(bogus, "typo")


@pytest.mark.parametrize("name", ["", "has space", "-lead", 3])
def test_bad_registered_name_is_rejected(registry: PluginRegistry, name: Any) -> None:
    with pytest.raises(ValueError, match="name must be"):
        registry.add_plugin(_plugin(counters={name: lambda: None}), "bad")


def test_non_callable_factory_is_rejected(registry: PluginRegistry) -> None:
    with pytest.raises(TypeError, match="factory for 'x' must be callable"):
        registry.add_plugin(_plugin(counters={"x": 42}), "bad")


def test_hook_implementation_may_take_no_arguments(registry: PluginRegistry) -> None:
    quiet = types.SimpleNamespace(dynamicemb_register_counters=hookimpl(lambda: None))
    registry.add_plugin(quiet, "quiet")
    assert "quiet" in {p.name for p in registry.plugins()}


def test_removed_plugin_names_disappear(registry: PluginRegistry) -> None:
    registry.add_plugin(_plugin(admission_strategies={"everything": _Everything}), "p")
    assert "everything" in registry.entries(PluginKind.ADMISSION_STRATEGY)
    registry.remove_plugin("p")
    assert "everything" not in registry.entries(PluginKind.ADMISSION_STRATEGY)
    with pytest.raises(ValueError, match="no plugin named 'p'"):
        registry.remove_plugin("p")


def test_resolve_storage_by_name_builds_it_with_options() -> None:
    options = DynamicEmbTableOptions(external_storage="dict")
    storage = resolve_storage(options, TABLES, "cpu")
    assert isinstance(storage, PyDictStorage) and storage.tables == TABLES


def test_resolve_storage_accepts_an_instance_a_class_and_none() -> None:
    instance = PyDictStorage(TABLES)
    assert (
        resolve_storage(DynamicEmbTableOptions(external_storage=instance), TABLES, "cpu")
        is instance
    )
    built = resolve_storage(DynamicEmbTableOptions(external_storage=PyDictStorage), TABLES, "cpu")
    assert isinstance(built, PyDictStorage) and built is not instance
    assert resolve_storage(DynamicEmbTableOptions(), TABLES, "cpu") is None


def test_options_with_an_instance_are_rejected() -> None:
    options = DynamicEmbTableOptions(
        external_storage=PyDictStorage(TABLES), external_storage_options={"url": "x"}
    )
    with pytest.raises(
        ValueError,
        match=r"external_storage_options \['url'\] given but external_storage is an instance",
    ):
        resolve_storage(options, TABLES, "cpu")


def test_factory_rejecting_its_options_names_the_plugin() -> None:
    options = DynamicEmbTableOptions(
        external_storage="dict", external_storage_options={"colour": 1}
    )
    with pytest.raises(
        PluginResultError, match=r"external_storage 'dict' from plugin 'dynamicemb_core'.*colour"
    ):
        resolve_storage(options, TABLES, "cpu")


def test_factory_returning_the_wrong_type_is_an_error(registry: PluginRegistry) -> None:
    registry.add_plugin(_plugin(counters={"liar": lambda: "not a counter"}), "liar")
    with pytest.raises(
        PluginResultError, match="admission_counter 'liar' .* must build Counter, got str"
    ):
        resolve(PluginKind.COUNTER, "liar", {}, registry=registry)


def test_wrong_value_type_lists_what_is_accepted() -> None:
    with pytest.raises(
        TypeError,
        match="admit_strategy must be a registered name, None, a AdmissionStrategy instance",
    ):
        resolve(PluginKind.ADMISSION_STRATEGY, 3.5, {})


def test_runtime_plugin_is_resolved_through_the_table_options(everything_plugin: None) -> None:
    options = DynamicEmbTableOptions(
        admit_strategy="everything", admit_strategy_options={"initializer_args": None}
    )
    strategy = resolve_admission_strategy(options)
    assert isinstance(strategy, _Everything)
    assert strategy.admit(torch.tensor([1, 2]), torch.tensor([0, 0])).all()


def test_counter_and_score_function_none_resolve_to_none() -> None:
    options = DynamicEmbTableOptions()
    assert resolve_counter(options) is None
    assert resolve_admission_strategy(options) is None
    assert resolve_score_function(options) is None


def test_score_function_callable_passes_through_and_name_gets_strategy_tuple(
    registry: PluginRegistry,
) -> None:
    seen = {}

    def factory(strategy: Any, scale: float = 1.0) -> Any:
        seen["strategy"], seen["scale"] = strategy, scale
        return lambda scores, now: scale * scores[1]

    registry.add_plugin(_plugin(score_functions={"scaled": factory}), "sf")
    compound = (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.TIMESTAMP)
    fn = resolve(PluginKind.SCORE_FUNCTION, "scaled", {"scale": 2.0}, compound, registry=registry)
    assert fn([0, 5], 0) == 10.0 and seen == {"strategy": compound, "scale": 2.0}

    def mine(scores: Any, now: int) -> float:
        return 0.0

    options = DynamicEmbTableOptions(score_strategy=compound, score_function=mine)
    assert resolve_score_function(options) is mine


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_disable_autoload_env_loads_builtins_only() -> None:
    code = (
        "from dynamicemb_core.plugins import get_registry\n"
        "print(sorted(p.name for p in get_registry().plugins()))\n"
        "try:\n    get_registry().get(__import__('dynamicemb_core.plugins').plugins.PluginKind.STORAGE, 'redis')\n"
        "except ValueError as e:\n    print(e)\n"
    )
    result = _run(code, DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "['dynamicemb_core']"
    assert "DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD is set" in lines[1]


def test_every_core_name_in_known_plugins_is_registered_by_the_builtins(
    registry: PluginRegistry,
) -> None:
    for (kind, name), dist in KNOWN_PLUGINS.items():
        if dist == "dynamicemb-core":
            assert name in registry.entries(PluginKind(kind)), (kind, name)


def test_builtin_names_build_the_core_classes() -> None:
    from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
    from dynamicemb_core.storage.grouped import GroupedDeviceStorage

    tables = [StorageTableSpec("t", dim=4, row_width=4)]
    device = resolve_storage(DynamicEmbTableOptions(external_storage="device"), tables, "cpu")
    # the core's tiers speak the per-table contract: resolved, they come behind the adapter
    assert type(device) is PerTableAdapter and type(device.inner) is GroupedDeviceStorage
    options = DynamicEmbTableOptions(
        admission_counter="kv",
        admission_counter_options={"capacity": 1024},
        admit_strategy="frequency",
        admit_strategy_options={"threshold": 3},
    )
    counter, strategy = resolve_counter(options), resolve_admission_strategy(options)
    assert isinstance(counter, KVCounter) and isinstance(strategy, FrequencyAdmissionStrategy)
    assert strategy.threshold == 3
    with pytest.raises(PluginResultError, match="admit_strategy 'frequency' .* could not be built"):
        resolve_admission_strategy(DynamicEmbTableOptions(admit_strategy="frequency"))


def test_a_score_function_named_in_the_options_reaches_the_groups_hash_table() -> None:
    """A registered score_function name, resolved where admission strategies resolve
    (plugins.with_score_function, as the module does), reaches the group's hash table; the group
    refuses an unresolved name instead of dropping it (it used to drop names silently)."""
    from dynamicemb_core.plugins import with_score_function
    from dynamicemb_core.storage.grouped import GroupedDeviceStorage

    def scaled(strategy: Any) -> Any:
        return lambda scores, now: 2.0 * scores[1]

    register_plugin(_plugin(score_functions={"test-scaled": scaled}), "test-scaled")
    try:
        compound = (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)
        options = DynamicEmbTableOptions(
            dim=4, max_capacity=256, score_strategy=compound, score_function="test-scaled"
        )
        spec = StorageTableSpec("t", dim=4, row_width=4, num_scores=2)
        group = GroupedDeviceStorage(
            [spec], "cpu", dims=[4], table_options=[with_score_function(options)]
        )
        fn = group.table.specs[0].score_function
        assert fn is not None and fn([0, 5], 0) == 10.0
        with pytest.raises(ValueError, match="'t'.*registered name"):
            GroupedDeviceStorage([spec], "cpu", dims=[4], table_options=[options])
    finally:
        unregister_plugin("test-scaled")
