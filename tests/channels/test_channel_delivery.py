"""Acks, retries, dead letters and delivery modes, stepped with an injected clock.

Every timer is a stored deadline, so these tests move the clock by hand and
call receive or tick: no sleeping, and the same results after a reopen.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from bus import Bus
from bus.storage import schema
from bus.channels.engine import Channels
from bus.channels.engine import StoreLimits
from bus.storage.errors import StoreFull
from bus.storage.errors import ValidationFailed
from tests.conftest import LATEST_VERSION
from tests.conftest import ManualClock

T0 = 1_700_000_000_000


@pytest.fixture
def ch(bus: Bus, clock: ManualClock) -> Channels:
    return Channels(bus, clock=clock)


def make_pair(ch: Channels, mode: str = "at_least_once", **config) -> None:
    ch.create_channel("work", "direct", "boss", delivery_mode=mode, **config)
    ch.join_channel("work", "worker")


def received_at(ch: Channels, clock: ManualClock, when: int) -> list:
    clock.now = T0 + when
    return list(ch.receive_messages("worker"))


# --- the retry schedule -------------------------------------------------------------


def test_retry_schedule_is_one_three_seven_seconds_of_backoff_then_dead_letter(
        ch: Channels, clock: ManualClock, bus: Bus) -> None:
    # ack_timeout 0.5 s, backoff 1 s, 3 retries (the seed's defaults but the timeout).
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=3)
    sent = ch.send_message("work", "boss", "command", "do it")
    deliveries = []
    # Each attempt times out 500 ms after it is handed out; the retry is
    # visible backoff * 2^(n-1) after that deadline: waits of 1 s, 2 s, 4 s,
    # so 1 s, 3 s and 7 s of backoff in all (seed 004, "Backoff Schedule").
    for handed_at, visible_again in ((0, 1500), (1500, 4000), (4000, 8500)):
        [got] = received_at(ch, clock, handed_at)
        deliveries.append((handed_at, got.attempt, got.retry_count))
        assert received_at(ch, clock, visible_again - 1) == []
        clock.now = T0 + visible_again - 1
        assert ch.tick().redelivered == 0  # due at the deadline, already counted
    [last] = received_at(ch, clock, 8500)
    deliveries.append((8500, last.attempt, last.retry_count))
    assert deliveries == [(0, 1, 0), (1500, 2, 1), (4000, 3, 2), (8500, 4, 3)]
    backoff_waits = [1500 - 500, 4000 - 2000, 8500 - 4500]
    assert [sum(backoff_waits[:n]) for n in (1, 2, 3)] == [1000, 3000, 7000]

    clock.now = T0 + 8999
    assert ch.tick().dead_lettered == 0
    clock.now = T0 + 9000  # the last attempt's ack timeout
    assert ch.tick().dead_lettered == 1
    [dead] = ch.dead_letters()
    assert (dead.recipient, dead.retry_count, dead.dead_lettered_at_ms, dead.message.seq) == (
        "worker", 3, T0 + 9000, sent.seq)
    assert dead.last_error == "not acknowledged within 0.5 s"
    assert dead.message.status == "dead_letter" and dead.message.content == "do it"
    # The notice is a message on the bus's own pubsub channel, topic _system.message.deadletter.
    [notice] = ch.query_messages({"channel": "_system"}).messages
    assert (notice.sender, notice.type, notice.topic) == (
        "bus", "notification", "_system.message.deadletter")
    assert notice.content == {"dead_letter": dead.id, "seq": sent.seq, "channel": "work",
                              "recipient": "worker", "retry_count": 3,
                              "last_error": "not acknowledged within 0.5 s"}
    assert received_at(ch, clock, 60_000) == []


def test_a_late_tick_keeps_the_schedule_of_the_stored_deadlines(ch: Channels,
                                                                clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=3)
    ch.send_message("work", "boss", "command", "do it")
    received_at(ch, clock, 0)
    clock.now = T0 + 1499  # nobody ran tick at 500 ms: it runs now, late
    assert ch.tick().redelivered == 1
    assert received_at(ch, clock, 1499) == []
    assert [m.attempt for m in received_at(ch, clock, 1500)] == [2]


def test_timers_survive_a_restart(ch: Channels, clock: ManualClock, db_path: Path) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=0)
    ch.send_message("work", "boss", "command", "do it")
    received_at(ch, clock, 0)
    ch.bus.close()
    with Bus.open(db_path) as reopened:
        again = Channels(reopened, clock=clock)
        clock.now = T0 + 500
        assert again.tick().dead_lettered == 1
        assert [d.recipient for d in again.dead_letters()] == ["worker"]


# --- acknowledgments ----------------------------------------------------------------


def test_completed_ack_stops_retries(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5)
    ch.send_message("work", "boss", "command", "do it")
    [got] = received_at(ch, clock, 0)
    ch.acknowledge_message(got, "worker", "completed")
    clock.now = T0 + 600_000
    assert ch.tick().to_json_dict() == {"redelivered": 0, "dead_lettered": 0,
                                        "expired_queries": 0}
    assert received_at(ch, clock, 600_000) == []


def test_in_progress_ack_extends_the_deadline(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5)
    ch.send_message("work", "boss", "command", "do it")
    [got] = received_at(ch, clock, 0)
    clock.now = T0 + 400
    ch.acknowledge_message(got, "worker", "in_progress")
    clock.now = T0 + 899
    assert ch.tick().redelivered == 0  # deadline moved to 900
    clock.now = T0 + 900
    assert ch.tick().redelivered == 1


def test_a_late_completed_ack_cancels_a_scheduled_retry(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5)
    ch.send_message("work", "boss", "command", "do it")
    [got] = received_at(ch, clock, 0)
    clock.now = T0 + 700
    ch.tick()  # retry scheduled for 1500
    ch.acknowledge_message(got, "worker", "completed", "finished after all")
    assert received_at(ch, clock, 1500) == []
    assert ch.query_messages().messages[0].status == "acknowledged"


def test_ack_refusals(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch)
    sent = ch.send_message("work", "boss", "command", "do it")
    with pytest.raises(ValidationFailed, match="has not been received by worker yet"):
        ch.acknowledge_message(sent, "worker", "completed")
    with pytest.raises(ValidationFailed, match="has no delivery to stranger"):
        ch.acknowledge_message(sent, "stranger", "completed")
    received_at(ch, clock, 0)
    with pytest.raises(ValidationFailed, match="'done' is not one of received, in_progress"):
        ch.acknowledge_message(sent, "worker", "done")
    assert ch.acknowledge_message(sent, "worker", "failed", "disk full") == "failed"
    assert ch.acknowledge_message(sent, "worker", "failed") == "failed"  # repeated: no-op
    with pytest.raises(ValidationFailed, match="already failed; a final status cannot change"):
        ch.acknowledge_message(sent, "worker", "completed")
    [delivery] = ch.deliveries(sent)
    assert (delivery.status, delivery.note) == ("failed", "disk full")
    assert ch.query_messages().messages[0].status == "failed"


def test_acking_a_duplicate_says_it_is_a_duplicate(ch: Channels) -> None:
    make_pair(ch, "exactly_once")
    ch.send_message("work", "boss", "command", "pay", correlation_id="inv-1")
    repeat = ch.send_message("work", "boss", "command", "pay", correlation_id="inv-1")
    with pytest.raises(ValidationFailed, match="repeats a correlation id already delivered"):
        ch.acknowledge_message(repeat, "worker", "completed")


# --- answers acknowledge what they answer -------------------------------------------


def test_an_acknowledgment_message_completes_the_command_for_its_sender(
        ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5)
    command = ch.send_message("work", "boss", "command", "deploy", correlation_id="job-1")
    [got] = received_at(ch, clock, 0)
    answer = ch.send_message("work", "worker", "acknowledgment", "deployed",
                             correlation_id="job-1")
    [delivery] = ch.deliveries(command)
    assert (delivery.status, delivery.note) == ("completed", f"answered by message {answer.id}")
    assert ch.get_channel("work").open_deliveries == 1  # the answer, waiting for boss
    assert [m.content for m in ch.receive_messages("boss")] == ["deployed"]
    ch.acknowledge_message(answer.seq, "boss", "completed")
    clock.now = T0 + 600_000
    assert ch.tick().redelivered == 0
    assert received_at(ch, clock, 600_000) == []
    assert ch.query_messages({"types": ["command"]}).messages[0].status == "acknowledged"


def test_a_response_completes_the_query_for_the_agent_that_answered(
        ch: Channels, clock: ManualClock) -> None:
    ch.create_channel("g", "group", "asker", ack_timeout=0.5)
    ch.join_channel("g", "expert")
    ch.join_channel("g", "other")
    query = ch.send_query("g", "asker", "what is the port?")
    [got] = ch.receive_messages("expert")
    ch.send_response("g", "expert", got.correlation_id, "8080")
    statuses = {d.recipient: d.status for d in ch.deliveries(query)}
    assert statuses == {"expert": "completed", "other": "pending"}  # still waits for other
    clock.now = T0 + 600_000
    assert [m.type for m in ch.receive_messages("expert")] == []  # not asked again
    statuses = {d.recipient: d.status for d in ch.deliveries(query)}
    # other never received: its timer ran from the send, through its retries.
    assert statuses == {"expert": "completed", "other": "dead_letter"}


def test_an_answer_leaves_a_delivery_already_final_alone(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch)
    command = ch.send_message("work", "boss", "command", "x", correlation_id="c")
    [got] = received_at(ch, clock, 0)
    ch.acknowledge_message(got, "worker", "failed", "no disk")
    ch.send_message("work", "worker", "acknowledgment", "gave up", correlation_id="c")
    [delivery] = ch.deliveries(command)
    assert (delivery.status, delivery.note) == ("failed", "no disk")


def test_message_is_acknowledged_only_when_every_recipient_completed(ch: Channels) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    ch.join_channel("g", "c")
    ch.send_message("g", "a", "command", "x")
    [for_b] = ch.receive_messages("b")
    [for_c] = ch.receive_messages("c")
    ch.acknowledge_message(for_b, "b", "completed")
    assert ch.query_messages().messages[0].status == "delivered"
    ch.acknowledge_message(for_c, "c", "completed")
    assert ch.query_messages().messages[0].status == "acknowledged"
    assert ch.get_channel("g").open_deliveries == 0


# --- delivery modes -----------------------------------------------------------------


def test_at_most_once_never_redelivers(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, "at_most_once", ack_timeout=0.5)
    ch.send_message("work", "boss", "command", "do it")
    assert len(received_at(ch, clock, 0)) == 1
    assert received_at(ch, clock, 600_000) == []
    assert ch.get_channel("work").open_deliveries == 0


def test_exactly_once_suppresses_a_repeated_correlation_id(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, "exactly_once", ack_timeout=1)
    first = ch.send_message("work", "boss", "command", "pay invoice 7", correlation_id="inv-7")
    clock.now = T0 + 100
    repeat = ch.send_message("work", "boss", "command", "pay invoice 7", correlation_id="inv-7")
    assert [d.status for d in ch.deliveries(repeat)] == ["duplicate"]
    got = received_at(ch, clock, 100)
    assert [m.seq for m in got] == [first.seq]
    ch.acknowledge_message(got[0], "worker", "completed")
    # The entry lives 2 x ack_timeout after the last delivery or ack.
    clock.now = T0 + 2099
    again = ch.send_message("work", "boss", "command", "pay invoice 7", correlation_id="inv-7")
    assert [d.status for d in ch.deliveries(again)] == ["duplicate"]
    clock.now = T0 + 2100
    ch.tick()
    later = ch.send_message("work", "boss", "command", "pay invoice 7", correlation_id="inv-7")
    assert [d.status for d in ch.deliveries(later)] == ["pending"]


def test_exactly_once_gives_every_send_a_correlation_id(ch: Channels) -> None:
    make_pair(ch, "exactly_once")
    sent = ch.send_message("work", "boss", "command", "a")
    assert sent.correlation_id == sent.id
    other = ch.send_message("work", "boss", "command", "a")  # same content, new message
    assert [d.status for d in ch.deliveries(other)] == ["pending"]


def test_exactly_once_dedup_survives_a_restart(ch: Channels, clock: ManualClock,
                                               db_path: Path) -> None:
    make_pair(ch, "exactly_once", ack_timeout=30)
    ch.send_message("work", "boss", "command", "x", correlation_id="c-1")
    ch.bus.close()
    with Bus.open(db_path) as reopened:
        again = Channels(reopened, clock=clock)
        repeat = again.send_message("work", "boss", "command", "x", correlation_id="c-1")
        assert [d.status for d in again.deliveries(repeat)] == ["duplicate"]


def test_exactly_once_still_redelivers_an_unacknowledged_delivery(ch: Channels,
                                                                  clock: ManualClock) -> None:
    make_pair(ch, "exactly_once", ack_timeout=0.5, retry_backoff_ms=100)
    ch.send_message("work", "boss", "command", "x", correlation_id="c-1")
    assert [m.attempt for m in received_at(ch, clock, 0)] == [1]
    assert [m.attempt for m in received_at(ch, clock, 600)] == [2]


# --- dead letters ---------------------------------------------------------------------


def bury_one(ch: Channels, clock: ManualClock, content: str = "x") -> int:
    ch.send_message("work", "boss", "command", content)
    received_at(ch, clock, clock.now - T0)
    clock.now += 500
    assert ch.tick().dead_lettered == 1
    return ch.dead_letters()[-1].id


def test_replay_delivers_a_dead_letter_again(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    dead_id = bury_one(ch, clock)
    seq, recipient = ch.replay_dead_letter(dead_id)
    assert recipient == "worker" and ch.dead_letters() == []
    [got] = received_at(ch, clock, clock.now - T0)
    assert (got.seq, got.retry_count, got.status) == (seq, 0, "delivered")
    ch.acknowledge_message(got, "worker", "completed")
    assert ch.query_messages({"channel": "work"}).messages[0].status == "acknowledged"


def test_dead_letter_ids_are_never_reused(ch: Channels, clock: ManualClock) -> None:
    """Replaying or discarding the newest dead letter does not free its id for the next."""
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    first = bury_one(ch, clock, "first")
    ch.replay_dead_letter(first)
    received_at(ch, clock, clock.now - T0)
    clock.now += 500
    assert ch.tick().dead_lettered == 1  # the replayed delivery, dead again
    [again] = ch.dead_letters()
    ch.discard_dead_letter(again.id)
    third = bury_one(ch, clock, "third")
    assert (first, again.id, third) == (1, 2, 3)
    assert [(d.id, d.message.content) for d in ch.dead_letters()] == [(3, "third")]


def test_migration_11_keeps_dead_letters_and_their_ids_are_not_reused_after(
        db_path: Path, tmp_path: Path, clock: ManualClock, monkeypatch) -> None:
    """A bus made before migration 11 keeps its dead letters; afterwards ids are not reused."""
    old = tmp_path / "migrations-v10"
    old.mkdir()
    for migration in schema.available_migrations()[:10]:
        shutil.copy(migration.path, old / migration.path.name)
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", old)
    with Bus.open(db_path) as bus:
        ch = Channels(bus, clock=clock)
        make_pair(ch, ack_timeout=0.5, max_retries=0)
        assert [bury_one(ch, clock, "a"), bury_one(ch, clock, "b")] == [1, 2]
    monkeypatch.undo()
    with Bus.open(db_path) as bus:
        assert bus.schema_version() == LATEST_VERSION
        ch = Channels(bus, clock=clock)
        assert [(d.id, d.message.content) for d in ch.dead_letters()] == [(1, "a"), (2, "b")]
        ch.discard_dead_letter(2)
        assert bury_one(ch, clock, "c") == 3


def test_replay_refuses_a_closed_channel_or_a_departed_recipient(ch: Channels,
                                                                 clock: ManualClock) -> None:
    ch.create_channel("work", "group", "boss", ack_timeout=0.5, max_retries=0)
    ch.join_channel("work", "worker")
    dead_id = bury_one(ch, clock)
    ch.leave_channel("work", "worker")
    with pytest.raises(ValidationFailed, match="worker has left channel 'work'"):
        ch.replay_dead_letter(dead_id)
    ch.set_channel_state("work", "closed")
    with pytest.raises(ValidationFailed, match="is closed; replay needs it active"):
        ch.replay_dead_letter(dead_id)
    with pytest.raises(ValidationFailed, match="no dead letter with id 999"):
        ch.replay_dead_letter(999)


def test_discard_and_purge_remove_only_what_they_name(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    old = bury_one(ch, clock, "old")
    clock.now += 10_000
    middle = bury_one(ch, clock, "middle")
    clock.now += 10_000
    new = bury_one(ch, clock, "new")
    ch.discard_dead_letter(middle)
    with pytest.raises(ValidationFailed, match=f"no dead letter with id {middle}"):
        ch.discard_dead_letter(middle)
    # `old` is 20.5 s old, `new` 0 s: purging what is older than 5 s leaves `new`.
    assert ch.purge_dead_letters(5) == 1
    assert [d.id for d in ch.dead_letters()] == [new]
    assert old != new
    with pytest.raises(ValidationFailed, match="older_than: must be seconds >= 0"):
        ch.purge_dead_letters(-1)


def test_dead_letter_json_keeps_the_whole_message(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    dead = ch.dead_letter(bury_one(ch, clock, "payload"))
    data = orjson.loads(orjson.dumps(dead.to_json_dict()))
    assert data["message"]["content"] == "payload" and data["retry_count"] == 0
    assert data["dead_lettered_at"].endswith("Z")


def test_leaving_cancels_unfinished_deliveries_and_frees_the_store(ch: Channels,
                                                                   clock: ManualClock) -> None:
    ch.create_channel("g", "group", "boss", ack_timeout=0.5)
    ch.join_channel("g", "worker")
    ch.join_channel("g", "other")
    handed = ch.send_message("g", "boss", "command", "one")
    waiting = ch.send_message("g", "boss", "command", "two")
    [got] = ch.receive_messages("worker", {"limit": 1})
    assert ch.get_channel("g").open_deliveries == 4
    assert ch.leave_channel("g", "worker") is True
    assert ch.get_channel("g").open_deliveries == 2  # only other's two are left
    for message in (handed, waiting):
        statuses = {d.recipient: (d.status, d.last_error) for d in ch.deliveries(message)}
        assert statuses["worker"] == ("cancelled", "the recipient left the channel")
        assert statuses["other"] == ("pending", None)
    with pytest.raises(ValidationFailed, match="was cancelled when worker left the channel"):
        ch.acknowledge_message(got, "worker", "completed")
    clock.now = T0 + 60_000  # other never received: its two run their retries out; worker's stay
    assert ch.tick().to_json_dict() == {"redelivered": 6, "dead_lettered": 2,
                                        "expired_queries": 0}
    assert [d.recipient for d in ch.dead_letters()] == ["other", "other"]
    for message in (handed, waiting):
        statuses = {d.recipient: d.status for d in ch.deliveries(message)}
        assert statuses == {"worker": "cancelled", "other": "dead_letter"}


def test_closing_a_channel_dead_letters_what_waits_and_frees_the_store(
        ch: Channels, clock: ManualClock) -> None:
    ch.limits = StoreLimits(max_active=2)
    make_pair(ch)
    handed = ch.send_message("work", "boss", "command", "one")
    waiting = ch.send_message("work", "boss", "command", "two")
    received_at(ch, clock, 0)
    ch.create_channel("other", "direct", "a")
    ch.join_channel("other", "b")
    with pytest.raises(StoreFull):
        ch.send_message("other", "a", "text", "blocked")
    ch.set_channel_state("work", "closed")
    assert ch.get_channel("work").open_deliveries == 0
    letters = {d.message.seq: d.last_error for d in ch.dead_letters()}
    assert letters == {handed.seq: "channel closed", waiting.seq: "channel closed"}
    assert {m.status for m in ch.query_messages({"channel": "work"})} == {"dead_letter"}
    ch.send_message("other", "a", "text", "now it fits")


# --- the ack timer starts at send (seed 004, stage 5) --------------------------------


def delivery_of(ch: Channels, message) -> tuple:
    [d] = ch.deliveries(message)
    return d.status, d.attempts, d.retry_count


def test_a_command_to_a_recipient_that_never_receives_retries_with_backoff_then_dead_letters(
        ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=3)
    sent = ch.send_message("work", "boss", "command", "do it")
    # Nobody calls receive. Attempt n times out 500 ms after it became
    # visible; retry n is visible 1000 * 2^(n-1) ms after that: the same
    # schedule as for a recipient that receives each attempt at once.
    for deadline, retries in ((500, 1), (2000, 2), (4500, 3)):
        clock.now = T0 + deadline - 1
        assert ch.tick().redelivered == 0
        clock.now = T0 + deadline
        assert ch.tick().redelivered == 1
        assert delivery_of(ch, sent) == ("pending", 0, retries)
    clock.now = T0 + 8999
    assert ch.tick().dead_lettered == 0
    clock.now = T0 + 9000
    assert ch.tick().dead_lettered == 1
    [dead] = ch.dead_letters()
    assert (dead.recipient, dead.retry_count, dead.last_error, dead.dead_lettered_at_ms) == (
        "worker", 3, "not acknowledged within 0.5 s", T0 + 9000)
    assert delivery_of(ch, sent) == ("dead_letter", 0, 3)
    assert dead.message.status == "dead_letter"
    assert received_at(ch, clock, 60_000) == []


def test_one_late_tick_runs_the_whole_schedule_of_an_offline_recipient(
        ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=3)
    first = ch.send_message("work", "boss", "command", "one")
    clock.now = T0 + 8999  # nobody ran tick since the send
    assert ch.tick().to_json_dict() == {"redelivered": 3, "dead_lettered": 0,
                                        "expired_queries": 0}
    assert delivery_of(ch, first) == ("pending", 0, 3)
    [got] = received_at(ch, clock, 8999)  # retry 3, visible since 8500
    assert got.retry_count == 3
    ch.acknowledge_message(got, "worker", "completed")

    second = ch.send_message("work", "boss", "command", "two")
    clock.now = T0 + 8999 + 9000
    assert ch.tick().to_json_dict() == {"redelivered": 3, "dead_lettered": 1,
                                        "expired_queries": 0}
    assert delivery_of(ch, second) == ("dead_letter", 0, 3)


def test_a_late_receiver_gets_a_message_until_it_is_dead_lettered(
        ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=1000, max_retries=3)
    sent = ch.send_message("work", "boss", "command", "do it")
    assert received_at(ch, clock, 1000) == []  # timed out at 500, retry 1 waits until 1500
    [got] = received_at(ch, clock, 1500)
    assert (got.seq, got.attempt, got.retry_count) == (sent.seq, 1, 1)
    # Handing it out restarts the timer: the receiver has a whole ack_timeout.
    clock.now = T0 + 1999
    assert ch.tick().redelivered == 0
    ch.acknowledge_message(got, "worker", "completed")
    clock.now = T0 + 600_000
    assert ch.tick().to_json_dict() == {"redelivered": 0, "dead_lettered": 0,
                                        "expired_queries": 0}
    assert delivery_of(ch, sent) == ("completed", 1, 1)


def test_a_paused_channel_holds_the_timers_of_what_waits(ch: Channels,
                                                         clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    sent = ch.send_message("work", "boss", "command", "do it")
    clock.now = T0 + 100
    ch.set_channel_state("work", "paused")
    clock.now = T0 + 60_000
    assert ch.tick().dead_lettered == 0  # nothing is handed out while paused
    ch.set_channel_state("work", "active")  # the timer runs again from the resume
    clock.now = T0 + 60_499
    assert ch.tick().dead_lettered == 0
    clock.now = T0 + 60_500
    assert ch.tick().dead_lettered == 1
    assert delivery_of(ch, sent) == ("dead_letter", 0, 0)


def test_a_retry_while_paused_waits_for_the_resume(ch: Channels, clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, retry_backoff_ms=0, max_retries=1)
    sent = ch.send_message("work", "boss", "command", "do it")
    received_at(ch, clock, 0)
    ch.set_channel_state("work", "paused")
    clock.now = T0 + 500  # the handed-out one times out: retry 1 waits, with no timer
    assert ch.tick().redelivered == 1
    clock.now = T0 + 60_000
    assert ch.tick().dead_lettered == 0
    ch.set_channel_state("work", "draining")  # delivers again: the timer runs from now
    clock.now = T0 + 60_500
    assert ch.tick().dead_lettered == 1
    assert delivery_of(ch, sent) == ("dead_letter", 1, 1)


def test_max_pending_and_at_most_once_start_no_timer_at_send(ch: Channels,
                                                             clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0, max_pending=1)
    ch.create_channel("news", "direct", "boss", delivery_mode="at_most_once")
    ch.join_channel("news", "worker")
    queued = ch.send_message("work", "boss", "command", "one")
    ch.send_message("news", "boss", "text", "fyi")
    clock.now = T0 + 60_000
    assert ch.tick().dead_lettered == 0  # max_pending: the timer starts when handed out
    assert sorted(m.content for m in ch.receive_messages("worker")) == ["fyi", "one"]
    clock.now = T0 + 60_500
    assert ch.tick().dead_lettered == 1
    assert delivery_of(ch, queued) == ("dead_letter", 1, 0)


def test_a_replayed_dead_letter_times_out_again_unreceived(ch: Channels,
                                                           clock: ManualClock) -> None:
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    sent = ch.send_message("work", "boss", "command", "do it")
    clock.now = T0 + 500
    assert ch.tick().dead_lettered == 1
    clock.now = T0 + 1000
    ch.replay_dead_letter(ch.dead_letters()[0].id)
    clock.now = T0 + 1500
    assert ch.tick().dead_lettered == 1
    assert delivery_of(ch, sent) == ("dead_letter", 0, 0)


# --- the dead-letter notice is a message on _system.message.deadletter --------------


def test_a_pubsub_subscriber_to_the_deadletter_topic_receives_the_notice(
        ch: Channels, clock: ManualClock) -> None:
    # _system does not exist yet: subscribing creates it.
    assert ch.subscribe("_system", "ops", "_system.message.deadletter") is True
    ch.subscribe("_system", "auditor", "_system.#")
    ch.subscribe("_system", "capacity-watch", "_system.store.*")
    make_pair(ch, ack_timeout=0.5, max_retries=0)
    sent = ch.send_message("work", "boss", "command", "do it")
    clock.now = T0 + 500
    assert ch.tick().dead_lettered == 1
    [dead] = ch.dead_letters()
    for agent in ("ops", "auditor"):
        [notice] = ch.receive_messages(agent)
        assert (notice.channel, notice.sender, notice.type, notice.topic) == (
            "_system", "bus", "notification", "_system.message.deadletter")
        assert notice.content == {"dead_letter": dead.id, "seq": sent.seq, "channel": "work",
                                  "recipient": "worker", "retry_count": 0,
                                  "last_error": "not acknowledged within 0.5 s"}
    assert list(ch.receive_messages("capacity-watch")) == []
    # A notice handed out is done (at_most_once): never retried, never a dead letter itself.
    clock.now = T0 + 600_000
    assert ch.tick().to_json_dict() == {"redelivered": 0, "dead_lettered": 0,
                                        "expired_queries": 0}
    assert len(ch.dead_letters()) == 1


def test_the_system_channel_belongs_to_the_bus(ch: Channels, clock: ManualClock) -> None:
    with pytest.raises(ValidationFailed, match="_system is the bus's own channel") as refused:
        ch.create_channel("_system", "group", "mallory")
    assert refused.value.field == "name"
    ch.subscribe("_system", "ops", "_system.#")
    system = ch.get_channel("_system")
    assert (system.type, system.owner, system.config.delivery_mode) == (
        "pubsub", "bus", "at_most_once")
    assert [(p.agent, p.role) for p in ch.participants("_system")] == [
        ("bus", "owner"), ("ops", "observer")]
    with pytest.raises(ValidationFailed, match="ops observes channel '_system'"):
        ch.send_message("_system", "ops", "notification", "forged",
                        topic="_system.message.deadletter")
    assert ch.subscribe("_system", "ops", "_system.#") is False
    with pytest.raises(ValidationFailed, match="_system takes observers only") as refused:
        ch.join_channel("_system", "mallory")
    assert refused.value.field == "role"
    ch.join_channel("_system", "mallory", "observer")
