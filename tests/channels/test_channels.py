"""The message engine through its Python API (seed 004): the seed's three
workflows, the send pipeline's checks, routing per channel type, filters and
their indexes, channel states and the store's backpressure."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus import Bus
from bus.channels.engine import Channels
from bus.channels.engine import StoreLimits
from bus.storage.errors import StoreCapacity
from bus.storage.errors import StoreFull
from bus.storage.errors import UnknownChannel
from bus.storage.errors import ValidationFailed
from tests.conftest import ManualClock


@pytest.fixture
def ch(bus: Bus, clock: ManualClock) -> Channels:
    return Channels(bus, clock=clock)


def row_counts(bus: Bus) -> tuple[int, ...]:
    return tuple(bus.conn.execute(f"SELECT count(*) FROM {table}").get for table in (
        "messages", "channel_messages", "deliveries", "dedup", "dead_letters"))


# --- the seed's workflows --------------------------------------------------------


def test_workflow_one_to_one_task_delegation(ch: Channels) -> None:
    ch.create_channel("planner-executor", "direct", "agent-planner")
    ch.join_channel("planner-executor", "agent-executor")
    sent = ch.send_message("planner-executor", "agent-planner", "command",
                           "Deploy the authentication service to staging")
    got = ch.receive_messages("agent-executor")
    assert [m.content for m in got] == ["Deploy the authentication service to staging"]
    assert (got[0].seq, got[0].sender, got[0].type, got[0].attempt) == (
        sent.seq, "agent-planner", "command", 1)
    assert ch.acknowledge_message(got[0], "agent-executor", "received") == "received"
    assert ch.acknowledge_message(got[0], "agent-executor", "completed",
                                  "Deployed successfully. Health check passing.") == "completed"
    [delivery] = ch.deliveries(sent)
    assert (delivery.recipient, delivery.status, delivery.note) == (
        "agent-executor", "completed", "Deployed successfully. Health check passing.")
    assert ch.query_messages().messages[0].status == "acknowledged"
    assert ch.receive_messages("agent-planner").total_count == 0  # not to the sender


def test_workflow_pub_sub_event_notification(ch: Channels) -> None:
    ch.create_channel("ci-events", "pubsub", "ci-agent")
    ch.subscribe("ci-events", "deploy-agent", "build.*.success")
    ch.subscribe("ci-events", "monitor-agent", "deploy.#")
    ch.subscribe("ci-events", "alert-agent", "*.failure")
    ch.publish("ci-events", "ci-agent", "build.frontend.success",
               "Frontend build completed: 847 tests passed, bundle size 2.1 MB")
    assert len(ch.receive_messages("deploy-agent")) == 1
    assert len(ch.receive_messages("alert-agent")) == 0
    assert len(ch.receive_messages("monitor-agent")) == 0
    ch.publish("ci-events", "ci-agent", "deploy.staging.done", "staging is up")
    [event] = ch.receive_messages("monitor-agent")
    assert (event.topic, event.type, event.content) == (
        "deploy.staging.done", "event", "staging is up")


def test_workflow_threaded_conversation(ch: Channels) -> None:
    ch.create_channel("discussion", "group", "agent-lead")
    ch.join_channel("discussion", "agent-researcher")
    ch.join_channel("discussion", "agent-reviewer")
    query = ch.send_query("discussion", "agent-lead",
                          "What is the recommended connection pool size?", timeout=30)
    ch.send_response("discussion", "agent-researcher", query.correlation_id, "20 connections.")
    ch.send_response("discussion", "agent-reviewer", query.correlation_id, "Consider PgBouncer.")
    thread = ch.get_thread(query.correlation_id)
    assert [(m.sender, m.type) for m in thread] == [
        ("agent-lead", "query"), ("agent-researcher", "response"), ("agent-reviewer", "response")]
    assert all(m.in_reply_to == query.id for m in thread[1:])
    # Everyone else in the group hears each message: the lead gets both responses.
    assert [m.sender for m in ch.receive_messages("agent-lead")] == [
        "agent-researcher", "agent-reviewer"]


# --- the send pipeline refuses and writes nothing ---------------------------------


@pytest.fixture
def populated(ch: Channels) -> Channels:
    ch.create_channel("team", "group", "lead", max_message_size=64)
    ch.join_channel("team", "dev")
    ch.join_channel("team", "watcher", role="observer")
    ch.create_channel("news", "broadcast", "editor")
    ch.join_channel("news", "reader")
    ch.create_channel("events", "pubsub", "ci")
    ch.create_channel("held", "group", "lead")
    ch.set_channel_state("held", "paused")
    return ch


@pytest.mark.parametrize("call,field,reason", [
    (lambda c: c.send_message("team", "bad id", "text", "x"), "sender", "contains ' '"),
    (lambda c: c.send_message("team", "lead", "shout", "x"), "type", "'shout' is not one of"),
    (lambda c: c.send_message("team", "lead", "text", ""), "content", "must not be empty"),
    (lambda c: c.send_message("team", "lead", "text", "x" * 65), "content",
     "exceeds channel max_message_size (64 bytes)"),
    (lambda c: c.send_message("team", "lead", "text", "x", priority=5), "priority",
     "must be an integer 0-4"),
    (lambda c: c.send_message("team", "stranger", "text", "x"), "sender",
     "not a participant of channel 'team'"),
    (lambda c: c.send_message("team", "watcher", "text", "x"), "sender", "observes"),
    (lambda c: c.send_message("news", "reader", "text", "x"), "sender",
     "only the owner (editor)"),
    (lambda c: c.send_message("held", "lead", "text", "x"), "channel", "is paused"),
    (lambda c: c.send_message("events", "ci", "event", "x"), "topic", "needs a topic"),
    (lambda c: c.send_response("team", "dev", "no-such-query", "x"), "correlation_id",
     "no query with correlation_id 'no-such-query'"),
    (lambda c: c.send_message("team", "dev", "acknowledgment", "x", correlation_id="c1"),
     "correlation_id", "no command with correlation_id 'c1'"),
    (lambda c: c.send_message("team", "dev", "response", "x"), "correlation_id",
     "needs the correlation_id of the query"),
    (lambda c: c.send_message("team", "lead", "text", "x", topic="a.*"), "topic", "segment '*'"),
])
def test_send_refusals_name_the_field_and_write_nothing(populated: Channels, bus: Bus,
                                                        call, field: str, reason: str) -> None:
    before = row_counts(bus)
    with pytest.raises(ValidationFailed) as caught:
        call(populated)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert row_counts(bus) == before


def test_oversized_content_reports_its_length(populated: Channels) -> None:
    with pytest.raises(ValidationFailed) as caught:
        populated.send_message("team", "lead", "text", "é" * 40)  # 80 bytes in UTF-8
    assert caught.value.details == {"value_length": 80}


def test_max_message_size_counts_the_texts_utf8_bytes_not_its_json(ch: Channels) -> None:
    ch.create_channel("small", "group", "a", max_message_size=10)
    ch.join_channel("small", "b")
    ch.send_message("small", "a", "text", "0123456789")  # 10 bytes: at the limit
    ch.send_message("small", "a", "text", "\n" * 10)  # escaped to 22 bytes of JSON
    with pytest.raises(ValidationFailed) as caught:
        ch.send_message("small", "a", "text", "é" * 6)  # 12 bytes
    assert caught.value.details == {"value_length": 12}
    with pytest.raises(ValidationFailed):
        ch.send_message("small", "a", "event", {"k": "0123"})  # a dict counts as its JSON


def test_send_to_an_unknown_channel_raises_unknown_channel(ch: Channels, bus: Bus) -> None:
    with pytest.raises(UnknownChannel, match="no channel named 'nope'"):
        ch.send_message("nope", "a", "text", "x")
    assert row_counts(bus) == (0, 0, 0, 0, 0)


def test_channel_settings_are_validated(ch: Channels) -> None:
    with pytest.raises(ValidationFailed, match="delivery_mode: 'twice' is not one of"):
        ch.create_channel("c", "group", "o", delivery_mode="twice")
    with pytest.raises(ValidationFailed, match="colour: unknown channel setting"):
        ch.create_channel("c", "group", "o", colour="red")
    with pytest.raises(ValidationFailed, match="type: 'mesh' is not one of direct, group"):
        ch.create_channel("c", "mesh", "o")
    ch.create_channel("c", "group", "o")
    with pytest.raises(ValidationFailed, match="a channel named 'c' exists already"):
        ch.create_channel("c", "group", "o")


# --- routing ----------------------------------------------------------------------


def recipients(ch: Channels, message) -> list[str]:
    return [d.recipient for d in ch.deliveries(message)]


def test_direct_channel_takes_two_participants(ch: Channels) -> None:
    ch.create_channel("dm", "direct", "a")
    ch.join_channel("dm", "b")
    with pytest.raises(ValidationFailed, match="has its two participants already"):
        ch.join_channel("dm", "c")
    assert recipients(ch, ch.send_message("dm", "b", "text", "hi")) == ["a"]


def test_group_routes_to_all_but_the_sender_unless_echo(ch: Channels) -> None:
    ch.create_channel("g", "group", "a")
    ch.create_channel("e", "group", "a", echo=True)
    for name in ("g", "e"):
        ch.join_channel(name, "b")
        ch.join_channel(name, "c", role="observer")
    assert recipients(ch, ch.send_message("g", "b", "text", "x")) == ["a", "c"]
    assert recipients(ch, ch.send_message("e", "b", "text", "x")) == ["a", "b", "c"]


def test_broadcast_reaches_members_and_observers_not_the_owner(ch: Channels) -> None:
    ch.create_channel("news", "broadcast", "editor")
    ch.join_channel("news", "m")
    ch.join_channel("news", "o", role="observer")
    assert recipients(ch, ch.send_message("news", "editor", "notification", "x")) == ["m", "o"]


def test_pubsub_delivers_once_per_subscriber_with_overlapping_patterns(ch: Channels) -> None:
    ch.create_channel("ps", "pubsub", "pub")
    for pattern in ("build.#", "build.*.ok", "build.web.ok"):
        ch.subscribe("ps", "s1", pattern)
    ch.subscribe("ps", "s2", "deploy.#")
    ch.subscribe("ps", "pub", "#")  # the publisher's own subscription: no echo
    assert recipients(ch, ch.publish("ps", "pub", "build.web.ok", "x")) == ["s1"]


def test_subscription_changes_reach_a_cached_topic_index(ch: Channels, bus: Bus,
                                                         clock: ManualClock) -> None:
    other = Channels(bus, clock=clock)  # a second process's view, with its own cache
    ch.create_channel("ps", "pubsub", "pub")
    ch.subscribe("ps", "s1", "a.#")
    assert recipients(other, other.publish("ps", "pub", "a.b", "x")) == ["s1"]
    ch.subscribe("ps", "s2", "a.*")
    ch.unsubscribe("ps", "s1", "a.#")
    assert recipients(other, other.publish("ps", "pub", "a.b", "x")) == ["s2"]


def test_leave_drops_subscriptions_and_the_owner_cannot_leave(ch: Channels) -> None:
    ch.create_channel("ps", "pubsub", "pub")
    ch.subscribe("ps", "s1", "a.#")
    assert ch.leave_channel("ps", "s1") is True
    assert ch.subscriptions("ps") == []
    assert ch.leave_channel("ps", "s1") is False
    with pytest.raises(ValidationFailed, match="owns channel 'ps' and cannot leave"):
        ch.leave_channel("ps", "pub")


def test_subscribe_needs_a_pubsub_channel(ch: Channels) -> None:
    ch.create_channel("g", "group", "a")
    with pytest.raises(ValidationFailed, match="topic subscriptions need a pubsub channel"):
        ch.subscribe("g", "b", "x.#")


# --- channel states ---------------------------------------------------------------------


def test_paused_holds_deliveries_and_draining_delivers_without_new_sends(ch: Channels) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    ch.send_message("g", "a", "text", "one")
    ch.set_channel_state("g", "paused")
    assert ch.receive_messages("b").total_count == 0
    ch.set_channel_state("g", "draining")
    with pytest.raises(ValidationFailed, match="is draining; it accepts messages only while"):
        ch.send_message("g", "a", "text", "two")
    assert [m.content for m in ch.receive_messages("b")] == ["one"]
    ch.set_channel_state("g", "closed")
    with pytest.raises(ValidationFailed, match="a closed channel cannot be reopened"):
        ch.set_channel_state("g", "active")


# --- receive filters ------------------------------------------------------------------------


@pytest.fixture
def history(ch: Channels, clock: ManualClock) -> Channels:
    ch.create_channel("g", "group", "a")
    ch.create_channel("h", "group", "a")
    ch.create_channel("ps", "pubsub", "a")
    for name in ("g", "h"):
        ch.join_channel(name, "b")
        ch.join_channel(name, "r")
    ch.subscribe("ps", "r", "#")
    sends = [("g", "a", "text", "alpha", None, 2), ("g", "b", "command", "beta", None, 4),
             ("h", "a", "text", "gamma", None, 0), ("ps", "a", "event", "delta", "build.web.ok", 3),
             ("ps", "a", "event", "epsilon", "deploy.prod", 1)]
    for channel, sender, type_, content, topic, priority in sends:
        clock.now += 1000
        ch.send_message(channel, sender, type_, content, topic=topic, priority=priority)
    return ch


@pytest.mark.parametrize("flt,expected", [
    ({}, ["alpha", "beta", "gamma", "delta", "epsilon"]),
    ({"channel": "g"}, ["alpha", "beta"]),
    ({"sender": "b"}, ["beta"]),
    ({"types": ["text", "event"]}, ["alpha", "gamma", "delta", "epsilon"]),
    ({"topic": "build.web.ok"}, ["delta"]),
    ({"topic": "*.prod"}, ["epsilon"]),
    ({"topic": "#"}, ["delta", "epsilon"]),
    ({"content_pattern": "^(al|ga)"}, ["alpha", "gamma"]),
    ({"after_ms": 1_700_000_002_000, "before_ms": 1_700_000_004_000}, ["beta", "gamma"]),
    ({"sort_by": "priority", "sort_order": "desc"}, ["beta", "delta", "alpha", "epsilon", "gamma"]),
    ({"sort_order": "desc", "limit": 2}, ["epsilon", "delta"]),
    ({"limit": 2, "offset": 1}, ["beta", "gamma"]),
    ({"status": ["sent"], "channel": "h"}, ["gamma"]),
])
def test_receive_filters(history: Channels, flt: dict, expected: list[str]) -> None:
    result = history.receive_messages("r", flt)
    assert [m.content for m in result] == expected


def test_receive_counts_only_when_asked(history: Channels) -> None:
    statements = traced_selects(history.bus.conn, lambda: history.receive_messages("r"))
    assert not [sql for sql, _b in statements if sql.startswith("SELECT count(*)")]


def test_receive_reports_total_count_and_has_more(history: Channels) -> None:
    page = history.receive_messages("r", {"limit": 2})
    assert (len(page), page.total_count, page.has_more) == (2, 5, True)
    rest = history.receive_messages("r", {"limit": 10})  # the first two are handed out now
    assert (len(rest), rest.total_count, rest.has_more) == (3, 3, False)


def test_query_messages_sees_every_channel_newest_first(history: Channels) -> None:
    result = history.query_messages({"limit": 3})
    assert [m.content for m in result] == ["epsilon", "delta", "gamma"]
    assert (result.total_count, result.has_more) == (5, True)
    assert history.query_messages({"status": ["sent"]}).total_count == 5


def test_priority_ordering_puts_higher_priorities_first(ch: Channels) -> None:
    ch.create_channel("p", "group", "a", priority_ordering=True)
    ch.join_channel("p", "b")
    for content, priority in (("low", 0), ("urgent", 4), ("normal", 2), ("urgent2", 4)):
        ch.send_message("p", "a", "text", content, priority=priority)
    assert [m.content for m in ch.receive_messages("b")] == ["urgent", "urgent2", "normal", "low"]


def test_sorting_by_priority_keeps_each_priority_fifo(ch: Channels) -> None:
    ch.create_channel("p", "group", "a")
    ch.join_channel("p", "b")
    for content, priority in (("n1", 2), ("u1", 4), ("n2", 2), ("u2", 4), ("n3", 2)):
        ch.send_message("p", "a", "text", content, priority=priority)
    newest_priority_first = ch.query_messages({"sort_by": "priority"})
    assert [m.content for m in newest_priority_first] == ["u1", "u2", "n1", "n2", "n3"]
    lowest_first = ch.query_messages({"sort_by": "priority", "sort_order": "asc"})
    assert [m.content for m in lowest_first] == ["n1", "n2", "n3", "u1", "u2"]


@pytest.mark.parametrize("flt,field", [
    ({"types": ["nope"]}, "filter.types"), ({"status": ["lost"]}, "filter.status"),
    ({"sort_by": "colour"}, "filter.sort_by"), ({"sort_order": "up"}, "filter.sort_order"),
    ({"limit": 0}, "filter.limit"), ({"offset": -1}, "filter.offset"),
    ({"content_pattern": "("}, "filter.content_pattern"), ({"topic": "a.#.b"}, "filter.topic"),
    ({"colour": 1}, "filter.colour"), ({"after_ms": "yesterday"}, "filter.after_ms"),
])
def test_bad_filters_name_the_field(ch: Channels, flt: dict, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        ch.receive_messages("r", flt)
    assert caught.value.field == field


@pytest.mark.parametrize("flt", [
    {"channel": "g"}, {"sender": "b"}, {"topic": "build.web.ok"}, {"correlation_id": "c"},
])
def test_filters_use_an_index_not_a_table_scan(history: Channels, bus: Bus, flt: dict) -> None:
    from bus.channels.queries import FROM_SQL
    from bus.channels.queries import MessageFilter
    from bus.channels.queries import filter_sql
    clauses, params = filter_sql(MessageFilter.coerce(flt))
    plan = [row[3] for row in history.bus.conn.execute(
        "EXPLAIN QUERY PLAN SELECT cm.seq" + FROM_SQL + " WHERE " + " AND ".join(clauses),
        params)]
    assert not [step for step in plan if step.startswith("SCAN")], plan


def traced_selects(conn, action) -> list[tuple[str, object]]:
    """The SELECT statements (with bindings) that `action` ran on `conn`."""
    seen: list[tuple[str, object]] = []

    def tracer(_cursor, sql: str, bindings) -> bool:
        if sql.lstrip().upper().startswith("SELECT"):
            seen.append((sql, bindings))
        return True

    conn.exec_trace = tracer
    try:
        action()
    finally:
        conn.exec_trace = None
    return seen


def test_receive_reads_the_pending_index_in_order_whatever_the_backlog(
        history: Channels) -> None:
    conn = history.bus.conn
    statements = traced_selects(
        conn, lambda: history.receive_messages("r", {"limit": 1}).total_count)
    assert statements
    for sql, bindings in statements:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]
        table_scans = [step for step in plan
                       if step.startswith("SCAN") and "json_each" not in step]
        assert not table_scans and not [s for s in plan if "TEMP B-TREE" in s], (sql, plan)
    [count_plan] = [[row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, b)]
                    for sql, b in statements if sql.startswith("SELECT count(*) FROM deliveries")]
    assert "SEARCH d USING COVERING INDEX idx_deliveries_pending (recipient=?)" in count_plan


@pytest.mark.parametrize("flt, first_step", [
    ({"types": ["command"]}, "SCAN cm"),  # seq order, stopping at the limit: types are few
    ({"sender": "b"}, "SEARCH cm USING INDEX idx_channel_messages_sender (sender=?)"),
    ({"types": ["command"], "sender": "b"},
     "SEARCH cm USING INDEX idx_channel_messages_sender (sender=?)"),
])
def test_query_by_type_and_sender_reads_in_order_without_sorting(
        history: Channels, flt: dict, first_step: str) -> None:
    """`bus channel query --type/--sender` (the messages table has no type index since
    migration 8: these filters read channel_messages)."""
    conn = history.bus.conn
    statements = traced_selects(conn, lambda: history.query_messages({**flt, "limit": 5}).messages)
    assert statements
    for sql, bindings in statements:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]
        assert plan[0] == first_step, plan
        assert not [step for step in plan if "TEMP B-TREE" in step], plan


# --- content ----------------------------------------------------------------------------------


def test_large_content_goes_to_the_blob_store_and_comes_back(ch: Channels, bus: Bus) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    big = "x" * 10_000
    ch.send_message("g", "a", "text", big)
    assert bus.conn.execute("SELECT payload IS NULL AND payload_ref IS NOT NULL"
                            " FROM messages").get == 1
    [got] = ch.receive_messages("b", {"content_pattern": "^x+$"})
    assert got.content == big and got.content_error is None


def test_json_content_round_trips(ch: Channels) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    ch.send_message("g", "a", "command", {"task": "t1", "files": ["a.py"]})
    assert ch.receive_messages("b")[0].content == {"task": "t1", "files": ["a.py"]}


def test_channel_messages_are_bus_messages_that_poll_never_returns(ch: Channels,
                                                                   bus: Bus) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    sent = ch.send_message("g", "a", "text", "hello")
    [row] = bus.last_messages(1)
    assert (row.seq, row.to_agent, row.from_agent, row.payload) == (sent.seq, "#g", "a", "hello")
    assert bus.poll("b") == [] and bus.poll("a") == []


def test_query_timeout_marks_an_unanswered_query_expired(ch: Channels, clock: ManualClock) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    unanswered = ch.send_query("g", "a", "anyone?", timeout=5)
    answered = ch.send_query("g", "a", "and you?", timeout=5)
    ch.send_response("g", "b", answered.correlation_id, "yes")
    clock.now += 4999
    assert ch.tick().expired_queries == 0
    clock.now += 1
    assert ch.tick().expired_queries == 1
    statuses = {m.seq: m.status for m in ch.query_messages({"types": ["query"]})}
    assert statuses[unanswered.seq] == "expired" and statuses[answered.seq] != "expired"


# --- backpressure -------------------------------------------------------------------------------


def test_max_pending_pauses_delivery_but_accepts_sends(ch: Channels) -> None:
    ch.create_channel("slow", "group", "a", max_pending=2)
    ch.join_channel("slow", "b")
    for i in range(5):
        ch.send_message("slow", "a", "text", f"m{i}")
    first = ch.receive_messages("b")
    assert [m.content for m in first] == ["m0", "m1"]
    assert ch.receive_messages("b").total_count == 0  # held while two are unacknowledged
    ch.acknowledge_message(first[0], "b", "completed")
    assert [m.content for m in ch.receive_messages("b")] == ["m2"]
    ch.acknowledge_message(first[1], "b", "received")  # still in flight
    assert len(ch.receive_messages("b")) == 0


def test_store_full_refuses_sends_until_deliveries_finish(ch: Channels, bus: Bus) -> None:
    ch.limits = StoreLimits(max_active=3)
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    ch.join_channel("g", "c")
    ch.send_message("g", "a", "text", "one")  # two deliveries
    before = row_counts(bus)
    with pytest.raises(StoreFull) as caught:
        ch.send_message("g", "a", "text", "two")
    assert (caught.value.active, caught.value.limit) == (2, 3)
    assert row_counts(bus) == before
    for agent in ("b", "c"):
        [m] = ch.receive_messages(agent)
        ch.acknowledge_message(m, agent, "completed")
    ch.send_message("g", "a", "text", "two")


def test_store_capacity_refuses_sends_near_the_file_limit(ch: Channels, bus: Bus) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    size = bus.conn.execute("SELECT page_count * page_size FROM pragma_page_count,"
                            " pragma_page_size").get
    ch.limits = StoreLimits(max_file_bytes=size + 1000, reserve_bytes=2000)
    with pytest.raises(StoreCapacity, match="within 2000 bytes of its"):
        ch.send_message("g", "a", "text", "x")


def test_near_the_file_limit_a_send_succeeds_and_warns_once_a_minute(
        ch: Channels, bus: Bus, clock: ManualClock) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    size = bus.conn.execute("SELECT page_count * page_size FROM pragma_page_count,"
                            " pragma_page_size").get
    ch.limits = StoreLimits(max_file_bytes=size + 50_000, reserve_bytes=1_000,
                            warn_bytes=100_000)

    def warnings() -> list:
        return [m for m in bus.last_messages(50) if m.type == "_system.store.capacity"]

    ch.send_message("g", "a", "text", "one")
    [warning] = warnings()
    assert warning.from_agent == "bus" and warning.to_agent is None
    assert warning.payload["max_file_bytes"] == size + 50_000
    assert warning.payload["refused_above"] == size + 49_000
    clock.now += 59_999
    ch.send_message("g", "a", "text", "two")
    assert len(warnings()) == 1
    clock.now += 1
    ch.send_message("g", "a", "text", "three")
    assert len(warnings()) == 2


def test_batch_commits_several_sends_together(ch: Channels, bus: Bus, db_path: Path) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    with Bus.open(db_path) as other:
        with ch.batch():
            ch.send_message("g", "a", "text", "one")
            ch.send_message("g", "a", "text", "two")
            assert other.channels.query_messages().total_count == 0  # not committed yet
        assert other.channels.query_messages().total_count == 2
    with pytest.raises(ValidationFailed):
        with ch.batch():
            ch.send_message("g", "a", "text", "three")
            ch.send_message("g", "a", "text", "")
    assert ch.query_messages().total_count == 2  # the failed batch wrote nothing


def test_compact_keeps_channel_messages_with_unfinished_deliveries(ch: Channels,
                                                                   bus: Bus) -> None:
    ch.create_channel("g", "group", "a")
    ch.join_channel("g", "b")
    done = ch.send_message("g", "a", "text", "done")
    ch.send_message("g", "a", "text", "waiting")
    [first, _second] = ch.receive_messages("b")
    ch.acknowledge_message(first, "b", "completed")
    bus.ack("b", done.seq + 1)  # every cursor is past both
    report = bus.compact(0, now=ch.clock() + 1)
    assert report.messages == 1
    assert [m.content for m in ch.query_messages()] == ["waiting"]


# --- fan-out to many recipients (seed 004, "Broadcast Fan-out") --------------------------


def join_many(ch: Channels, channel: str, agents: list[str]) -> None:
    with ch.batch():
        for agent in agents:
            ch.join_channel(channel, agent)


def statements_of(bus: Bus, action) -> list[str]:
    """The SQL statements `action` runs on the bus's connection (an apsw exec tracer)."""
    seen: list[str] = []

    def trace(_cursor, sql: str, _bindings) -> bool:
        seen.append(sql)
        return True

    bus.conn.exec_trace = trace
    try:
        action()
    finally:
        bus.conn.exec_trace = None
    return seen


def test_fan_out_to_5000_recipients_is_batched_and_each_gets_it_once(ch: Channels,
                                                                    bus: Bus) -> None:
    agents = [f"agent-{n:04d}" for n in range(5000)]
    ch.create_channel("all-hands", "broadcast", "boss")
    join_many(ch, "all-hands", agents)
    sent: list = []
    statements = statements_of(bus, lambda: sent.append(
        ch.send_message("all-hands", "boss", "notification", "standup in 5")))
    inserts = [sql for sql in statements if sql.startswith("INSERT INTO deliveries")]
    assert len(inserts) == 5  # batches of 1,000 recipients, not 5,000 statements
    assert len(statements) < 30
    seq = sent[0].seq
    assert bus.conn.execute(
        "SELECT count(*), count(DISTINCT recipient), min(status), max(status) FROM deliveries"
        " WHERE seq = ?", (seq,)).fetchone() == (5000, 5000, "pending", "pending")
    assert [r for (r,) in bus.conn.execute(
        "SELECT recipient FROM deliveries WHERE seq = ? ORDER BY recipient", (seq,))] == agents
    assert ch.get_channel("all-hands").open_deliveries == 5000
    for agent in ("agent-0000", "agent-2500", "agent-4999"):
        assert [m.seq for m in ch.receive_messages(agent)] == [seq]
        assert list(ch.receive_messages(agent)) == []


def test_batched_fan_out_keeps_exactly_once_duplicates_per_recipient(ch: Channels,
                                                                    bus: Bus) -> None:
    first = [f"old-{n:04d}" for n in range(1500)]
    later = [f"new-{n:04d}" for n in range(1000)]
    ch.create_channel("all-hands", "broadcast", "boss", delivery_mode="exactly_once")
    join_many(ch, "all-hands", first)
    ch.send_message("all-hands", "boss", "command", "v1", correlation_id="deploy-42")
    join_many(ch, "all-hands", later)
    again: list = []
    statements = statements_of(bus, lambda: again.append(
        ch.send_message("all-hands", "boss", "command", "v1 again", correlation_id="deploy-42")))
    # Three batches: the 1,000 new recipients, then the old ones, all duplicates.
    assert len([sql for sql in statements if sql.startswith("INSERT INTO deliveries")]) == 3
    statuses = dict(bus.conn.execute(
        "SELECT status, count(*) FROM deliveries WHERE seq = ? GROUP BY status", (again[0].seq,)))
    assert statuses == {"duplicate": 1500, "pending": 1000}  # the new ones had not had it
    assert bus.conn.execute("SELECT count(*) FROM dedup WHERE correlation_id = 'deploy-42'"
                            ).get == 2500
    assert [m.content for m in ch.receive_messages("old-0000")] == ["v1"]
    assert [m.content for m in ch.receive_messages("new-0999")] == ["v1 again"]
