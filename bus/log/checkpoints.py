"""Checkpoints off the writer's path: a thread of its own copies the WAL into the file.

By default SQLite checkpoints inside the commit that takes the WAL past 1000
pages (`wal_autocheckpoint`): that commit copies the log into the database
file and fsyncs both while its writer waits. A writer that commits all the
time pays for it every hundred commits or so; for the pump at one unit per
transaction that was about a quarter of its throughput (docs/benchmarks.md).
`Checkpointer` moves the work to a thread:

    with Checkpointer(bus) as checkpointer:
        checkpointer.attach(conn)         # the busy writer's connection
        ...                               # commits on conn

The WAL hook installed on `conn` (it replaces the connection's
autocheckpoint) wakes the thread once the log holds `threshold` pages. The
thread runs PASSIVE checkpoints on its own connection, at most one every
`INTERVAL_S`; they block neither writers nor readers.

A passive checkpoint copies what was committed when it started, and the log
only starts over when a writer begins after all of it was copied. A thread
racing a stream of commits rarely gets there, and until the log starts
over, every other connection past its own 1000-page autocheckpoint
checkpoints in its commits (a client's send took three times as long). So
the writer says, per commit, where its checkpoint goes (`where()`):

    THREAD  more commits follow at once: the thread's
    HERE    in the hook, as autocheckpoint would (a quiet moment)
    LATER   not after this commit: another soon is the better moment

and once the log holds `backstop` pages it is HERE whatever `where()` says,
so the WAL stays bounded (as far as readers let any checkpoint go: one that
keeps a read transaction open holds the log for everyone).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable
from typing import Protocol

import apsw

from bus.storage.db import connect
from bus.storage.errors import BusError

log = logging.getLogger("bus.log.checkpoints")
THREAD, HERE, LATER = "thread", "here", "later"
DEFAULT_THRESHOLD_PAGES = 1000  # SQLite's own wal_autocheckpoint
DEFAULT_BACKSTOP_PAGES = 4000  # 16 MB of WAL at 4 KB pages
INTERVAL_S = 0.01
_AUTOCHECKPOINT_PAGES = 1000


class BusFile(Protocol):
    """Where the checkpoint thread opens its own connection (a `Bus` is one)."""

    path: str
    durability: str


class OpenBus(BusFile, Protocol):
    """A bus whose calling thread's connection a Checkpointer attaches (a `Bus` is one)."""

    @property
    def conn(self) -> apsw.Connection: ...


class Checkpointer:
    """A thread that checkpoints the bus for the connections attached to it."""

    def __init__(self, bus: BusFile, threshold: int = DEFAULT_THRESHOLD_PAGES,
                 backstop: int = DEFAULT_BACKSTOP_PAGES,
                 where: Callable[[], str] = lambda: THREAD) -> None:
        if not 0 < threshold <= backstop:
            raise ValueError(f"need 0 < threshold <= backstop, got {threshold}, {backstop}")
        self.bus, self.threshold, self.backstop, self.where = bus, threshold, backstop, where
        self.runs = 0  # checkpoints the thread completed
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._ran = threading.Condition()
        self._attached: list[apsw.Connection] = []
        self._thread = threading.Thread(target=self._run, name="bus-checkpointer", daemon=True)

    def __enter__(self) -> Checkpointer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def attach(self, conn: apsw.Connection) -> None:
        """Checkpoint for `conn` from now on: call it on the thread that owns `conn`."""
        conn.set_wal_hook(self._on_commit)
        self._attached.append(conn)

    def attach_thread_of(self, bus: OpenBus) -> None:
        """`attach` the calling thread's connection to `bus`: call it on the thread that
        writes (a part above the log never holds a connection of its own)."""
        self.attach(bus.conn)

    def stop(self) -> None:
        """End the thread, then give the attached connections their autocheckpoint back.

        Call it on the thread that owns them, when none is running a statement.
        """
        self._stopping.set()
        self._due.set()
        try:
            if self._thread.is_alive():
                self._thread.join()
        finally:
            attached, self._attached = self._attached, []
            for conn in attached:
                try:
                    conn.wal_autocheckpoint(_AUTOCHECKPOINT_PAGES)  # also removes our hook
                except apsw.Error as exc:  # closed: nothing left to checkpoint for
                    log.warning("could not detach the checkpointer: %s", exc)

    def wait_for_run(self, runs: int, timeout: float) -> bool:
        """Block until the thread has run `runs` checkpoints; False after `timeout` s."""
        with self._ran:
            return self._ran.wait_for(lambda: self.runs >= runs, timeout)

    def _on_commit(self, conn: apsw.Connection, name: str, pages: int) -> int:
        # Runs inside each commit on an attached connection, after the commit
        # is durable: an exception here would fail a statement that succeeded.
        if pages < self.threshold:
            return apsw.SQLITE_OK
        try:
            where = HERE if pages >= self.backstop else self.where()
            if where == HERE:
                conn.wal_checkpoint(name, apsw.SQLITE_CHECKPOINT_PASSIVE)
            elif where == THREAD:
                self._due.set()
        except apsw.BusyError:  # the thread is checkpointing: the next commit tries again
            pass
        except Exception as exc:  # noqa: BLE001 - the commit stands; say why nothing ran
            log.warning("checkpoint after a commit failed: %s", exc)
        return apsw.SQLITE_OK

    def _run(self) -> None:
        try:
            conn = connect(self.bus.path, self.bus.durability, create=False)
        except BusError as exc:  # the writers' autocheckpoint is gone: the backstop holds
            log.warning("the checkpoint thread cannot open the bus: %s", exc)
            return
        try:
            while True:
                self._due.wait()
                self._due.clear()  # before the check: a stop() from now on is seen
                if self._stopping.is_set():
                    return
                self._checkpoint(conn)
                if self._stopping.wait(INTERVAL_S):
                    return
        finally:
            conn.close()

    def _checkpoint(self, conn: apsw.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except apsw.Error as exc:  # busy, or the file went away: the backstop still holds
            log.warning("background checkpoint failed: %s", exc)
            return
        with self._ran:
            self.runs += 1
            self._ran.notify_all()
