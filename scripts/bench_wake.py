"""Wake latency: how soon a waiter notices a commit made by another process or thread.

The waiter (this process) tells a publisher child to go and starts waiting;
the child reads the monotonic clock, publishes one message and reports the
reading. Latency = wake time - that reading, so it includes the publish
itself: an upper bound of commit-to-wake. CLOCK_MONOTONIC is one clock for
all processes of a host, so the two readings compare. The last two cases
publish from a thread of the waiter's process instead: with `bus.publish`,
and with one plain autocommit SQL INSERT.

    python scripts/bench_wake.py [--commits 500]
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import apsw

from bus import Bus
from bus.log.wake import ChangeWatcher

TARGET_P50_MS = 1.0  # with inotify
_LAST_SEQ_SQL = "SELECT max(seq) FROM messages"
REPO_ROOT = Path(__file__).resolve().parent.parent


def wake_rows(workdir: Path, commits: int = 500) -> list[dict]:
    """p50/p99 wake latency for inotify, agentbus polling and a raw polling loop."""
    path = workdir / "wake.db"
    Bus.open(path).close()
    rows = []
    for name, make_wait, publisher, target in (
        ("agentbus wait_for_change, inotify", _watcher_wait(True), ChildPublisher,
         TARGET_P50_MS),
        ("agentbus wait_for_change, polling", _watcher_wait(False), ChildPublisher, None),
        ("raw apsw: data_version every 1 ms", _raw_poll_wait, ChildPublisher, None),
        ("inotify, publish in a thread", _watcher_wait(True), ThreadPublisher, TARGET_P50_MS),
        ("inotify, plain SQL INSERT in a thread", _watcher_wait(True),
         lambda path: ThreadPublisher(path, plain_sql=True), TARGET_P50_MS),
    ):
        conn = apsw.Connection(str(path))
        try:
            latencies = measure(path, commits, conn, make_wait(conn, path), publisher(path))
        finally:
            conn.close()
        p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
        rows.append({"case": name, "commits": commits, "p50_ms": round(p50, 3),
                     "p99_ms": round(p99, 3), "target_p50_ms": target,
                     "ok": target is None or p50 < target})
    return rows


def measure(path: Path, commits: int, conn: apsw.Connection,
            wait: Callable[[float], int], publisher: ChildPublisher | ThreadPublisher
            ) -> list[float]:
    """Latencies in milliseconds of `commits` wakes after the publisher's commits.

    A wake counts only once the new message is visible to the waiter; an
    earlier (spurious) wake just means waiting again, and its cost is included.
    """
    try:
        wait(0)  # a watcher's first wait returns at once
        latencies = []
        for _ in range(commits):
            expected = (conn.execute(_LAST_SEQ_SQL).get or 0) + 1
            publisher.go()
            woke_ns = wait(5.0)
            while (conn.execute(_LAST_SEQ_SQL).get or 0) < expected:
                woke_ns = wait(5.0)
            latencies.append((woke_ns - publisher.started_ns()) / 1e6)
        return latencies
    finally:
        publisher.close()


class ChildPublisher:
    """Commits made by another process (`publisher` below)."""

    def __init__(self, path: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.child = subprocess.Popen([sys.executable, __file__, "--publisher", str(path)],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)

    def go(self) -> None:
        self.child.stdin.write("go\n")
        self.child.stdin.flush()

    def started_ns(self) -> int:
        return int(self.child.stdout.readline())

    def close(self) -> None:
        self.child.stdin.close()
        self.child.wait(timeout=30)


class ThreadPublisher:
    """Commits made by another thread of the waiter's process (a pump in a thread,
    say): it runs while the waiter looks, where another process is slower to start.
    `plain_sql`: one autocommit INSERT on a raw connection, as someone writing
    to the file with plain SQL would."""

    def __init__(self, path: Path, plain_sql: bool = False) -> None:
        self.orders: queue.Queue[bool] = queue.Queue()
        self.started: queue.Queue[int] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(path, plain_sql), daemon=True)
        self.thread.start()

    def _run(self, path: Path, plain_sql: bool) -> None:
        with Bus.open(path, create=False) as bus:
            raw = apsw.Connection(str(path))
            raw.set_busy_timeout(5000)
            while self.orders.get():
                self.started.put(time.monotonic_ns())
                if plain_sql:
                    raw.execute("INSERT INTO messages (id, ts_ms, from_agent, type)"
                                " VALUES (lower(hex(randomblob(16))), 0, 'bench', 'tick')")
                else:
                    bus.publish("bench", "tick")
            raw.close()

    def go(self) -> None:
        self.orders.put(True)

    def started_ns(self) -> int:
        return self.started.get(timeout=30)

    def close(self) -> None:
        self.orders.put(False)
        self.thread.join()


def _watcher_wait(use_inotify: bool):
    def make(conn: apsw.Connection, path: Path) -> Callable[[float], int]:
        watcher = ChangeWatcher(conn, path, use_inotify=use_inotify)

        def wait(timeout: float) -> int:
            if not watcher.wait(timeout) and timeout:
                raise RuntimeError("no wake within the timeout: a missed wake")
            return time.monotonic_ns()
        return wait
    return make


def _raw_poll_wait(conn: apsw.Connection, path: Path) -> Callable[[float], int]:
    """The obvious hand-written loop: look at data_version every millisecond."""
    state = {"version": None}

    def wait(timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            version = conn.execute("PRAGMA data_version").get
            if version != state["version"]:
                state["version"] = version
                return time.monotonic_ns()
            if time.monotonic() >= deadline:
                return time.monotonic_ns()
            time.sleep(0.001)
    return wait


def _percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def publisher(path: str) -> None:
    """The child: publish one message per "go" line, reporting the time just before."""
    with Bus.open(path, create=False) as bus:
        for line in sys.stdin:
            started = time.monotonic_ns()
            bus.publish("bench", "tick")
            print(started, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--publisher", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.publisher:
        publisher(args.publisher)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="agentbus-wake-"))
    try:
        rows = wake_rows(workdir, args.commits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for row in rows:
        print(f"{row['case']:40} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
