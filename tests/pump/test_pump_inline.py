"""Inline listeners (bus/pump/inline.py): answered in the transaction that routes.

A running pump answers a client's request to an `inline: true` listener in
the transaction that takes it from the inbox: no work unit, no lease. What
waited before the pump started, what the pump writes itself and a listener
that overran its timeout take the leased path. Crash tests are in
tests/pump/test_pump_processes.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage.db import write_transaction
from bus.storage.errors import OrganismInvalid
from bus.storage.errors import ValidationFailed
from bus.pump import Pump
from bus.pump import client
from bus.pump import commit
from bus.pump import threads
from bus.pump import work
from bus.pump.envelopes import derived_id
from bus.pump.organism import INLINE_DEFAULT_TIMEOUT_S
from bus.pump.organism import load_organism
from bus.pump.organism import parse_organism
from tests.support import pump_tools
from tests.support.cli_helpers import run
from tests.support.properties import scaled_settings

ECHO = """\
  - name: echo
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:echo_inline
    inline: true
    timeout: 0.2
"""
COUNTER = pump_tools.counter_listeners(inline=True)


def write_organism(directory: Path, listeners: str = ECHO) -> Path:
    path = directory / "organism.yaml"
    path.write_text(f"name: org\nlisteners:\n{listeners}")
    return path


class Running:
    """A pump running in a thread until the test ends; `answered` counts settled units."""

    def __init__(self, bus: Bus, organism: Path, **options) -> None:
        self.answered = threading.Semaphore(0)
        self.pump = Pump(bus, load_organism(organism), oob=False,
                         on_unit=lambda done, outcome: self.answered.release(), **options)
        self.thread = threading.Thread(target=self.pump.run, daemon=True)
        self.thread.start()

    def settle(self, units: int) -> None:
        for _ in range(units):
            assert self.answered.acquire(timeout=30), "the pump did not settle its units"

    def stop(self) -> None:
        self.pump.stop()
        self.thread.join()


@pytest.fixture
def running(bus: Bus, tmp_path: Path):
    """Start a pump on an organism; it has booted (answered a first request) on return."""
    started: list[Running] = []

    def start(listeners: str = ECHO, **options) -> Running:
        pump = Running(bus, write_organism(tmp_path, listeners), **options)
        started.append(pump)
        first = "<echo><text>boot</text><count>0</count></echo>" if listeners is ECHO \
            else "<add><a>0</a><b>0</b></add>"
        client.send(bus, "org", first)
        pump.settle(1)  # routed before the pump's boot or after: either way it has booted
        return pump
    yield start
    for pump in started:
        pump.stop()


def echo(bus: Bus, text: str, count: int = 1, mode: str = "ok") -> client.Sent:
    return client.send(bus, "org", f"<echo><text>{text}</text><count>{count}</count>"
                                   f"<mode>{mode}</mode></echo>")


def test_an_inline_request_is_answered_without_a_work_unit(bus, running):
    pump = running()
    sent = [echo(bus, "a", 2), echo(bus, "b", 0), echo(bus, "c", mode="raise")]
    pump.settle(3)
    assert [work.units_for_input(bus.conn, one.seq) for one in sent] == [[], [], []]
    two, none, failed = (client.replies(bus, one) for one in sent)
    assert [r.message.id for r in two] == [derived_id(sent[0].id, "echo", k) for k in (0, 1)]
    assert [r.payload_xml for r in two] == [
        f"<result><source>{k}</source><text>a</text></result>" for k in (0, 1)]
    assert none == []
    assert failed[0].root_tag == "huh" and 'code="handler-error"' in failed[0].payload_xml
    ctx = pump_tools.CALLS[-1][2]
    assert (ctx.listener, ctx.from_, ctx.attempt) == ("echo", "console", 1)


def test_an_inline_unit_leaves_the_thread_rows_a_leased_one_does(bus, running):
    """Each inline call gets its thread under the request's conversation, with the UUID
    its handler saw, closed once it answered (written closed at once when the handler
    only answered), and the conversation closes: only the organism's root stays open."""
    pump = running()
    sent = [echo(bus, "two", 2), echo(bus, "none", 0), echo(bus, "bad", mode="raise")]
    pump.settle(3)
    seen = {msg.text: ctx.thread for _, msg, ctx in pump_tools.CALLS}
    for one, text in zip(sent, ("two", "none", "bad")):
        children = bus.conn.execute(
            "SELECT c.uuid, c.status, c.name FROM threads c JOIN threads p ON p.id = c.parent_id"
            " WHERE p.uuid = ?", (one.thread,)).fetchall()
        assert children == [(seen[text], "closed", "echo")]
    assert threads.thread_count(bus.conn, "open") == 1


def test_inline_units_of_one_transaction_that_only_answered_leave_each_its_rows(bus, running):
    """Written together (a statement per table for all of them), each unit still gets
    its closed thread with the UUID its handler saw, its replies with their derived ids
    on its client's conversation, and that conversation closed."""
    pump = running()
    with write_transaction(bus.conn):
        sent = [echo(bus, f"t{i}", 1 + i % 2) for i in range(5)]
    pump.settle(5)
    seen = {msg.text: ctx.thread for _, msg, ctx in pump_tools.CALLS}
    for i, one in enumerate(sent):
        children = bus.conn.execute(
            "SELECT c.uuid, c.status, c.name FROM threads c JOIN threads p ON p.id = c.parent_id"
            " WHERE p.uuid = ?", (one.thread,)).fetchall()
        assert children == [(seen[f"t{i}"], "closed", "echo")]
        got = client.replies(bus, one)
        assert [r.message.id for r in got] == [derived_id(one.id, "echo", k)
                                              for k in range(1 + i % 2)]
        assert {(r.message.correlation_id, r.to, r.message.in_reply_to) for r in got} == {
            (one.thread, "console", one.id)}
    assert threads.thread_count(bus.conn, "open") == 1


def test_an_inline_request_on_a_closed_conversation_is_refused_among_others(bus, running):
    """Its conversation was closed before the pump wrote its results: they are dropped,
    its sender gets a <huh code="thread-closed">, the others of its transaction are
    answered."""
    pump = running()
    with write_transaction(bus.conn):
        sent = [echo(bus, f"t{i}") for i in range(3)]
        threads.close_thread(bus.conn, sent[1].thread)
    pump.settle(3)
    assert pump.pump.stats.outcomes == {"replied": 3, "huh": 1}  # the boot request too
    first, refused, third = (client.replies(bus, one) for one in sent)
    assert [r.payload_xml for r in first + third] == [
        "<result><source>0</source><text>t0</text></result>",
        "<result><source>0</source><text>t2</text></result>"]
    assert [(r.sender, r.root_tag) for r in refused] == [("system", "huh")]
    assert 'code="thread-closed"' in refused[0].payload_xml


def test_an_inline_call_to_a_peer_runs_under_the_thread_its_handler_saw(bus, running):
    """A handler that calls a peer leaves its thread open (written with its results),
    and the peer's unit runs on a thread under it."""
    pump = running(ECHO + "    peers: [calc.add]\n  - name: calc.add\n    root_tag: add\n"
                          "    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add\n")
    echo(bus, "peer", mode="peer")
    pump.settle(2)  # echo inline, then calc.add's leased unit
    # By listener and message, not position: the boot's call to calc.add came first, and
    # calc.add's answer may already be back at echo (a call after the peer's).
    caller = next(ctx for listener, msg, ctx in pump_tools.CALLS
                  if listener == "echo" and isinstance(msg, pump_tools.Echo))
    peer = [ctx for listener, _msg, ctx in pump_tools.CALLS if listener == "calc.add"][-1]
    parent = bus.conn.execute("SELECT p.uuid, p.name FROM threads c JOIN threads p"
                              " ON p.id = c.parent_id WHERE c.uuid = ?", (peer.thread,)).get
    assert parent == (caller.thread, "echo") and caller.listener == "echo"


def test_an_inline_call_to_a_tool_its_agent_cannot_see_is_refused(bus, running):
    """The inline path checks calls against the agent's visible_tools too."""
    pump = running(ECHO + "    peers: [calc.add]\n  - name: calc.add\n    root_tag: add\n"
                          "    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add\n"
                          "agents:\n  - name: echo\n    type: llm\n")
    sent = echo(bus, "peer", mode="peer")
    pump.settle(1)
    got, = client.replies(bus, sent)
    assert (got.sender, got.root_tag) == ("echo", "huh")
    assert "reply 0 calls 'calc.add', a tool this listener's agent cannot see (its " \
           "visible_tools: none)" in got.payload_xml
    # calc.add answered the fixture's first request, and was not called again
    assert [name for name, _, _ in pump_tools.CALLS] == ["calc.add", "echo"]


def test_an_inline_handler_reads_its_agent_s_model_and_system_prompt(bus, running):
    pump = running(ECHO.replace("echo_inline", "introduce") + COUNTER + (
        "agents:\n  - name: echo\n    type: llm\n    model: local-7b\n"
        "    system_prompt: Be brief.\n"))
    sent = echo(bus, "who?")
    pump.settle(1)
    assert [r.payload_xml for r in client.replies(bus, sent)] == [
        "<result><source>local-7b</source><text>Be brief.</text></result>"]
    assert work.units_for_input(bus.conn, sent.seq) == []  # it ran inline


def test_a_reply_the_commit_refuses_fails_alone_among_inline_units(bus, running, monkeypatch):
    """Inline units of one transaction are written together; when one cannot be written,
    the others are written again one by one and that one's sender gets a bad-reply."""
    build_row = commit.envelope_row

    def refused(payload, **fields):
        if fields["in_reply_to"] == sent[1].id and payload.tag != "huh":
            raise ValidationFailed("payload", "refused by the commit")
        return build_row(payload, **fields)

    pump = running()
    monkeypatch.setattr(commit, "envelope_row", refused)
    with write_transaction(bus.conn):
        sent = [echo(bus, f"t{i}") for i in range(3)]
    pump.settle(3)
    first, second, third = (client.replies(bus, one) for one in sent)
    assert [r.payload_xml for r in first + third] == [
        "<result><source>0</source><text>t0</text></result>",
        "<result><source>0</source><text>t2</text></result>"]
    assert 'code="bad-reply"' in second[0].payload_xml
    assert threads.thread_count(bus.conn, "open") == 1


def test_requests_waiting_when_the_pump_starts_take_the_leased_path(bus, tmp_path):
    """One of them may have killed the pump before: only a work unit counts attempts."""
    sent = echo(bus, "early")
    Pump(bus, load_organism(write_organism(tmp_path)), oob=False).run(until_idle=True)
    unit, = work.units_for_input(bus.conn, sent.seq)
    assert (unit.listener, unit.attempts) == ("echo", 1)
    got, = client.replies(bus, sent)
    assert got.payload_xml == "<result><source>0</source><text>early</text></result>"


def test_an_inline_handler_that_overruns_gets_timeout_and_its_listener_goes_leased(
        bus, running):
    pump = running()
    slow = echo(bus, "slow", mode="sleep")
    pump.settle(1)
    got, = client.replies(bus, slow)
    assert got.root_tag == "huh" and 'code="timeout"' in got.payload_xml
    assert work.units_for_input(bus.conn, slow.seq) == []
    after = echo(bus, "after")
    pump.settle(1)
    assert [unit.listener for unit in work.units_for_input(bus.conn, after.seq)] == ["echo"]
    assert client.replies(bus, after)[0].root_tag == "result"


def test_calls_the_pump_writes_to_an_inline_listener_are_work_units(bus, running):
    """Only client requests run inline: a peer call goes through a leased unit."""
    pump = running(COUNTER)
    sent = client.send(bus, "org", "<sum><value>0</value></sum>", to="counter")
    pump.settle(7)  # counter 4 times, calc.add 3 times
    got, = client.replies(bus, sent)
    assert got.payload_xml == "<final-answer><text>counted to 3</text></final-answer>"
    units = bus.conn.execute("SELECT count(*) FROM pump_work WHERE listener = 'calc.add'"
                             " AND input_seq > ?", (sent.seq,)).get
    assert units == 3
    direct = client.send(bus, "org", "<add><a>1</a><b>2</b></add>", to="calc.add")
    pump.settle(1)
    assert work.units_for_input(bus.conn, direct.seq) == []
    assert client.replies(bus, direct)[0].payload_xml == "<sum><value>3.0</value></sum>"


REQUESTS = st.lists(st.tuples(st.sampled_from(["ok", "raise"]), st.integers(0, 3)),
                    min_size=1, max_size=12)


@scaled_settings(max_examples=10, deadline=None)
@given(requests=REQUESTS, batch=st.sampled_from([1, 3, 64]))
def test_every_inline_request_gets_exactly_its_reply_set(tmp_path_factory, requests, batch):
    """Requests committed together, answered `batch` per transaction."""
    directory = tmp_path_factory.mktemp("inline")
    with Bus.open(directory / "bus.db") as bus:
        pump = Running(bus, write_organism(directory), commit_batch=batch)
        try:
            client.send(bus, "org", "<echo><text>boot</text><count>0</count></echo>")
            pump.settle(1)
            with write_transaction(bus.conn):
                sent = [echo(bus, f"t{i}", count, mode)
                        for i, (mode, count) in enumerate(requests)]
            pump.settle(len(requests))
        finally:
            pump.stop()
        for one, (mode, count) in zip(sent, requests):
            got = client.replies(bus, one)
            assert len(got) == (count if mode == "ok" else 1), (mode, count, got)
            assert len({r.message.id for r in got}) == len(got)
            assert work.units_for_input(bus.conn, one.seq) == []
        assert threads.thread_count(bus.conn, "open") == 1  # every conversation ended


# --- organism.yaml ---------------------------------------------------------------------


def listener_yaml(**keys: object) -> str:
    entry = {"name": "echo", "root_tag": "echo", "payload": "tests.support.pump_tools:Echo",
             "handler": "tests.support.pump_tools:echo_inline", **keys}
    return "listeners:\n  - " + "\n    ".join(f"{k}: {v}" for k, v in entry.items())


def test_an_inline_listener_gets_a_small_default_timeout():
    spec, = parse_organism(listener_yaml(inline="true")).listeners
    assert (spec.inline, spec.timeout_s) == (True, INLINE_DEFAULT_TIMEOUT_S)
    spec, = parse_organism(listener_yaml()).listeners
    assert (spec.inline, spec.timeout_s) == (False, 300.0)


@pytest.mark.parametrize("keys, field, fragment", [
    ({"inline": 1}, "listeners[0].inline", "must be true or false"),
    ({"inline": "true", "timeout": 30}, "listeners[0].timeout",
     "set inline: false for a slower handler"),
])
def test_inline_options_are_checked(keys, field, fragment):
    with pytest.raises(OrganismInvalid) as refused:
        parse_organism(listener_yaml(**keys))
    assert refused.value.field == field and fragment in refused.value.reason


def test_an_async_handler_cannot_be_inline(bus, tmp_path):
    organism = write_organism(tmp_path, ECHO.replace("echo_inline", "echo"))
    with pytest.raises(OrganismInvalid) as refused:
        Pump(bus, load_organism(organism), oob=False)
    assert refused.value.field == "listeners[0].inline"
    assert "listener 'echo' has an async handler" in refused.value.reason
    assert "make it a plain `def` or set inline: false" in refused.value.reason


def test_organism_check_refuses_an_async_inline_handler(tmp_path):
    organism = write_organism(tmp_path, ECHO.replace("echo_inline", "echo"))
    result = run(["pump", "organism", "check", str(organism)], tmp_path / "bus.db")
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {organism}: listeners[0].inline: listener 'echo'"
                                    " has an async handler")
