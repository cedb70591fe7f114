"""bus.log.checkpoints: WAL checkpoints on a thread of their own, with the writer as backstop.

The database file only grows when a checkpoint copies pages out of the WAL,
so its size tells whether (and by whom) a checkpoint ran.
"""

from __future__ import annotations

import os

import pytest

from bus.log.checkpoints import HERE
from bus.log.checkpoints import LATER
from bus.log.checkpoints import Checkpointer

ROW = "x" * 3000  # most of a page: every commit adds a page to the table


def commit_rows(conn, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (f"row-{i}", ROW))


def wal_frames(bus) -> int:
    """Frames in the WAL now (this also copies what it can: call it last)."""
    _busy, log, _copied = bus.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return log


def test_the_writer_no_longer_checkpoints_below_the_backstop(bus, db_path):
    checkpointer = Checkpointer(bus, threshold=4, backstop=10_000)  # thread not started
    conn = bus.conn
    size = os.path.getsize(db_path)
    checkpointer.attach(conn)
    commit_rows(conn, 1200)  # past SQLite's own 1000-page autocheckpoint
    assert os.path.getsize(db_path) == size


def test_the_thread_copies_the_wal_into_the_file(bus, db_path):
    with Checkpointer(bus, threshold=4, backstop=10_000) as checkpointer:
        conn = bus.conn
        size = os.path.getsize(db_path)
        checkpointer.attach(conn)
        commit_rows(conn, 40)
        assert checkpointer.wait_for_run(1, timeout=10)
        assert os.path.getsize(db_path) > size
    assert sorted(bus.conn.execute("SELECT count(*) FROM meta WHERE key LIKE 'row-%'")) == [(40,)]


def test_past_the_backstop_the_writer_checkpoints_itself(bus, db_path):
    checkpointer = Checkpointer(bus, threshold=2, backstop=8)  # no thread: only the backstop
    conn = bus.conn
    size = os.path.getsize(db_path)
    checkpointer.attach(conn)
    commit_rows(conn, 100)
    assert os.path.getsize(db_path) > size
    assert wal_frames(bus) < 8 + 10  # the log started over instead of holding 100+ pages


def test_stop_gives_the_connection_its_autocheckpoint_back(bus, db_path):
    checkpointer = Checkpointer(bus, threshold=4, backstop=10_000).__enter__()
    conn = bus.conn
    checkpointer.attach(conn)
    checkpointer.stop()
    assert conn.execute("PRAGMA wal_autocheckpoint").get == 1000
    size = os.path.getsize(db_path)
    commit_rows(conn, 1200)  # autocheckpoint runs again, in the writer
    assert os.path.getsize(db_path) > size


@pytest.mark.parametrize("threshold, backstop", [(0, 10), (10, 5), (-1, -1)])
def test_bad_limits_are_refused(bus, threshold, backstop):
    with pytest.raises(ValueError, match="threshold"):
        Checkpointer(bus, threshold=threshold, backstop=backstop)


def test_here_checkpoints_in_the_commit_at_the_threshold(bus, db_path):
    """`where()` HERE: the hook checkpoints in the commit, as autocheckpoint
    would, and the log starts over (no thread needed, none started)."""
    checkpointer = Checkpointer(bus, threshold=4, backstop=10_000, where=lambda: HERE)
    conn = bus.conn
    size = os.path.getsize(db_path)
    checkpointer.attach(conn)
    commit_rows(conn, 100)
    assert os.path.getsize(db_path) > size
    assert wal_frames(bus) < 4 + 10


def test_later_leaves_the_log_to_a_later_commit(bus, db_path):
    checkpointer = Checkpointer(bus, threshold=4, backstop=10_000, where=lambda: LATER)
    conn = bus.conn
    size = os.path.getsize(db_path)
    checkpointer.attach(conn)
    commit_rows(conn, 200)
    assert os.path.getsize(db_path) == size
    checkpointer.where = lambda: HERE
    commit_rows(conn, 1, start=200)
    assert os.path.getsize(db_path) > size
