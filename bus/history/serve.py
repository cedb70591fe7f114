"""A warm Spark for `bus history`: a Spark Connect server on 127.0.0.1, and its state file.

    start_server(db, spark_home, settings)  # spark-submit's SparkConnectServer, in the
                                            # background; its state
    live_server(db)  # the running server's state, or None (a stale state file removed)
    stop_server(db)

The JVM start and the first jobs' warm-up are most of a small run's time;
a server started once keeps a session warm, and `bus history` connects to
it (`sc://127.0.0.1:PORT`) instead of starting a JVM of its own. Its state
(pid, port) lives beside the bus file, `<bus file>.spark-connect.json`; a
state whose process is gone or whose port does not answer is stale, and is
removed when found. The server's Python workers run this interpreter, so
the pipeline's foreachBatch (which runs on the server) imports the same
agentbus. Nothing here imports pyspark.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bus.history.errors import ServerError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STATE_SUFFIX = ".spark-connect.json"
LOG_SUFFIX = ".spark-connect.log"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServerState:
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"


def state_path(db: str | os.PathLike[str]) -> Path:
    path = Path(db).absolute()
    return path.with_name(path.name + STATE_SUFFIX)


def read_state(db: str | os.PathLike[str]) -> ServerState | None:
    """The recorded state, alive or not; None without one (or an unreadable one)."""
    try:
        recorded = json.loads(state_path(db).read_text())
        return ServerState(int(recorded["pid"]), int(recorded["port"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_server(db: str | os.PathLike[str]) -> ServerState | None:
    """The running server's state; a stale state file (process gone, port silent) is
    removed and None returned."""
    state = read_state(db)
    if state is None:
        return None
    if _alive(state.pid) and _answers(state.port):
        return state
    state_path(db).unlink(missing_ok=True)
    return None


def start_server(db: str | os.PathLike[str], spark_home: str, settings: dict[str, str],
                 timeout: float = START_TIMEOUT_S) -> tuple[ServerState, bool]:
    """Start the server unless one runs; (its state, whether it was started now).

    `settings` are Spark settings for it (session.server_settings: on a local master, a
    driver on loopback, as the server is, and a local job's SQL settings).

    Raises ServerError naming the log when it exits or does not answer in time.
    """
    running = live_server(db)
    if running is not None:
        return running, False
    port = _free_port()
    log = state_path(db).with_name(Path(db).name + LOG_SUFFIX)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": spark_home}
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [os.path.join(spark_home, "bin", "spark-submit"), "--class", SERVER_CLASS,
             "--name", "agentbus-history", "--master", server_master(),
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.sql.session.timeZone=UTC",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
             *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}"))],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own group: stopped whole, and not by the shell's ^C
    state = ServerState(process.pid, port)
    deadline = time.monotonic() + timeout
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            _kill_group(process.pid)
            raise ServerError(f"the Spark Connect server did not start (see {log})")
        time.sleep(0.2)
    state_path(db).write_text(json.dumps({"pid": state.pid, "port": state.port}))
    return state, True


def server_master() -> str:
    """The master the server runs its jobs on: SPARK_MASTER, else local[*]."""
    return os.environ.get("SPARK_MASTER", "local[*]")


def stop_server(db: str | os.PathLike[str], timeout: float = STOP_TIMEOUT_S) -> ServerState | None:
    """Stop the running server (SIGTERM to its process group, SIGKILL after `timeout`);
    the state it had, or None when none ran."""
    state = live_server(db)
    if state is None:
        return None
    _kill_group(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(state.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(state.pid):
        _kill_group(state.pid)
    state_path(db).unlink(missing_ok=True)
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid: not our server
        return False
    try:  # a zombie child of this process is gone for our purposes
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
