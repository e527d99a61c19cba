"""``RedisStorage``: the rows of several tables in Redis hashes, read and written in batches.

Layout in Redis: one hash per (model, table), named ``demb:{<model>:<table>}:rows``. The braces are a
Redis Cluster hash tag, so every row of a table lives in one slot and a batched HMGET/HSET never
crosses nodes; different tables spread over the cluster. Hash fields are the 8-byte little-endian
keys; values are whole stored rows (header, score words, embedding and optimizer state) in the layout
of :mod:`dynamicemb_core.plugins.row_codec`, which refuses to decode a row written for another dim,
optimizer, dtype or score strategy.

Every call may name keys of several tables (the multi-table ``Storage`` contract): its keys are
grouped by table and each table's share split in ``chunk_size`` pieces, all sent in one pipeline
(one round trip for the whole call, whatever the number of tables). A call that fails on a broken connection or a timeout is retried ``retries`` times with exponential backoff
(writes are idempotent: HSET of the same values); then :class:`RedisStorageError` says which table,
which operation and which server. Nothing ever returns zeros in place of data it could not read.
"""

from __future__ import annotations

import re
import ssl
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from dynamicemb_core.plugins.row_codec import KEY_BYTES, RowCodec, decode_spans, encode_keys
from dynamicemb_core.plugins.storage_adapter import TableGroups
from dynamicemb_core.plugins.storage_checks import (
    check_export_ids,
    check_insert_pairs,
    check_pairs,
    check_table_ids,
    check_table_specs,
    common_row_dtype,
)
from dynamicemb_core.redaction import redact_text
from dynamicemb_core.types import DynamicEmbError, MemoryType, Storage, StorageTableSpec

__all__ = ["RedisStorage", "RedisStorageError"]

T = TypeVar("T")
# Braces would break the hash tag and ':' the namespace; keep names to a plain alphabet.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-/]+$")
# ClusterDown / TryAgain: a cluster mid-failover or mid-resharding answers again shortly.
_TRANSIENT = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
_PERMANENT = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


class RedisStorageError(DynamicEmbError):
    """Redis could not be reached (after the bounded retries) or refused a command."""


def _short(exc: BaseException, limit: int = 300) -> str:
    """The exception text, cut: redis-py quotes whole pipelined commands, binary rows included."""
    text = redact_text(str(exc))
    return text if len(text) <= limit else text[:limit] + "..."


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it (causes, then contexts), at most ten deep."""
    seen: Optional[BaseException] = exc
    for _ in range(10):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _tls_failure(exc: BaseException) -> Optional[BaseException]:
    """The TLS error behind a redis-py error: an ``ssl.SSLError`` (certificate, protocol) or a
    handshake that timed out (a TLS client on a port that does not speak TLS), if there is one."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLError) or "handshake" in str(cause).lower():
            return cause
    return None


class RedisStorage(Storage):
    """A multi-table Storage on one Redis server (or one cluster slot per table).

    Args:
        tables: the logical tables, in table-id order; names become part of the Redis key.
        device: where ``find`` and ``export`` return tensors.
        url: ``redis://[user:password@]host:port/db``; ``rediss://`` for TLS.
        model: namespace shared by all tables of one model; two storages with the same model and
            table name see the same rows (that is how a job resumes).
        password: overrides the URL's password.
        socket_timeout: seconds to wait for a reply before the attempt counts as failed.
        socket_connect_timeout: seconds to wait for a connection.
        retries: extra attempts after a connection error or timeout (0 = fail at once).
        retry_backoff_s: first backoff; doubles per attempt.
        chunk_size: keys per HMGET / HSET / HDEL command inside one pipeline.
        cluster: ``url`` is a node of a Redis Cluster (``redis.cluster.RedisCluster``); each table's
            hash lives on the node owning its ``{model:table}`` slot.
        client_options: passed through to ``redis.Redis.from_url`` (TLS files, ``username``,
            ``ssl_cert_reqs``, ``health_check_interval``, ...).
    """

    def __init__(
        self,
        tables: Sequence[StorageTableSpec],
        device: torch.device | str = "cpu",
        *,
        url: str = "redis://127.0.0.1:6379/0",
        model: str = "default",
        password: Optional[str] = None,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 2.0,
        retries: int = 3,
        retry_backoff_s: float = 0.05,
        chunk_size: int = 4096,
        cluster: bool = False,
        client_options: Optional[Dict[str, Any]] = None,
    ) -> None:
        check_table_specs(type(self).__name__, tables)
        common_row_dtype(tables)  # one rows matrix per call: tables of one dtype
        for label, value in [("model", model)] + [("table name", t.name) for t in tables]:
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise ValueError(
                    f"RedisStorage: {label} {value!r} must be non-empty and use only letters, digits "
                    f"and '_.-/' (it becomes part of the Redis key demb:{{model:table}}:rows)"
                )
        if retries < 0 or chunk_size <= 0 or socket_timeout <= 0 or retry_backoff_s < 0:
            raise ValueError(
                f"RedisStorage: need retries >= 0, chunk_size > 0, socket_timeout > 0, "
                f"retry_backoff_s >= 0; got {retries}, {chunk_size}, {socket_timeout}, {retry_backoff_s}"
            )
        super().__init__(tables, torch.device(device))
        self.url = url
        self.model = model
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.chunk_size = chunk_size
        options = dict(client_options or {})
        if password is not None:
            options["password"] = password
        self.cluster = cluster
        # Retries are ours (below), so that the attempt count and the final error are explicit.
        kwargs: Dict[str, Any] = dict(
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=Retry(NoBackoff(), 0),
            **options,
        )
        if cluster:
            from redis.cluster import RedisCluster

            # RedisCluster discovers the nodes at construction: that is the first network call.
            self.client = self._call("connect", None, lambda: RedisCluster.from_url(url, **kwargs))
        else:
            self.client = redis.Redis.from_url(url, **kwargs)
        self._hash_keys = [f"demb:{{{model}:{t.name}}}:rows".encode() for t in self.tables]
        self._codecs = [
            RowCodec(t, context=f"demb-redis: table {t.name!r} (model {model!r})")
            for t in self.tables
        ]
        self._call("connect", None, self.client.ping)

    # -- the one place that talks to Redis ---------------------------------------------------

    def _call(self, op: str, table_ids: Optional[Sequence[int]], fn: Callable[[], T]) -> T:
        where = ""
        if table_ids:
            names = ", ".join(repr(self.tables[t].name) for t in table_ids)
            where = f"table{'s' if len(table_ids) > 1 else ''} {names} "
        start = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                # RedisCluster wraps what failed at discovery in RedisClusterException (not a
                # RedisError): classify by what is behind it
                cluster_wrap = isinstance(exc, redis.exceptions.RedisClusterException)
                behind = list(_chain(exc)) if cluster_wrap else [exc]
                auth = next((c for c in behind if isinstance(c, _PERMANENT)), None)
                if auth is not None:  # redis-py derives these from ConnectionError: never retry
                    raise self._refused(op, where, auth) from exc
                tls = _tls_failure(exc)
                if isinstance(tls, ssl.SSLError):  # a certificate or protocol mismatch: final
                    raise self._tls_error(op, where, tls) from exc
                if not any(isinstance(c, _TRANSIENT) for c in behind):
                    # OOM, wrong type, a command refused: retrying won't help
                    raise self._refused(op, where, exc) from exc
                if attempt < self.retries:
                    time.sleep(self.retry_backoff_s * (2**attempt))
                    continue
                if tls is not None:  # a handshake timed out on every attempt
                    raise self._tls_error(op, where, tls, attempt + 1) from exc
                server = f"Redis at {redact_text(self.url)}"
                if self.cluster:
                    server = (
                        f"the Redis Cluster node serving it (cluster at {redact_text(self.url)})"
                    )
                raise RedisStorageError(
                    f"demb-redis: {op} on {where}(model {self.model!r}) failed: {server} did not "
                    f"answer after {attempt + 1} attempts over {time.monotonic() - start:.2f}s "
                    f"({type(exc).__name__}: {_short(exc)}). No data was returned in its place. "
                    f"Check that the server is up and reachable{self._tls_hint(op)}, or raise "
                    f"retries / socket_timeout in external_storage_options"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _refused(self, op: str, where: str, exc: BaseException) -> RedisStorageError:
        hint = ""
        if op == "connect" and any(
            isinstance(c, (ConnectionError, redis.exceptions.ConnectionError)) for c in _chain(exc)
        ):
            hint = self._tls_hint(op)
        return RedisStorageError(
            f"demb-redis: {op} on {where}(model {self.model!r}) at {redact_text(self.url)} was "
            f"refused: {type(exc).__name__}: {_short(exc)}{hint}"
        )

    def _tls_hint(self, op: str) -> str:
        if op == "connect" and self.url.startswith("redis://"):
            return " (a server that speaks TLS on that port needs a rediss:// URL)"
        return ""

    def _tls_error(
        self, op: str, where: str, tls: BaseException, attempts: int = 1
    ) -> RedisStorageError:
        """The TLS reason first, then what did not run and what to check."""
        tries = f" ({attempts} attempts)" if attempts > 1 else ""
        return RedisStorageError(
            f"demb-redis: TLS handshake with {redact_text(self.url)} failed{tries}: "
            f"{type(tls).__name__}: {_short(tls)}; {op} on {where}(model {self.model!r}) did not "
            f"run. Check client_options (ssl_ca_certs, ssl_certfile / ssl_keyfile, "
            f"ssl_check_hostname) against the server's certificate, and that the port speaks TLS "
            f"(rediss://) or not (redis://)"
        )

    def _pipelined(
        self,
        op: str,
        parts: Sequence[Tuple[int, int]],
        build: Callable[[Any, int, int, int], None],
    ) -> List[List[Any]]:
        """One pipeline (one round trip) for several tables' shares of a call.

        ``parts`` is ``[(table id, n)]``; ``build(pipe, table id, a, b)`` queues the commands of
        items ``[a, b)`` of that table, ``chunk_size`` at a time. Returns each table's replies.
        """

        def run() -> List[Any]:
            pipe = self.client.pipeline(transaction=False)
            for t, n in parts:
                for start in range(0, n, self.chunk_size):
                    build(pipe, t, start, min(start + self.chunk_size, n))
            return pipe.execute()

        replies = self._call(op, [t for t, _ in parts], run)
        out, at = [], 0
        for _, n in parts:
            count = -(-n // self.chunk_size)
            out.append(replies[at : at + count])
            at += count
        return out

    # -- Storage ----------------------------------------------------------------------------

    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_pairs(self.tables, keys, table_ids)
        groups = TableGroups(table_ids.cpu())
        keys = groups.sort(keys.cpu())
        fields = {t: encode_keys(keys[a:b]) for t, a, b in groups.spans}
        replies = self._pipelined(
            "find",
            [(t, b - a) for t, a, b in groups.spans],
            lambda p, t, a, b: p.hmget(self._hash_keys[t], fields[t][a:b]),
        )
        values = [v for chunks in replies for chunk in chunks for v in chunk]
        results = decode_spans(self._codecs, groups.spans, values, keys)
        found, rows, scores = groups.merge(self, results)
        return found.to(self.device), rows.to(self.device), scores.to(self.device)

    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        check_insert_pairs(self.tables, keys, table_ids, rows, scores)
        if keys.numel() == 0:
            return
        groups = TableGroups(table_ids.cpu())
        keys, rows, scores = (groups.sort(x.cpu()) for x in (keys, rows, scores))
        fields, values = {}, {}
        for t, a, b in groups.spans:  # encode every table first: a codec error writes nothing
            spec = self.tables[t]
            fields[t] = encode_keys(keys[a:b])
            values[t] = self._codecs[t].encode(
                rows[a:b, : spec.row_width], scores[a:b, : spec.num_scores]
            )
        self._pipelined(
            "insert",
            [(t, b - a) for t, a, b in groups.spans],
            lambda p, t, a, b: p.hset(
                self._hash_keys[t], mapping=dict(zip(fields[t][a:b], values[t][a:b]))
            ),
        )

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        if check_pairs(self.tables, keys, table_ids) == 0:
            return
        groups = TableGroups(table_ids.cpu())
        keys = groups.sort(keys.cpu())
        fields = {t: encode_keys(keys[a:b]) for t, a, b in groups.spans}
        self._pipelined(
            "erase",
            [(t, b - a) for t, a, b in groups.spans],
            lambda p, t, a, b: p.hdel(self._hash_keys[t], *fields[t][a:b]),
        )

    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        """HLEN of each table's hash, all in one pipeline."""
        ids = check_table_ids(self.tables, table_ids)
        if not ids:
            return []

        def run() -> List[Any]:
            pipe = self.client.pipeline(transaction=False)
            for t in ids:
                pipe.hlen(self._hash_keys[t])
            return pipe.execute()

        return [int(x) for x in self._call("size", ids, run)]

    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield every row of the tables once, table by table, by HSCAN.

        HSCAN may return a field twice when Redis rehashes the hash mid-scan, so fields already
        yielded are remembered (8 bytes plus Python overhead per key) and skipped.
        """
        for table_id in check_export_ids(self.tables, table_ids, batch_size):
            yield from self._export_table(table_id, batch_size)

    def _export_table(
        self, table_id: int, batch_size: int
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        name = self._hash_keys[table_id]
        seen: set = set()
        cursor = 0
        pending: Dict[bytes, bytes] = {}
        while True:
            cursor, page = self._call(
                "export",
                [table_id],
                lambda c=cursor: self.client.hscan(name, c, count=batch_size),
            )
            for field, value in page.items():
                if field not in seen:
                    seen.add(field)
                    pending[field] = value
            while len(pending) >= batch_size or (cursor == 0 and pending):
                items = list(pending.items())[:batch_size]
                for field, _ in items:
                    del pending[field]
                yield self._decode_page(table_id, items)
            if cursor == 0:
                return

    def _decode_page(
        self, table_id: int, items: List[Tuple[bytes, bytes]]
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        for field, _ in items:
            if len(field) != KEY_BYTES:
                raise RedisStorageError(
                    f"demb-redis: table {self.tables[table_id].name!r}: field of {len(field)} bytes in "
                    f"{self._hash_keys[table_id]!r}; something other than demb-redis wrote to this hash"
                )
        keys, r, sc = self._codecs[table_id].decode_items(items)
        spec, n = self.tables[table_id], keys.numel()
        rows = torch.zeros(n, self.max_row_width, dtype=self.row_dtype)
        scores = torch.zeros(n, self.max_num_scores, dtype=torch.int64)
        rows[:, : spec.row_width] = r
        scores[:, : spec.num_scores] = sc
        tids = torch.full((n,), table_id, dtype=torch.int64)
        return tuple(x.to(self.device) for x in (keys, tids, rows, scores))  # type: ignore[return-value]

    def flush(self) -> None:
        """Nothing is buffered: every call returns after Redis acknowledged it."""

    def close(self) -> None:
        """Close the connection pool. The data stays in Redis."""
        self.client.close()

    def clear(self) -> None:
        """Delete every row of this storage's tables from Redis (not part of the Storage ABC)."""
        for key in self._hash_keys:  # one DEL per hash: in a cluster they live in different slots
            self._call("clear", None, lambda k=key: self.client.delete(k))

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Payload bytes held in Redis (rows and keys, without Redis's own overhead)."""
        if mem_type is not MemoryType.EXTERNAL:
            return 0
        return sum(
            size * (KEY_BYTES + codec.value_bytes)
            for size, codec in zip(self.sizes(), self._codecs)
        )
