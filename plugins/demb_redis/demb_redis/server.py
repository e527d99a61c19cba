"""A throw-away ``redis-server`` on a free loopback port, for tests and benchmarks.

Started as a child process (not daemonized: its exit is seen at once, and a kill is reaped by
``wait``, so only the process this helper started is ever signalled), without persistence unless
``appendonly=True``.

Ports come from outside the kernel's ephemeral range (``ip_local_port_range``). A port inside it
can be taken between our check and the server's bind by any process's outgoing connection, and,
while the server is down between a kill and its restart, a client connecting to it can be given
that very port as its own source port and connect to itself (TCP self-connect), holding the port
so that the restart cannot bind it. Outside the range only an explicit bind can take a port; a
server that still loses its port at start is started again on another one.

Secrets never go on the command line, where ``ps`` shows them to every user of the machine: the
password (``requirepass`` / ``masterauth``) is written to a ``redis.conf`` of mode 0600 in the
server's own folder, which the server reads as its config file, and ``redis-cli`` gets it through
``REDISCLI_AUTH``. With ``tls=`` (a :class:`LocalTLS`, made by :meth:`LocalTLS.create` with the
``openssl`` command) the server speaks only TLS, on its port and (for a cluster) on its bus.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["LocalRedisCluster", "LocalRedisServer", "LocalTLS", "free_port"]

_BUS_OFFSET = 10000  # a Redis Cluster node also listens on port + 10000 (the cluster bus)
_LOWEST_PORT = 10000  # below: well-known and commonly configured service ports (6379, 5432, ...)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ephemeral_range() -> Tuple[int, int]:
    """The kernel's range of ports for outgoing connections and ``bind(0)`` (Linux default when
    it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidate_ports(cluster: bool) -> List[int]:
    """Ports ``p`` with ``p`` (and ``p + 10000`` for a cluster node) outside the ephemeral range."""
    low, high = _ephemeral_range()

    def outside(port: int) -> bool:
        return _LOWEST_PORT <= port <= 65535 and not low <= port <= high

    ports = [
        p
        for p in range(_LOWEST_PORT, 65536)
        if outside(p) and (not cluster or outside(p + _BUS_OFFSET))
    ]
    if not ports:  # an unusual ephemeral range that covers everything: take any port
        ports = list(range(20000, 65536 - (_BUS_OFFSET if cluster else 0)))
    return ports


def free_port(cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1, outside the ephemeral range, that was free a moment ago.

    Args:
        cluster: also need ``port + 10000`` free (the cluster bus port).
    """
    ports = _candidate_ports(cluster)
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(ports)
        if _bindable(port) and (not cluster or _bindable(port + _BUS_OFFSET)):
            return port
    raise OSError("no free port (outside the ephemeral range) found for a local redis-server")


@dataclass(frozen=True)
class LocalTLS:
    """A throw-away certificate authority, a server certificate for 127.0.0.1 / localhost and a
    client certificate signed by it (PEM files), for TLS tests.

    Attributes:
        ca_cert: the CA's certificate (clients verify the server with it: ``ssl_ca_certs``).
        server_cert, server_key: the server's certificate and key.
        client_cert, client_key: a client certificate for mutual TLS (``ssl_certfile`` /
            ``ssl_keyfile``).
    """

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @classmethod
    def create(cls, folder: str, days: int = 2) -> "LocalTLS":
        """Generate the CA and both certificates into ``folder`` with the ``openssl`` command."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise FileNotFoundError("the openssl command is needed to make test certificates")
        os.makedirs(folder, exist_ok=True)

        def path(name: str) -> str:
            return os.path.join(folder, name)

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days),
            "-subj", "/CN=demb-redis test CA", "-keyout", path("ca.key"), "-out", path("ca.crt"))  # fmt: skip
        with open(path("san.cnf"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for who in ("server", "client"):
            run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=demb-redis test {who}",
                "-keyout", path(f"{who}.key"), "-out", path(f"{who}.csr"))  # fmt: skip
            run("x509", "-req", "-in", path(f"{who}.csr"), "-CA", path("ca.crt"),
                "-CAkey", path("ca.key"), "-CAcreateserial", "-days", str(days),
                "-extfile", path("san.cnf"), "-out", path(f"{who}.crt"))  # fmt: skip
        for name in ("ca.key", "server.key", "client.key"):
            os.chmod(path(name), 0o600)
        return cls(
            ca_cert=path("ca.crt"),
            server_cert=path("server.crt"),
            server_key=path("server.key"),
            client_cert=path("client.crt"),
            client_key=path("client.key"),
        )

    def client_options(self, client_cert: bool = False) -> Dict[str, str]:
        """redis-py keyword arguments that trust the CA (and present the client certificate)."""
        options = {"ssl_ca_certs": self.ca_cert}
        if client_cert:
            options.update(ssl_certfile=self.client_cert, ssl_keyfile=self.client_key)
        return options

    def cli_args(self) -> List[str]:
        """``redis-cli`` arguments for a TLS connection trusting the CA."""
        return [
            "--tls",
            "--cacert",
            self.ca_cert,
            "--cert",
            self.client_cert,
            "--key",
            self.client_key,
        ]


def _conf_value(value: str) -> str:
    """``value`` as a double-quoted redis.conf string."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError("a redis.conf value cannot hold a newline or NUL")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _PortTaken(OSError):
    """The server exited at start because its port was taken in the meantime."""


class LocalRedisServer:
    """Start, stop or kill one local redis-server.

    Args:
        password: set ``requirepass`` (and ``masterauth``), through a 0600 config file, never argv.
        extra_args: more ``redis-server`` arguments (nothing secret: argv is public).
        tls: serve TLS only, with these certificates (:meth:`url` is then ``rediss://``).
        tls_auth_clients: with ``tls``, whether clients must present a certificate signed by the
            CA (``"yes"``), may (``"optional"``) or need not (``"no"``).
        appendonly: keep every acknowledged write across a crash: AOF on, with
            ``appendfsync always``. Redis's default ``everysec`` is not enough even for a killed
            process: while its background fsync of the AOF still runs (a busy disk), Redis keeps
            new writes in memory for up to two seconds and replies to them anyway, so a SIGKILL
            in that window loses writes it acknowledged. ``always`` writes (and fsyncs) the AOF
            before any reply leaves.
    """

    def __init__(
        self,
        password: Optional[str] = None,
        extra_args: Optional[List[str]] = None,
        appendonly: bool = False,
        tls: Optional[LocalTLS] = None,
        tls_auth_clients: str = "optional",
    ) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError(
                "redis-server is not installed; install it with "
                "`apt-get update && apt-get install -y redis-server`"
            )
        self.password = password
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.port = 0
        self.dir = tempfile.mkdtemp(prefix="demb-redis-")
        self.log = os.path.join(self.dir, "log")
        self.config_file = os.path.join(self.dir, "redis.conf")
        self.pid: Optional[int] = None
        self._proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``rediss://`` with TLS; without the password)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def client_options(self) -> Dict[str, str]:
        """redis-py keyword arguments a client of this server needs besides the URL (the CA and
        client certificate with TLS; the password is the caller's to give)."""
        return self.tls.client_options(client_cert=True) if self.tls else {}

    def cli(self, *args: str, timeout_s: float = 10.0) -> "subprocess.CompletedProcess[str]":
        """Run ``redis-cli`` against this server (TLS and password included, the password through
        the environment)."""
        env = dict(os.environ)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        tls = self.tls.cli_args() if self.tls else []
        return subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *tls, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )

    def start(self, timeout_s: float = 10.0) -> "LocalRedisServer":
        """Start on a free port and wait until it answers PING (on another port if the first
        one is taken before the server binds it)."""
        cluster = "--cluster-enabled" in self.extra_args
        for attempt in range(5):
            self.port = free_port(cluster=cluster)
            try:
                return self._launch(timeout_s)
            except _PortTaken:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def restart(self, timeout_s: float = 10.0) -> "LocalRedisServer":
        """Start again on the same port and directory (after :meth:`kill`, or killing it now).

        With ``appendonly=True`` the server reloads every write it acknowledged before it died;
        without, it starts empty. A cluster node reloads its ``nodes.conf`` and rejoins its
        cluster.
        """
        self.kill()
        return self._launch(timeout_s)

    def _write_config(self) -> None:
        """The secrets (and the TLS files) in ``redis.conf``, created with mode 0600."""
        lines = []
        if self.password:
            lines += [f"requirepass {_conf_value(self.password)}"]
            lines += [f"masterauth {_conf_value(self.password)}"]
        if self.tls:
            lines += [
                f"tls-cert-file {_conf_value(self.tls.server_cert)}",
                f"tls-key-file {_conf_value(self.tls.server_key)}",
                f"tls-ca-cert-file {_conf_value(self.tls.ca_cert)}",
                f"tls-auth-clients {self.tls_auth_clients}",
                "tls-replication yes",
                "tls-cluster yes",
            ]
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also when the file was there with wider permissions
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _args(self) -> List[str]:
        assert self.binary is not None
        self._write_config()
        args = [self.binary, self.config_file, "--bind", "127.0.0.1", "--save", ""]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port)]
        else:
            args += ["--port", str(self.port)]
        args += ["--daemonize", "no", "--dir", self.dir, "--logfile", self.log]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + self.extra_args

    def _ping(self) -> bytes:
        """One PING over a fresh connection (TLS when the server speaks it); the raw reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as raw:
            if self.tls is None:
                raw.sendall(b"PING\r\n")
                return raw.recv(64)
            context = ssl.create_default_context(cafile=self.tls.ca_cert)
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"PING\r\n")
                return s.recv(64)

    def _launch(self, timeout_s: float) -> "LocalRedisServer":
        """Run the server and wait until it answers PING; raise at once if it exits."""
        log_start = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        proc = subprocess.Popen(
            self._args(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._proc, self.pid = proc, proc.pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = self.pid = None
                self._exited(proc.returncode, log_start)
            try:
                reply = self._ping()
                # -LOADING while it reads its AOF: not ready yet
                if reply.startswith(b"+PONG") or b"NOAUTH" in reply:
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(
            f"redis-server on port {self.port} did not answer PING within {timeout_s}s"
            f"{self._log_tail(0)}"
        )

    def _exited(self, code: int, log_start: int) -> None:
        tail = self._log_tail(log_start)
        if "Address already in use" in tail:
            raise _PortTaken(f"redis-server could not bind port {self.port}{tail}")
        raise RuntimeError(f"redis-server on port {self.port} exited with code {code}{tail}")

    def _log_tail(self, start: int) -> str:
        try:
            with open(self.log, errors="replace") as f:
                f.seek(start)
                lines = f.read().splitlines()[-5:]
        except OSError:
            return ""
        return "; its log ends:\n" + "\n".join(lines) if lines else ""

    def _signal(self, sig: int, timeout_s: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = self.pid = None

    def pause(self) -> None:
        """SIGSTOP the server: connections are still accepted by the kernel, replies never come."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server (a crash, as the failure tests need); returns once it is gone."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM the server (resuming it first if paused) and remove its directory."""
        self.resume()
        self._signal(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalRedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalRedisCluster:
    """A throw-away Redis Cluster of ``masters`` local servers (no replicas), for tests.

    Args:
        masters: number of master nodes (Redis needs at least 3).
        appendonly: run every node with the AOF on (``LocalRedisServer(appendonly=True)``), so a
            node killed and restarted (:meth:`restart_node`) comes back with every write it
            acknowledged.
        password: every node's ``requirepass`` / ``masterauth`` (in each node's 0600 config file).
        tls: every node speaks only TLS, clients and cluster bus alike.
    """

    def __init__(
        self,
        masters: int = 3,
        appendonly: bool = False,
        password: Optional[str] = None,
        tls: Optional[LocalTLS] = None,
    ) -> None:
        self.servers: List[LocalRedisServer] = []
        self.masters = masters
        self.appendonly = appendonly
        self.password = password
        self.tls = tls

    @property
    def url(self) -> str:
        """URL of the first node; the client discovers the others."""
        return self.servers[0].url

    def client_options(self) -> Dict[str, str]:
        """What a client needs besides the URL and the password (see LocalRedisServer)."""
        return self.servers[0].client_options()

    def start(self, timeout_s: float = 60.0) -> "LocalRedisCluster":
        """Start the nodes, assign the 16384 slots, and wait until every node reports ok."""
        for _ in range(self.masters):
            server = LocalRedisServer(
                password=self.password,
                extra_args=["--cluster-enabled", "yes"],
                appendonly=self.appendonly,
                tls=self.tls,
            )
            server.extra_args += ["--cluster-config-file", os.path.join(server.dir, "nodes.conf")]
            self.servers.append(server.start())
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        created = self.servers[0].cli(
            "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes",
            timeout_s=timeout_s,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create {' '.join(nodes)} failed: "
                f"{(created.stdout + created.stderr).strip()[-500:]}"
            )
        return self.wait_ok(timeout_s)

    def wait_ok(self, timeout_s: float = 60.0) -> "LocalRedisCluster":
        """Wait until every node reports ``cluster_state:ok`` (all slots served)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(s, timeout_s) for s in self.servers):
                return self
            time.sleep(0.1)
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        raise TimeoutError(
            f"Redis Cluster on {nodes} did not reach cluster_state:ok in {timeout_s}s"
        )

    def restart_node(self, index: int, timeout_s: float = 60.0) -> "LocalRedisCluster":
        """Restart node ``index`` on its port and directory (killing it first if it runs); it
        reloads its ``nodes.conf`` (and AOF) and rejoins; returns once every node reports ok."""
        self.servers[index].restart(timeout_s)
        return self.wait_ok(timeout_s)

    def node_for_slot(self, slot: int) -> int:
        """Index in :attr:`servers` of the master serving hash ``slot``."""
        done = self.servers[0].cli("cluster", "slots")
        done.check_returncode()
        out = done.stdout.split()
        # flat output: start, end, host, port, node id, [more nodes], start, end, ...
        ports = {s.port: i for i, s in enumerate(self.servers)}
        for i in range(len(out) - 3):
            if out[i].isdigit() and out[i + 1].isdigit() and out[i + 2] == "127.0.0.1":
                start, end, port = int(out[i]), int(out[i + 1]), int(out[i + 3])
                if start <= slot <= end and port in ports:
                    return ports[port]
        raise LookupError(f"no node of the cluster serves slot {slot}")

    @staticmethod
    def _node_ok(server: LocalRedisServer, timeout_s: float) -> bool:
        try:
            info = server.cli("cluster", "info", timeout_s=timeout_s).stdout
        except subprocess.TimeoutExpired:
            return False
        return "cluster_state:ok" in info

    def stop(self) -> None:
        """Stop every node."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "LocalRedisCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
