"""The test servers' helper: ports clear of the ephemeral range, a taken port, durable AOF."""

from __future__ import annotations

import socket

import pytest
import redis

from demb_redis import server as server_module
from demb_redis.server import LocalRedisServer, free_port


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("ephemeral", [(32768, 60999), (15000, 40000)])
def test_ports_are_outside_the_ephemeral_range(monkeypatch, cluster: bool, ephemeral) -> None:
    # an outgoing connection can take (or self-connect on) a port in that range; see the module doc
    monkeypatch.setattr(server_module, "_ephemeral_range", lambda: ephemeral)
    low, high = ephemeral
    for _ in range(50):
        port = free_port(cluster=cluster)
        assert 10000 <= port <= 65535 and not low <= port <= high
        if cluster:
            assert port + 10000 <= 65535 and not low <= port + 10000 <= high


@pytest.mark.parametrize("cluster", [False, True])
def test_an_ephemeral_range_covering_every_port_still_gives_a_free_port(
    monkeypatch, cluster: bool
) -> None:
    monkeypatch.setattr(server_module, "_ephemeral_range", lambda: (1024, 65535))
    port = free_port(cluster=cluster)
    assert server_module._bindable(port) and (not cluster or port + 10000 <= 65535)


def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        ports = iter([taken, free_port()])
        monkeypatch.setattr(server_module, "free_port", lambda cluster=False: next(ports))
        with LocalRedisServer() as server:
            assert server.port != taken
            assert redis.Redis.from_url(server.url).ping()


def test_restart_on_a_taken_port_is_a_clear_error() -> None:
    server = LocalRedisServer().start()
    try:
        server.kill()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
            held.bind(("127.0.0.1", server.port))
            held.listen()
            with pytest.raises(OSError, match=f"could not bind port {server.port}"):
                server.restart()
        assert server.pid is None
        server.restart()  # the port is free again
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()


def test_appendonly_server_writes_before_it_replies() -> None:
    with LocalRedisServer(appendonly=True) as server:
        config = redis.Redis.from_url(server.url).config_get("append*")
        assert config["appendonly"] == "yes" and config["appendfsync"] == "always"
        client = redis.Redis.from_url(server.url)
        client.hset("h", mapping={str(i): "x" for i in range(100)})
        server.kill()  # acknowledged, then SIGKILL at once
        server.restart()
        assert client.hlen("h") == 100
