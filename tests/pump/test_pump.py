"""The pump in-process (bus/pump/pump.py): routing, threads, broadcast, replies, <huh>.

Each test writes an organism.yaml whose handlers live in tests/support/pump_tools.py,
sends requests as a client, runs the pump until idle on a real bus file and
reads what it committed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage.db import write_transaction
from bus.storage.errors import BusBusy
from bus.storage.errors import OrganismInvalid
from bus.storage.errors import ValidationFailed
from bus.pump import Pump
from bus.pump import client
from bus.pump import threads
from bus.pump import work
from bus.pump.envelopes import derived_id
from bus.pump.organism import load_organism
from bus.xml import XmlRejected
from bus.xml.pipeline import Huh
from tests.support import pump_tools
from tests.support.properties import scaled_settings

ADD = "root_tag: add\n    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add"
LISTENERS = {
    "calculator": ADD,
    "calc.add": ADD,
    "search.fast": "root_tag: search\n    payload: tests.support.pump_tools:Search\n"
                   "    handler: tests.support.pump_tools:search_fast",
    "search.slow": "root_tag: search\n    payload: tests.support.pump_tools:Search\n"
                   "    handler: tests.support.pump_tools:search_slow",
    "search.sync": "root_tag: search\n    payload: tests.support.pump_tools:Search\n"
                   "    handler: tests.support.pump_tools:search_sync",
    "echo": "root_tag: echo\n    payload: tests.support.pump_tools:Echo\n"
            "    handler: tests.support.pump_tools:echo\n    timeout: 0.3",
    "counter": "root_tag: sum\n    payload: tests.support.pump_tools:Sum\n"
               "    handler: tests.support.pump_tools:count_up\n    peers: [calc.add]",
    "welcome": "root_tag: boot\n    payload: tests.support.pump_tools:Boot\n"
               "    handler: tests.support.pump_tools:on_boot",
    "element": "root_tag: echo\n    payload: tests.support.pump_tools:Echo\n"
               "    handler: tests.support.pump_tools:element_reply",
    "dictionary": "root_tag: lookup\n    payload: tests.support.pump_tools:Lookup\n"
                  "    handler: tests.support.pump_tools:lookup\n"
                  "    namespace: https://example.org/ns/lookup/v1",
    "careless": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
                "    handler: tests.support.pump_tools:careless\n    peers: [calc.add]",
    "stubborn": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
                "    handler: tests.support.pump_tools:stubborn\n    peers: [calc.add]",
    "misfit": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
              "    handler: tests.support.pump_tools:misaddressed\n    peers: [calc.add]",
    "wrapper": "root_tag: echo\n    payload: tests.support.pump_tools:Echo\n"
               "    handler: tests.support.pump_tools:envelope_reply",
    "asker": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
             "    handler: tests.support.pump_tools:ask_calc\n    peers: [calc.add]",
    "definer": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
               "    handler: tests.support.pump_tools:ask_dictionary\n    peers: [dictionary]",
    "relay": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
             "    handler: tests.support.pump_tools:relay\n    peers: [echo]",
    "ignorer": "root_tag: ask\n    payload: tests.support.pump_tools:Ask\n"
               "    handler: tests.support.pump_tools:ignore_answers\n    peers: [calc.add]",
    "outer": "root_tag: echo\n    payload: tests.support.pump_tools:Echo\n"
             "    handler: tests.support.pump_tools:outer\n    peers: [asker]",
}


def write_organism(directory: Path, *names: str, extra: str = "") -> Path:
    body = "".join(f"  - name: {name}\n    {LISTENERS[name]}\n" for name in names)
    path = directory / "organism.yaml"
    path.write_text(f"name: org\nlisteners:\n{body}{extra}")
    return path


def run_pump(bus: Bus, organism: Path, **options) -> Pump:
    pump = Pump(bus, load_organism(organism), oob=False, **options)
    pump.run(until_idle=True)
    return pump


def answers(bus: Bus, sent: client.Sent) -> list[client.Received]:
    return client.replies(bus, sent)


# --- requests and answers -------------------------------------------------------------


@pytest.mark.parametrize("listener", ["calculator", "calc.add"])
def test_two_conversations_on_one_path_each_get_their_own_answer(bus, tmp_path, listener):
    organism = write_organism(tmp_path, listener)
    first = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", to=listener)
    second = client.send(bus, "org", b"<add><a>10</a><b>20</b></add>", to=listener)
    run_pump(bus, organism)
    assert first.thread != second.thread
    for sent, value in ((first, "3.0"), (second, "30.0")):
        got, = answers(bus, sent)
        assert (got.sender, got.to, got.payload_xml) == (listener, "console",
                                                         f"<sum><value>{value}</value></sum>")
        assert got.message.correlation_id == sent.thread
        assert got.message.in_reply_to == sent.id
        assert got.message.id == derived_id(sent.id, listener, 0)
    # The handler saw opaque threads of its own, one per call, both now closed.
    handler_threads = [ctx.thread for _, _, ctx in pump_tools.CALLS]
    assert len(set(handler_threads)) == 2
    for uuid in handler_threads:
        thread = threads.get_thread(bus.conn, uuid)
        assert (thread.path[-1], thread.status) == (listener, "closed")


def test_a_namespaced_listener_gets_payloads_of_its_namespace_only(bus, tmp_path):
    organism = write_organism(tmp_path, "dictionary")
    sent = client.send(bus, "org", b'<lookup xmlns="https://example.org/ns/lookup/v1">'
                                   b"<word>pump</word></lookup>")
    wrong = client.send(bus, "org", b'<lookup xmlns="urn:other"><word>pump</word></lookup>')
    bare = client.send(bus, "org", b"<lookup><word>pump</word></lookup>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.payload_xml) == ("dictionary", "<meaning>pump: a word</meaning>")
    assert [(listener, msg) for listener, msg, _ in pump_tools.CALLS] == [
        ("lookup", pump_tools.Lookup("pump"))]
    for refused in (wrong, bare):  # same local name, other namespace: nobody listens
        huh, = answers(bus, refused)
        assert huh.root_tag == "huh" and 'code="no-route"' in huh.payload_xml


def test_a_listener_namespace_must_be_its_payload_namespace(bus, tmp_path):
    organism = tmp_path / "organism.yaml"
    organism.write_text("name: org\nlisteners:\n  - name: dictionary\n"
                        "    root_tag: lookup\n    payload: tests.support.pump_tools:Lookup\n"
                        "    handler: tests.support.pump_tools:lookup\n    namespace: urn:elsewhere\n")
    with pytest.raises(OrganismInvalid) as raised:
        Pump(bus, load_organism(organism), oob=False)
    assert raised.value.field == "listeners[0].namespace"
    assert "is in namespace 'https://example.org/ns/lookup/v1'" in str(raised.value)


def test_the_handler_context_is_stamped_by_the_pump(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", client="alice")
    run_pump(bus, organism)
    (_, msg, ctx), = pump_tools.CALLS
    assert msg == pump_tools.Add(1.0, 2.0)
    assert (ctx.from_, ctx.listener, ctx.message_id, ctx.attempt) == ("alice", "calculator",
                                                                      sent.id, 1)
    assert threads.lookup(bus.conn, ctx.thread) == ("org", "alice", "calculator")
    with pytest.raises(AttributeError):
        ctx.from_ = "mallory"


def test_a_client_cannot_send_an_envelope(bus):
    forged = (b'<env:message xmlns:env="urn:agentbus:envelope:1"><env:from>calculator'
              b'</env:from><env:thread>t</env:thread><add><a>1</a><b>2</b></add></env:message>')
    with pytest.raises(ValidationFailed, match="stamps <from> and <thread>"):
        client.send(bus, "org", forged)
    with pytest.raises(XmlRejected):
        client.send(bus, "org", b"<add><a>1</a>")
    assert bus.message_count() == 0


@pytest.mark.parametrize("client_id", ["system", "bus", "org"])
def test_a_client_cannot_send_as_the_pump_or_the_bus(bus, client_id):
    with pytest.raises(ValidationFailed, match=f"'{client_id}' is reserved"):
        client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", client=client_id)
    assert bus.message_count() == 0


@pytest.mark.parametrize("xml", [b"<boot/>", b'<huh step="x" code="y">z</huh>'])
def test_a_client_cannot_send_the_pump_s_own_messages(bus, xml):
    with pytest.raises(ValidationFailed, match="is the pump's own message"):
        client.send(bus, "org", xml)
    assert bus.message_count() == 0


def test_a_client_named_like_a_listener_gets_its_reply(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", client="calculator")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.payload_xml) == ("calculator", "calculator",
                                                     "<sum><value>3.0</value></sum>")


def test_broadcast_commits_the_fast_reply_first_each_with_its_own_from(bus, tmp_path):
    organism = write_organism(tmp_path, "search.slow", "search.fast", "search.sync")
    sent = client.send(bus, "org", b"<search><query>weather</query></search>")
    run_pump(bus, organism)
    got = answers(bus, sent)
    assert [r.sender for r in got] == ["search.fast", "search.sync", "search.slow"]
    assert all(r.message.in_reply_to == sent.id and r.to == "console" for r in got)
    # Each reply was committed when its handler finished, not when the last one did.
    times = [r.message.ts_ms for r in got]
    assert times[1] - times[0] >= 150 and times[2] - times[1] >= 150


def test_three_replies_are_committed_in_one_transaction(bus, tmp_path):
    organism = write_organism(tmp_path, "echo")
    sent = client.send(bus, "org", b"<echo><text>hi</text><count>3</count></echo>")
    run_pump(bus, organism)
    got = answers(bus, sent)
    assert [r.payload_xml for r in got] == [
        f"<result><source>{i}</source><text>hi</text></result>" for i in range(3)]
    assert [r.message.id for r in got] == [derived_id(sent.id, "echo", i) for i in range(3)]
    assert len({r.message.ts_ms for r in got}) == 1  # one transaction's clock
    assert [r.message.seq for r in got] == list(range(got[0].message.seq,
                                                     got[0].message.seq + 3))


def test_a_handler_returning_none_closes_its_thread_and_sends_nothing(bus, tmp_path):
    organism = write_organism(tmp_path, "echo")
    sent = client.send(bus, "org", b"<echo><text>hi</text><count>0</count></echo>")
    run_pump(bus, organism)
    assert answers(bus, sent) == []
    unit, = work.units_for_input(bus.conn, sent.seq)
    assert threads.get_thread(bus.conn, unit.thread).status == "closed"


def test_an_lxml_element_is_a_payload_too(bus, tmp_path):
    organism = write_organism(tmp_path, "element")
    sent = client.send(bus, "org", b"<echo><text>x</text></echo>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert got.payload_xml == "<result><source>element</source><text>x</text></result>"


# --- <huh> ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, code", [
    ("raise", "handler-error"), ("sleep", "timeout"), ("peer", "peer-denied"),
    ("bad", "bad-reply")])
def test_handler_failures_become_a_huh_to_the_sender_on_its_thread(bus, tmp_path, mode, code):
    organism = write_organism(tmp_path, "echo")
    sent = client.send(bus, "org", f"<echo><text>x</text><mode>{mode}</mode></echo>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.root_tag) == ("echo", "console", "huh")
    assert f'code="{code}"' in got.payload_xml and 'step="handler"' in got.payload_xml
    assert got.message.correlation_id == sent.thread
    if mode == "peer":  # the refused call was not sent
        assert bus.message_count() == 3  # boot, the request, the huh


def test_a_peer_s_huh_reaches_the_calling_listener_on_its_thread(bus, tmp_path):
    organism = write_organism(tmp_path, "careless", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.payload_xml) == (
        "careless", "<result><source>careless</source><text>calc.add said payload-invalid"
                    "</text></result>")
    (_, asked, first), (_, huh, second) = pump_tools.CALLS
    assert isinstance(huh, Huh) and (huh.code, second.from_) == ("payload-invalid", "calc.add")
    assert second.thread == first.thread  # on the thread the call was made from
    assert threads.thread_count(bus.conn, "open") == 1  # the organism's root only


def test_a_call_a_peer_does_not_take_comes_back_to_the_caller_as_no_route(bus, tmp_path):
    organism = write_organism(tmp_path, "misfit", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>hello?</text></ask>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert got.payload_xml == ("<result><source>misfit</source><text>system said no-route"
                               "</text></result>")
    assert threads.thread_count(bus.conn, "open") == 1


def test_a_huh_never_answers_a_huh_so_two_listeners_cannot_loop(bus, tmp_path):
    organism = write_organism(tmp_path, "stubborn", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    run_pump(bus, organism)  # returns: nothing bounces for ever
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.root_tag) == ("calc.add", "console", "huh")
    assert 'code="payload-invalid"' in got.payload_xml
    assert [type(msg).__name__ for _, msg, _ in pump_tools.CALLS] == ["Ask", "Huh"]
    assert threads.thread_count(bus.conn, "open") == 1


def test_a_client_waiting_on_a_chain_gets_the_peer_s_huh(bus, tmp_path):
    organism = write_organism(tmp_path, "stubborn", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    pump = Pump(bus, load_organism(organism), oob=False)
    runner = threading.Thread(target=pump.run)
    runner.start()
    try:
        got = client.wait_replies(bus, sent, count=5, timeout=60)
    finally:
        pump.stop()
        runner.join()
    assert [item.root_tag for item in got] == ["huh"]  # final: the wait ended on it


def test_a_handler_returning_an_envelope_gets_bad_reply_at_once(bus, tmp_path):
    organism = write_organism(tmp_path, "wrapper")
    sent = client.send(bus, "org", b"<echo><text>x</text></echo>")
    pump = run_pump(bus, organism)
    got, = answers(bus, sent)
    assert got.root_tag == "huh" and 'code="bad-reply"' in got.payload_xml
    assert "is an envelope" in got.payload_xml
    assert work.units_for_input(bus.conn, sent.seq)[0].attempts == 1
    assert pump.stats.outcomes == {"huh": 1}


def test_a_reply_the_commit_refuses_becomes_bad_reply_not_retries(bus, tmp_path, monkeypatch):
    from bus.pump.commit import Batch

    def refused(self, done, caller=None) -> str:
        raise ValidationFailed("payload", "refused by the commit")

    monkeypatch.setattr(Batch, "_replies", refused)
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>")
    pump = run_pump(bus, organism, lease_ms=200)
    got, = answers(bus, sent)
    assert 'code="bad-reply"' in got.payload_xml and "refused by the commit" in got.payload_xml
    assert work.units_for_input(bus.conn, sent.seq)[0].attempts == 1
    assert pump.stats.outcomes == {"huh": 1}


def test_answered_requests_close_their_threads(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator", "search.fast", "search.slow", "echo")
    sent = [client.send(bus, "org", b"<add><a>1</a><b>2</b></add>") for _ in range(20)]
    sent.append(client.send(bus, "org", b"<search><query>q</query></search>"))  # broadcast
    sent.append(client.send(bus, "org", b"<echo><text>x</text><count>0</count></echo>"))
    sent.append(client.send(bus, "org", b"<nobody-takes-this/>"))
    run_pump(bus, organism)
    assert threads.thread_count(bus.conn, "open") == 1  # the organism's root only
    again = threads.get_or_create(bus.conn, ["org", "console"])  # no longer ambiguous
    assert again.status == "open" and again.uuid not in {item.thread for item in sent}


def test_invalid_input_reaches_no_handler(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", b"<add><a>one</a><b>2</b></add>", to="calculator")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert got.root_tag == "huh" and 'code="payload-invalid"' in got.payload_xml
    assert pump_tools.CALLS == []


@pytest.mark.parametrize("xml, to", [
    (b"<hot-reload/>", None), (b"<add-listener><name>x</name></add-listener>", None),
    (b"<remove-listener/>", "calculator"), (b"<add><a>1</a><b>2</b></add>", "nobody"),
    (b"<search><query>q</query></search>", "calculator")])
def test_what_no_listener_accepts_routes_nowhere(bus, tmp_path, xml, to):
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", xml, to=to)
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.root_tag) == ("system", "huh")
    assert 'code="no-route"' in got.payload_xml
    assert work.units_for_input(bus.conn, sent.seq) == [] and pump_tools.CALLS == []


# --- chains, final answers, boot --------------------------------------------------------------


def test_answers_bubble_back_to_a_calling_listener_on_its_thread(bus, tmp_path):
    organism = write_organism(tmp_path, "counter", "calc.add")
    sent = client.send(bus, "org", b"<sum><value>0</value></sum>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.root_tag, got.payload_xml) == (
        "counter", "final-answer", "<final-answer><text>counted to 3</text></final-answer>")
    counter_threads = {ctx.thread for name, _, ctx in pump_tools.CALLS if name == "counter"}
    assert len(counter_threads) == 1  # every answer came back on the counter's own thread
    assert [type(msg).__name__ for name, msg, _ in pump_tools.CALLS] == \
        ["Sum", "Add", "Sum", "Add", "Sum", "Add", "Sum"]
    assert threads.get_thread(bus.conn, sent.thread).status == "closed"


def test_boot_is_sent_once_per_organism_not_per_restart(bus, tmp_path):
    organism = write_organism(tmp_path, "welcome", "calculator")
    first = run_pump(bus, organism)
    second = run_pump(bus, organism)
    assert (first.stats.booted, second.stats.booted) == (True, False)
    (name, msg, ctx), = pump_tools.CALLS
    assert (name, msg, ctx.from_) == ("welcome", pump_tools.Boot(), "system")


def test_payload_and_root_tag_must_agree(bus, tmp_path):
    path = tmp_path / "organism.yaml"
    path.write_text("listeners:\n  - name: calc\n    root_tag: plus\n"
                    "    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add\n")
    with pytest.raises(OrganismInvalid, match=r"listeners\[0\]\.root_tag: .*set root_tag: add"):
        Pump(bus, load_organism(path))


# --- properties -------------------------------------------------------------------------------

REQUESTS = st.lists(st.tuples(st.sampled_from(["ok", "raise", "peer", "final"]),
                              st.integers(0, 3)), min_size=1, max_size=8)


@scaled_settings(max_examples=12)
@given(requests=REQUESTS, batch=st.sampled_from([1, 3, 64]))
def test_every_request_gets_exactly_its_reply_set(tmp_path_factory, requests, batch):
    directory = tmp_path_factory.mktemp("prop")
    organism = write_organism(directory, "echo")
    with Bus.open(directory / "bus.db") as bus:
        sent = [client.send(bus, "org", f"<echo><text>t{i}</text><count>{count}</count>"
                                        f"<mode>{mode}</mode></echo>")
                for i, (mode, count) in enumerate(requests)]
        run_pump(bus, organism, commit_batch=batch)
        for one, (mode, count) in zip(sent, requests):
            got = answers(bus, one)
            expected = {"ok": count, "raise": 1, "peer": 1, "final": 1}[mode]
            assert len(got) == expected, (mode, count, got)
            assert len({r.message.id for r in got}) == expected
            unit, = work.units_for_input(bus.conn, one.seq)
            assert bus.conn.execute("SELECT status FROM pump_work WHERE id = ?",
                                    (unit.id,)).get == "done"


def test_a_request_on_a_closed_conversation_is_refused_and_the_pump_goes_on(bus, tmp_path):
    """Its thread was closed before the pump routed it (by hand, or cleared): no unit
    runs it, its sender gets a <huh code="thread-closed"> on that thread for the record,
    and the requests routed with it are answered."""
    organism = write_organism(tmp_path, "calculator")
    with write_transaction(bus.conn):
        closed = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", to="calculator")
        sent = client.send(bus, "org", b"<add><a>1</a><b>3</b></add>", to="calculator")
        threads.close_thread(bus.conn, closed.thread)
    pump = run_pump(bus, organism)
    assert pump.stats.outcomes == {"replied": 1}
    assert [r.payload_xml for r in answers(bus, sent)] == ["<sum><value>4.0</value></sum>"]
    refused, = answers(bus, closed)
    assert refused.root_tag == "huh" and 'code="thread-closed"' in refused.payload_xml
    assert (refused.sender, refused.to) == ("system", "console")
    assert work.units_for_input(bus.conn, closed.seq) == []


# --- the commit: claim check and batches ------------------------------------------------


def test_a_unit_taken_over_before_the_commit_is_lost_and_writes_nothing(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator")
    sent = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", to="calculator")
    stolen = []

    def steal(finished: list) -> None:  # another pump claims the unit meanwhile
        if not stolen:
            stolen.append(finished[0].unit.id)
            bus.conn.execute("UPDATE pump_work SET lease_owner = 'thief', attempts = attempts"
                             " + 1, lease_until_ms = 0 WHERE id = ?", (stolen[0],))

    pump = run_pump(bus, organism, before_commit=steal)
    assert pump.stats.outcomes == {"lost": 1, "replied": 1}
    got, = answers(bus, sent)  # the lost commit wrote nothing; the retry wrote it once
    assert got.message.id == derived_id(sent.id, "calculator", 0)
    unit, = work.units_for_input(bus.conn, sent.seq)
    assert (unit.id, unit.attempts) == (stolen[0], 3)


def test_a_dead_letter_says_how_often_its_handler_was_tried(bus, tmp_path):
    """A unit whose lease ran out on its only attempt is a dead letter tried `once`."""
    organism = tmp_path / "organism.yaml"
    organism.write_text(f"name: org\nlisteners:\n  - name: calculator\n    {ADD}\n"
                        "    max_attempts: 1\n")
    sent = client.send(bus, "org", b"<add><a>1</a><b>2</b></add>", to="calculator")
    stalled = []

    def lose_the_lease(finished: list) -> None:  # as if the pump stalled past its lease
        if not stalled:
            stalled.append(finished[0].unit.id)
            bus.conn.execute("UPDATE pump_work SET lease_owner = 'stalled', lease_until_ms = 1"
                             " WHERE id = ?", (stalled[0],))

    pump = run_pump(bus, organism, before_commit=lose_the_lease)
    assert pump.stats.outcomes == {"dead": 1, "lost": 1}
    got, = answers(bus, sent)
    assert (got.root_tag, got.to) == ("huh", "console")
    assert "the listener's handler was tried once and never finished" in got.payload_xml


def test_a_unit_taken_over_among_others_is_lost_alone(bus, tmp_path):
    """Units that only answered their clients commit together; one another pump took over
    meanwhile is lost (nothing written for it), the others of its batch are replied."""
    organism = tmp_path / "organism.yaml"
    organism.write_text(f"name: org\nlisteners:\n  - name: calculator\n    {ADD}\n"
                        "    concurrency: 3\n")
    sent = [client.send(bus, "org", f"<add><a>{i}</a><b>1</b></add>".encode(), to="calculator")
            for i in range(3)]
    batches, stolen = [], []

    def steal(finished: list) -> None:
        batches.append(len(finished))
        if not stolen and len(finished) > 1:  # another pump claims one of them meanwhile
            stolen.append(finished[-1].unit.id)
            bus.conn.execute("UPDATE pump_work SET lease_owner = 'thief', attempts = attempts"
                             " + 1, lease_until_ms = 0 WHERE id = ?", (stolen[0],))
        elif len(batches) == 1:
            time.sleep(0.05)  # the other handlers finish meanwhile: one batch commits them

    pump = run_pump(bus, organism, lease_ms=200, before_commit=steal)
    assert stolen, f"no batch of several units to steal from: {batches}"
    assert pump.stats.outcomes == {"lost": 1, "replied": 3}
    for one in sent:
        got, = answers(bus, one)  # the lost commit wrote nothing; the retry wrote it once
        assert got.message.id == derived_id(one.id, "calculator", 0)
    assert threads.thread_count(bus.conn, "open") == 1


def test_a_unit_that_fails_to_commit_fails_alone_and_is_tried_again(bus, tmp_path, monkeypatch):
    from bus.pump import commit
    organism = tmp_path / "organism.yaml"
    organism.write_text(f"name: org\nlisteners:\n  - name: calculator\n    {ADD}\n"
                        "    concurrency: 3\n")
    sent = [client.send(bus, "org", f"<add><a>{i}</a><b>1</b></add>".encode(), to="calculator")
            for i in range(3)]
    build_row = commit.envelope_row
    batches, attempt = [], {}

    def failing(payload, **fields):
        if fields["in_reply_to"] == sent[1].id and attempt.get(sent[1].id) == 1:
            raise BusBusy("locked, in the test")  # a passing failure: tried again
        return build_row(payload, **fields)

    monkeypatch.setattr(commit, "envelope_row", failing)

    def before_commit(finished: list) -> None:
        batches.append({done.input.id for done in finished})
        attempt.update((done.input.id, done.unit.attempts) for done in finished)
        if len(batches) == 1:
            time.sleep(0.05)  # the other handlers finish meanwhile: one batch commits them

    pump = run_pump(bus, organism, lease_ms=200, before_commit=before_commit)
    assert pump.stats.outcomes == {"failed": 1, "replied": 3}
    failed_in = next(batch for batch in batches if sent[1].id in batch)
    assert len(failed_in) > 1  # the others in its batch were committed all the same
    for one in sent:
        got, = answers(bus, one)
        assert got.message.id == derived_id(one.id, "calculator", 0)
    assert [work.units_for_input(bus.conn, one.seq)[0].attempts for one in sent] == [1, 2, 1]


def test_a_claim_reads_its_listener_s_units_in_order_and_stops(bus: Bus) -> None:
    """The claim walks idx_pump_work_pending in id order and stops after
    `limit`: no temporary sort, and never the whole unclaimed backlog of
    every listener (as the lease index range would be)."""
    args = {"now": 1, "organism": "org", "listener": "l", "limit": 64}
    plan = " | ".join(row[3] for row in bus.conn.execute(
        "EXPLAIN QUERY PLAN " + work._CLAIMABLE_SQL, args))
    assert "USING INDEX idx_pump_work_pending" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_a_lone_reply_commits_without_a_look_that_could_find_nothing(bus, tmp_path):
    """A serving pump commits a lone request's reply in a transaction of its own when no
    other connection committed since the look that claimed the request, and that look
    left nothing to claim: no inbox, dead-unit or claim statement holds the reply back.
    (A pump running until idle looks in that transaction: every test above. With one
    slot, the claim took all it asked for and may have left units: it claims again.)"""
    path = tmp_path / "organism.yaml"
    path.write_text(f"name: org\nlisteners:\n  - name: calculator\n    {ADD}\n"
                    "    concurrency: 4\n")
    organism = load_organism(path)
    statements: list[str] = []

    def trace(finished: list) -> None:  # on the database thread, before its first commit
        if not statements:
            bus.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True

    # A long lease: the pump's heartbeat (every third of it) commits no beat meanwhile.
    pump = Pump(bus, organism, oob=False, lease_ms=120_000, before_commit=trace)
    runner = threading.Thread(target=pump.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10  # its first beat is in: no other commit follows
        while not any(alive.agent == "pump:org" for alive in bus.heartbeats.liveness()):
            assert time.monotonic() < deadline, "the pump never beat"
            time.sleep(0.01)
        for a in (1, 2):  # the first also makes sure the tracer is on for the second
            sent = client.send(bus, "org", f"<add><a>{a}</a><b>2</b></add>".encode(),
                               to="calculator")
            assert [got.root_tag for got in client.wait_replies(bus, sent, timeout=10)] \
                == ["sum"]
    finally:
        pump.stop()
        runner.join(10)
    text = "\n".join(statements)  # each transaction: from its BEGIN to its COMMIT
    transactions = [part.split("\nCOMMIT")[0].split("\n")[1:]
                    for part in text.split("BEGIN IMMEDIATE")[1:]]
    replies = [one for one in transactions if any("status = 'done'" in sql for sql in one)]
    assert len(replies) == 2, transactions
    assert not [sql for sql in replies[-1] if "pump_inbox" in sql or "lease_until_ms" in sql]


def test_a_sleeping_pump_takes_over_when_another_pump_s_lease_runs_out(
        bus: Bus, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pump B claims a request with a short lease and dies before its commit.
    Pump A, asleep, sees B's claim commit: no work for it yet, but a lease that
    runs out before A would wake by itself, so A wakes then and answers. (With
    IDLE_WAKE_S at 60 s, only that wake-up can answer within the test.)"""
    from bus.pump import pump as pump_module
    monkeypatch.setattr(pump_module, "IDLE_WAKE_S", 60.0)
    organism = load_organism(write_organism(tmp_path, "calculator"))
    a = Pump(bus, organism, oob=False)
    runner = threading.Thread(target=a.run, daemon=True)
    runner.start()
    try:
        assert a._sleeping.wait(10)  # booted, nothing to do
        with Bus.open(db_path) as other:
            b = Pump(other, organism, oob=False, lease_ms=300)
            with write_transaction(other.conn):  # one commit: A never sees the inbox row
                sent = client.send(other, "org", b"<add><a>1</a><b>2</b></add>",
                                   to="calculator")
                step = b.steps.step([], b._capacity(), {})  # B claims it ...
            assert [unit.listener for unit, _ in step.claimed] == ["calculator"]
            # ... and never commits: A must answer once B's lease has run out, not
            # at its next heartbeat (10 s) or IDLE_WAKE_S. 5 s: loose on purpose.
            got = client.wait_replies(other, sent, timeout=5)
        assert [reply.root_tag for reply in got] == ["sum"]
        assert [name for name, _, ctx in pump_tools.CALLS] == ["calculator"]
        assert pump_tools.CALLS[0][2].attempt == 2
    finally:
        a.stop()
        runner.join(10)


# --- organism.yaml's agents and meta ----------------------------------------------------------


def test_an_agent_s_context_lists_only_its_visible_tools_with_their_usage(bus, tmp_path):
    organism = write_organism(tmp_path, "careless", "counter", "calc.add", extra=(
        "agents:\n  - name: careless\n    type: llm\n    visible_tools: [calc.add]\n"
        "  - name: counter\n    type: llm\n"))
    client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    client.send(bus, "org", b"<sum><value>3</value></sum>")
    run_pump(bus, organism)
    seen = {name: ctx.tools for name, _, ctx in pump_tools.CALLS}
    tool, = seen["careless"]
    assert (tool.name, tool.root_tag) == ("calc.add", "add")
    assert tool.usage.startswith("<add>: Add two numbers.") and "Fields:" in tool.usage
    assert seen["counter"] == ()  # its agent lists no visible tools, though it has a peer


def test_a_listener_without_an_agent_sees_all_its_peers(bus, tmp_path):
    organism = write_organism(tmp_path, "counter", "calc.add")
    client.send(bus, "org", b"<sum><value>3</value></sum>")
    run_pump(bus, organism)
    (_, _, ctx), = pump_tools.CALLS
    assert [tool.name for tool in ctx.tools] == ["calc.add"]


COUNTER_SEEING_ECHO = """\
name: org
listeners:
  - name: counter
    root_tag: sum
    payload: tests.support.pump_tools:Sum
    handler: tests.support.pump_tools:count_up
    peers: [calc.add, echo]
  - name: calc.add
    root_tag: add
    payload: tests.support.pump_tools:Add
    handler: tests.support.pump_tools:add
  - name: echo
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:echo
agents:
  - name: counter
    type: llm
    visible_tools: [echo]
"""


def test_a_call_to_a_tool_its_agent_cannot_see_is_refused_with_a_huh_naming_it(bus, tmp_path):
    """calc.add is among counter's peers, but its agent sees only echo: visible_tools
    restrict what it may call, not only what its context lists (seed 000)."""
    organism = tmp_path / "organism.yaml"
    organism.write_text(COUNTER_SEEING_ECHO)
    sent = client.send(bus, "org", b"<sum><value>1</value></sum>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.root_tag) == ("counter", "console", "huh")
    assert 'code="peer-denied"' in got.payload_xml
    assert ("reply 0 calls 'calc.add', a tool this listener's agent cannot see (its "
            "visible_tools: echo); add calc.add to the agent's visible_tools in organism.yaml"
            ) in got.payload_xml
    assert [name for name, _, _ in pump_tools.CALLS] == ["counter"]  # calc.add never ran


INTRODUCER = """\
name: org
listeners:
  - name: researcher
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:introduce
  - name: plain
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:introduce
agents:
  - name: researcher
    type: llm
    model: claude-sonnet-4
    system_prompt: "You are a research assistant..."
"""


def test_a_handler_reads_its_agent_s_model_and_system_prompt_from_its_context(bus, tmp_path):
    organism = tmp_path / "organism.yaml"
    organism.write_text(INTRODUCER)
    sent = client.send(bus, "org", b"<echo><text>who are you?</text></echo>")
    run_pump(bus, organism)
    assert sorted((got.sender, got.payload_xml) for got in answers(bus, sent)) == [
        ("plain", "<result><source>no model</source><text>no prompt</text></result>"),
        ("researcher", "<result><source>claude-sonnet-4</source>"
                       "<text>You are a research assistant...</text></result>")]


def test_meta_requests_are_answered_by_the_pump_when_allowed(bus, tmp_path):
    organism = write_organism(tmp_path, "calculator", extra=(
        "meta:\n  allow_list_capabilities: all\n  allow_schema_requests: admin\n"))
    listed = client.send(bus, "org", b"<list-capabilities/>")
    schema = client.send(bus, "org", b"<schema-request><listener>calculator</listener>"
                                     b"</schema-request>")
    pump = run_pump(bus, organism)
    got, = answers(bus, listed)
    assert (got.sender, got.to, got.root_tag) == ("system", "console", "capabilities")
    assert got.payload_xml.startswith('<capabilities><tool name="calculator" root_tag="add">'
                                      "&lt;add&gt;: Add two numbers.")
    refused, = answers(bus, schema)
    assert refused.root_tag == "huh" and 'code="meta-denied"' in refused.payload_xml
    assert "bus pump oob send schema-request" in refused.payload_xml
    assert pump_tools.CALLS == [] and pump.stats.outcomes == {"meta": 1, "huh": 1}
    assert threads.thread_count(bus.conn, "open") == 1


@pytest.mark.parametrize("level, allowed", [("admin", True), ("all", True), ("none", False)])
def test_signed_meta_requests_follow_the_meta_switches(tmp_path, level, allowed):
    from bus.pump.meta import MetaDenied
    from bus.pump.oob import OobRequest
    from bus.pump.routing import RoutingTable
    organism = write_organism(tmp_path, "calculator", extra=(
        f"meta:\n  allow_list_capabilities: {level}\n  allow_schema_requests: {level}\n"))
    table = RoutingTable(load_organism(organism))
    requests = [OobRequest("list-capabilities", {}, "n1", 1, "key"),
                OobRequest("schema-request", {"listener": "calculator"}, "n2", 1, "key")]
    if not allowed:
        for request in requests:
            with pytest.raises(MetaDenied, match="is allowed to none"):
                table.dispatch(request)
        return
    listed, schema = (table.dispatch(request) for request in requests)
    assert [tool["name"] for tool in listed["tools"]] == ["calculator"]
    assert schema["root_tag"] == "add" and schema["xsd"].startswith("<xs:schema")
    assert schema["example"].startswith("<add>")
