"""An agent's own messages (its broadcasts, and what it sent itself) are not waiting for it: poll leaves them out (unless asked),
the counts of what waits do not count them, and acks pass them, in the library and in the
readers built on its poll (the MCP tools, `bus poll`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus import process_loop
from tests.support.properties import scaled_settings


def test_own_broadcasts_are_left_out_of_poll_and_counts_unless_asked(bus: Bus):
    bus.publish("ann", "state_change", {"to": "WORKING"})
    theirs = bus.publish("bob", "state_change", {"to": "WORKING"}).seq
    bus.publish("ann", "task_done", {"task": "t1"})
    assert [m.seq for m in bus.poll("ann")] == [theirs]
    assert [m.from_agent for m in bus.poll("ann", include_own=True)] == ["ann", "bob", "ann"]
    bus.set_cursor("ann", 0, create=True)
    assert [c.pending for c in bus.list_cursors()] == [1]  # bob's; her own two do not wait
    assert bus.ack("ann", theirs) == 3  # past ann's own task_done, the last message
    assert [c.pending for c in bus.list_cursors()] == [0]
    assert bus.ack("bob", theirs) == theirs  # ann's task_done after it waits for bob


def test_own_direct_messages_are_left_out_of_poll_counts_and_the_glance_unless_asked(bus: Bus):
    from bus.log import glance
    own = bus.publish("ann", "note", "a reminder to herself", to="ann").seq
    assert bus.poll("ann") == [] and not glance.has_waiting(bus.conn, "ann")
    assert [m.seq for m in bus.poll("ann", include_own=True)] == [own]
    theirs = bus.publish("bob", "note", "to ann", to="ann").seq
    bus.publish("ann", "note", "another to herself", to="ann")
    assert [m.seq for m in bus.poll("ann")] == [theirs]
    bus.set_cursor("ann", 0, create=True)
    assert [c.pending for c in bus.list_cursors()] == [1]
    assert bus.ack("ann", theirs) == theirs + 1  # past her own note after bob's


def test_ack_passes_only_own_broadcasts_before_the_next_waiting_message(bus: Bus):
    first = bus.publish("bob", "note", 1, to="ann").seq
    own = [bus.publish("ann", "note", n).seq for n in range(2)]
    other = bus.publish("cy", "note", 3).seq
    bus.publish("ann", "note", 4)
    assert bus.ack("ann", first) == own[-1]  # stops before cy's broadcast, which waits
    assert [m.seq for m in bus.poll("ann")] == [other]
    assert bus.ack("ann", first, include_own=True) == own[-1]  # never backwards
    fresh = Bus.open(bus.path)
    try:
        assert fresh.ack("dee", first, include_own=True) == first  # stops at the seq asked
    finally:
        fresh.close()


def test_exchange_reply_is_acked_though_own_broadcasts_came_before_it(bus: Bus):
    question = bus.publish("ann", "question", "which branch?", to="bob")
    bus.publish("ann", "state_change", {"to": "WAITING"})
    reply = bus.answer("bob", question.seq, "answer", "main")
    assert bus.ack_if_next("ann", reply.seq)  # nothing of another's waits before it
    assert bus.cursor("ann") == reply.seq


def test_process_loop_does_not_hand_an_agent_its_own_broadcasts(bus: Bus):
    seen = []
    bus.publish("worker", "started", None)
    bus.publish("planner", "task", "t1", to="worker")
    process_loop(bus, "worker", seen.append, until_idle=True)
    assert [m.type for m in seen] == ["task"]


def test_mcp_poll_tool_leaves_out_the_agents_own_broadcasts(bus: Bus):
    bus.publish("ann", "task_done", {"task": "t1"})
    bus.publish("bob", "review", "looks good", to="ann")
    done = subprocess.run([sys.executable, "-m", "bus.cli", "--db", bus.path, "mcp", "--agent",
                           "ann", "--call", "poll"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [m["type"] for m in result["messages"]] == ["review"]


AGENTS = ("ann", "bob")
# (sender, recipient or None for all): every way a message can stand towards ann
SENDS = st.tuples(st.sampled_from(AGENTS), st.sampled_from((*AGENTS, None)))


def where_ack_goes(log: list[tuple[str, str | None]], agent: str, seq: int) -> int:
    """The model: `seq`, or the last of the agent's own messages (to itself or to all)
    before the next one that waits for it (seqs are 1-based positions in `log`)."""
    waits = [n for n, (sender, to) in enumerate(log, 1)
             if n > seq and sender != agent and to in (agent, None)]
    end = waits[0] if waits else len(log) + 1
    own = [n for n, (sender, to) in enumerate(log, 1)  # what poll would show but for its sender
           if seq < n < end and sender == agent and to in (agent, None)]
    return own[-1] if own else seq


@pytest.fixture(scope="module")
def empty_bus_file(tmp_path_factory) -> Path:
    """A new bus file, migrated and closed: each example starts from a copy of it."""
    path = Path(tmp_path_factory.mktemp("empty")) / "bus.db"
    Bus.open(path, create=True).close()
    return path


@scaled_settings(max_examples=60, deadline=None)
@given(log=st.lists(SENDS, min_size=1, max_size=12), data=st.data())
def test_ack_lands_where_the_model_says(tmp_path_factory, empty_bus_file, log, data) -> None:
    """Whatever mix of own, others' and broadcast messages follows, ack (its one-statement
    path when the next message waits, or the general one) lands where the model says."""
    path = Path(tmp_path_factory.mktemp("acks")) / "bus.db"
    shutil.copy(empty_bus_file, path)
    with Bus.open(path) as bus:
        for sender, to in log:
            bus.publish(sender, "note", None, to=to)
        seq = data.draw(st.integers(1, len(log)), label="seq")
        assert bus.ack("ann", seq) == where_ack_goes(log, "ann", seq)
