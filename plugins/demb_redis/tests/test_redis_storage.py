"""demb-redis against a real redis-server: discovery, the conformance suites, layout and failures."""

from __future__ import annotations

import time
import uuid
from typing import Sequence

import pytest
import redis
import torch

from demb_redis import RedisStorage, RedisStorageError
from demb_redis.server import LocalRedisServer
from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.plugins import KNOWN_PLUGINS, PluginKind, PluginRegistry, resolve_storage
from dynamicemb_core.plugins.row_codec import RowFormatError
from dynamicemb_core.plugins.storage_adapter import find_in_table, insert_in_table
from dynamicemb_core.testing.storage_suite import (
    StoragePersistenceSuite,
    StorageSuite,
    bits,
    make_rows,
)
from dynamicemb_core.types import Storage, StorageTableSpec

SPEC = StorageTableSpec("emb", dim=4, row_width=8)


def test_entry_point_is_discovered_by_the_registry() -> None:
    entry = PluginRegistry().get(PluginKind.STORAGE, "redis")
    assert entry.distribution.startswith("demb-redis ")
    assert entry.plugin == "redis" and entry.factory is RedisStorage
    assert KNOWN_PLUGINS[("storages", "redis")] == "demb-redis"  # the core's install hint


def test_table_options_resolve_redis_by_name(redis_server: LocalRedisServer) -> None:
    options = DynamicEmbTableOptions(
        external_storage="redis",
        external_storage_options={"url": redis_server.url, "model": "resolve-test"},
    )
    storage = resolve_storage(options, [SPEC], "cpu")
    # the multi-table contract natively: no adapter in between
    assert type(storage) is RedisStorage and storage.model == "resolve-test"
    storage.close()


class TestRedisStorage(StorageSuite, StoragePersistenceSuite):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: LocalRedisServer) -> None:
        self.server = redis_server

    def make_storage(self, tables: Sequence[StorageTableSpec], device: torch.device) -> Storage:
        # a fresh namespace per storage; chunk_size small enough that big batches span chunks
        return RedisStorage(
            tables, device, url=self.server.url, model=uuid.uuid4().hex, chunk_size=1000
        )

    def reopen_storage(self, storage: Storage) -> Storage:
        assert isinstance(storage, RedisStorage)
        storage.close()
        return RedisStorage(storage.tables, storage.device, url=storage.url, model=storage.model)


def test_rows_live_in_one_hash_per_model_and_table_with_a_cluster_hash_tag(
    redis_server: LocalRedisServer,
) -> None:
    storage = RedisStorage([SPEC], url=redis_server.url, model="m1")
    rows, scores = make_rows(SPEC, 2, seed=0)
    insert_in_table(storage, 0, torch.tensor([1, -1]), rows, scores)
    raw = redis.Redis.from_url(redis_server.url)
    stored = raw.hgetall(b"demb:{m1:emb}:rows")
    assert set(stored) == {(1).to_bytes(8, "little"), (-1).to_bytes(8, "little", signed=True)}
    value = stored[(1).to_bytes(8, "little")]
    # header: version 1, float32 code 1, one score word, reserved, row_width 8 (LE u32)
    assert value[:8] == bytes([1, 1, 1, 0, 8, 0, 0, 0])
    assert int.from_bytes(value[8:16], "little", signed=True) == int(scores[0, 0])
    assert value[16:] == rows[0].numpy().astype("<f4").tobytes()
    storage.clear()
    assert raw.exists(b"demb:{m1:emb}:rows") == 0


def test_models_are_separate_namespaces(redis_server: LocalRedisServer) -> None:
    a = RedisStorage([SPEC], url=redis_server.url, model="ns-a")
    b = RedisStorage([SPEC], url=redis_server.url, model="ns-b")
    rows, scores = make_rows(SPEC, 1, seed=1)
    insert_in_table(a, 0, torch.tensor([7]), rows, scores)
    assert (
        a.sizes([0])[0] == 1
        and b.sizes([0])[0] == 0
        and not find_in_table(b, 0, torch.tensor([7]))[0].any()
    )
    a.clear()


def test_reader_with_another_layout_refuses_the_rows(redis_server: LocalRedisServer) -> None:
    writer = RedisStorage([SPEC], url=redis_server.url, model="layout")
    rows, scores = make_rows(SPEC, 2, seed=2)
    insert_in_table(writer, 0, torch.tensor([10, 11]), rows, scores)
    wider = StorageTableSpec("emb", dim=4, row_width=12)  # e.g. the optimizer changed to Adam
    reader = RedisStorage([wider], url=redis_server.url, model="layout")
    with pytest.raises(
        RowFormatError,
        match=r"table 'emb' \(model 'layout'\) key 11: .*row_width 8.*expects.*row_width 12",
    ):
        find_in_table(reader, 0, torch.tensor([11]))
    writer.clear()


@pytest.mark.parametrize("bad", ["has{brace}", "a:b", ""])
def test_names_that_would_break_the_key_are_rejected(
    redis_server: LocalRedisServer, bad: str
) -> None:
    with pytest.raises(ValueError, match="model"):
        RedisStorage([SPEC], url=redis_server.url, model=bad)


def test_password_is_passed_through_and_a_wrong_one_is_a_clear_error() -> None:
    with LocalRedisServer(password="s3cret") as server:
        with pytest.raises(RedisStorageError, match=r"connect .* was refused: AuthenticationError"):
            RedisStorage([SPEC], url=server.url, password="wrong", retries=0)
        storage = RedisStorage([SPEC], url=server.url, password="s3cret")
        rows, scores = make_rows(SPEC, 1, seed=3)
        insert_in_table(storage, 0, torch.tensor([1]), rows, scores)
        assert find_in_table(storage, 0, torch.tensor([1]))[0].all()
        url_with_password = server.url.replace("redis://", "redis://:s3cret@")
        assert RedisStorage([SPEC], url=url_with_password).sizes([0])[0] == 1


def test_client_options_reach_the_connection() -> None:
    with LocalRedisServer() as server:
        storage = RedisStorage([SPEC], url=server.url, client_options={"client_name": "demb-test"})
        assert storage.client.client_getname() == "demb-test"


def test_unreachable_server_at_construction_is_a_clear_error() -> None:
    with LocalRedisServer() as server:
        url = server.url
    start = time.monotonic()
    with pytest.raises(
        RedisStorageError,
        match=r"connect on \(model 'default'\) failed: Redis at redis://127\.0\.0\.1:\d+/0 did not answer after 3 attempts",
    ):
        RedisStorage([SPEC], url=url, retries=2, retry_backoff_s=0.01)
    assert time.monotonic() - start < 5


def test_server_killed_mid_use_gives_a_clear_error_not_zeros() -> None:
    server = LocalRedisServer().start()
    try:
        storage = RedisStorage(
            [SPEC], url=server.url, retries=2, retry_backoff_s=0.02, socket_timeout=1.0
        )
        rows, scores = make_rows(SPEC, 64, seed=4)
        insert_in_table(storage, 0, torch.arange(64), rows, scores)
        assert find_in_table(storage, 0, torch.arange(64))[0].all()
        server.kill()
        start = time.monotonic()
        with pytest.raises(RedisStorageError) as info:
            find_in_table(storage, 0, torch.arange(64))
        assert time.monotonic() - start < 10
        message = str(info.value)
        assert (
            "find on table 'emb'" in message
            and server.url in message
            and "after 3 attempts" in message
        )
        assert "No data was returned in its place" in message
        with pytest.raises(RedisStorageError, match="insert on table 'emb'"):
            insert_in_table(storage, 0, torch.arange(64), rows, scores)
        with pytest.raises(RedisStorageError, match="size on table 'emb'"):
            storage.sizes([0])[0]
    finally:
        server.stop()


def test_password_is_redacted_in_errors() -> None:
    with LocalRedisServer(password="topsecret") as server:
        url = server.url.replace("redis://", "redis://:topsecret@")
        storage = RedisStorage([SPEC], url=url, retries=0)
        server.kill()
        with pytest.raises(RedisStorageError) as info:
            storage.sizes([0])[0]
        assert "topsecret" not in str(info.value) and ":***@127.0.0.1" in str(info.value)


def test_hung_server_times_out_after_bounded_retries() -> None:
    with LocalRedisServer() as server:
        storage = RedisStorage(
            [SPEC], url=server.url, retries=1, retry_backoff_s=0.01, socket_timeout=1.0
        )  # 1 s: long enough that the calls before the pause and after the resume never time out
        rows, scores = make_rows(SPEC, 4, seed=5)
        insert_in_table(storage, 0, torch.arange(4), rows, scores)
        server.pause()
        try:
            start = time.monotonic()
            with pytest.raises(
                RedisStorageError, match=r"find on table 'emb' .*after 2 attempts.*Timeout"
            ):
                find_in_table(storage, 0, torch.arange(4))
            # each attempt waited its full timeout (a hang would never get here)
            assert time.monotonic() - start > 2 * 1.0 - 0.05
        finally:
            server.resume()
        # the server is back: the same storage works again (broken connections are replaced)
        found, got, _ = find_in_table(storage, 0, torch.arange(4))
        assert found.all() and torch.equal(bits(got), bits(rows))


def test_redis_cluster_keeps_each_table_in_its_hash_tag_slot(redis_cluster) -> None:
    cluster = redis_cluster  # shared by the session (conftest)
    tables = [StorageTableSpec(f"tbl{i}", dim=4, row_width=8) for i in range(6)]
    storage = RedisStorage(tables, url=cluster.url, model="m", cluster=True, chunk_size=100)
    # one mixed call for all six tables: one cluster pipeline, routed per table's node
    keys = torch.cat([torch.arange(300) * (t + 1) for t in range(len(tables))])
    tids = torch.arange(len(tables)).repeat_interleave(300)
    order = torch.randperm(keys.numel(), generator=torch.Generator().manual_seed(0))
    keys, tids = keys[order], tids[order]
    rows, scores = make_rows(tables[0], keys.numel(), seed=1)
    storage.insert(keys, tids, rows, scores)
    found, got, got_scores = storage.find(keys.flip(0), tids.flip(0))
    assert found.all() and torch.equal(bits(got), bits(rows.flip(0)))
    assert torch.equal(got_scores, scores.flip(0))
    assert storage.sizes() == [300] * len(tables)
    # each table's hash sits whole on the one node that owns its {model:table} slot
    holders = {}
    for server in cluster.servers:
        node = redis.Redis.from_url(server.url)
        for key in node.keys("demb:{m:tbl*"):
            holders.setdefault(key, []).append(server.port)
            assert node.hlen(key) == 300
    assert sorted(holders) == sorted(f"demb:{{m:tbl{i}}}:rows".encode() for i in range(6))
    assert all(len(ports) == 1 for ports in holders.values())
    assert len({p for ports in holders.values() for p in ports}) > 1  # spread over nodes
    storage.clear()
    assert storage.sizes() == [0] * len(tables)
