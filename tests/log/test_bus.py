"""The Bus API: publish, publish_many, poll, ack and inspection."""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid

import pytest

from bus import Bus
from bus import BusClosed
from bus import Message
from bus import PublishResult
from bus import ValidationFailed
from bus.log.glance import _FIRST_WAITING_SQL
from bus.log.messages import _POLL_SQL


def test_publish_returns_seq_id_and_commit_durability(bus):
    result = bus.publish("a", "hello", {"n": 1}, to="b")
    assert isinstance(result, PublishResult)
    assert (result.seq, result.duplicate, result.durable) == (1, False, "commit")
    uuid.UUID(result.id)


def test_publish_with_full_durability_reports_fsync(db_path):
    with Bus.open(db_path, durability="full") as bus:
        assert bus.publish("a", "t").durable == "fsync"


def test_open_rejects_unknown_durability(db_path):
    with pytest.raises(ValidationFailed, match="durability"):
        Bus.open(db_path, durability="sometimes")


def test_publish_same_id_twice_writes_once_and_keeps_seq_dense(bus):
    message_id = str(uuid.uuid4())
    first = bus.publish("a", "t", {"v": 1}, id=message_id)
    again = bus.publish("a", "t", {"v": 2}, id=message_id)
    after = bus.publish("a", "t")
    assert (again.seq, again.id, again.duplicate) == (first.seq, first.id, True)
    assert after.seq == first.seq + 1
    assert [m.payload for m in bus.poll("z")] == [{"v": 1}, None]


def test_publish_invalid_input_writes_nothing(bus):
    with pytest.raises(ValidationFailed) as info:
        bus.publish("a", "t", {"x": {1, 2}})
    assert info.value.field == "payload"
    with pytest.raises(ValidationFailed):
        bus.publish("a", "t", id="nope")
    assert bus.message_count() == 0


def test_publish_many_is_one_transaction(bus):
    results = bus.publish_many([
        {"from_agent": "a", "type": "t", "payload": i, "to": "b"} for i in range(5)
    ])
    assert [r.seq for r in results] == [1, 2, 3, 4, 5]
    with pytest.raises(ValidationFailed, match=r"messages\[2\]"):
        bus.publish_many([{"from_agent": "a", "type": "t"}] * 2 + [{"from_agent": "", "type": "t"}])
    assert bus.message_count() == 5


def test_publish_many_marks_duplicates_within_and_across_batches(bus):
    ids = [str(uuid.uuid4()) for _ in range(2)]
    first = bus.publish_many([{"from_agent": "a", "type": "t", "id": ids[0]}])
    results = bus.publish_many([
        {"from_agent": "a", "type": "t", "id": ids[0]},
        {"from_agent": "a", "type": "t", "id": ids[1]},
        {"from_agent": "a", "type": "t", "id": ids[1]},
    ])
    assert [(r.seq, r.duplicate) for r in results] == [
        (first[0].seq, True), (2, False), (2, True)]


def test_publish_many_empty_batch_returns_nothing(bus):
    assert bus.publish_many([]) == []


def test_poll_returns_direct_and_broadcast_in_seq_order(bus):
    bus.publish("a", "to-b", to="b")
    bus.publish("a", "to-c", to="c")
    bus.publish("a", "everyone")
    bus.publish("c", "to-b-again", to="b", correlation_id="task-1", in_reply_to="m-1")
    got = bus.poll("b")
    assert all(isinstance(m, Message) for m in got)
    assert [(m.seq, m.type) for m in got] == [(1, "to-b"), (3, "everyone"), (4, "to-b-again")]
    last = got[-1]
    assert (last.from_agent, last.to_agent, last.correlation_id, last.in_reply_to) == (
        "c", "b", "task-1", "m-1")
    assert [m.type for m in bus.poll("c")] == ["to-c", "everyone"]


def test_poll_never_moves_the_cursor(bus):
    for i in range(3):
        bus.publish("a", "t", i)
    assert bus.poll("b") == bus.poll("b")
    assert bus.cursor("b") == 0


def test_poll_respects_limit_and_validates_it(bus):
    for i in range(5):
        bus.publish("a", "t", i)
    assert [m.payload for m in bus.poll("b", limit=2)] == [0, 1]
    for bad in (0, -1, 10_001, 1.5, True):
        with pytest.raises(ValidationFailed, match="limit"):
            bus.poll("b", limit=bad)


def test_message_is_frozen(bus):
    bus.publish("a", "t")
    with pytest.raises(AttributeError):
        bus.poll("b")[0].seq = 7


def test_ack_moves_forward_only(bus):
    for i in range(4):
        bus.publish("a", "t", i)
    assert bus.ack("b", 3) == 3
    assert bus.ack("b", 1) == 3
    assert [m.payload for m in bus.poll("b")] == [3]
    assert bus.cursor("b") == 3


def test_ack_beyond_last_seq_is_refused(bus):
    bus.publish("a", "t")
    with pytest.raises(ValidationFailed, match="no message has seq 5; the last seq is 1"):
        bus.ack("b", 5)
    assert bus.cursor("b") == 0
    with pytest.raises(ValidationFailed, match="seq"):
        bus.ack("b", 0)


def test_ack_on_empty_bus_is_refused(bus):
    with pytest.raises(ValidationFailed, match="the last seq is 0"):
        bus.ack("b", 1)


def test_ack_seq_of_message_for_another_agent_advances_past_it(bus):
    bus.publish("a", "t", to="c")
    bus.publish("a", "t", to="b")
    bus.ack("b", 1)
    assert [m.seq for m in bus.poll("b")] == [2]


def test_list_cursors_counts_pending_messages_per_agent(bus):
    bus.publish("a", "t", to="b")
    bus.publish("a", "t", to="c")
    bus.publish("a", "t")
    bus.ack("b", 1)
    bus.ack("c", 1)
    pending = {c.agent: (c.last_acked_seq, c.pending) for c in bus.list_cursors()}
    assert pending == {"b": (1, 1), "c": (1, 2)}


def test_inspection_counts_and_last_messages(bus):
    assert (bus.message_count(), bus.last_seq()) == (0, 0)
    for i in range(5):
        bus.publish("a", "t", i)
    assert (bus.message_count(), bus.last_seq()) == (5, 5)
    assert [m.seq for m in bus.last_messages(2)] == [4, 5]
    assert [m.seq for m in bus.list_messages(after=3)] == [4, 5]


def test_bus_reopens_with_same_data(db_path):
    with Bus.open(db_path) as bus:
        bus.publish("a", "t", {"k": "v"})
        bus.ack("b", 1)
    with Bus.open(db_path, create=False) as bus:
        assert bus.cursor("b") == 1
        assert bus.last_messages(1)[0].payload == {"k": "v"}


def test_closed_bus_refuses_use(db_path):
    bus = Bus.open(db_path)
    bus.close()
    bus.close()
    with pytest.raises(BusClosed):
        bus.publish("a", "t")


def test_each_thread_gets_its_own_connection(bus):
    seen = {}

    def publish_from_thread(n):
        seen[n] = bus.conn  # held, so no two can share an id() after a thread ends
        bus.publish(f"thread-{n}", "t")

    threads = [threading.Thread(target=publish_from_thread, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(conn) for conn in [*seen.values(), bus.conn]}) == 5
    assert bus.message_count() == 4


def query_plan(bus, sql, params):
    return " | ".join(row[3] for row in bus.conn.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_poll_plan_uses_index_ranges_without_sorting(bus):
    plan = query_plan(bus, _POLL_SQL, {"agent": "b", "after": 0, "limit": 10})
    assert plan.count("INDEX idx_messages_to_seq (to_agent=? AND seq>?)") == 2
    assert "MERGE" in plan
    assert "TEMP B-TREE" not in plan and "SCAN" not in plan


def test_answer_goes_to_the_sender_and_acks_the_question_in_one_transaction(bus):
    bus.publish("c", "note", to="b")
    asked = bus.publish("a", "question", {"q": 1}, to="b", correlation_id="job-7")
    bus.publish("a", "later", to="b")
    sent = bus.answer("b", asked.seq, "answer", {"a": 2})
    answer = bus.poll("a")[0]
    assert (answer.seq, answer.from_agent, answer.type, answer.payload) == (
        sent.seq, "b", "answer", {"a": 2})
    assert (answer.in_reply_to, answer.correlation_id) == (asked.id, "job-7")
    assert bus.cursor("b") == asked.seq  # acked through the question, as ack does
    assert [m.type for m in bus.poll("b")] == ["later"]


def test_answer_refuses_a_seq_not_sent_to_the_agent_and_changes_nothing(bus, db_path):
    for_c = bus.publish("a", "question", to="c")
    broadcast = bus.publish("a", "hello")
    big = {"text": "x" * 10_000}  # would go to the blob store
    for seq in (for_c.seq, 99):
        with pytest.raises(ValidationFailed, match=f"no message with seq {seq} was sent to b"):
            bus.answer("b", seq, "answer", big)
    assert (bus.last_seq(), bus.cursor("b")) == (broadcast.seq, 0)
    assert [p for p in (db_path.parent / "blobs").rglob("*") if p.is_file()] == []
    assert bus.answer("b", broadcast.seq, "answer", big).seq == broadcast.seq + 1


def test_ack_if_next_acks_only_the_first_message_waiting(bus):
    first = bus.publish("a", "one", to="b")
    second = bus.publish("a", "two")
    assert bus.ack_if_next("b", second.seq) is False  # `first` still waits
    assert bus.cursor("b") == 0
    assert bus.ack_if_next("b", first.seq) is True  # a consumer with no cursor yet
    assert bus.ack_if_next("b", second.seq) is True
    assert (bus.cursor("b"), bus.poll("b")) == (second.seq, [])
    assert bus.ack_if_next("b", first.seq) is False  # handled already: nothing moves back
    assert bus.cursor("b") == second.seq


def test_first_waiting_plan_uses_index_ranges_without_sorting(bus):
    plan = query_plan(bus, _FIRST_WAITING_SQL, {"agent": "b", "after": 0})
    assert plan.count("INDEX idx_messages_to_seq (to_agent=? AND seq>?)") == 2
    assert "TEMP B-TREE" not in plan and "SCAN" not in plan


def test_a_finished_threads_connection_and_watcher_are_closed(bus: Bus):
    """A long-running server's worker threads come and go; their connections must not pile up."""
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def use_the_bus() -> None:
        bus.publish("t", "note", {"n": 1})
        bus.wait_for_change(0)  # makes this thread's watcher too

    use_the_bus()  # this thread's own, kept
    first = threading.Thread(target=use_the_bus)  # and what a first other thread opens once
    first.start()
    first.join()
    before = open_fds()
    for _ in range(20):
        worker = threading.Thread(target=use_the_bus)
        worker.start()
        worker.join()
    deadline = time.monotonic() + 10
    while open_fds() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert open_fds() <= before
    assert bus.poll("u", 100)  # the bus still serves its own thread after all that
    bus.close()
    bus.close()
