"""Redis with AUTH and TLS, standalone and as a cluster; no secret in what the plugin shows.

The servers are real redis-server processes started by the tests (``LocalRedisServer`` /
``LocalRedisCluster``), with certificates made by ``openssl`` (``LocalTLS``). A client with the
right password and CA works; a wrong or missing password, an untrusted certificate and a plain
client on a TLS port each fail at once with a message that says which.
"""

from __future__ import annotations

import os
import stat
import time
import traceback
import uuid
from typing import Any, Dict, Iterator

import pytest
import redis
import torch

from demb_redis import RedisStorage, RedisStorageError
from demb_redis.server import LocalRedisCluster, LocalRedisServer, LocalTLS
from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import PluginResultError, resolve_storage
from dynamicemb_core.plugins.storage_adapter import find_in_table, insert_in_table
from dynamicemb_core.testing.storage_suite import bits, make_rows
from dynamicemb_core.types import StorageTableSpec

SECRET = "Pw-7f3a-s3cr3t"
SPEC = StorageTableSpec("emb", dim=4, row_width=8)


def _with_password(url: str, user: str = "") -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{SECRET}@{rest}"


def _shown(exc: BaseException) -> str:
    """Everything a traceback of ``exc`` prints (its chain included)."""
    return "".join(traceback.format_exception(exc))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTLS:
    return LocalTLS.create(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def auth_server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer(password=SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def tls_server(tls: LocalTLS) -> Iterator[LocalRedisServer]:
    with LocalRedisServer(password=SECRET, tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def tls_cluster(tls: LocalTLS) -> Iterator[LocalRedisCluster]:
    with LocalRedisCluster(masters=3, password=SECRET, tls=tls) as cluster:
        yield cluster


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


# -- the test servers keep the password off the command line --------------------------------------


def test_the_servers_password_is_in_a_0600_config_file_not_on_the_command_line(
    auth_server: LocalRedisServer,
) -> None:
    assert auth_server.pid is not None
    argv = _cmdline(auth_server.pid)
    assert "redis-server" in argv and SECRET not in argv and "requirepass" not in argv
    mode = stat.S_IMODE(os.stat(auth_server.config_file).st_mode)
    assert mode == 0o600, oct(mode)
    with open(auth_server.config_file) as f:
        assert SECRET in f.read()
    # and the server does require it
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(auth_server.url).ping()
    assert redis.Redis.from_url(auth_server.url, password=SECRET).ping()
    assert "PONG" in auth_server.cli("ping").stdout  # redis-cli gets it from the environment


def test_cluster_nodes_keep_the_password_off_the_command_line(
    tls_cluster: LocalRedisCluster,
) -> None:
    for server in tls_cluster.servers:
        assert server.pid is not None and SECRET not in _cmdline(server.pid)
        assert stat.S_IMODE(os.stat(server.config_file).st_mode) == 0o600


# -- no secret when the redis factory raises ------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"url_password": True, "socket_timout": 1.0}, id="misspelled-socket_timout"),
        pytest.param({"password": SECRET, "client_options": {"ssl": True}}, id="ssl-on-redis-url"),
        pytest.param(
            {"client_options": {"password": SECRET, "ssl_password": SECRET, "retry_on_tmeout": 1}},
            id="client_options",
        ),
    ],
)
def test_no_secret_when_the_redis_factory_raises(
    auth_server: LocalRedisServer, options: Dict[str, Any]
) -> None:
    options = dict(options)
    url = _with_password(auth_server.url, "default") if options.pop("url_password", False) else None
    options["url"] = url or auth_server.url
    table_options = DynamicEmbTableOptions(
        external_storage="redis", external_storage_options=options
    )
    assert SECRET not in repr(table_options) and SECRET not in str(table_options)
    with pytest.raises(PluginResultError) as caught:
        resolve_storage(table_options, [SPEC], "cpu")
    message = str(caught.value)
    assert "external_storage 'redis'" in message and "could not be built" in message
    assert "***" in message and SECRET not in _shown(caught.value)


def test_no_secret_in_a_connection_failure(auth_server: LocalRedisServer) -> None:
    with pytest.raises(RedisStorageError) as caught:
        RedisStorage([SPEC], url=_with_password(auth_server.url, "nobody"), retries=0)
    assert "AuthenticationError" in str(caught.value) and "nobody:***@" in str(caught.value)
    assert SECRET not in _shown(caught.value)


# -- TLS, standalone -------------------------------------------------------------------------------


def test_tls_with_a_password_works(tls_server: LocalRedisServer) -> None:
    assert tls_server.url.startswith("rediss://")
    storage = RedisStorage(
        [SPEC],
        url=_with_password(tls_server.url),
        model=uuid.uuid4().hex,
        client_options=tls_server.client_options(),
    )
    rows, scores = make_rows(SPEC, 16, seed=0)
    insert_in_table(storage, 0, torch.arange(16), rows, scores)
    found, got, got_scores = find_in_table(storage, 0, torch.arange(16))
    assert found.all() and torch.equal(bits(got), bits(rows)) and torch.equal(got_scores, scores)
    storage.clear()
    storage.close()


def test_an_untrusted_certificate_fails_at_once_with_the_ssl_reason_first(
    tls_server: LocalRedisServer,
) -> None:
    start = time.monotonic()
    with pytest.raises(RedisStorageError) as caught:
        # no ssl_ca_certs: the system's CAs do not know the test CA
        RedisStorage([SPEC], url=_with_password(tls_server.url), retries=3, retry_backoff_s=0.5)
    message = str(caught.value)
    assert message.startswith(
        f"demb-redis: TLS handshake with rediss://:***@127.0.0.1:{tls_server.port}/0 failed: "
        "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]"
    ), message
    assert "did not answer" not in message and "ssl_ca_certs" in message
    assert time.monotonic() - start < 1.5  # not retried: backoffs alone would take 3.5 s
    assert SECRET not in _shown(caught.value)


def test_a_tls_client_on_a_plain_port_fails_with_the_ssl_reason(
    auth_server: LocalRedisServer, tls: LocalTLS
) -> None:
    url = _with_password(auth_server.url).replace("redis://", "rediss://")
    # the server waits for a command line that never comes: the handshake times out
    pattern = r"^demb-redis: TLS handshake with rediss://:\*\*\*@\S+ failed: .*handshake.*timed out"
    with pytest.raises(RedisStorageError, match=pattern):
        RedisStorage(
            [SPEC], url=url, retries=0, socket_timeout=1.0, client_options=tls.client_options()
        )


def test_a_plain_client_on_a_tls_port_is_a_clear_error(tls_server: LocalRedisServer) -> None:
    url = _with_password(tls_server.url).replace("rediss://", "redis://")
    with pytest.raises(RedisStorageError, match=r"needs a rediss:// URL") as caught:
        RedisStorage([SPEC], url=url, retries=0)
    assert SECRET not in _shown(caught.value)


def test_a_wrong_password_over_tls_is_refused(tls_server: LocalRedisServer) -> None:
    with pytest.raises(RedisStorageError, match=r"was refused: AuthenticationError"):
        RedisStorage(
            [SPEC], url=tls_server.url, password="wrong", client_options=tls_server.client_options()
        )


# -- a Redis Cluster with AUTH and TLS -----------------------------------------------------------


def test_a_cluster_with_auth_and_tls_keeps_every_row(tls_cluster: LocalRedisCluster) -> None:
    assert tls_cluster.url.startswith("rediss://")
    tables = [StorageTableSpec(f"tbl{i}", dim=4, row_width=8) for i in range(4)]
    storage = RedisStorage(
        tables,
        url=_with_password(tls_cluster.url),
        model=uuid.uuid4().hex[:12],
        cluster=True,
        chunk_size=64,
        client_options=tls_cluster.client_options(),
    )
    keys = torch.cat([torch.arange(200) * (t + 1) for t in range(len(tables))])
    tids = torch.arange(len(tables)).repeat_interleave(200)
    rows, scores = make_rows(tables[0], keys.numel(), seed=3)
    storage.insert(keys, tids, rows, scores)
    found, got, got_scores = storage.find(keys, tids)
    assert found.all() and torch.equal(bits(got), bits(rows)) and torch.equal(got_scores, scores)
    assert storage.sizes() == [200] * len(tables)
    # the rows went over TLS, with AUTH, to more than one node
    holders = set()
    for server in tls_cluster.servers:
        node = redis.Redis.from_url(server.url, password=SECRET, **server.client_options())
        if node.keys(f"demb:{{{storage.model}:*"):
            holders.add(server.port)
    assert len(holders) > 1
    storage.clear()
    storage.close()


@pytest.mark.parametrize("password", [None, "wrong"], ids=["no-password", "wrong-password"])
def test_a_cluster_with_auth_refuses_a_missing_or_wrong_password(
    tls_cluster: LocalRedisCluster, password: Any
) -> None:
    with pytest.raises(RedisStorageError) as caught:
        RedisStorage(
            [SPEC],
            url=tls_cluster.url,
            password=password,
            cluster=True,
            retries=0,
            client_options=tls_cluster.client_options(),
        )
    # RedisCluster wraps the refusal in RedisClusterException: the message names the refusal
    assert "was refused: AuthenticationError: " in str(caught.value), caught.value


def test_a_plain_client_on_a_tls_cluster_is_a_clear_error(tls_cluster: LocalRedisCluster) -> None:
    with pytest.raises(RedisStorageError) as caught:
        RedisStorage(
            [SPEC],
            url=_with_password(tls_cluster.url).replace("rediss://", "redis://"),
            cluster=True,
            retries=0,
            socket_timeout=2.0,
        )
    assert "rediss://" in str(caught.value) and SECRET not in _shown(caught.value)


def test_mutual_tls_refuses_a_client_without_a_certificate(tls: LocalTLS) -> None:
    with LocalRedisServer(password=SECRET, tls=tls, tls_auth_clients="yes") as server:
        url = _with_password(server.url)
        with pytest.raises(RedisStorageError) as caught:
            RedisStorage(
                [SPEC], url=url, retries=0, socket_timeout=2.0, client_options=tls.client_options()
            )
        message = str(caught.value)
        assert message.startswith("demb-redis: TLS handshake with rediss://:***@"), message
        assert SECRET not in _shown(caught.value)
        # with the client certificate it works
        storage = RedisStorage([SPEC], url=url, client_options=server.client_options())
        assert storage.sizes() == [0]
        storage.close()


def test_a_cluster_with_auth_only() -> None:
    """AUTH without TLS (the TLS cluster above has both): works with the password, refused without."""
    with LocalRedisCluster(masters=3, password=SECRET) as cluster:
        assert cluster.url.startswith("redis://")
        for server in cluster.servers:
            assert server.pid is not None and SECRET not in _cmdline(server.pid)
        tables = [StorageTableSpec(f"t{i}", dim=4, row_width=8) for i in range(3)]
        storage = RedisStorage(tables, url=_with_password(cluster.url), cluster=True)
        keys = torch.arange(300)
        tids = keys % 3
        rows, scores = make_rows(tables[0], 300, seed=4)
        storage.insert(keys, tids, rows, scores)
        found, got, _ = storage.find(keys, tids)
        assert found.all() and torch.equal(bits(got), bits(rows))
        storage.close()
        with pytest.raises(RedisStorageError, match="was refused: AuthenticationError: "):
            RedisStorage([SPEC], url=cluster.url, cluster=True, retries=0)
