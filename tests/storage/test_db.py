"""Connections: pragmas read back, file identity checks, filesystem checks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import apsw
import pytest

from bus import Bus
from tests.conftest import LATEST_VERSION
from bus.storage.db import APPLICATION_ID
from bus.storage.db import check_local_filesystem
from bus.storage.db import connect
from bus.storage.db import filesystem_type
from bus.storage.db import wait_when_busy
from bus.storage.db import write_transaction
from bus.storage.errors import BusBusy
from bus.storage.errors import BusNotFound
from bus.storage.errors import NotABusDatabase
from bus.storage.errors import UnsupportedFilesystem
from bus.storage.errors import ValidationFailed


def pragma(conn: apsw.Connection, name: str):
    return conn.execute(f"PRAGMA {name}").get


def test_connect_sets_wal_foreign_keys_and_normal_sync(db_path):
    conn = connect(db_path)
    assert pragma(conn, "journal_mode") == "wal"
    assert pragma(conn, "foreign_keys") == 1
    assert pragma(conn, "synchronous") == 1  # NORMAL
    assert conn.transaction_mode == "IMMEDIATE"
    conn.close()


def test_connect_full_durability_sets_synchronous_full(db_path):
    conn = connect(db_path, "full")
    assert pragma(conn, "synchronous") == 2  # FULL
    conn.close()


def test_connect_rejects_unknown_durability(db_path):
    with pytest.raises(ValidationFailed) as info:
        connect(db_path, "paranoid")
    assert info.value.field == "durability"
    assert "normal, full" in str(info.value)
    assert not db_path.exists()


def test_connect_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "a" / "b" / "bus.db"
    connect(path).close()
    assert path.exists()


def test_connect_without_create_refuses_missing_file(db_path):
    with pytest.raises(BusNotFound):
        connect(db_path, create=False)
    with pytest.raises(BusNotFound):
        connect(db_path, readonly=True)
    assert not db_path.exists()


def test_connect_refuses_non_sqlite_file_untouched(db_path):
    db_path.write_bytes(b"hello, I am a text file\n" * 10)
    before = db_path.read_bytes()
    with pytest.raises(NotABusDatabase) as info:
        Bus.open(db_path)
    assert "not a SQLite database" in str(info.value)
    assert db_path.read_bytes() == before
    assert not Path(str(db_path) + "-wal").exists()


def test_connect_refuses_directory(tmp_path):
    with pytest.raises(NotABusDatabase, match="directory"):
        Bus.open(tmp_path)


def foreign_database(path: Path, application_id: int = 0) -> bytes:
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    if application_id:
        conn.execute(f"PRAGMA application_id = {application_id}")
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("application_id", [0, 0x12345678])
def test_connect_refuses_foreign_sqlite_database_untouched(db_path, application_id):
    before = foreign_database(db_path, application_id)
    with pytest.raises(NotABusDatabase) as info:
        Bus.open(db_path)
    assert "left untouched" in str(info.value)
    assert db_path.read_bytes() == before
    conn = apsw.Connection(str(db_path))
    assert pragma(conn, "journal_mode") == "delete"
    conn.close()


def test_connect_accepts_empty_file_as_new_bus(db_path):
    db_path.touch()
    with Bus.open(db_path) as bus:
        assert bus.schema_version() == LATEST_VERSION
    conn = connect(db_path)
    assert pragma(conn, "application_id") == APPLICATION_ID
    conn.close()


def test_write_transaction_rolls_back_on_error(bus):
    conn = bus.conn
    with pytest.raises(RuntimeError):
        with write_transaction(conn):
            conn.execute("INSERT INTO meta (key, value) VALUES ('k', 'v')")
            raise RuntimeError("boom")
    assert conn.execute("SELECT count(*) FROM meta WHERE key = 'k'").get == 0


def test_a_writer_waits_for_the_lock_in_growing_sleeps_then_gives_up(db_path, bus):
    """connect() waits with wait_when_busy: 5 ms, then twice as long each time
    up to 100 ms, until its timeout; then the statement fails as busy."""
    holder = connect(db_path)
    holder.execute("BEGIN IMMEDIATE")
    other = connect(db_path)
    sleeps = []
    wait = wait_when_busy(timeout_ms=300)

    def recorded(attempts: int) -> bool:
        began = time.monotonic()
        keep_waiting = wait(attempts)
        sleeps.append((attempts, keep_waiting, time.monotonic() - began))
        return keep_waiting
    other.set_busy_handler(recorded)
    try:
        with pytest.raises(apsw.BusyError):
            other.execute("BEGIN IMMEDIATE")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [attempts for attempts, _, _ in sleeps] == list(range(len(sleeps)))
    assert [keep for _, keep, _ in sleeps] == [True] * (len(sleeps) - 1) + [False]
    slept = [seconds for _, keep, seconds in sleeps if keep]
    assert slept[0] >= 0.005 and slept[1] >= 0.010 and slept[2] >= 0.020
    assert sum(slept) >= 0.3 - 0.001  # it gave up only once the timeout was spent
    with write_transaction(other):  # the lock is free again: no wait at all
        other.execute("INSERT INTO meta (key, value) VALUES ('after', '1')")
    other.close()


def test_write_transaction_turns_a_held_lock_into_bus_busy(db_path, bus):
    holder = connect(db_path)
    holder.execute("BEGIN IMMEDIATE")
    other = connect(db_path)
    other.set_busy_timeout(50)  # keep the test short; the default is 5000 ms
    try:
        with pytest.raises(BusBusy, match="retry later"):
            with write_transaction(other):
                pass
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        other.close()


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,relatime 0 0
/dev/sdb1 /mnt/shared/local ext4 rw 0 0
//host/share /mnt/my\\040share cifs rw 0 0
"""


@pytest.mark.parametrize("path, expected", [
    ("/home/u/bus.db", "ext4"),
    ("/mnt/shared/bus.db", "nfs4"),
    ("/mnt/shared/team/bus.db", "nfs4"),
    ("/mnt/shared/local/bus.db", "ext4"),
    ("/mnt/sharedx/bus.db", "ext4"),
    ("/mnt/my share/bus.db", "cifs"),
])
def test_filesystem_type_picks_longest_mount_prefix(path, expected):
    assert filesystem_type(Path(path), MOUNTS) == expected


def test_check_local_filesystem_refuses_network_mounts():
    with pytest.raises(UnsupportedFilesystem) as info:
        check_local_filesystem(Path("/mnt/shared/bus.db"), MOUNTS)
    assert info.value.fstype == "nfs4"
    assert "local disk" in str(info.value)
    check_local_filesystem(Path("/home/u/bus.db"), MOUNTS)


def test_write_transaction_nested_is_a_savepoint(bus):
    conn = bus.conn
    with write_transaction(conn):
        conn.execute("INSERT INTO meta (key, value) VALUES ('outer', '1')")
        with pytest.raises(RuntimeError):
            with write_transaction(conn):
                conn.execute("INSERT INTO meta (key, value) VALUES ('inner', '1')")
                raise RuntimeError("inner fails")
        with write_transaction(conn):
            conn.execute("INSERT INTO meta (key, value) VALUES ('inner2', '1')")
    keys = {k for (k,) in conn.execute("SELECT key FROM meta")}
    assert {"outer", "inner2"} <= keys and "inner" not in keys
    assert not conn.in_transaction


def test_write_transaction_waiting_for_the_lock_lets_other_threads_run(db_path, bus):
    """A writer blocked on the lock must not stall the thread that holds it."""
    holder = connect(db_path)
    waiter = connect(db_path)
    waiter.set_busy_timeout(3000)
    holding, waiting = threading.Event(), threading.Event()
    outcome = {}

    def wait_for_lock():
        waiting.set()
        try:
            with write_transaction(waiter):
                waiter.execute("INSERT INTO meta (key, value) VALUES ('waiter', '1')")
            outcome["waiter"] = "committed"
        except BusBusy:
            outcome["waiter"] = "busy"

    with write_transaction(holder):
        holder.execute("INSERT INTO meta (key, value) VALUES ('holder', '1')")
        thread = threading.Thread(target=wait_for_lock)
        thread.start()
        waiting.wait()
        time.sleep(0.2)  # let the waiter reach BEGIN; a shorter wait only weakens the test
        started = time.monotonic()
    # Committing needed this thread to run while the waiter waited.
    thread.join()
    assert outcome["waiter"] == "committed"
    assert time.monotonic() - started < 2.5
    holder.close()
    waiter.close()


# --- no stray descriptor on the database file ---------------------------------------------------


def own_locks(path: Path) -> list[str]:
    """This process's POSIX locks on `path`'s inode, as /proc/locks lists them (kind and range)."""
    inode = path.stat().st_ino
    mine = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[4] == str(os.getpid()) and fields[5].endswith(f":{inode}"):
            mine.append(" ".join(fields[1:4] + fields[6:8]))
    return sorted(mine)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
def test_a_second_open_keeps_the_first_connections_locks(db_path):
    with Bus.open(db_path) as first:
        first.publish("a", "hello")
        first.conn.execute("BEGIN")
        first.conn.execute("SELECT count(*) FROM messages").fetchall()
        held = own_locks(db_path)
        assert held, "a read transaction holds a lock on the database file"
        Bus.open(db_path).close()
        connect(db_path, readonly=True).close()
        assert own_locks(db_path) == held
        first.conn.execute("COMMIT")


CLOSING_WRITER = """
import sys
from bus import Bus
for i in range(int(sys.argv[2])):
    with Bus.open(sys.argv[1]) as bus:  # each close may be the last one: it checkpoints the WAL
        bus.publish("closer", "tick", {"i": i})
"""


def test_commits_survive_other_opens_and_closes_beside_a_long_lived_writer(db_path):
    """One process writes on one connection while it also opens and closes others, and another
    process opens, writes and closes over and over. Had an open dropped the writer's locks,
    another process's close would take itself for the last one and remove the WAL the writer
    still commits into: those commits would be lost."""
    closer_writes = 100
    with Bus.open(db_path) as writer:
        writer.publish("writer", "work", {"i": -1})  # its lock on the file is taken
        closer = subprocess.Popen([sys.executable, "-c", CLOSING_WRITER, str(db_path),
                                   str(closer_writes)], stderr=subprocess.PIPE)
        stop = threading.Event()

        def open_and_close() -> None:
            while not stop.is_set():
                Bus.open(db_path).close()

        opener = threading.Thread(target=open_and_close)
        opener.start()
        ids = set()
        try:
            while closer.poll() is None:  # write for as long as the other process comes and goes
                ids.add(writer.publish("writer", "work", {"i": len(ids)}).id)
        finally:
            stop.set()
            opener.join()
        assert closer.wait(timeout=120) == 0, closer.stderr.read().decode()
        assert len(ids) > 100, "the writer wrote while the other process came and went"
    with Bus.open(db_path) as after:
        rows = after.conn.execute("SELECT id, from_agent FROM messages").fetchall()
        assert after.conn.execute("PRAGMA integrity_check").get == "ok"
    assert ids <= {row_id for row_id, sender in rows if sender == "writer"}
    assert sum(sender == "closer" for _, sender in rows) == closer_writes


_HOLD_EXCLUSIVE = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS held(x); COMMIT")
print("held", flush=True)
sys.stdin.readline()
conn.close()
"""


def test_connect_read_only_waits_for_a_lock_at_its_first_read(db_path, python_env):
    # A reader's first read (the probe that tells a readable file) meets "busy" when another
    # connection holds the file, as the first readers of a new -shm do while one builds it:
    # it must wait its turn through the busy handler, not fail at once.
    Bus.open(db_path, create=True).close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_EXCLUSIVE, str(db_path)],
                              env=python_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        outcome: list[object] = []

        def read() -> None:
            try:
                conn = connect(db_path, readonly=True)
                outcome.append(conn.execute("SELECT count(*) FROM messages").get)
                conn.close()
            except Exception as exc:  # noqa: BLE001 - the test reports what the reader met
                outcome.append(exc)

        reader = threading.Thread(target=read)
        started = time.monotonic()
        reader.start()
        # Release once the reader has been blocked a while (or has already given up).
        deadline = time.monotonic() + 60
        while reader.is_alive() and time.monotonic() - started < 0.3:
            assert time.monotonic() < deadline
            reader.join(0.01)
        holder.stdin.write("release\n")
        holder.stdin.flush()
        reader.join(30)
        assert outcome == [0], outcome
    finally:
        holder.kill()
        holder.wait(timeout=30)


# --- the doors: bus.read() and bus.write() ------------------------------------------------


def test_read_door_is_one_snapshot_until_it_ends(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "t", 1)
    with Bus.open(db_path) as other:
        with bus.read() as conn:
            assert conn.execute("SELECT count(*) FROM messages").get == 1
            other.publish("a", "t", 2)  # commits while the read is open
            assert conn.execute("SELECT count(*) FROM messages").get == 1
        assert not bus.conn.in_transaction
        with bus.read() as conn:
            assert conn.execute("SELECT count(*) FROM messages").get == 2


def test_read_door_inside_a_write_joins_it(bus: Bus) -> None:
    with bus.write() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('door', 'open')")
        with bus.read() as inner:
            assert inner is conn
            assert inner.execute("SELECT value FROM meta WHERE key = 'door'").get == "open"
        assert conn.in_transaction  # the read ended nothing
    with bus.read() as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'door'").get == "open"


def test_write_door_rolls_back_and_nests_as_a_savepoint(bus: Bus) -> None:
    with pytest.raises(ZeroDivisionError):
        with bus.write() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('lost', 'x')")
            1 / 0
    with bus.write() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('kept', 'x')")
        with pytest.raises(ZeroDivisionError):
            with bus.write() as inner:  # a savepoint: only its own rows go
                inner.execute("INSERT INTO meta (key, value) VALUES ('inner', 'x')")
                1 / 0
    with bus.read() as conn:
        keys = {key for (key,) in conn.execute("SELECT key FROM meta")}
    assert "kept" in keys and not {"lost", "inner"} & keys
