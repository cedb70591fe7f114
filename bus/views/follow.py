"""The refresh loop of the live views: read after each commit, hand the result over.

`bus top` and `bus serve` each run this in one thread with one read-only
connection. The bus's `ChangeWatcher` (inotify on the WAL) wakes it when
anything commits; a burst of commits is read at most every MIN_REFRESH_S (a quarter second),
so a busy writer pays for a few reads a second, not one per commit; with no
commit it still reads every AGE_REFRESH_S, so ages and rates move.

The watcher holds its inotify watch only while it waits (`hold_watch=False`):
a watch held through the reads and pauses made the kernel build an event for
every write to the WAL, in the writers' time: with two views watching, a
publisher spent 39% more CPU per publish (docs/benchmarks.md). A commit that slips past
the watch's return is seen at the watcher's 50 ms look: nothing a person sees.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable
from typing import TypeVar

import apsw

from bus.db import connect
from bus.errors import BusBusy
from bus.wake import ChangeWatcher

log = logging.getLogger("bus.views")

MIN_REFRESH_S = 0.25  # a person sees no difference; a burst costs four reads a second
AGE_REFRESH_S = 2.0
STOP_CHECK_S = 0.25  # the longest the loop waits before it looks whether to stop

T = TypeVar("T")


def follow(path: str, read: Callable[[apsw.Connection], T], deliver: Callable[[T], object],
           stop: threading.Event) -> None:
    """Until `stop` is set: `deliver(read(conn))` now, after commits, and every AGE_REFRESH_S.

    A read that finds the file busy is skipped (the next change or tick
    retries); any other error ends the loop and propagates.
    """
    conn = connect(path, readonly=True)
    watcher = ChangeWatcher(conn, path, hold_watch=False)
    try:
        due = 0.0
        while not stop.is_set():
            if watcher.wait(STOP_CHECK_S) or time.monotonic() >= due:
                _read_and_deliver(conn, read, deliver)
                due = time.monotonic() + AGE_REFRESH_S
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
