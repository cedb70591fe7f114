"""Waking on commits: bus/log/wake.py's ChangeWatcher and Bus.wait_for_change.

Commits come from a child process (tests/support/procs_wake.py, driven by lines on
its stdin) or from another thread. To check that a waiter is really woken
(not merely finding the change when it starts), the command to publish is
sent by a helper thread once the waiting thread sleeps in select/poll/
nanosleep, as /proc/self/task/<tid>/wchan tells; where the kernel does not
tell, the command is sent anyway and the test checks less. Nothing waits a
guessed time: every wait has a generous deadline and fails the test when it
runs out. Latency bounds are loose (seconds), never benchmarks.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import apsw
import pytest

from bus import Bus
from bus import BusClosed
from bus.storage.db import connect
from bus.log.wake import ChangeWatcher

PROCS = Path(__file__).resolve().parent.parent / "support" / "procs_wake.py"
LINE_TIMEOUT = 60.0  # for a child to start, import the bus and answer
WAIT_TIMEOUT = 20.0  # what the waiter is given
WAKE_WITHIN = 5.0    # how soon after the publish it must be awake: loose on purpose
AT_ONCE = 2.0        # "returns at once": no blocking wait, whatever the machine's load
TOLERANCE = 0.02     # clock granularity when checking a timeout was waited out
MODES = ["inotify", "inotify-released", "polling", "bus"]  # released: hold_watch=False


def inotify_fds() -> int:
    """How many inotify instances this process has open (Linux /proc)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                count += 1
        except OSError:
            continue
    return count


def inotify_works(directory: Path) -> bool:
    """Whether a watcher can use inotify on `directory` (the connection is not used)."""
    conn = apsw.Connection(":memory:")
    try:
        ChangeWatcher(conn, directory / "probe.db", use_inotify=True).close()
    except OSError:
        return False
    finally:
        conn.close()
    return True


def publish_once(db_path: Path, type_: str = "t") -> None:
    with Bus.open(db_path) as other:
        other.publish("other", type_)


@pytest.fixture
def need_inotify(tmp_path: Path) -> None:
    if not inotify_works(tmp_path):
        pytest.skip("inotify is not available here")


class Child:
    """A procs_wake.py child: commands as stdin lines, answers read with a deadline."""

    def __init__(self, role: str, db: Path, env: dict[str, str], stderr_path: Path,
                 *extra: str) -> None:
        self._stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(PROCS), role, str(db), *extra], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, bufsize=0)
        self._buffer = b""
        self.sent_at: float | None = None

    def send(self, line: str) -> None:
        self.sent_at = time.monotonic()
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_line(self, timeout: float = LINE_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
            if not ready:
                pytest.fail(f"no line from the child within {timeout} s; {self.describe()}")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait(timeout=LINE_TIMEOUT)
                pytest.fail(f"the child closed its stdout; {self.describe()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def describe(self) -> str:
        self._stderr.flush()
        return (f"pid {self.proc.pid}, returncode {self.proc.poll()}, stderr:\n"
                f"{self._stderr_path.read_text(errors='replace')}")

    def finish(self) -> None:
        """Ask a publisher to quit and check it exited cleanly."""
        self.send("quit")
        assert self.proc.wait(timeout=LINE_TIMEOUT) == 0, self.describe()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def spawn(bus: Bus, db_path: Path, tmp_path: Path, python_env):
    """Start procs_wake.py children on the test's bus file; each has said 'ready'."""
    children: list[Child] = []

    def start(role: str = "publisher", *extra: str) -> Child:
        child = Child(role, db_path, python_env, tmp_path / f"child-{len(children)}.stderr",
                      *extra)
        children.append(child)
        assert child.read_line() == "ready"
        return child

    yield start
    for child in children:
        child.cleanup()


def thread_sleeps(tid: int, timeout: float = 10.0) -> bool:
    """Block until thread `tid` of this process sleeps in select/poll/nanosleep.

    False when the kernel does not say what a thread waits on (so the caller
    goes ahead and checks less); fails when it says, but never a sleep.
    """
    wchan = Path(f"/proc/self/task/{tid}/wchan")
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < deadline:
        try:
            value = wchan.read_text().strip()
        except OSError:
            return False
        if any(word in value for word in ("nanosleep", "select", "poll")):
            return True
        seen.add(value)
        if seen <= {"", "0"} and time.monotonic() > deadline - timeout + 2.0:
            return False
        pause.wait(0.002)
    raise AssertionError(f"thread {tid} never slept within {timeout} s (wchan: {seen})")


class WhenBlocked:
    """Run `action` on a helper thread as soon as the calling thread blocks."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.blocked: bool | None = None
        self.acted_at: float | None = None
        self.error: BaseException | None = None
        self._action = action
        self._thread = threading.Thread(target=self._run, args=(threading.get_native_id(),),
                                        daemon=True)
        self._thread.start()

    def _run(self, tid: int) -> None:
        try:
            self.blocked = thread_sleeps(tid)
            self.acted_at = time.monotonic()
            self._action()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> None:
        self._thread.join(timeout=LINE_TIMEOUT)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error


def make_waiter(mode: str, bus: Bus, db_path: Path) -> Callable[[float], bool]:
    """wait(timeout) through a ChangeWatcher in the given mode, or through the Bus."""
    if mode == "bus":
        return bus.wait_for_change
    inotify = mode.startswith("inotify")
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=inotify,
                            hold_watch=(mode != "inotify-released"))
    assert watcher.uses_inotify == inotify
    return watcher.wait


@pytest.fixture(params=MODES)
def mode(request, tmp_path: Path) -> str:
    if request.param.startswith("inotify") and not inotify_works(tmp_path):
        pytest.skip("inotify is not available here")
    return request.param


# --- waking on another process's commit -----------------------------------------


def test_wait_wakes_on_commit_in_another_process(mode: str, bus: Bus, db_path: Path,
                                                 spawn) -> None:
    child = spawn()
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True  # the documented first wake
    trigger = WhenBlocked(lambda: child.send("publish"))
    started = time.monotonic()
    changed = wait(WAIT_TIMEOUT)
    woke = time.monotonic()
    trigger.join()
    assert changed is True
    assert woke >= child.sent_at, "woke before anything was published"
    assert woke - child.sent_at < WAKE_WITHIN
    assert woke - started < WAIT_TIMEOUT / 2
    assert child.read_line() == "published 1"
    assert [m.payload for m in bus.poll("parent")] == [{"n": 0}]
    child.finish()


def test_wait_commit_between_two_waits_is_not_missed(mode: str, bus: Bus, db_path: Path,
                                                     spawn) -> None:
    child = spawn()
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    assert wait(0.05) is False  # one wait ended on its timeout ...
    child.send("publish")       # ... a commit lands before the next one starts
    assert child.read_line() == "published 1"
    started = time.monotonic()
    assert wait(WAIT_TIMEOUT) is True
    assert time.monotonic() - started < AT_ONCE  # at once, not after the timeout
    assert wait(0) is False  # and that change is reported once
    child.finish()


def test_wait_times_out_without_commits(mode: str, bus: Bus, db_path: Path) -> None:
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    for timeout in (0.2, 0.05):
        started = time.monotonic()
        assert wait(timeout) is False
        elapsed = time.monotonic() - started
        assert elapsed >= timeout - TOLERANCE
        assert elapsed < timeout + 2.0


@pytest.mark.parametrize("timeout", [0, -5])
def test_wait_zero_or_negative_timeout_returns_at_once(mode: str, bus: Bus, db_path: Path,
                                                       timeout: float) -> None:
    wait = make_waiter(mode, bus, db_path)
    assert wait(timeout) is True  # first call
    started = time.monotonic()
    assert wait(timeout) is False
    assert time.monotonic() - started < AT_ONCE


def test_wait_first_call_on_new_watcher_returns_true_at_once(mode: str, bus: Bus,
                                                             db_path: Path) -> None:
    bus.publish("a", "t")  # nothing changes after this
    wait = make_waiter(mode, bus, db_path)
    started = time.monotonic()
    assert wait(WAIT_TIMEOUT) is True
    assert time.monotonic() - started < AT_ONCE
    assert wait(0.05) is False


def test_wait_reads_and_passive_checkpoints_by_others_do_not_wake(mode: str, bus: Bus,
                                                                   db_path: Path) -> None:
    """Another connection reading and checkpointing (PASSIVE, as SQLite's
    auto-checkpoint does) touches the files, so inotify sees events, but
    commits nothing: the waiter must not report a change."""
    bus.publish("a", "t", {"n": 1})
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    other = connect(db_path)
    try:
        def read_and_checkpoint() -> None:
            other.execute("SELECT count(*) FROM messages").fetchall()
            other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

        trigger = WhenBlocked(read_and_checkpoint)
        assert wait(0.3) is False
        trigger.join()
    finally:
        other.close()


def test_wait_truncate_checkpoint_by_another_connection_is_an_extra_wake(
        mode: str, bus: Bus, db_path: Path) -> None:
    """Documents SQLite's behaviour: a wal_checkpoint(TRUNCATE) by another
    connection (what `bus compact` runs) resets the WAL, which changes
    PRAGMA data_version although no row changed. Waiters wake and find
    nothing new: an extra wake, harmless, never a missed one."""
    bus.publish("a", "t", {"n": 1})
    [message] = bus.poll("w1")
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    other = connect(db_path)
    try:
        trigger = WhenBlocked(lambda: other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        assert wait(WAIT_TIMEOUT) is True
        trigger.join()
    finally:
        other.close()
    assert bus.poll("w1") == [message]


def test_wal_writes_of_an_open_transaction_end_no_wait_and_its_commit_wakes(
        mode: str, bus: Bus, db_path: Path) -> None:
    """A large transaction spills pages to the WAL before it commits: events
    come, the waiter looks for a moment (bus/log/wake.py, SPIN_S), finds no change,
    sleeps again, and wakes at the commit."""
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    waiter = threading.get_native_id()
    other = connect(db_path)
    wal = Path(f"{db_path}-wal")
    committed_at: list[float] = []

    def spill_then_commit() -> None:
        other.execute("PRAGMA cache_size = 1")
        other.execute("BEGIN IMMEDIATE")
        before = wal.stat().st_size
        for n in range(200):
            other.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (f"k{n}", "x" * 900))
        assert wal.stat().st_size > before  # the pages went to the WAL, uncommitted
        thread_sleeps(waiter)  # the waiter sleeps again: it did not take the writes for a commit
        committed_at.append(time.monotonic())
        other.execute("COMMIT")

    try:
        trigger = WhenBlocked(spill_then_commit)
        assert wait(WAIT_TIMEOUT) is True
        woke_at = time.monotonic()
        trigger.join()
    finally:
        other.close()
    assert committed_at and woke_at >= committed_at[0]  # woken by the commit, not before


# --- commits from this process ----------------------------------------------------


def test_wait_ignores_commits_on_its_own_connection(mode: str, bus: Bus, db_path: Path) -> None:
    """PRAGMA data_version does not change for the connection's own commits, so
    a thread is not woken by what it published itself (it knows already)."""
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    bus.publish("me", "mine")            # this thread's connection, the waiter's too
    bus.ack("me", 1)
    bus.heartbeats.beat("me")
    assert wait(0.2) is False
    publish_once(db_path)                # another connection in the same thread
    assert wait(WAIT_TIMEOUT) is True


def test_wait_wakes_on_commit_from_another_thread_with_its_own_bus(mode: str, bus: Bus,
                                                                   db_path: Path) -> None:
    published: list[int] = []
    other = Bus.open(db_path)
    try:
        wait = make_waiter(mode, bus, db_path)
        assert wait(0) is True

        def publish_from_thread() -> None:
            def work() -> None:
                published.append(other.publish("thread", "hello").seq)
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()

        trigger = WhenBlocked(publish_from_thread)
        changed = wait(WAIT_TIMEOUT)
        woke = time.monotonic()
        trigger.join()
    finally:
        other.close()
    assert changed is True
    assert published == [1]
    assert woke - trigger.acted_at < WAKE_WITHIN


def test_wait_wakes_on_commit_from_another_thread_sharing_the_bus(mode: str, bus: Bus,
                                                                  db_path: Path) -> None:
    """A Bus gives each thread its own connection, so a publish on another
    thread through the same Bus object wakes this thread's waiter."""
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    trigger = WhenBlocked(lambda: bus.publish("thread", "hello"))
    changed = wait(WAIT_TIMEOUT)
    woke = time.monotonic()
    trigger.join()
    assert changed is True
    assert woke - trigger.acted_at < WAKE_WITHIN
    assert [m.type for m in bus.poll("me")] == ["hello"]


# --- many commits -------------------------------------------------------------------


def test_wait_in_a_loop_sees_every_burst(mode: str, bus: Bus, db_path: Path, spawn) -> None:
    child = spawn()
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    seen = 0
    for round_ in range(15):
        child.send(f"burst {round_ % 4 + 1}")
        last = int(child.read_line().split()[1])
        assert wait(WAIT_TIMEOUT) is True, f"round {round_}: no change seen"
        batch = bus.poll("parent", limit=1000)
        assert [m.seq for m in batch] == list(range(seen + 1, last + 1))
        bus.ack("parent", last)
        seen = last
        assert wait(0) is False  # the burst was reported once, and our ack is ours
    child.finish()


def test_wait_loop_keeps_up_with_a_free_running_publisher(mode: str, bus: Bus, db_path: Path,
                                                          spawn) -> None:
    """A consumer loop (wait, poll, ack) while another process publishes bursts
    on its own: while messages are missing each wait must report a change,
    and the loop must end with everything seen, never hanging."""
    rounds, size = 20, 25
    total = rounds * size
    child = spawn("stream", "--rounds", str(rounds), "--size", str(size))
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True
    child.send("go")
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < total:
        assert time.monotonic() < deadline, f"only {len(seen)} of {total} seen"
        assert wait(WAIT_TIMEOUT) is True, f"{len(seen)} of {total} seen, then no wake"
        batch = bus.poll("consumer", limit=10_000)
        if batch:
            seen.extend(m.seq for m in batch)
            bus.ack("consumer", batch[-1].seq)
    assert seen == list(range(1, total + 1))
    assert child.read_line() == f"done {total}"
    assert child.proc.wait(timeout=LINE_TIMEOUT) == 0, child.describe()


# --- fallbacks -----------------------------------------------------------------------


def test_watcher_use_inotify_none_picks_inotify_where_available(need_inotify, bus: Bus,
                                                                db_path: Path) -> None:
    before = inotify_fds()
    auto = ChangeWatcher(bus.conn, db_path)
    assert auto.uses_inotify
    assert inotify_fds() == before + 1
    polling = ChangeWatcher(bus.conn, db_path, use_inotify=False)
    assert not polling.uses_inotify
    assert inotify_fds() == before + 1  # polling opens no inotify instance
    auto.close()
    assert inotify_fds() == before


def test_watcher_unwatchable_directory_falls_back_to_polling(bus: Bus, db_path: Path,
                                                             tmp_path: Path) -> None:
    nowhere = tmp_path / "does-not-exist" / "bus.db"
    with pytest.raises(OSError, match="inotify"):
        ChangeWatcher(bus.conn, nowhere, use_inotify=True)
    watcher = ChangeWatcher(bus.conn, nowhere)  # use_inotify=None: falls back
    assert not watcher.uses_inotify
    assert watcher.wait(0) is True
    trigger = WhenBlocked(lambda: publish_once(db_path))
    assert watcher.wait(WAIT_TIMEOUT) is True
    assert time.monotonic() - trigger.acted_at < WAKE_WITHIN
    trigger.join()


def test_watcher_inotify_wakes_even_without_events_in_watched_directory(
        need_inotify, tmp_path: Path) -> None:
    """The bus opened through a symlink: SQLite writes the WAL beside the real
    file, so the watched directory sees no event; the periodic recheck still
    wakes the waiter (late, never lost)."""
    real = tmp_path / "real" / "bus.db"
    link = tmp_path / "link" / "bus.db"
    link.parent.mkdir()
    with Bus.open(real):
        pass
    link.symlink_to(real)
    with Bus.open(link) as waiter_bus, Bus.open(real) as publisher:
        watcher = ChangeWatcher(waiter_bus.conn, link, use_inotify=True)
        assert watcher.wait(0) is True
        trigger = WhenBlocked(lambda: publisher.publish("x", "t"))
        assert watcher.wait(WAIT_TIMEOUT) is True
        assert time.monotonic() - trigger.acted_at < WAKE_WITHIN
        trigger.join()
        watcher.close()


# --- closing ---------------------------------------------------------------------------


def test_watcher_close_is_idempotent(need_inotify, bus: Bus, db_path: Path) -> None:
    before = inotify_fds()
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=True)
    assert inotify_fds() == before + 1
    watcher.close()
    assert inotify_fds() == before
    assert not watcher.uses_inotify
    watcher.close()
    assert inotify_fds() == before
    polling = ChangeWatcher(bus.conn, db_path, use_inotify=False)
    polling.close()
    polling.close()


def test_watcher_after_close_still_waits_by_polling(need_inotify, bus: Bus, db_path: Path) -> None:
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=True)
    watcher.close()
    assert watcher.wait(0) is True
    started = time.monotonic()
    assert watcher.wait(0.1) is False
    assert time.monotonic() - started >= 0.1 - TOLERANCE
    publish_once(db_path)
    assert watcher.wait(WAIT_TIMEOUT) is True


def test_bus_close_closes_watchers_of_every_thread(need_inotify, db_path: Path) -> None:
    before = inotify_fds()
    opened = Bus.open(db_path)
    assert opened.wait_for_change(0) is True
    assert opened.wait_for_change(0) is False  # the same watcher again, not a new one
    assert inotify_fds() == before + 1
    results: list[bool] = []
    watching, release = threading.Event(), threading.Event()

    def watch_then_stay() -> None:  # alive through close(): its watcher is close()'s to close
        results.append(opened.wait_for_change(0))
        watching.set()
        release.wait(30)

    thread = threading.Thread(target=watch_then_stay)
    thread.start()
    assert watching.wait(30)
    assert results == [True]  # that thread's own first wake
    assert inotify_fds() == before + 2
    opened.close()
    assert inotify_fds() == before
    release.set()
    thread.join()
    opened.close()
    assert inotify_fds() == before


def test_bus_wait_for_change_after_close_raises_bus_closed(db_path: Path) -> None:
    opened = Bus.open(db_path)
    opened.close()
    with pytest.raises(BusClosed):
        opened.wait_for_change(0)


def test_bus_wait_for_change_after_close_raises_bus_closed_once_a_watcher_exists(
        db_path: Path) -> None:
    opened = Bus.open(db_path)
    assert opened.wait_for_change(0) is True
    opened.close()
    with pytest.raises(BusClosed):
        opened.wait_for_change(0)


# --- which events count ----------------------------------------------------------------


def test_only_the_wal_s_events_end_a_blocking_wait(need_inotify, bus: Bus, db_path: Path,
                                                   tmp_path: Path) -> None:
    """A file appended to beside the bus (an export, a log) and the database
    file a checkpoint writes are no commit: the inotify wait goes on through
    their events and ends at the WAL's."""
    bus.publish("a", "t", {"n": 1})
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=True)
    try:
        other = connect(db_path)
        export = tmp_path / "bus.jsonl"
        with export.open("ab") as out:
            out.write(b"{}\n")
            out.flush()
            other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # writes the db file
            ready, _, _ = select.select([watcher._inotify_fd], [], [], WAIT_TIMEOUT)
            assert ready  # their events arrived ...
            assert watcher._block(0.2) is False  # ... and were not enough
        other.execute("INSERT INTO meta (key, value) VALUES ('wake', 'x')")
        assert watcher._block(WAIT_TIMEOUT) is True
        other.close()
    finally:
        watcher.close()


@pytest.mark.parametrize("inotify", [True, False])
def test_a_byte_on_the_interrupt_fd_ends_a_wait_without_a_change(bus: Bus, db_path: Path,
                                                                 inotify: bool) -> None:
    """The pump's idle database thread waits so: a finished handler or stop() writes a
    byte, and the wait ends (False: nothing changed) before its timeout."""
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=inotify or False)
    if inotify and not watcher.uses_inotify:
        pytest.skip("no inotify here")
    read, write = os.pipe()
    try:
        assert watcher.wait(0, read) is True  # the first wait: nothing to compare with
        results: list[bool] = []
        waiter = threading.Thread(target=lambda: results.append(watcher.wait(3600, read)),
                                  daemon=True)
        waiter.start()
        os.write(write, b"!")
        waiter.join(60)
        assert results == [False]  # ended by the byte, not by its hour-long timeout
        assert os.read(read, 16) == b"!"  # left for the caller to drain
        other = connect(db_path)
        other.execute("INSERT INTO meta (key, value) VALUES ('wake', 'x')")
        other.close()
        assert watcher.wait(3600, read) is True  # a change still wins over no byte
    finally:
        watcher.close()
        os.close(read)
        os.close(write)


def inotify_watches(fd: int) -> int:
    """How many watches the inotify instance `fd` of this process holds (Linux /proc)."""
    lines = Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
    return sum(line.startswith("inotify wd:") for line in lines)


@pytest.mark.parametrize("hold_watch", [True, False])
def test_watcher_keeps_its_watch_between_waits_only_with_hold_watch(
        need_inotify, bus: Bus, db_path: Path, hold_watch: bool) -> None:
    """While a watch exists the kernel builds an event for every write to the
    WAL, in the writer's own time: a view's watcher (hold_watch=False) holds
    none between two waits; the default keeps its watch, to wake at once."""
    watcher = ChangeWatcher(bus.conn, db_path, use_inotify=True, hold_watch=hold_watch)
    between_waits = 1 if hold_watch else 0
    try:
        assert inotify_watches(watcher._inotify_fd) == between_waits
        assert watcher.wait(0) is True
        assert inotify_watches(watcher._inotify_fd) == between_waits
        while_blocked: list[int] = []

        def publish_once_watched() -> None:
            while_blocked.append(inotify_watches(watcher._inotify_fd))
            publish_once(db_path)

        trigger = WhenBlocked(publish_once_watched)
        assert watcher.wait(WAIT_TIMEOUT) is True
        trigger.join()
        if trigger.blocked:  # the kernel said the waiter was blocked, so in select
            assert while_blocked == [1]
        assert inotify_watches(watcher._inotify_fd) == between_waits
    finally:
        watcher.close()


def test_waiting_threads_are_counted_while_they_wait_and_only_then(mode: str, bus: Bus,
                                                                   db_path: Path) -> None:
    """A waiter looks without sleeping only when it is the process's one waiting
    thread (bus/log/wake.py): the count must come back down however a wait ends."""
    from bus.log.wake import _WAITERS
    wait = make_waiter(mode, bus, db_path)
    assert wait(0) is True and _WAITERS.count == 0
    seen: list[int] = []
    trigger = WhenBlocked(lambda: (seen.append(_WAITERS.count), publish_once(db_path)))
    assert wait(WAIT_TIMEOUT) is True
    trigger.join()
    assert seen == [1] and _WAITERS.count == 0
    assert wait(0.05) is False and _WAITERS.count == 0


# --- the one wait of the library: Bus.wait_for and poll(wait=) ----------------------------


def test_poll_with_wait_returns_the_message_another_process_publishes(bus: Bus, spawn) -> None:
    """poll(wait=) blocks until a commit brings a message, not until its wait runs out."""
    child = spawn()
    assert bus.poll("parent") == []
    trigger = WhenBlocked(lambda: child.send("publish"))
    started = time.monotonic()
    found = bus.poll("parent", wait=WAIT_TIMEOUT)
    trigger.join()
    assert [m.payload for m in found] == [{"n": 0}]
    assert time.monotonic() - started < WAIT_TIMEOUT / 2
    assert child.read_line() == "published 1"
    child.finish()


def test_wait_for_returns_the_last_result_when_nothing_is_enough(bus: Bus) -> None:
    """Without commits it fetches again each WAIT_SLICE_S and hands back what it has."""
    calls = []

    def fetch() -> list[int]:
        calls.append(time.monotonic())
        return [len(calls)]

    started = time.monotonic()
    assert bus.wait_for(fetch, 2.5, done=lambda found: found[0] > 99) == [len(calls)]
    assert time.monotonic() - started >= 2.5
    assert len(calls) >= 3  # the first fetch, then one per slice of at most a second
    assert bus.wait_for(lambda: ["here"], 60) == ["here"]  # enough at once: no wait
