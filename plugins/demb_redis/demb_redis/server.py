"""A throw-away ``redis-server`` on a free loopback port, for tests and benchmarks.

Started daemonized without persistence (``--save '' --appendonly no``) and stopped by the pid in
its pidfile, so only the process this helper started is ever signalled.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import List, Optional

__all__ = ["LocalRedisCluster", "LocalRedisServer", "free_port"]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Args:
        cluster: also need ``port + 10000`` free (the cluster bus port), which caps the port at
            55535; picked at random from 20000..55535.
    """
    if not cluster:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 55536)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise OSError("no free port pair (p, p + 10000) found for a Redis Cluster node")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


class LocalRedisServer:
    """Start, stop or kill one local redis-server.

    Args:
        password: set ``requirepass``.
        extra_args: more ``redis-server`` arguments.
    """

    def __init__(
        self, password: Optional[str] = None, extra_args: Optional[List[str]] = None
    ) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError(
                "redis-server is not installed; install it with "
                "`apt-get update && apt-get install -y redis-server`"
            )
        self.password = password
        self.extra_args = list(extra_args or [])
        self.port = 0
        self.dir = tempfile.mkdtemp(prefix="demb-redis-")
        self.pidfile = os.path.join(self.dir, "redis.pid")
        self.pid: Optional[int] = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (without the password)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "LocalRedisServer":
        """Start on a free port and wait until it answers PING."""
        self.port = free_port(cluster="--cluster-enabled" in self.extra_args)
        return self._launch(timeout_s)

    def restart(self, timeout_s: float = 10.0) -> "LocalRedisServer":
        """Start again on the same port and directory (after :meth:`kill`, or killing it now).

        With ``extra_args=["--appendonly", "yes"]`` the server reloads every write it
        acknowledged before it died (the AOF is written before replies are sent); without, it
        starts empty. A cluster node reloads its ``nodes.conf`` and rejoins its cluster.
        """
        self.kill()
        return self._launch(timeout_s)

    def _launch(self, timeout_s: float) -> "LocalRedisServer":
        if os.path.exists(self.pidfile):  # a killed server's pidfile names a dead process
            os.remove(self.pidfile)
        self.pid = None
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            self.pidfile,
            "--dir",
            self.dir,
            "--logfile",
            os.path.join(self.dir, "log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        subprocess.run(args + self.extra_args, check=True, capture_output=True, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.pid is None and os.path.exists(self.pidfile):
                with open(self.pidfile) as f:
                    text = f.read().strip()
                self.pid = int(text) if text else None
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                if self.pid is not None and (reply.startswith(b"+PONG") or b"NOAUTH" in reply):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not start within {timeout_s}s")

    def _signal(self, sig: int, timeout_s: float = 10.0) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            self.pid = None
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.01)
        self.pid = None

    def pause(self) -> None:
        """SIGSTOP the server: connections are still accepted by the kernel, replies never come."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server (a crash, as the failure tests need)."""
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
        appendonly: run every node with the AOF on, so a node killed and restarted
            (:meth:`restart_node`) comes back with every write it acknowledged.
    """

    def __init__(self, masters: int = 3, appendonly: bool = False) -> None:
        self.servers: List[LocalRedisServer] = []
        self.masters = masters
        self.appendonly = appendonly

    @property
    def url(self) -> str:
        """URL of the first node; the client discovers the others."""
        return self.servers[0].url

    def start(self, timeout_s: float = 20.0) -> "LocalRedisCluster":
        """Start the nodes, assign the 16384 slots, and wait until every node reports ok."""
        for _ in range(self.masters):
            server = LocalRedisServer(extra_args=["--cluster-enabled", "yes"])
            server.extra_args += ["--cluster-config-file", os.path.join(server.dir, "nodes.conf")]
            if self.appendonly:
                server.extra_args += ["--appendonly", "yes"]
            self.servers.append(server.start())
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *nodes,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        return self.wait_ok(timeout_s)

    def wait_ok(self, timeout_s: float = 20.0) -> "LocalRedisCluster":
        """Wait until every node reports ``cluster_state:ok`` (all slots served)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(s.port, timeout_s) for s in self.servers):
                return self
            time.sleep(0.1)
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        raise TimeoutError(
            f"Redis Cluster on {nodes} did not reach cluster_state:ok in {timeout_s}s"
        )

    def restart_node(self, index: int, timeout_s: float = 20.0) -> "LocalRedisCluster":
        """Restart node ``index`` on its port and directory (killing it first if it runs); it
        reloads its ``nodes.conf`` (and AOF) and rejoins; returns once every node reports ok."""
        self.servers[index].restart(timeout_s)
        return self.wait_ok(timeout_s)

    def node_for_slot(self, slot: int) -> int:
        """Index in :attr:`servers` of the master serving hash ``slot``."""
        out = subprocess.run(
            ["redis-cli", "-p", str(self.servers[0].port), "cluster", "slots"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        # flat output: start, end, host, port, node id, [more nodes], start, end, ...
        ports = {s.port: i for i, s in enumerate(self.servers)}
        for i in range(len(out) - 3):
            if out[i].isdigit() and out[i + 1].isdigit() and out[i + 2] == "127.0.0.1":
                start, end, port = int(out[i]), int(out[i + 1]), int(out[i + 3])
                if start <= slot <= end and port in ports:
                    return ports[port]
        raise LookupError(f"no node of the cluster serves slot {slot}")

    @staticmethod
    def _node_ok(port: int, timeout_s: float) -> bool:
        try:
            info = subprocess.run(
                ["redis-cli", "-p", str(port), "cluster", "info"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            ).stdout
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
