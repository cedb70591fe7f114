"""Waking up when another connection commits, without a busy loop.

`PRAGMA data_version` on a connection changes whenever another connection
(in this process or any other) commits. It is the truth; how long we wait
between looks is the only question:

- With inotify (Linux), the waiter blocks on events in the database's
  directory: every commit writes the `-wal` file, which wakes it at once.
  A commit's first write reaches the WAL a moment (tens of microseconds)
  before SQLite publishes the new wal-index header, so after an event the
  waiter looks again after 20 µs, then after twice as long each time up to
  0.5 ms, for 20 ms; it also looks every 50 ms whatever happens: an event
  that came too early can delay a wake, never lose it. (Looking every
  0.5 ms from the start woke about 0.35 ms after the commit; see
  docs/benchmarks.md.)
- While a watch exists, the kernel builds an event for every write any
  writer makes to the WAL (several per commit), in the writer's own
  system time, even while the waiter is busy elsewhere: two idle views
  cost a publisher about a fifth of its speed (docs/benchmarks.md). A
  waiter that need not wake at once (a view that reads a few times a
  second) passes `hold_watch=False`: its watch is one-shot (IN_ONESHOT)
  and exists only inside `wait`, so it costs the writers one event per
  wait. The price: a commit whose WAL writes came just before the watch
  was added and whose header is published just after the look (with
  `synchronous=FULL` that gap is the commit's fsync) wakes it only at the
  50 ms look.
- An event that comes while the waiter sleeps means another connection is
  committing now: a waiter alone in its process then looks again and again
  without sleeping, for up to 0.2 ms, until the commit's header is
  published. Sleeping between looks instead, it was woken again by each of
  the commit's other WAL writes, and each wake-up was paid in the writer's
  time: another process's publish took 0.12 ms beside a sleeping waiter,
  0.07 ms beside a looking one, and the waiter saw it 0.10 ms after the
  publish began instead of 0.15 ms (docs/benchmarks.md). Many
  waiting threads of one process sleep, as before (see
  `_look_while_committing`). Events already queued when a wait begins are
  mostly the waiter's own commits (which never change its data_version):
  they get the looks after 20 µs and more, never the spinning.
- Without inotify, it looks every millisecond.

inotify is reached through ctypes (stdlib) rather than a package: four libc
calls do the job and nothing needs to be compiled or installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
import time
from pathlib import Path

import apsw

POLL_INTERVAL_S = 0.001
RECHECK_INTERVAL_S = 0.05
HOT_FIRST_S = 0.00002  # the first look after an event; each next one waits twice as long
HOT_INTERVAL_S = 0.0005  # ... up to this
HOT_PERIOD_S = 0.02
SPIN_S = 0.0002  # after an event that woke a sleeping waiter: look without sleeping, this long
_IN_MODIFY = 0x002
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_Q_OVERFLOW = 0x4000
_IN_ONESHOT = 0x80000000
_WATCH_MASK = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class ChangeWatcher:
    """Waits for commits by other connections to the database `conn` is open on.

    One watcher per connection (and so per thread). The first `wait` returns
    at once: it has no earlier version to compare with, and an extra wake is
    harmless where a missed one is not. `hold_watch=False`: watch only inside
    `wait`, so writers pay nothing while the caller is busy (see above).
    """

    def __init__(self, conn: apsw.Connection, db_path: str | os.PathLike[str],
                 use_inotify: bool | None = None, hold_watch: bool = True) -> None:
        self.conn = conn
        self.hold_watch = hold_watch
        self._last_version: int | None = None
        self._inotify_fd = -1
        self._wd = -1  # the watch, while there is one
        if use_inotify is not False:
            # SQLite writes the WAL beside the real file, wherever a symlink points.
            real = Path(db_path).resolve()
            directory = real.parent
            # Every commit writes the WAL; nothing else in the directory (the
            # database file a checkpoint writes, an export being appended to)
            # can mean a commit, so only the WAL's events count.
            self._wal_name = os.fsencode(real.name + "-wal")
            self._directory = os.fsencode(directory)
            self._mask = _WATCH_MASK if hold_watch else _WATCH_MASK | _IN_ONESHOT
            self._inotify_fd = _inotify_init()
            if self.uses_inotify and not self._arm():  # the directory cannot be watched
                self.close()
            self._release()
            if use_inotify and self._inotify_fd < 0:
                raise OSError(f"cannot watch {directory} with inotify (not Linux, or no such"
                              " directory, or the inotify watch limit is reached)")

    @property
    def uses_inotify(self) -> bool:
        return self._inotify_fd >= 0

    def wait(self, timeout: float, interrupt: int | None = None) -> bool:
        """Block until another connection commits or `timeout` seconds pass.

        Returns True on a change (or on the first call), False on timeout.
        `interrupt`, a readable fd (a pipe's read end), ends the wait early as
        soon as it holds data (False, unless a change came too); the caller
        drains it.
        """
        _WAITERS.add(1)
        try:
            return self._wait(timeout, () if interrupt is None else (interrupt,))
        finally:
            _WAITERS.add(-1)
            self._release()

    def _wait(self, timeout: float, extra: tuple[int, ...]) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        hot_until = hot_interval = 0.0
        if self._wd >= 0 and _wal_changed(self._drain(), self._wal_name):
            # Queued before this wait (this thread's own commits, most likely):
            # the looks after an event, but no spinning.
            hot_until, hot_interval = time.monotonic() + HOT_PERIOD_S, HOT_FIRST_S
        while True:
            if self.uses_inotify and self._wd < 0 and time.monotonic() >= hot_until:
                self._arm()  # before the look: a commit from here on leaves an event
            version = self.conn.execute("PRAGMA data_version").get
            if version != self._last_version:
                self._last_version = version
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if self.uses_inotify:
                interval = RECHECK_INTERVAL_S
                if now < hot_until:
                    interval, hot_interval = hot_interval, min(hot_interval * 2, HOT_INTERVAL_S)
                woken = self._block(min(deadline - now, interval), extra)
                if woken is True:
                    self._look_while_committing(min(SPIN_S, deadline - time.monotonic()))
                    hot_until, hot_interval = time.monotonic() + HOT_PERIOD_S, HOT_FIRST_S
            else:
                woken = _select(None, extra, min(deadline - now, POLL_INTERVAL_S))
            if woken is _INTERRUPTED:
                return False

    def _look_while_committing(self, seconds: float) -> None:
        """Look at data_version without sleeping, up to `seconds`, until it changes.

        Running, the waiter is not woken again by the writer's next WAL writes;
        the caller's next look sees the change. An interrupt waits this long at most.
        Only a waiter alone in its process (as each `bus mcp` server's is): 16
        waiting threads of one process all looking fought over the GIL and the
        CPUs (the publish beside them took 0.27 ms instead of 0.23, the last of
        them woke 1.4 ms after it began instead of 1.1), and one of them looking
        still slowed the others.
        """
        if _WAITERS.count > 1:
            return  # not alone: sleep between looks, as before
        end = time.monotonic() + seconds
        while (self.conn.execute("PRAGMA data_version").get == self._last_version
               and time.monotonic() < end):
            os.sched_yield()  # on a busy machine the writer may be waiting for this CPU

    def close(self) -> None:
        if self._inotify_fd >= 0:
            os.close(self._inotify_fd)  # with its watch
            self._inotify_fd = self._wd = -1

    def _arm(self) -> bool:
        """Add the watch on the directory; False where it cannot be watched."""
        self._wd = _libc().inotify_add_watch(self._inotify_fd, self._directory, self._mask)
        return self._wd >= 0

    def _release(self) -> None:
        """Without hold_watch: remove the watch, spent or not, and what it left queued.

        Removed here rather than trusted to IN_ONESHOT: the kernel removes a
        spent watch in the writer's context after it queued the event, and a
        watch added again before that would only update the dying one.
        """
        if not self.hold_watch and self._wd >= 0:
            _libc().inotify_rm_watch(self._inotify_fd, self._wd)  # EINVAL once spent: fine
            self._wd = -1
            self._drain()  # its IN_IGNORED

    def _block(self, timeout: float, extra: tuple[int, ...] = ()) -> object:
        """Wait for directory events: True if one was the WAL's (all are drained),
        _INTERRUPTED if an `extra` fd is readable, else False."""
        ready = _select(self._inotify_fd, extra, timeout)
        if ready is not _WAL:
            return ready or False
        events = self._drain()
        self._release()  # a one-shot watch is spent by any event
        return _wal_changed(events, self._wal_name)

    def _drain(self) -> bytes:
        events = b""
        try:
            while chunk := os.read(self._inotify_fd, 65536):
                events += chunk
        except BlockingIOError:
            pass
        return events


class _Waiters:
    """How many threads of this process are inside `ChangeWatcher.wait`."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        with self._lock:
            self.count += delta


_WAITERS = _Waiters()
_WAL = "wal"  # what _select says when the inotify fd is readable
_INTERRUPTED = "interrupted"  # ... when an interrupt fd is


def _select(inotify_fd: int | None, extra: tuple[int, ...], timeout: float) -> object:
    """Wait up to `timeout` s: _INTERRUPTED if an `extra` fd is readable (it wins: the
    caller wants to hear of it at once), _WAL if `inotify_fd` is, else None."""
    fds = ([] if inotify_fd is None else [inotify_fd]) + list(extra)
    if not fds:
        time.sleep(timeout)
        return None
    ready, _, _ = select.select(fds, [], [], timeout)
    if any(fd in extra for fd in ready):
        return _INTERRUPTED
    return _WAL if ready else None


def _wal_changed(events: bytes, wal_name: bytes) -> bool:
    """Whether a buffer of `struct inotify_event` records names the WAL, or says
    events were lost (the queue overflowed: one of them may have been the WAL's)."""
    offset = 0
    while offset + _EVENT_HEADER.size <= len(events):
        _wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(events, offset)
        start = offset + _EVENT_HEADER.size
        if mask & _IN_Q_OVERFLOW or events[start:start + length].rstrip(b"\0") == wal_name:
            return True
        offset = start + length
    return False


def _inotify_init() -> int:
    """A non-blocking inotify fd (no watch yet), or -1 where inotify is missing."""
    libc = _libc()
    if libc is None:
        return -1
    return libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)


_LIBC: ctypes.CDLL | None | bool = False


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is False:
        _LIBC = None
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            _LIBC = libc
        except (OSError, AttributeError):
            pass  # not Linux, or a libc without inotify: polling it is
    return _LIBC


