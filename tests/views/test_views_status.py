"""The status snapshot (bus/views/status.py): every section from a real file, read-only."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.log import receipts
from bus.storage.db import connect
from bus.storage.errors import BusNotFound
from bus.storage.errors import SchemaOutdated
from bus.storage.schema import _apply as apply_migration
from bus.storage.schema import available_migrations
from bus.coordination.heartbeats import Thresholds
from bus.coordination.heartbeats import beat
from bus.views.render import status_lines
from bus.views.status import EXPORTER
from bus.views.status import read_status
from tests.support.cli_helpers import run
from tests.conftest import LATEST_VERSION

NOW = 1_800_000_000_000


def test_status_of_an_empty_bus(bus: Bus, db_path: Path) -> None:
    found = read_status(db_path, now=NOW)
    assert (found.log.messages, found.log.last_seq, found.log.oldest_seq) == (0, 0, None)
    assert found.consumers == [] and found.agents == [] and found.channels == []
    assert found.file.schema_version == LATEST_VERSION
    assert found.file.size_bytes == db_path.stat().st_size
    assert found.agents_by_state == {"alive": 0, "warn": 0, "stale": 0, "dead": 0,
                                     "stopped": 0}
    assert (found.export.last_seq, found.export.path) == (0, None)
    assert found.to_json_dict()["pump"] == {"organisms": [], "queued": 0, "in_flight": 0,
                                             "dead": 0}


def test_status_consumers_pending_lag_and_the_exporter(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t", to="w1")   # 1
    bus.publish("p", "t", to="w2")   # 2
    bus.publish("p", "t")            # 3 broadcast
    bus.ack("w1", 1)
    bus.export_jsonl()
    bus.publish("p", "t", to="w1")   # 4
    found = read_status(db_path)
    rows = [(c.agent, c.kind, c.cursor, c.pending, c.lag) for c in found.consumers]
    assert rows == [("w1", "agent", 1, 2, 3), (EXPORTER, "exporter", 3, 1, 1)]
    assert found.consumer("w1").last_ack_ms == bus.list_cursors()[0].updated_at_ms
    assert found.consumer("nobody") is None
    assert (found.log.messages, found.log.last_seq, found.log.oldest_seq) == (4, 4, 1)
    assert (found.export.last_seq, found.export.lag) == (3, 1)
    assert found.export.path == str(db_path.parent / "bus.jsonl")


def test_status_agents_by_liveness(bus: Bus, db_path: Path) -> None:
    for agent, silent_s in (("fresh", 1), ("quiet", 40), ("gone", 400)):
        beat(bus.conn, agent, "working", "t1", None, now=NOW - silent_s * 1000)
    # `worker done`, `fail` and `cancel` leave a stopped beat: stopped however silent.
    beat(bus.conn, "finished", "stopped", "t2", None, now=NOW - 4_000_000)
    found = read_status(db_path, now=NOW, thresholds=Thresholds())
    assert [(a.agent, a.state) for a in found.agents] == [
        ("gone", "dead"), ("quiet", "warn"), ("fresh", "alive"), ("finished", "stopped")]
    assert found.agents_by_state == {"alive": 1, "warn": 1, "stale": 0, "dead": 1,
                                     "stopped": 1}


def test_status_claims_held_expiring_expired_taken_over_dead(bus: Bus, db_path: Path) -> None:
    assert bus.claims.claim("long", "a", 60_000, now=NOW)
    assert bus.claims.claim("short", "a", 5_000, now=NOW)
    assert bus.claims.claim("lapsed", "a", 1_000, now=NOW - 2_000)
    assert bus.claims.claim("retried", "a", 1_000, now=NOW - 10_000)
    assert bus.claims.claim("retried", "b", 60_000, now=NOW - 5_000)  # takes over the expired lease
    assert bus.claims.claim("doomed", "a", 1_000, max_attempts=1, now=NOW - 10_000)
    assert not bus.claims.claim("doomed", "b", 1_000, max_attempts=1, now=NOW - 5_000)  # dies
    c = read_status(db_path, now=NOW).claims
    assert (c.held, c.expiring_soon, c.expired, c.taken_over, c.dead) == (3, 1, 1, 1, 1)
    assert sorted(claim.task_id for claim in c.claims) == ["lapsed", "long", "retried", "short"]
    assert {claim.task_id: claim.fence for claim in c.claims} == {
        "lapsed": 1, "long": 1, "retried": 2, "short": 1}  # b took retried over: fence 2
    screen = status_lines(read_status(db_path, now=NOW))
    table = next(i for i, line in enumerate(screen) if line.startswith("claims: "))
    assert screen[table + 1].split() == ["task", "holder", "fence", "lease", "left", "attempt"]
    assert screen[table + 4].split()[:3] == ["retried", "b", "2"]


def test_status_workers_channels_and_pump(bus: Bus, db_path: Path) -> None:
    for worker, state in (("w1", "WORKING"), ("w2", "WORKING"), ("w3", "FAILED")):
        bus.conn.execute(
            "INSERT INTO workers (worker_id, task_id, state, repo, base, branch, worktree,"
            " created_at_ms, updated_at_ms) VALUES (?, 't', ?, '/r', 'main', 'b', '/w', 1, 1)",
            (worker, state))
    bus.channels.create_channel("jobs", "group", "boss")
    bus.channels.join_channel("jobs", "w1")
    bus.channels.join_channel("jobs", "w2")
    bus.channels.send_message("jobs", "boss", "command", "resize")
    bus.channels.receive_messages("w1")  # handed out: awaiting its ack
    units = (("pending", 0), ("pending", NOW + 60_000), ("dead", 0), ("done", 0))
    for input_seq, (status, lease) in enumerate(units):
        bus.conn.execute(
            "INSERT INTO pump_work (organism, input_seq, listener, kind, thread, status,"
            " max_attempts, lease_until_ms, created_at_ms) VALUES ('org', ?, 'l', 'call', 'x',"
            " ?, 3, ?, 1)", (input_seq, status, lease))
    bus.conn.execute("INSERT INTO pump_organisms VALUES ('org', 1, 'boot')")
    found = read_status(db_path, now=NOW)
    assert found.workers == {"FAILED": 1, "WORKING": 2}
    assert [(w.worker, w.state) for w in found.worker_list] == [
        ("w1", "WORKING"), ("w2", "WORKING"), ("w3", "FAILED")]
    screen = status_lines(found)
    table = screen.index("workers: 1 FAILED, 2 WORKING")
    assert screen[table + 1].split() == ["worker", "task", "state", "branch", "changed"]
    assert screen[table + 4].split()[:4] == ["w3", "t", "FAILED", "b"]
    [jobs] = found.channels
    assert (jobs.name, jobs.type, jobs.state, jobs.open_deliveries, jobs.awaiting_ack,
            jobs.dead_letters) == ("jobs", "group", "active", 2, 1, 0)
    assert (found.pump.organisms, found.pump.queued, found.pump.in_flight,
            found.pump.dead) == (["org"], 1, 1, 1)


def test_status_receipts_not_delivered_and_not_acked_oldest_first(bus: Bus,
                                                                  db_path: Path) -> None:
    first = bus.publish("ann", "question", to="bob").seq
    bus.publish("ann", "note", to="bobb")  # a typo: never delivered
    for _ in range(6):
        bus.publish("bob", "answer", to="ann")
    receipts.record_delivered(bus.conn, "bob", [first], "hook:Stop", "s1", now=NOW - 60_000)
    receipts.record_delivered(bus.conn, "bob", [first], "hook:Stop", "s1", now=NOW - 4_000)
    found = read_status(db_path, now=NOW)
    assert (found.receipts.not_delivered, found.receipts.delivered_not_acked) == (7, 1)
    assert [(r.seq, r.to_agent, r.state) for r in found.receipts.oldest] == [
        (1, "bob", "delivered"), (2, "bobb", "sent"), (3, "ann", "sent"), (4, "ann", "sent"),
        (5, "ann", "sent")]
    assert found.to_json_dict()["receipts"]["oldest"][0]["delivery"] == {
        "first_ms": NOW - 60_000, "last_ms": NOW - 4_000, "deliveries": 2, "via": "hook:Stop",
        "session": "s1"}
    screen = status_lines(found)
    at = screen.index("receipts: 7 direct messages not delivered, 1 delivered and not acked"
                      " (the oldest 5)")
    assert screen[at + 1].split() == ["seq", "from", "to", "type", "sent", "state", "delivered"]
    assert screen[at + 2].split()[:3] + screen[at + 2].split()[-7:] == [
        "#1", "ann", "bob", "delivered", "hook:Stop", "2x,", "last", "4.0", "s", "ago"]
    assert screen[at + 3].split()[-2:] == ["sent", "-"]
    bus.ack("bob", first)
    bus.ack("bobb", 2)
    bus.ack("ann", 8)
    assert "receipts: every direct message acked" in status_lines(read_status(db_path))


def test_status_never_writes_the_file(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t")
    bus.ack("w", 1)
    version = bus.conn.execute("PRAGMA data_version").get
    files = {p: p.read_bytes() for p in db_path.parent.iterdir() if p.is_file()}
    for _ in range(3):
        read_status(db_path)
    assert bus.conn.execute("PRAGMA data_version").get == version
    assert {p: p.read_bytes() for p in db_path.parent.iterdir() if p.is_file()} == files


def test_status_refuses_a_missing_file_and_an_old_schema(tmp_path: Path) -> None:
    with pytest.raises(BusNotFound):
        read_status(tmp_path / "none.db")
    old = tmp_path / "old.db"
    Bus.open(old).close()
    # Behind by a migration that changes what readers see: the views refuse to guess.
    changes_readers = max(m.version for m in available_migrations() if not m.readers_unchanged())
    conn = connect(old)
    conn.execute(f"PRAGMA user_version = {changes_readers - 1}")
    conn.close()
    with pytest.raises(SchemaOutdated, match="bus migrate"):
        read_status(old)


def bus_before_migration_11(path: Path) -> None:
    """A bus file an earlier release made (schema 10), with one message to w1 and its cursor."""
    conn = connect(path)
    conn.execute("PRAGMA foreign_keys = OFF")  # as the runner applies them
    for migration in available_migrations()[:10]:
        apply_migration(conn, migration)
    conn.execute("INSERT INTO messages (id, ts_ms, from_agent, to_agent, type)"
                 " VALUES (?, ?, 'p', 'w1', 't')",
                 ("0190a000-0000-7000-8000-000000000001", NOW - 5000))
    conn.execute("INSERT INTO cursors (agent_id, last_acked_seq, updated_at_ms) VALUES"
                 " ('w1', 0, ?)", (NOW - 5000,))
    conn.close()


def test_status_reads_a_file_behind_by_migrations_readers_do_not_see(tmp_path: Path) -> None:
    """Migration 11 changes only how dead-letter ids are handed out: `bus status` on a
    schema-10 file (a demo of the last release) reads it as it is, writes nothing, and
    says what `bus migrate` would bring."""
    assert [m.readers_unchanged() for m in available_migrations()[9:11]] == [False, True]
    old = tmp_path / "old.db"
    bus_before_migration_11(old)
    before = old.read_bytes()
    found = read_status(old, now=NOW)
    assert (found.file.schema_version, found.file.schema_latest) == (10, LATEST_VERSION)
    assert (found.log.messages, [(c.agent, c.pending) for c in found.consumers]) == (
        1, [("w1", 1)])
    # No receipts table yet: its direct message reads as sent, never delivered.
    assert [(r.seq, r.state) for r in found.receipts.oldest] == [(1, "sent")]
    assert status_lines(found)[0].startswith(
        f"bus {old}  schema 10 ({LATEST_VERSION} after bus migrate)  durability normal")
    for command in (["status"], ["status", "--json"], ["consumers"], ["consumer", "info", "w1"]):
        assert run(command, old).exit_code == 0, command
    assert old.read_bytes() == before


@given(st.lists(st.one_of(st.tuples(st.just("publish"), st.sampled_from(["a", "b", None])),
                          st.tuples(st.just("ack"), st.sampled_from(["a", "b"]))),
                max_size=25))
def test_status_pending_matches_a_model(tmp_path_factory, steps) -> None:
    """pending = messages to the agent or broadcast above its cursor; lag = last seq - cursor."""
    path = tmp_path_factory.mktemp("model") / "bus.db"
    with Bus.open(path) as bus:
        sent: list[str | None] = []
        acked: dict[str, int] = {}
        for action, agent in steps:
            if action == "publish":
                bus.publish("p", "t", to=agent)
                sent.append(agent)
            elif sent:
                acked[agent] = bus.ack(agent, len(sent))
        found = read_status(path)
    for agent, cursor in acked.items():
        waiting = sum(1 for to in sent[cursor:] if to in (agent, None))
        c = found.consumer(agent)
        assert (c.cursor, c.pending, c.lag) == (cursor, waiting, len(sent) - cursor)
    assert sorted(c.agent for c in found.consumers) == sorted(acked)
