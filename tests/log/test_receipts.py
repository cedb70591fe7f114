"""Delivery receipts (bus/log/receipts.py): recorded where a message is shown, acked from the
cursor, the outstanding ones for `bus status`; and the names the bus has seen
(bus/coordination/held_names.py), behind the warning for a message to an unknown agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.log import receipts
from bus.storage.db import write_transaction
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import beat
from bus.coordination.held_names import ever_seen
from bus.coordination.held_names import join_name
from bus.log.receipts import ACKED
from bus.log.receipts import DELIVERED
from bus.log.receipts import SENT
from tests.support import bad_files
from tests.support.cli_helpers import run

NOW = 1_800_000_000_000


def states(bus: Bus, *seqs: int) -> list[str | None]:
    return [None if (r := bus.receipt(seq)) is None else r.state for seq in seqs]


def test_receipt_goes_sent_delivered_acked(bus: Bus) -> None:
    question = bus.publish("ann", "question", "why?", to="bob").seq
    assert states(bus, question) == [SENT]
    assert bus.receipt(question).delivery is None
    bus.record_delivered("bob", bus.poll("bob"), "mcp:poll", session="s1")
    assert states(bus, question) == [DELIVERED]
    bus.ack("bob", question)
    receipt = bus.receipt(question)
    assert receipt.state == ACKED and receipt.delivery.via == "mcp:poll"
    assert receipt.to_json_dict() == {
        "seq": question, "id": receipt.id, "from": "ann", "to": "bob", "type": "question",
        "ts": receipt.to_json_dict()["ts"], "state": "acked", "delivered": True, "acked": True,
        "first_delivered": receipt.to_json_dict()["first_delivered"],
        "last_delivered": receipt.to_json_dict()["last_delivered"], "deliveries": 1,
        "via": "mcp:poll", "session": "s1"}


def test_only_direct_messages_to_the_agent_get_a_receipt(bus: Bus) -> None:
    to_bob = bus.publish("ann", "note", to="bob").seq
    broadcast = bus.publish("ann", "note").seq
    to_cy = bus.publish("ann", "note", to="cy").seq
    bus.record_delivered("bob", [to_bob, broadcast, to_cy], "inbox")  # seqs: filtered in SQL
    assert states(bus, to_bob, broadcast, to_cy) == [DELIVERED, None, SENT]
    assert bus.conn.execute("SELECT seq, agent FROM receipts").fetchall() == [(to_bob, "bob")]


def test_a_delivery_again_counts_keeps_the_first_time_and_says_where_it_went_last(
        bus: Bus) -> None:
    seq = bus.publish("ann", "note", to="bob").seq
    receipts.record_delivered(bus.conn, "bob", [seq], "hook:PostToolUse", "s1", now=NOW)
    receipts.record_delivered(bus.conn, "bob", [seq], "hook:Stop", "s2", now=NOW + 500)
    delivery = bus.receipt(seq).delivery
    assert (delivery.first_ms, delivery.last_ms, delivery.deliveries, delivery.via,
            delivery.session) == (NOW, NOW + 500, 2, "hook:Stop", "s2")


def test_broadcasts_alone_write_nothing(bus: Bus) -> None:
    bus.publish("ann", "note")
    version = bus.conn.execute("PRAGMA data_version").get
    changes = bus.conn.total_changes()
    bus.record_delivered("bob", bus.poll("bob"), "poll")
    assert bus.conn.total_changes() == changes
    assert bus.conn.execute("PRAGMA data_version").get == version


def test_a_receipt_is_part_of_the_callers_transaction(bus: Bus) -> None:
    seq = bus.publish("ann", "note", to="bob").seq
    with pytest.raises(RuntimeError):
        with write_transaction(bus.conn):
            bus.record_delivered("bob", [seq], "hook:Stop")
            assert states(bus, seq) == [DELIVERED]
            raise RuntimeError("the hook's output failed")
    assert states(bus, seq) == [SENT]


@pytest.mark.parametrize("via, session", [("", None), ("Hook", None), ("a b", None),
                                          ("x" * 65, None), ("poll", "s" * 201)])
def test_bad_via_or_session_is_refused_and_writes_nothing(bus: Bus, via: str,
                                                          session: str | None) -> None:
    seq = bus.publish("ann", "note", to="bob").seq
    with pytest.raises(ValidationFailed) as refused:
        bus.record_delivered("bob", [seq], via, session)
    assert refused.value.field == ("via" if session is None else "session")
    assert states(bus, seq) == [SENT]


def test_a_read_only_bus_shows_messages_without_receipts(tmp_path: Path) -> None:
    db = tmp_path / "ro" / "bus.db"
    db.parent.mkdir()
    with Bus.open(db) as writer:
        seq = writer.publish("ann", "note", to="bob").seq
    with bad_files.read_only_directory(db.parent), Bus.open(db) as reader:
        found = reader.poll("bob")
        reader.record_delivered("bob", found, "poll")  # nothing raised
        assert [m.seq for m in found] == [seq]
        assert states(reader, seq) == [SENT]


def test_compaction_takes_the_receipt_with_its_message(bus: Bus) -> None:
    first = bus.publish("ann", "note", to="bob").seq
    bus.publish("ann", "note", to="bob")
    bus.record_delivered("bob", bus.poll("bob"), "poll")
    bus.ack("bob", first)
    bus.compact(0, now=NOW * 2)
    assert bus.conn.execute("SELECT seq FROM receipts").fetchall() == [(first + 1,)]


def test_outstanding_counts_and_lists_the_oldest_not_acked(bus: Bus) -> None:
    seqs = [bus.publish("ann", "note", to=to).seq for to in ("bob", "cy", "bob", "dan", "cy")]
    bus.publish("ann", "note")  # a broadcast has no receipt
    bus.channels.create_channel("room", "group", "ann")
    bus.channels.join_channel("room", "bob")
    bus.channels.send_message("room", "ann", "text", "hi")  # a channel has its deliveries
    bus.record_delivered("bob", bus.poll("bob"), "poll")
    bus.ack("cy", seqs[1])
    found = receipts.outstanding(bus.conn, limit=3)
    assert (found.not_delivered, found.delivered_not_acked) == (2, 2)
    assert [(r.seq, r.to_agent, r.state) for r in found.oldest] == [
        (seqs[0], "bob", DELIVERED), (seqs[2], "bob", DELIVERED), (seqs[3], "dan", SENT)]


@given(st.lists(st.tuples(st.sampled_from(["publish", "deliver", "ack"]),
                          st.sampled_from(["a", "b", None])), max_size=30))
def test_receipts_match_a_model(tmp_path_factory, steps) -> None:
    """state = acked when the recipient's cursor reached it, else delivered when a poll of
    the recipient was shown it, else sent; outstanding counts the unacked ones."""
    path = tmp_path_factory.mktemp("model") / "bus.db"
    sent: list[str | None] = []
    delivered: set[int] = set()
    cursor: dict[str, int] = {}
    with Bus.open(path) as bus:
        for action, agent in steps:
            if action == "publish":
                sent.append(agent)
                bus.publish("p", "t", to=agent)
            elif agent is not None and action == "deliver":
                shown = bus.poll(agent, limit=3)
                bus.record_delivered(agent, shown, "poll")
                delivered |= {m.seq for m in shown if m.to_agent == agent}
            elif agent is not None and sent:
                cursor[agent] = bus.ack(agent, len(sent))
        for seq, to in enumerate(sent, start=1):
            expected = (None if to is None else ACKED if cursor.get(to, 0) >= seq
                        else DELIVERED if seq in delivered else SENT)
            assert states(bus, seq) == [expected]
        found = receipts.outstanding(bus.conn, limit=len(sent) + 1)
    waiting = [seq for seq, to in enumerate(sent, start=1)
               if to is not None and cursor.get(to, 0) < seq]
    assert [r.seq for r in found.oldest] == waiting
    assert found.delivered_not_acked == len(set(waiting) & delivered)
    assert found.not_delivered == len(set(waiting) - delivered)


# --- names the bus has seen ----------------------------------------------------------


@pytest.mark.parametrize("trace", ["heartbeat", "cursor", "worker", "joined", "delivery",
                                   "token", "message from it"])
def test_any_trace_of_an_agent_makes_its_name_known(bus: Bus, trace: str) -> None:
    assert not ever_seen(bus.conn, "bob")
    assert bus.recipient_warning("bob").startswith("no agent named 'bob' is known")
    if trace == "heartbeat":
        beat(bus.conn, "bob", "idle", None, None)
    elif trace == "cursor":
        bus.ack("bob", bus.publish("ann", "note").seq)
    elif trace == "joined":
        join_name(bus.conn, "bob")
    elif trace == "delivery":
        bus.record_delivered("bob", bus.poll("bob") or [bus.publish("ann", "n", to="bob").seq],
                             "inbox")
    elif trace == "token":
        bus.tokens.create("bob")
    elif trace == "worker":  # the row `worker spawn` writes (workers/ sits above bus/)
        bus.conn.execute("INSERT INTO workers (worker_id, task_id, state, repo, base, branch,"
                         " worktree, created_at_ms, updated_at_ms) VALUES ('bob', 't1',"
                         " 'ASSIGNED', '/r', 'main', 'bob/t1', '/r/w', 1, 1)")
    else:
        bus.publish("bob", "note")
    assert ever_seen(bus.conn, "bob")
    assert bus.recipient_warning("bob") is None
    assert bus.recipient_warning(None) is None  # a broadcast names nobody


def test_a_message_to_a_name_does_not_make_it_known(bus: Bus) -> None:
    bus.publish("ann", "note", to="bobb")
    assert not ever_seen(bus.conn, "bobb") and ever_seen(bus.conn, "ann")


def test_bus_inbox_records_what_it_prints_for_the_agent(bus: Bus, db_path: Path) -> None:
    direct = bus.publish("ann", "note", "for bob", to="bob").seq
    broadcast = bus.publish("ann", "note", "for all").seq
    shown = run(["inbox", "--agent", "bob"], db_path)
    assert shown.exit_code == 0 and "for bob" in shown.stdout
    receipt = bus.receipt(direct)
    assert (receipt.state, receipt.delivery.via) == (DELIVERED, "inbox")
    assert bus.receipt(broadcast) is None
    run(["inbox", "--agent", "bob", "--ack"], db_path)
    receipt = bus.receipt(direct)
    assert (receipt.state, receipt.delivery.deliveries) == (ACKED, 2)
