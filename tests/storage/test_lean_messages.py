"""Migration 8: the message log without AUTOINCREMENT and the unused type index.

A file made by the version 7 schema is converted in place, in one
transaction, with everything in it kept; seq stays strictly increasing
(compaction keeps the newest message; a file whose newest messages were
compacted under version 7 gets a `seq_floor` marker); ids the bus makes are
UUIDv7.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage import schema
from bus.storage.db import connect
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from tests.support.properties import scaled_settings

VERSION_BEFORE = 7
TABLES = ("messages", "cursors", "task_claims", "channels", "participants",
          "channel_messages", "deliveries", "dead_claims", "heartbeats")


def old_migrations(tmp_path: Path) -> Path:
    """The migrations directory as it was at VERSION_BEFORE."""
    old = tmp_path / "migrations-v7"
    old.mkdir()
    for migration in schema.available_migrations()[:VERSION_BEFORE]:
        shutil.copy(migration.path, old / migration.path.name)
    return old


def dump(conn, table: str) -> list[tuple]:
    # Table names come from TABLES above, never from input. Some tables are
    # WITHOUT ROWID: sort in Python.
    return sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)


def make_version_7_file(directory: Path, monkeypatch) -> Path:
    """A file at schema 7 with messages, cursors, claims and a channel in it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "old.db"
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", old_migrations(directory))
    with Bus.open(path) as bus:
        assert bus.conn.execute("PRAGMA user_version").get == VERSION_BEFORE
        for n in range(20):
            bus.publish("planner", "task_assign", {"n": n}, to=f"w{n % 3}",
                        correlation_id=f"c{n}" if n % 2 else None)
        bus.ack("w1", 10)
        # A claim as version 7 wrote it (today's claim code writes the fence of migration 12).
        now = bus.conn.execute("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)").get
        bus.conn.execute("INSERT INTO task_claims (task_id, claimed_by, claimed_at_ms,"
                         " lease_until_ms) VALUES ('t1', 'w1', ?, ?)", (now, now + 60_000))
        bus.heartbeats.beat("w1", "working", task="t1")
        ch = bus.channels
        ch.create_channel("pe", "direct", "planner")
        ch.join_channel("pe", "executor")
        ch.send_message("pe", "planner", "command", "deploy")  # seq 21
        # Version 7's compaction could delete the newest messages: AUTOINCREMENT
        # had handed out seqs 22 and 23 that no row holds any more.
        bus.publish("planner", "note", "x")
        bus.publish("planner", "note", "y")
        bus.conn.execute("DELETE FROM messages WHERE seq > 21")
    monkeypatch.undo()
    return path


def test_lean_migration_converts_a_version_7_file_in_place(tmp_path, monkeypatch):
    path = make_version_7_file(tmp_path, monkeypatch)
    raw = connect(path)
    assert raw.execute("PRAGMA user_version").get == VERSION_BEFORE
    assert raw.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").get == 23
    before = {table: dump(raw, table) for table in TABLES}
    raw.close()

    with Bus.open(path) as bus:
        conn = bus.conn
        assert conn.execute("PRAGMA user_version").get == len(schema.available_migrations())
        after = {table: dump(conn, table) for table in TABLES}
        # Every row kept as it was; the log gains only the floor marker, and a claim
        # the fence migration 12 gives every claim held before it (1, its last column).
        assert {t: rows for t, rows in after.items() if t not in ("messages", "task_claims")} == {
            t: rows for t, rows in before.items() if t not in ("messages", "task_claims")}
        assert after["task_claims"] == [(*row, 1) for row in before["task_claims"]]
        assert [row for row in after["messages"] if row[5] != "seq_floor"] == before["messages"]
        floor = bus.list_messages(after=21)
        assert [(m.seq, m.from_agent, m.to_agent, m.type) for m in floor] == [
            (23, "bus", "bus", "seq_floor")]
        assert uuid.UUID(floor[0].id).version == 4
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA foreign_keys").get == 1  # back on after migrating
        table_sql = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'messages'").get
        assert table_sql.startswith("CREATE TABLE messages (")  # not "messages_v7", not quoted
        assert "AUTOINCREMENT" not in table_sql.upper()
        assert conn.execute("PRAGMA legacy_alter_table").get == 0
        assert bus.publish("planner", "next").seq == 24  # above everything ever handed out
        # The channel tables still cascade from the new table.
        conn.execute("DELETE FROM messages WHERE seq = 21")
        assert conn.execute("SELECT count(*) FROM channel_messages").get == 0
        assert conn.execute("SELECT count(*) FROM deliveries").get == 0


def test_lean_migration_without_a_gap_adds_no_marker(tmp_path, monkeypatch):
    directory = tmp_path / "v7"
    directory.mkdir()
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", old_migrations(directory))
    with Bus.open(directory / "old.db") as bus:
        bus.publish_many([{"from_agent": "a", "type": "t"}] * 3)
    monkeypatch.undo()
    with Bus.open(directory / "old.db") as bus:
        assert [m.type for m in bus.list_messages()] == ["t", "t", "t"]
        assert bus.publish("a", "t").seq == 4


def test_lean_migration_is_one_transaction(tmp_path, monkeypatch):
    """A migration that fails half-way leaves the version 7 file exactly as it was."""
    path = make_version_7_file(tmp_path, monkeypatch)
    broken = tmp_path / "broken"
    broken.mkdir()
    for migration in schema.available_migrations():
        text = migration.sql()
        if migration.version == 8:  # fail after the copy and the DROP
            text = text.replace("DROP TABLE messages_v7;",
                                "DROP TABLE messages_v7;\nSELECT no_such();")
        (broken / migration.path.name).write_text(text)
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", broken)
    with pytest.raises(apsw.SQLError):
        Bus.open(path)
    monkeypatch.undo()
    conn = connect(path)
    assert conn.execute("PRAGMA user_version").get == VERSION_BEFORE
    assert conn.execute("SELECT count(*) FROM messages").get == 21
    assert "AUTOINCREMENT" in conn.execute(
        "SELECT sql FROM sqlite_schema WHERE name = 'messages'").get
    conn.close()


# --- ids ---------------------------------------------------------------------------


def test_new_message_id_is_a_uuid7_with_the_current_millisecond():
    before = now_ms()
    made = [new_message_id() for _ in range(1000)]
    after = now_ms()
    assert len(set(made)) == 1000
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after


def test_new_message_ids_sort_by_time_across_milliseconds():
    first = new_message_id()
    moment = now_ms()
    while now_ms() == moment:
        pass
    assert new_message_id() > first


def test_publish_makes_uuid7_ids_and_still_takes_any_uuid(bus):
    made = bus.publish("a", "t")
    assert uuid.UUID(made.id).version == 7
    given_v4 = str(uuid.uuid4())
    first = bus.publish("a", "t", id=given_v4)
    again = bus.publish("a", "t", id=given_v4.upper())
    assert (again.seq, again.duplicate) == (first.seq, True)
    assert bus.publish("a", "t").seq == first.seq + 1  # the duplicate took no seq


# --- seq over publish, compaction and reopening ----------------------------------------

STEPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 5)),
    st.tuples(st.just("duplicate"), st.integers(0, 50)),
    st.tuples(st.just("compact"), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0)),
), max_size=25)


@scaled_settings(max_examples=30, deadline=None)
@given(steps=STEPS)
def test_seq_never_repeats_or_goes_back(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("seq") / "bus.db"
    bus = Bus.open(path)
    handed_out: list[int] = []
    try:
        for step, n in steps:
            if step == "publish":
                results = bus.publish_many([{"from_agent": "a", "type": "t"}] * n)
                assert not any(r.duplicate for r in results)
                handed_out += [r.seq for r in results]
            elif step == "duplicate" and handed_out:
                # Ids are unique among the rows kept: pick one that compaction left.
                kept = [id_ for (id_,) in bus.conn.execute("SELECT id FROM messages")]
                again = bus.publish("a", "t", id=kept[n % len(kept)])
                assert again.duplicate
            elif step == "compact" and handed_out:
                bus.ack("a", handed_out[-1])
                bus.compact(0, now=now_ms() + 60_000)
            elif step == "reopen":
                bus.close()
                bus = Bus.open(path)
            assert bus.last_seq() == (handed_out[-1] if handed_out else 0)
        assert handed_out == sorted(set(handed_out))  # strictly increasing
    finally:
        bus.close()
