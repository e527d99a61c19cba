"""Secrets in options never reach repr/str, error messages, ``info`` or the planner's printouts.

The rule lives in :mod:`dynamicemb_core.redaction`; these tests build options holding a password in
each form a user writes one (in a URL, as ``password=``, nested in ``client_options``) and look for
it in everything the product shows.
"""

from __future__ import annotations

import io
import logging
import traceback
from contextlib import redirect_stdout
from typing import Any, Dict

import pytest
import torch
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynamicemb_core import info
from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynamicemb_core.planner.planner import default_topology
from dynamicemb_core.plugins import PluginResultError, UnknownPluginError, resolve_storage
from dynamicemb_core.redaction import is_secret_key, redact, redact_text
from dynamicemb_core.shard import DynamicEmbeddingBagCollectionSharder
from dynamicemb_core.types import StorageTableSpec

SECRET = "Hunter2-s3cr3t"

# Every form a user writes a credential in (redis-py's and common client option names).
SECRET_FORMS: Dict[str, Dict[str, Any]] = {
    "url user:password": {"url": f"redis://alice:{SECRET}@10.0.0.1:6379/0"},
    "url :password": {"url": f"rediss://:{SECRET}@cache.example:6380/2"},
    "password=": {"url": "redis://10.0.0.1:6379/0", "password": SECRET},
    "client_options": {
        "url": "redis://10.0.0.1/0",
        "client_options": {
            "username": "alice",
            "password": SECRET,
            "ssl_password": SECRET,
            "ssl_keyfile": "/etc/tls/client.key",
        },
    },
    "nested list and token": {"url": "redis://h/0", "sentinels": [{"auth_token": SECRET}]},
    "api key": {"endpoint": "https://kv.example", "api_key": SECRET, "credentials": {"k": SECRET}},
}


def _options(storage_options: Dict[str, Any]) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=4, max_capacity=64, external_storage="dict", external_storage_options=storage_options
    )


# -- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "PASSWORD",
        "ssl_password",
        "passwd",
        "db-password",
        "dbPassword",
        "token",
        "auth_token",
        "accessToken",
        "secret",
        "client_secret",
        "key",
        "api_key",
        "apiKey",
        "secret_key",
        "private_key",
        "credentials",
        "auth",
        "passphrase",
    ],
)
def test_names_of_secrets_are_recognized(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "key_type",
        "max_keys",
        "keys",
        "num_keys",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "username",
        "url",
        "author",
        "socket_timeout",
        "max_tokens",
        "bucket_capacity",
    ],
)
def test_innocent_names_stay_visible(name: str) -> None:
    assert not is_secret_key(name)


def test_url_passwords_are_redacted_wherever_they_appear_in_text() -> None:
    text = (
        f"at redis://u:{SECRET}@h:1/0, then rediss://:{SECRET}@h2 and 'redis://v:{SECRET}@h3' "
        "but redis://h4:6379/0 and user@example.com stay"
    )
    out = redact_text(text)
    assert SECRET not in out
    assert "redis://u:***@h:1/0" in out and "rediss://:***@h2" in out
    assert "'redis://v:***@h3'" in out
    assert "redis://h4:6379/0" in out and "user@example.com" in out


@pytest.mark.parametrize("password", ["p@ss", "it's", 'say"hi"', "a:b", "%2Fx%40"])
def test_url_passwords_with_odd_characters_are_hidden_whole(password: str) -> None:
    url = f"redis://user:{password}@cache.example:6379/0"
    assert redact_text(url) == "redis://user:***@cache.example:6379/0"
    assert password not in repr(_options({"url": url}))


def test_redaction_is_recursive_and_keeps_structure() -> None:
    value = {
        "url": f"redis://u:{SECRET}@h/0",
        "password": SECRET,
        "token": None,  # no secret set: shown as such
        "client_options": {"ssl_password": SECRET, "ssl_keyfile": "/k.pem", "key_type": "int64"},
        "nodes": [(f"redis://:{SECRET}@a", 1), {"secret": [SECRET]}],
    }
    assert redact(value) == {
        "url": "redis://u:***@h/0",
        "password": "***",
        "token": None,
        "client_options": {"ssl_password": "***", "ssl_keyfile": "/k.pem", "key_type": "int64"},
        "nodes": [("redis://:***@a", 1), {"secret": "***"}],
    }
    assert value["password"] == SECRET  # a copy: the options themselves are untouched


# -- repr, str, errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", sorted(SECRET_FORMS))
def test_no_secret_in_repr_or_str_of_options(form: str) -> None:
    options = _options(SECRET_FORMS[form])
    for shown in (repr(options), str(options), f"{options}", repr([options])):
        assert SECRET not in shown
        assert "***" in shown and "DynamicEmbTableOptions(" in shown
    assert "dim=4" in repr(options) and "max_capacity=64" in repr(options)  # the rest stays
    assert options.external_storage_options == SECRET_FORMS[form]  # the values are intact


@pytest.mark.parametrize("form", sorted(SECRET_FORMS))
def test_no_secret_when_a_storage_factory_rejects_its_options(form: str) -> None:
    # the core's "dict" storage takes no such options: its factory raises TypeError
    options = _options(SECRET_FORMS[form])
    with pytest.raises(PluginResultError) as caught:
        resolve_storage(options, [StorageTableSpec("t", dim=4, row_width=4)], "cpu")
    message = str(caught.value)
    assert "could not be built with external_storage_options=" in message and "***" in message
    assert SECRET not in "".join(traceback.format_exception(caught.value))


def test_no_secret_in_validation_errors() -> None:
    with pytest.raises(TypeError, match=r"external_storage_options must be a dict") as caught:
        DynamicEmbTableOptions(external_storage_options=f"redis://u:{SECRET}@h/0")  # type: ignore[arg-type]
    assert SECRET not in str(caught.value) and "redis://u:***@h/0" in str(caught.value)
    with pytest.raises(UnknownPluginError) as unknown:  # a URL pasted into the name field
        resolve_storage(
            DynamicEmbTableOptions(external_storage=f"redis://u:{SECRET}@h/0"),
            [StorageTableSpec("t", dim=4, row_width=4)],
            "cpu",
        )
    assert SECRET not in "".join(traceback.format_exception(unknown.value))


def test_no_secret_in_info_output(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def plugins(self) -> None:
            raise RuntimeError(f"plugin could not reach rediss://admin:{SECRET}@kv:6380")

    monkeypatch.setattr("dynamicemb_core.plugins.registry.get_registry", lambda: Broken())
    out = io.StringIO()
    assert info.main([], out=out) == 1
    text = out.getvalue()
    assert "plugins failed to load" in text and "rediss://admin:***@kv:6380" in text
    assert SECRET not in text


# -- the planner ----------------------------------------------------------------------------------


def test_no_secret_in_the_planners_logs_printouts_and_plan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configs = [
        EmbeddingBagConfig(name="dyn", embedding_dim=8, num_embeddings=1000, feature_names=["f0"]),
        EmbeddingBagConfig(name="native", embedding_dim=8, num_embeddings=64, feature_names=["f1"]),
    ]
    secret_options = {**SECRET_FORMS["client_options"], **SECRET_FORMS["url user:password"]}
    constraints = {
        "dyn": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                external_storage="dict", external_storage_options=secret_options
            ),
        ),
        "native": DynamicEmbParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
    }
    printed = io.StringIO()
    with caplog.at_level(logging.DEBUG), redirect_stdout(printed):
        planner = DynamicEmbeddingShardingPlanner(
            eb_configs=configs, topology=default_topology(2, "cpu"), constraints=constraints
        )
        plan = planner.plan(
            EmbeddingBagCollection(tables=configs, device=torch.device("meta")),
            [DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_sgd"})],
        )
    dyn = plan.plan[""]["dyn"]
    assert dyn.dynamicemb_options.external_storage_options == secret_options  # intact
    shown = [
        caplog.text,
        printed.getvalue(),
        str(plan),
        repr(plan),
        repr(dyn),
        repr(constraints),
        repr(planner.dynamic_table_options),
    ]
    assert "url': 'redis://alice:***@10.0.0.1" in repr(dyn)  # it is shown, redacted
    for text in shown:
        assert SECRET not in text
