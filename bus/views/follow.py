"""The refresh loop of the live views: read after each commit, hand the result over.

`bus top` and `bus serve` each run this in one thread with a read-only
connection. The bus's `ChangeWatcher` (inotify on the WAL) wakes it when
anything commits; a burst of commits is read at most every MIN_REFRESH_S (a quarter second),
so a busy writer pays for a few reads a second, not one per commit; with no
commit it still reads every AGE_REFRESH_S, so ages and rates move.

The watcher holds its inotify watch only while it waits (`hold_watch=False`):
a watch held through the reads and pauses made the kernel build an event for
every write to the WAL, in the writers' time: with two views watching, a
publisher spent 39% more CPU per publish (docs/benchmarks.md). A commit that slips past
the watch's return is seen at the watcher's 50 ms look: nothing a person sees.

The timed read goes through a fresh connection (one serves AGE_REFRESH_S at
most), so the view reads the path as it is now, with the checks every open
makes: a connection held for good would go on reading the file it opened
after that was renamed over or removed, and in WAL mode trusts its page
cache while the WAL is unchanged, so bytes overwritten in place would go
unseen.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable
from typing import TypeVar

import apsw

from bus.storage.db import connect
from bus.storage.db import environment_error
from bus.storage.errors import BusBusy
from bus.storage.errors import BusError
from bus.storage.errors import NotABusDatabase
from bus.log.wake import ChangeWatcher

log = logging.getLogger("bus.views")

MIN_REFRESH_S = 0.25  # a person sees no difference; a burst costs four reads a second
AGE_REFRESH_S = 2.0  # also the longest one connection serves (see above)
STOP_CHECK_S = 0.25  # the longest the loop waits before it looks whether to stop
RETRY_S = 1.0  # after a failed read, how long before the file is opened and read again

T = TypeVar("T")


class ReadFailed(BusError):
    """A live view could not read the file, for a reason the bus has no name for."""

    def __init__(self, path: str, exc: BaseException) -> None:
        super().__init__(f"reading {path} failed ({type(exc).__name__}: {exc}); see what is"
                         " wrong with the file with `bus check --full`")
        self.path = path


def read_failure(exc: Exception, path: str) -> BusError:
    """The error to show a person whose view could not read `path`: a BusError as it is,
    a failure of the file or the disk by its name, anything else as ReadFailed."""
    if isinstance(exc, BusError):
        return exc
    named = environment_error(exc, path)
    if named is not None:
        return named
    if isinstance(exc, apsw.NotADBError):
        return NotABusDatabase(path, f"not a readable SQLite database ({exc})")
    return ReadFailed(path, exc)


def follow(path: str, read: Callable[[apsw.Connection], T], deliver: Callable[[T], object],
           stop: threading.Event,
           on_error: Callable[[BusError], object] | None = None) -> None:
    """Until `stop` is set: `deliver(read(conn))` now, after commits, and every AGE_REFRESH_S.

    A read that finds the file busy is skipped (the next change or tick
    retries). Any other failure to open or read the file (it became corrupt
    or foreign, or is gone) raises, as `read_failure` names it; with
    `on_error`, that is called with it instead, and the file is opened and
    read again every RETRY_S until that works.
    """
    while not stop.is_set():
        try:
            _follow_one_connection(path, read, deliver, stop)
        except Exception as exc:  # whatever it was, the view must say it, not freeze
            failure = read_failure(exc, path)
            if on_error is None:
                raise failure from exc
            on_error(failure)
            stop.wait(RETRY_S)


def _follow_one_connection(path: str, read: Callable[[apsw.Connection], T],
                           deliver: Callable[[T], object], stop: threading.Event) -> None:
    """Read now and after each commit through one connection, for AGE_REFRESH_S; the
    caller then opens the file afresh and reads again (see above)."""
    conn = connect(path, readonly=True)
    watcher = ChangeWatcher(conn, path, hold_watch=False)
    try:
        reopen_at = time.monotonic() + AGE_REFRESH_S
        while not stop.is_set() and time.monotonic() < reopen_at:
            if watcher.wait(STOP_CHECK_S):  # its first wait returns at once: read now
                _read_and_deliver(conn, read, deliver)
                stop.wait(MIN_REFRESH_S)  # commits meanwhile are seen by the next wait
    finally:
        watcher.close()
        conn.close()


def _read_and_deliver(conn: apsw.Connection, read: Callable[[apsw.Connection], T],
                      deliver: Callable[[T], object]) -> None:
    try:
        found = read(conn)
    except BusBusy as exc:
        log.warning("the bus stayed busy; trying again at the next change: %s", exc)
        return
    deliver(found)
