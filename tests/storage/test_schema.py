"""The migration runner: versions, application id, refusing newer files."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from bus import Bus
from bus.storage import migration_files
from bus import migrations as migrations_package
from bus.storage.db import APPLICATION_ID
from bus.storage.db import connect
from bus.storage.errors import SchemaTooNew
from bus.pump import work
from bus.storage.schema import _apply
from bus.storage.schema import available_migrations
from bus.storage.schema import migrate
from bus.storage.schema import schema_status

CORE_TABLES = {"messages", "cursors", "heartbeats", "task_claims", "meta", "export_state",
               "dead_claims", "workers"}


def table_names(conn: apsw.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}


def test_migrations_are_numbered_from_one():
    migrations = available_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert migrations[0].name == "core"


def test_migrations_live_in_one_place_the_bus_migrations_package():
    """In a checkout bus.migrations is the top-level migrations/ folder, and only it.

    (A wheel puts the same package at bus/migrations/: test_architecture's
    wheel test opens a bus from one.)
    """
    root = Path(__file__).resolve().parents[2]
    assert migration_files.MIGRATIONS_DIR == root / "migrations"
    assert Path(migrations_package.__file__).parent.resolve() == root / "migrations"
    assert not (root / "bus" / "migrations").exists()
    names = sorted(path.name for path in (root / "migrations").glob("*.sql"))
    assert [m.path.name for m in available_migrations()] == names


def test_migrate_new_file_creates_core_schema_and_marks_it(db_path):
    conn = connect(db_path)
    applied = migrate(conn)
    assert [m.version for m in applied] == [m.version for m in available_migrations()]
    assert CORE_TABLES <= table_names(conn)
    assert conn.execute("PRAGMA user_version").get == len(available_migrations())
    assert conn.execute("PRAGMA application_id").get == APPLICATION_ID
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").get == str(
        len(available_migrations()))
    assert conn.execute("SELECT last_seq FROM export_state WHERE id = 1").get == 0
    conn.close()


def test_migrate_twice_applies_nothing(db_path):
    conn = connect(db_path)
    migrate(conn)
    assert migrate(conn) == []
    assert schema_status(conn).pending == ()
    conn.close()


def test_core_schema_indexes_exist(bus):
    indexes = {name for (name,) in bus.conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'messages'"
        " AND name NOT LIKE 'sqlite_%'")}
    # Each named with the query that needs it in migrations/0008_lean_messages.sql.
    assert indexes == {"idx_messages_to_seq", "idx_messages_correlation_seq",
                       "idx_messages_payload_ref"}


def test_core_schema_refuses_payload_and_payload_ref_together(bus):
    with pytest.raises(apsw.ConstraintError):
        bus.conn.execute(
            "INSERT INTO messages (id, ts_ms, from_agent, type, payload, payload_ref)"
            " VALUES ('x', 1, 'a', 't', '{}', 'sha256-00')")


def test_open_refuses_newer_schema_naming_both_versions(db_path):
    Bus.open(db_path).close()
    conn = connect(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(SchemaTooNew) as info:
        Bus.open(db_path)
    assert (info.value.found, info.value.supported) == (99, len(available_migrations()))
    assert "schema version 99" in str(info.value)
    assert f"up to version {len(available_migrations())}" in str(info.value)
    assert db_path.read_bytes() == before


def test_failed_migration_leaves_version_unchanged(db_path, tmp_path, monkeypatch):
    broken = tmp_path / "migrations"
    broken.mkdir()
    good = available_migrations()
    for m in good:
        (broken / m.path.name).write_text(m.sql())
    (broken / f"{len(good) + 1:04d}_broken.sql").write_text(
        "CREATE TABLE half_done (x);\nTHIS IS NOT SQL;\n")
    monkeypatch.setattr("bus.storage.schema.MIGRATIONS_DIR", broken)
    conn = connect(db_path)
    with pytest.raises(apsw.SQLError):
        migrate(conn)
    assert conn.execute("PRAGMA user_version").get == len(good)
    assert "half_done" not in table_names(conn)
    conn.close()


def test_migration_10_keeps_the_requests_waiting_in_the_pump_inbox(db_path):
    """The inbox is rebuilt clustered by (organism, seq): what waited still waits, in order."""
    conn = connect(db_path)
    conn.execute("PRAGMA foreign_keys = OFF")
    for migration in available_migrations()[:9]:
        _apply(conn, migration)
    rows = [(7, "org", "add", None, 1), (3, "org", "add", "calc", 2), (5, "other", "x", None, 3)]
    conn.executemany("INSERT INTO pump_inbox (seq, organism, root_tag, to_listener,"
                     " created_at_ms) VALUES (?, ?, ?, ?, ?)", rows)
    assert [m.version for m in migrate(conn)] == [m.version for m in available_migrations()[9:]]
    assert [(i.seq, i.root_tag, i.to) for i in work.take_inbox(conn, "org", 10)] == [
        (3, "add", "calc"), (7, "add", None)]
    assert work.inbox_waiting(conn, "other") and not work.inbox_waiting(conn, "org")
    conn.close()



def test_migration_12_gives_the_claims_held_fence_1_and_the_next_holder_fence_2(db_path):
    """Claims held before fences existed were each granted once: fence 1, remembered
    in task_fences, so a takeover after the upgrade hands out 2, never 1 again."""
    conn = connect(db_path)
    conn.execute("PRAGMA foreign_keys = OFF")
    for migration in available_migrations()[:11]:
        _apply(conn, migration)
    conn.executemany("INSERT INTO task_claims (task_id, claimed_by, claimed_at_ms, lease_until_ms)"
                     " VALUES (?, ?, ?, ?)", [("t1", "a", 1, 2), ("t2", "b", 1, 2)])
    assert 12 in [m.version for m in migrate(conn)]
    assert conn.execute("SELECT task_id, fence FROM task_claims ORDER BY task_id").fetchall() == [
        ("t1", 1), ("t2", 1)]
    assert conn.execute("SELECT task_id, fence FROM task_fences ORDER BY task_id").fetchall() == [
        ("t1", 1), ("t2", 1)]
    conn.close()
    with Bus.open(db_path) as bus:
        taken = bus.claims.try_claim("t1", "c", now=10**12)
        assert taken.granted and taken.fence == 2
        assert bus.claims.try_claim("t3", "c", now=10**12).fence == 1
