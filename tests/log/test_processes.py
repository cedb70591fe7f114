"""The bus used by real OS processes on one real file.

Every child is a separate Python interpreter running tests/support/procs.py. The
parent and children synchronise only through pipes (stdout lines, a start
barrier pipe whose write end the parent closes) and files, never by sleeping
for a guessed time. Every wait has a generous deadline so a broken bus fails
the test instead of hanging it; children that outlive their test are killed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import apsw
import pytest

from bus import Bus
from tests.support.children import Barrier
from tests.support.children import Child
from tests.support.children import Children
from tests.conftest import LATEST_VERSION

PROCS = Path(__file__).resolve().parent.parent / "support" / "procs.py"
SHORT_TIMEOUT = 60.0
LOAD_TIMEOUT = 300.0


@pytest.fixture
def spawn(tmp_path: Path, python_env: dict[str, str]):
    """spawn(name, *argv, pass_fds=()) starts tests/support/procs.py; leftovers are killed at teardown."""
    started = Children(python_env, tmp_path / "stderr", PROCS)
    yield started.start
    started.cleanup()


@pytest.fixture
def barrier():
    made = Barrier()
    yield made
    made.close()


def all_messages(bus: Bus) -> list:
    found, after = [], 0
    while batch := bus.list_messages(after, 10_000):
        found.extend(batch)
        after = batch[-1].seq
    return found


# --- many publishers and consumers at once ------------------------------------------

PUBLISHERS = 4
PER_PUBLISHER = 5_000
CONSUMERS = ("consumer-a", "consumer-b")


@pytest.mark.slow
def test_processes_publishers_and_consumers_see_everything(tmp_path, db_path, spawn, barrier):
    Bus.open(db_path).close()  # migrated up front: concurrent first open has its own test
    total = PUBLISHERS * PER_PUBLISHER
    done_file = tmp_path / "publishers-done"
    publishers = [
        spawn(f"publisher-{p}", "publisher", str(db_path), "--publisher", str(p),
              "--count", str(PER_PUBLISHER), "--go-fd", str(barrier.read_fd),
              pass_fds=(barrier.read_fd,))
        for p in range(PUBLISHERS)
    ]
    consumers = {
        agent: spawn(agent, "consumer", str(db_path), "--agent", agent,
                     "--expected", str(total), "--done-file", str(done_file),
                     "--out", str(tmp_path / f"{agent}.jsonl"), "--limit", "500",
                     "--go-fd", str(barrier.read_fd), pass_fds=(barrier.read_fd,))
        for agent in CONSUMERS
    }
    barrier.release(publishers + list(consumers.values()))
    started = time.monotonic()
    deadline = started + LOAD_TIMEOUT

    for child in publishers:
        child.wait_ok(deadline - time.monotonic())
        assert child.read_line(SHORT_TIMEOUT) == f"done {PER_PUBLISHER}", child.describe()
    published_in = time.monotonic() - started
    done_file.touch()  # every publish has committed: consumers may stop once drained
    for child in consumers.values():
        child.wait_ok(max(deadline - time.monotonic(), 1.0))
        summary = json.loads(child.read_line(SHORT_TIMEOUT))
        assert summary["count"] == total, child.describe()
    print(f"\n{total} messages from {PUBLISHERS} processes published in {published_in:.1f} s,"
          f" consumed by {len(CONSUMERS)} processes in {time.monotonic() - started:.1f} s")

    with Bus.open(db_path) as bus:
        log = all_messages(bus)
        in_db = [(m.seq, m.id) for m in log]
        cursors = {agent: bus.cursor(agent) for agent in CONSUMERS}
    assert len(in_db) == total
    # Times are taken under the write lock, so they follow seq order.
    times = [m.ts_ms for m in log]
    assert times == sorted(times)

    seen_by = {}
    for agent in CONSUMERS:
        rows = [json.loads(line)
                for line in (tmp_path / f"{agent}.jsonl").read_text().splitlines()]
        check_consumer_saw_each_message_once_in_order(agent, rows)
        assert [(r["seq"], r["id"]) for r in rows] == in_db, f"{agent} differs from the log"
        assert cursors[agent] == rows[-1]["seq"]
        seen_by[agent] = rows
    first, second = (seen_by[agent] for agent in CONSUMERS)
    assert {r["id"] for r in first} == {r["id"] for r in second}
    assert [(r["seq"], r["id"]) for r in first] == [(r["seq"], r["id"]) for r in second]


def check_consumer_saw_each_message_once_in_order(agent: str, rows: list[dict]) -> None:
    total = PUBLISHERS * PER_PUBLISHER
    assert len(rows) == total, f"{agent} saw {len(rows)} messages, expected {total}"
    seqs = [r["seq"] for r in rows]
    assert all(a < b for a, b in zip(seqs, seqs[1:])), f"{agent}: seq not strictly increasing"
    assert len({r["id"] for r in rows}) == total, f"{agent}: duplicate ids"
    assert all(r["payload_error"] is None and r["to"] is None for r in rows)
    counts = Counter((r["publisher"], r["n"]) for r in rows)
    expected = {(p, n) for p in range(PUBLISHERS) for n in range(PER_PUBLISHER)}
    missing = expected - counts.keys()
    assert not missing, f"{agent} missed {len(missing)} messages, e.g. {sorted(missing)[:5]}"
    duplicated = [key for key, count in counts.items() if count > 1]
    assert not duplicated, f"{agent} saw {len(duplicated)} twice, e.g. {duplicated[:5]}"
    assert counts.keys() == expected
    for p in range(PUBLISHERS):
        mine = [r for r in rows if r["publisher"] == p]
        assert {r["from"] for r in mine} == {f"pub-{p}"}
        # rows are in seq order, so this says n increases with seq
        assert [r["n"] for r in mine] == list(range(PER_PUBLISHER)), (
            f"{agent}: publisher {p}'s messages are out of publish order"
        )


# --- a consumer killed between poll and ack -------------------------------------------


def publish_mixed(db_path: Path, agent: str, count: int = 60) -> list[tuple[int, str]]:
    """Publish to `agent`, to everyone and to someone else in turn; return (seq, id) for `agent`."""
    with Bus.open(db_path) as bus:
        for n in range(count):
            to = (agent, None, "someone-else")[n % 3]
            bus.publish("producer", "work", {"n": n}, to=to)
        return [(m.seq, m.id) for m in all_messages(bus) if m.to_agent in (agent, None)]


def polled(child: Child) -> dict:
    report = json.loads(child.read_line(SHORT_TIMEOUT))
    report["pairs"] = list(zip(report["seqs"], report["ids"]))
    return report


def test_processes_consumer_killed_between_poll_and_ack_gets_messages_again(db_path, spawn):
    expected = publish_mixed(db_path, "worker")
    assert len(expected) == 40

    first = spawn("first", "poll", str(db_path), "--agent", "worker", "--hang")
    got_first = polled(first)
    first.kill()
    assert got_first["pairs"] == expected
    assert "someone-else" not in got_first["to"]
    with Bus.open(db_path) as bus:
        assert bus.cursor("worker") == 0

    second = spawn("second", "poll", str(db_path), "--agent", "worker")
    got_second = polled(second)
    second.wait_ok(SHORT_TIMEOUT)
    assert got_second["pairs"] == got_first["pairs"]


def test_processes_consumer_killed_after_partial_ack_gets_the_rest(db_path, spawn):
    expected = publish_mixed(db_path, "worker")
    acked = 7

    first = spawn("first", "poll", str(db_path), "--agent", "worker", "--hang",
                  "--ack-first", str(acked))
    got_first = polled(first)  # printed after the acks committed
    first.kill()
    assert got_first["pairs"] == expected
    assert got_first["acked"] == expected[acked - 1][0]
    with Bus.open(db_path) as bus:
        assert bus.cursor("worker") == expected[acked - 1][0]

    second = spawn("second", "poll", str(db_path), "--agent", "worker")
    got_second = polled(second)
    second.wait_ok(SHORT_TIMEOUT)
    assert got_second["pairs"] == expected[acked:]


# --- a publisher killed mid-stream -------------------------------------------------------


def test_processes_publisher_killed_mid_stream_loses_nothing_returned(db_path, spawn):
    Bus.open(db_path).close()
    publisher = spawn("publisher", "publish-stream", str(db_path), "--sender", "streamer")
    reported = [publisher.read_line(SHORT_TIMEOUT) for _ in range(200)]
    publisher.kill()
    more, partial = publisher.remaining_lines()
    reported += more
    assert not partial, f"a line was cut short: {partial!r}"
    triples = [tuple(line.split()) for line in reported]
    returned = [(int(n), int(seq), id_) for n, seq, id_ in triples]
    assert [n for n, _, _ in returned] == list(range(len(returned)))

    with Bus.open(db_path) as bus:
        assert bus.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = all_messages(bus)
        by_seq = {m.seq: m for m in rows}
        for n, seq, id_ in returned:
            assert seq in by_seq, f"publish #{n} returned seq {seq}, which is not in the db"
            assert by_seq[seq].id == id_
            assert by_seq[seq].payload["n"] == n
        assert all(m.payload_error is None and m.from_agent == "streamer" for m in rows)
        # one publisher, one transaction per message: the rows are publishes 0..k-1
        # in seq order, and at most one committed before the kill and was not yet printed
        assert [m.payload["n"] for m in rows] == list(range(len(rows)))
        assert [m.seq for m in rows] == list(range(1, len(rows) + 1))
        assert len(rows) - len(returned) in (0, 1)
        # the killed writer left no lock behind: the next publish goes straight through
        after = bus.publish("parent", "after-kill")
        assert after.seq == len(rows) + 1


def test_processes_sixteen_publishing_threads_killed_lose_and_invent_nothing(db_path, spawn):
    """Group commit under SIGKILL: every publish that returned is in the file with the
    seq it returned, and nothing is there that no thread tried to publish."""
    Bus.open(db_path).close()
    child = spawn("threads", "publish-threads", str(db_path), "--threads", "16")
    lines = []
    while sum(line.startswith("ok ") for line in lines) < 2000:
        lines.append(child.read_line(SHORT_TIMEOUT))
    child.kill()
    more, partial = child.remaining_lines()
    lines += more
    tried = {line.split()[1] for line in lines if line.startswith("try ")}
    returned = {line.split()[1]: int(line.split()[2]) for line in lines if line.startswith("ok ")}
    # A "try" line cut short by the kill names an attempt we cannot read in full.
    hidden_attempts = 1 if partial.startswith(b"try ") else 0

    with Bus.open(db_path) as bus:
        assert bus.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = {m.id: m.seq for m in all_messages(bus)}
        assert {id_: rows.get(id_) for id_ in returned} == returned  # nothing returned is lost
        unknown = set(rows) - tried
        assert len(unknown) <= hidden_attempts, unknown  # nothing invented
        assert len(rows) - len(returned) <= 16  # at most the publishes in flight
        assert bus.publish("parent", "after-kill").seq == max(rows.values()) + 1


# --- several processes opening a new file at once ---------------------------------------

OPENERS = 6
# Each round races the openers on a fresh file. A given interleaving shows up
# in only a few percent of rounds, so the children stay up and run many.
OPEN_ROUNDS = 25


def test_processes_concurrent_first_open_migrates_once(tmp_path, spawn):
    barriers = [Barrier() for _ in range(OPEN_ROUNDS)]
    try:
        read_fds = tuple(b.read_fd for b in barriers)
        template = str(tmp_path / "round-{round}" / "bus.db")
        openers = [
            spawn(f"opener-{i}", "open-and-publish", template, "--sender", f"opener-{i}",
                  "--go-fds", ",".join(map(str, read_fds)), pass_fds=read_fds)
            for i in range(OPENERS)
        ]
        errors = []
        for round_, barrier in enumerate(barriers):
            db_path = Path(template.format(round=round_))
            assert not db_path.exists()
            barrier.release(openers)  # all wait at this round's barrier, none has the file
            reports = [json.loads(child.read_line(SHORT_TIMEOUT)) for child in openers]
            assert all(r["round"] == round_ for r in reports)
            failed = [r["error"] for r in reports if "error" in r]
            if failed:
                errors.append(f"round {round_}: {len(failed)} of {OPENERS} opens failed;"
                              f" the first:\n{failed[0]}")
                continue
            assert all(r["schema_version"] == LATEST_VERSION for r in reports)
            assert sorted(r["seq"] for r in reports) == list(range(1, OPENERS + 1))
            check_migrated_once_with_messages_from(db_path, [f"opener-{i}" for i in range(OPENERS)])
    finally:
        for barrier in barriers:
            barrier.close()
    assert not errors, f"{len(errors)} of {OPEN_ROUNDS} rounds failed:\n" + "\n".join(errors)
    for child in openers:
        child.wait_ok(SHORT_TIMEOUT)


def check_migrated_once_with_messages_from(db_path: Path, senders: list[str]) -> None:
    conn = apsw.Connection(str(db_path))
    try:
        assert conn.execute("PRAGMA user_version").get == LATEST_VERSION
        assert conn.execute("PRAGMA application_id").get == 0x61627573
        assert conn.execute("PRAGMA journal_mode").get == "wal"
        assert conn.execute("SELECT key, value FROM meta").fetchall() == [
            ("schema_version", str(LATEST_VERSION))]
        assert conn.execute("SELECT count(*) FROM export_state").get == 1
        assert conn.execute("PRAGMA integrity_check").get == "ok"
        found = conn.execute("SELECT from_agent FROM messages ORDER BY seq").fetchall()
        assert sorted(s for (s,) in found) == sorted(senders)
    finally:
        conn.close()
