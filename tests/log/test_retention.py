"""Retention (bus/log/retention.py, Bus.compact): what goes, what stays, and the WAL.

A message may be deleted only when it is older than the cutoff AND at or
below the lowest cursor (the exporter's position counting as one more cursor
once it is > 0). Times are controlled with compact's `now` argument and SQL
updates of ts_ms; old blobs are made with os.utime. Nothing sleeps.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus import ValidationFailed
from bus.log import retention
from bus.storage.db import JOURNAL_SIZE_LIMIT
from bus.storage.db import connect
from bus.log.messages import now_ms
from bus.log.retention import CompactReport
from tests.support.properties import scaled_settings

DAY_MS = 86_400_000
HOUR = 3600.0
_counter = itertools.count()


def later() -> int:
    """A `now` one minute ahead: with keep_days=0 every existing message is old."""
    return now_ms() + 60_000


def seqs(bus: Bus) -> list[int]:
    return [seq for (seq,) in bus.conn.execute("SELECT seq FROM messages ORDER BY seq")]


def publish_n(bus: Bus, count: int, to: str | None = None, start: int = 0) -> list[int]:
    results = bus.publish_many([{"from_agent": "p", "type": "t", "payload": {"n": n}, "to": to}
                                for n in range(start, start + count)])
    return [r.seq for r in results]


def age(bus: Bus, seq_from: int, seq_to: int, days: float) -> None:
    bus.conn.execute("UPDATE messages SET ts_ms = ts_ms - ? WHERE seq BETWEEN ? AND ?",
                     (int(days * DAY_MS), seq_from, seq_to))


def set_export(bus: Bus, last_seq: int) -> None:
    bus.conn.execute("UPDATE export_state SET last_seq = ? WHERE id = 1", (last_seq,))


def make_old(path: Path, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(path, (when, when))


def wal_size(db_path: Path) -> int:
    wal = Path(str(db_path) + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def table_dump(bus: Bus) -> dict[str, list[tuple]]:
    return {table: bus.conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("messages", "cursors", "export_state", "heartbeats", "task_claims")}


# --- what is deleted ------------------------------------------------------------------


def test_compact_deletes_only_messages_acked_by_every_cursor(bus: Bus) -> None:
    publish_n(bus, 10)
    bus.ack("fast", 8)
    bus.ack("slow", 3)
    report = bus.compact(0, now=later())
    assert (report.messages, report.acked_through) == (3, 3)
    assert seqs(bus) == list(range(4, 11))
    assert [m.seq for m in bus.poll("slow")] == list(range(4, 11))
    assert [m.seq for m in bus.poll("fast")] == [9, 10]
    # The slow consumer catches up: now the fast one holds things back.
    bus.ack("slow", 10)
    report = bus.compact(0, now=later())
    assert (report.messages, report.acked_through) == (5, 8)
    assert seqs(bus) == [9, 10]


def test_compact_lowest_cursor_protects_messages_addressed_to_others(bus: Bus) -> None:
    """The rule is global: a lagging cursor holds back every message above it,
    even those addressed to agents that have acked them (conservative)."""
    publish_n(bus, 5, to="w1")
    bus.ack("w1", 5)
    bus.ack("w2", 1)  # w2 never sees w1's messages, but its cursor counts
    assert bus.compact(0, now=later()).messages == 1
    assert seqs(bus) == [2, 3, 4, 5]


def test_compact_with_no_cursors_deletes_nothing(bus: Bus) -> None:
    publish_n(bus, 5)
    age(bus, 1, 5, 365)
    for dry_run in (True, False):
        report = bus.compact(0, now=later(), dry_run=dry_run)
        assert (report.messages, report.acked_through) == (0, 0)
    assert seqs(bus) == [1, 2, 3, 4, 5]


def test_compact_agent_without_cursor_does_not_hold_back(bus: Bus) -> None:
    """Documents the semantics: only agents that have acked at least once have a
    cursor. A consumer that never acked is unknown to the bus, so messages
    for it go once every known cursor has passed them."""
    publish_n(bus, 3, to="newcomer")
    publish_n(bus, 1)
    bus.ack("veteran", 4)
    assert bus.compact(0, now=later()).messages == 3  # all but the newest, which always stays
    assert [m.seq for m in bus.poll("newcomer")] == [4]  # the broadcast; its own three are gone


def test_compact_keeps_messages_younger_than_keep_days(bus: Bus) -> None:
    publish_n(bus, 10)
    bus.ack("a", 10)
    age(bus, 1, 4, 8)   # eight days old
    age(bus, 5, 5, 6)   # six days old
    before = now_ms()
    report = bus.compact(7)
    after = now_ms()
    assert (report.messages, report.acked_through) == (4, 9)  # 10 is the newest: it stays
    assert before - 7 * DAY_MS <= report.cutoff_ms <= after - 7 * DAY_MS
    assert seqs(bus) == list(range(5, 11))


def test_compact_cutoff_is_strict_and_cursor_inclusive(bus: Bus) -> None:
    publish_n(bus, 4)
    bus.ack("a", 3)
    now = later()
    cutoff = now - DAY_MS
    for seq, ts in [(1, cutoff - 1), (2, cutoff), (3, cutoff - 1), (4, cutoff - 1)]:
        bus.conn.execute("UPDATE messages SET ts_ms = ? WHERE seq = ?", (ts, seq))
    report = bus.compact(1, now=now)
    assert report.cutoff_ms == cutoff
    # 1: old and acked; 2: exactly at the cutoff (not older); 3: the cursor itself
    # (acked); 4: above the cursor.
    assert report.messages == 2
    assert seqs(bus) == [2, 4]


def test_compact_export_position_counts_as_a_cursor_once_used(bus: Bus) -> None:
    publish_n(bus, 10)
    bus.ack("a", 8)
    set_export(bus, 0)  # never exported: ignored
    assert retention.acked_through(bus.conn) == 8
    assert bus.compact(0, now=later(), dry_run=True).messages == 8
    set_export(bus, 5)
    assert retention.acked_through(bus.conn) == 5
    report = bus.compact(0, now=later())
    assert (report.messages, report.acked_through) == (5, 5)
    assert seqs(bus) == [6, 7, 8, 9, 10]
    set_export(bus, 10)  # ahead of the cursor: the cursor is the lower one
    assert bus.compact(0, now=later()).acked_through == 8
    assert seqs(bus) == [9, 10]


def test_compact_export_position_alone_is_the_cursor(bus: Bus) -> None:
    publish_n(bus, 6)
    set_export(bus, 4)
    report = bus.compact(0, now=later())
    assert (report.messages, report.acked_through) == (4, 4)
    assert seqs(bus) == [5, 6]


def test_compact_dry_run_counts_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    with Bus.open(db, blob_threshold=16) as bus:
        publish_n(bus, 6)
        orphan_seq = bus.publish("p", "big", "B" * 100).seq
        bus.ack("a", 5)
        ref = bus.conn.execute("SELECT payload_ref FROM messages WHERE seq = ?",
                               (orphan_seq,)).get
        bus.ack("a", orphan_seq)
        bus.conn.execute("DELETE FROM messages WHERE seq = ?", (orphan_seq,))
        make_old(bus.blobs.path(ref), 2 * HOUR)
        tables = table_dump(bus)
        wal = wal_size(db)
        report = bus.compact(0, now=later(), dry_run=True, grace_seconds=0)
        # The orphan's row is gone, so seq 6 is the newest: it stays.
        assert report == CompactReport(dry_run=True, cutoff_ms=report.cutoff_ms,
                                       acked_through=5, messages=5, blobs=[],
                                       wal_bytes_before=0, wal_bytes_after=0)
        assert table_dump(bus) == tables
        assert bus.blobs.list_refs() == [ref]   # the orphan is not collected either
        assert wal_size(db) == wal              # no checkpoint


def test_compact_report_fields_and_json(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    with Bus.open(db, blob_threshold=16) as bus:
        publish_n(bus, 3)
        gone = bus.publish("p", "big", "G" * 100).seq
        kept = bus.publish("p", "big", "K" * 100).seq
        refs = dict(bus.conn.execute("SELECT seq, payload_ref FROM messages WHERE seq >= ?",
                                     (gone,)).fetchall())
        for ref in refs.values():
            make_old(bus.blobs.path(ref), 2 * HOUR)
        bus.ack("a", gone)
        age(bus, 1, kept, 1)
        now = later()
        assert wal_size(db) > 0
        report = bus.compact(0.5, now=now)
        assert report.dry_run is False
        assert report.cutoff_ms == now - DAY_MS // 2
        assert (report.messages, report.acked_through) == (4, gone)
        assert report.blobs == [refs[gone]]
        assert report.wal_bytes_before > 0
        assert report.wal_bytes_after == 0 == wal_size(db)
        assert report.to_json_dict() == {
            "dry_run": False, "cutoff_ms": now - DAY_MS // 2, "acked_through": gone,
            "messages": 4, "blobs": 1, "wal_bytes_before": report.wal_bytes_before,
            "wal_bytes_after": 0, "checkpoint": "truncate"}
        assert bus.blobs.list_refs() == [refs[kept]]
        assert seqs(bus) == [kept]


# --- blobs and the WAL ----------------------------------------------------------------


def test_compact_removes_blobs_only_deleted_messages_referenced(tmp_path: Path) -> None:
    with Bus.open(tmp_path / "bus.db", blob_threshold=16) as bus:
        shared = bus.publish("p", "t", "A" * 100).seq        # 1: blob A
        only_old = bus.publish("p", "t", "B" * 100).seq      # 2: blob B
        bus.publish("p", "t", "A" * 100)                     # 3: blob A again, kept
        young = bus.publish("p", "t", "C" * 100).seq         # 4: blob C, recent file
        bus.publish("p", "t", "small")                       # 5
        ref = dict(bus.conn.execute("SELECT seq, payload_ref FROM messages").fetchall())
        make_old(bus.blobs.path(ref[shared]), 2 * HOUR)
        make_old(bus.blobs.path(ref[only_old]), 2 * HOUR)
        bus.ack("a", 2)
        report = bus.compact(0, now=later())
        assert report.messages == 2
        assert report.blobs == [ref[only_old]]
        assert bus.blobs.list_refs() == sorted([ref[shared], ref[young]])
        assert [m.payload for m in bus.poll("b")] == ["A" * 100, "C" * 100, "small"]
        bus.ack("a", 4)
        # The last message with blob A goes, and A (old) with it. Blob C's message
        # is gone too, but its file is younger than the grace period.
        report = bus.compact(0, now=later())
        assert (report.messages, report.blobs) == (2, [ref[shared]])
        assert bus.blobs.list_refs() == [ref[young]]
        report = bus.compact(0, now=later(), grace_seconds=0)
        assert (report.messages, report.blobs) == (0, [ref[young]])
        assert bus.blobs.list_refs() == []
        assert [m.payload for m in bus.poll("b")] == ["small"]


def test_compact_truncates_wal_with_other_idle_connections_open(bus: Bus, db_path: Path) -> None:
    idle = connect(db_path)
    other = Bus.open(db_path)
    try:
        other.publish("o", "t")
        assert idle.execute("SELECT count(*) FROM messages").get == 1  # then idle again
        for start in range(0, 3000, 500):
            publish_n(bus, 500, start=start)
        assert wal_size(db_path) > 100_000
        report = bus.compact(30)  # nothing old: the checkpoint still runs
        assert report.messages == 0
        assert report.wal_bytes_before >= 100_000
        assert report.wal_bytes_after == 0
        assert wal_size(db_path) == 0
        assert other.message_count() == 3001
    finally:
        idle.close()
        other.close()


def test_compact_deletes_more_than_one_batch(bus: Bus) -> None:
    total = 2 * retention.DELETE_BATCH + 1
    assert retention.DELETE_BATCH == 5000
    for start in range(0, total, 2000):
        publish_n(bus, min(2000, total - start), start=start)
    bus.ack("a", total)
    commits = []
    bus.conn.set_commit_hook(lambda: commits.append(1) is not None)
    report = bus.compact(0, now=later())
    bus.conn.set_commit_hook(None)
    assert report.messages == total - 1  # the newest stays: it keeps seq increasing
    assert seqs(bus) == [total]
    assert len(commits) >= 3  # one transaction per batch, so other writers get turns
    assert bus.publish("p", "after").seq == total + 1


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 6, 7])
def test_compact_batches_at_the_boundaries(bus: Bus, monkeypatch, count: int) -> None:
    monkeypatch.setattr(retention, "DELETE_BATCH", 3)
    publish_n(bus, count + 2)
    bus.ack("a", count + 2)
    if count:
        age(bus, 1, count, 2)
    commits = []
    bus.conn.set_commit_hook(lambda: commits.append(1) is not None)
    report = bus.compact(1)
    bus.conn.set_commit_hook(None)
    assert report.messages == count
    assert seqs(bus) == [count + 1, count + 2]
    assert len(commits) == count // 3 + 1


def test_compact_then_poll_ack_and_publish_keep_working(bus: Bus, db_path: Path) -> None:
    publish_n(bus, 5)
    bus.ack("a", 5)
    assert bus.compact(0, now=later()).messages == 4
    assert seqs(bus) == [5]                   # everything it may: the newest stays
    assert bus.last_seq() == 5
    assert bus.poll("a") == []
    assert bus.publish("p", "next").seq == 6  # never reused
    assert [m.seq for m in bus.poll("a")] == [6]
    assert bus.ack("a", 6) == 6
    assert bus.ack("a", 3) == 6               # an old, deleted seq: no move back
    assert bus.ack("late", 2) == 2            # a deleted seq is still a valid position
    assert [m.seq for m in bus.poll("late")] == [5, 6]
    with pytest.raises(ValidationFailed):
        bus.ack("a", 7)
    bus.close()
    with Bus.open(db_path) as reopened:       # the sequence survives reopening
        assert reopened.last_seq() == 6
        assert reopened.publish("p", "again").seq == 7


def test_compact_everything_then_publish_never_reuses_a_seq(bus: Bus, db_path: Path) -> None:
    """seq is max(seq) + 1 (no AUTOINCREMENT): compaction keeps the newest message."""
    for round_ in range(3):
        first = bus.last_seq() + 1
        publish_n(bus, 4)
        bus.ack("a", bus.last_seq())
        bus.compact(0, now=later())
        assert seqs(bus) == [first + 3]
        bus.close()
        bus = Bus.open(db_path)
        assert bus.publish("p", "after").seq == first + 4
        bus.ack("a", first + 4)
    bus.close()


@pytest.mark.parametrize("keep_days", [-1, float("inf"), float("nan"), True, "7", None])
def test_compact_rejects_invalid_keep_days(bus: Bus, keep_days) -> None:
    publish_n(bus, 1)
    bus.ack("a", 1)
    with pytest.raises(ValidationFailed) as info:
        bus.compact(keep_days)
    assert info.value.field == "keep_days"
    assert bus.message_count() == 1


@pytest.mark.parametrize("kwargs, field", [
    ({"grace_seconds": -1}, "grace_seconds"),
    ({"now": 1_700_000_000}, "now"),  # seconds, not milliseconds
    ({"now": 1.7e12}, "now"),
])
def test_compact_rejects_invalid_grace_and_now(bus: Bus, kwargs, field: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        bus.compact(1, **kwargs)
    assert info.value.field == field


# --- property: nothing unacked is ever removed -----------------------------------------

AGENTS = ["a", "b", "c"]
OPS = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 4), st.sampled_from([None, "a", "b", "c"])),
    st.tuples(st.just("ack"), st.sampled_from(AGENTS), st.floats(0, 1)),
    st.tuples(st.just("export"), st.floats(0, 1), st.none()),
    st.tuples(st.just("compact"), st.integers(0, 12), st.booleans()),
)


@scaled_settings(max_examples=40)
@given(ops=st.lists(OPS, max_size=30))
def test_compact_never_removes_what_a_cursor_has_not_acked(tmp_path: Path, ops) -> None:
    with Bus.open(tmp_path / f"prop-{next(_counter)}" / "bus.db") as bus:
        present: dict[int, tuple[int, str | None]] = {}  # seq -> (ts_ms, to)
        cursors: dict[str, int] = {}
        export = 0
        for op, x, y in ops:
            last = bus.last_seq()
            if op == "publish":
                publish_n(bus, x, to=y)
                present.update({seq: (ts, to) for seq, ts, to in bus.conn.execute(
                    "SELECT seq, ts_ms, to_agent FROM messages WHERE seq > ?", (last,))})
            elif op == "ack" and last:
                target = max(1, round(y * last))
                assert bus.ack(x, target) == max(cursors.get(x, 0), target)
                cursors[x] = max(cursors.get(x, 0), target)
            elif op == "export":
                export = round(x * last)
                set_export(bus, export)
            elif op == "compact":
                times = sorted({ts for ts, _ in present.values()})
                now = times[x] if x < len(times) else (times[-1] + 1 if times else now_ms())
                lowest = min([*cursors.values(), *([export] if export > 0 else [])], default=0)
                if present:  # the newest message always stays
                    lowest = min(lowest, max(present) - 1)
                doomed = {s for s, (ts, _) in present.items() if s <= lowest and ts < now}
                before = set(seqs(bus))
                report = bus.compact(0, now=now, dry_run=y, grace_seconds=0)
                assert (report.acked_through, report.messages) == (lowest, len(doomed))
                if not y:
                    present = {s: v for s, v in present.items() if s not in doomed}
                assert seqs(bus) == sorted(present)
                # The invariant, stated directly: whatever this compact removed, every
                # cursor (and the exporter, once used) had acknowledged.
                removed = before - set(seqs(bus))
                for position in [*cursors.values(), *([export] if export > 0 else [])]:
                    assert all(s <= position for s in removed)
        for agent, position in cursors.items():
            expected = [s for s, (_, to) in sorted(present.items())
                        if s > position and to in (None, agent)]
            assert [m.seq for m in bus.poll(agent, limit=1000)] == expected


# --- journal_size_limit --------------------------------------------------------------


def test_journal_size_limit_is_set_on_every_writable_connection(bus: Bus, db_path: Path) -> None:
    assert JOURNAL_SIZE_LIMIT == 64 * 1024 * 1024 == 67108864
    assert bus.conn.execute("PRAGMA journal_size_limit").get == 67108864
    seen = []
    thread = threading.Thread(
        target=lambda: seen.append(bus.conn.execute("PRAGMA journal_size_limit").get))
    thread.start()
    thread.join()
    assert seen == [67108864]  # the connection a Bus opens for another thread
    direct = connect(db_path)
    try:
        assert direct.execute("PRAGMA journal_size_limit").get == 67108864
    finally:
        direct.close()
    with Bus.open(db_path, durability="full") as full:
        assert full.conn.execute("PRAGMA journal_size_limit").get == 67108864
    # SQLite's default, for contrast: the setting is per connection, not stored in the file.
    plain = apsw.Connection(str(db_path))
    try:
        assert plain.execute("PRAGMA journal_size_limit").get == -1
    finally:
        plain.close()
