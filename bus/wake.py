"""Waking up when another connection commits, without a busy loop.

`PRAGMA data_version` on a connection changes whenever another connection
(in this process or any other) commits. It is the truth; how long we wait
between looks is the only question:

- With inotify (Linux), the waiter blocks on events in the database's
  directory: every commit writes the `-wal` file, which wakes it at once.
  The watch is one-shot (IN_ONESHOT), armed again only when the waiter
  next blocks: a watch that stays armed makes the kernel build an event
  for every write any writer makes to the WAL (several per commit), in the
  writer's own system time, even while the waiter is busy elsewhere (two
  idle views cost a publisher about a fifth of its speed; see
  docs/benchmarks.md). One-shot, a waiter costs the writers one event per
  wait. A commit's first write reaches the WAL a moment (tens of
  microseconds) before SQLite publishes the new wal-index header, so after
  an event the waiter looks again after 20 µs, then after twice as long
  each time up to 0.5 ms, for 20 ms; it also looks every 50 ms whatever
  happens: an event that came too early, or a commit that slipped past
  while the watch was spent, can delay a wake, never lose it. (Looking
  every 0.5 ms from the start woke about 0.35 ms after the commit; see
  docs/benchmarks.md.)
- Without inotify, it looks every millisecond.

inotify is reached through ctypes (stdlib) rather than a package: three libc
calls do the job and nothing needs to be compiled or installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import time
from pathlib import Path

import apsw

POLL_INTERVAL_S = 0.001
RECHECK_INTERVAL_S = 0.05
HOT_FIRST_S = 0.00002  # the first look after an event; each next one waits twice as long
HOT_INTERVAL_S = 0.0005  # ... up to this
HOT_PERIOD_S = 0.02
_IN_MODIFY = 0x002
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_Q_OVERFLOW = 0x4000
_IN_ONESHOT = 0x80000000
_WATCH_MASK = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE | _IN_ONESHOT
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class ChangeWatcher:
    """Waits for commits by other connections to the database `conn` is open on.

    One watcher per connection (and so per thread). The first `wait` returns
    at once: it has no earlier version to compare with, and an extra wake is
    harmless where a missed one is not.
    """

    def __init__(self, conn: apsw.Connection, db_path: str | os.PathLike[str],
                 use_inotify: bool | None = None) -> None:
        self.conn = conn
        self._last_version: int | None = None
        self._inotify_fd = -1
        if use_inotify is not False:
            # SQLite writes the WAL beside the real file, wherever a symlink points.
            real = Path(db_path).resolve()
            directory = real.parent
            # Every commit writes the WAL; nothing else in the directory (the
            # database file a checkpoint writes, an export being appended to)
            # can mean a commit, so only the WAL's events count.
            self._wal_name = os.fsencode(real.name + "-wal")
            self._directory = os.fsencode(directory)
            self._inotify_fd = _inotify_init()
            if self.uses_inotify and not self._arm():
                self.close()
            if use_inotify and self._inotify_fd < 0:
                raise OSError(f"cannot watch {directory} with inotify (not Linux, or no such"
                              " directory, or the inotify watch limit is reached)")

    @property
    def uses_inotify(self) -> bool:
        return self._inotify_fd >= 0

    def wait(self, timeout: float) -> bool:
        """Block until another connection commits or `timeout` seconds pass.

        Returns True on a change (or on the first call), False on timeout.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        hot_until = hot_interval = 0.0
        while True:
            hot = time.monotonic() < hot_until
            if self.uses_inotify and not hot:
                self._arm()  # before the look: a commit from here on leaves an event
            version = self.conn.execute("PRAGMA data_version").get
            if version != self._last_version:
                self._last_version = version
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if not self.uses_inotify:
                time.sleep(min(deadline - now, POLL_INTERVAL_S))
            elif hot:  # the event spent the watch; the commit is about to show
                time.sleep(min(deadline - now, hot_interval))
                hot_interval = min(hot_interval * 2, HOT_INTERVAL_S)
            elif self._block(min(deadline - now, RECHECK_INTERVAL_S)):
                hot_until, hot_interval = time.monotonic() + HOT_PERIOD_S, HOT_FIRST_S

    def close(self) -> None:
        if self._inotify_fd >= 0:
            os.close(self._inotify_fd)
            self._inotify_fd = -1

    def _arm(self) -> bool:
        """(Re)arm the one-shot watch on the directory; False where it cannot be watched.

        Arming a watch that is still armed only sets its mask again.
        """
        return _libc().inotify_add_watch(self._inotify_fd, self._directory, _WATCH_MASK) >= 0

    def _block(self, timeout: float) -> bool:
        """Wait for directory events; True if one was the WAL's (all are drained).

        Any event spends the one-shot watch, so the caller arms it again
        before it blocks again.
        """
        ready, _, _ = select.select([self._inotify_fd], [], [], timeout)
        return bool(ready) and _wal_changed(self._drain(), self._wal_name)

    def _drain(self) -> bytes:
        events = b""
        try:
            while chunk := os.read(self._inotify_fd, 65536):
                events += chunk
        except BlockingIOError:
            pass
        return events


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
            _LIBC = libc
        except (OSError, AttributeError):
            pass  # not Linux, or a libc without inotify: polling it is
    return _LIBC


