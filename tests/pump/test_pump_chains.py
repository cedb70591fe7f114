"""Call chains through the pump (seeds 001 and 002): an answer goes back up the chain to
the calling handler, whatever its root tag, and the chain is pruned as it bubbles, so no
thread is left open once a request is done.

Organisms as in tests/pump/test_pump.py (handlers in tests/support/pump_tools.py), plus the example
organism of examples/ through the seed-001 flow console -> greeter -> calculator ->
greeter -> console.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lxml import etree

from bus import Bus
from bus.pump import client
from bus.pump import threads
from bus.storage.db import write_transaction
from bus.log.messages import now_ms
from bus.pump import work
from bus.pump.commit import EncodedMemory
from bus.pump.envelopes import derived_id
from bus.pump.envelopes import envelope_xml
from bus.pump.organism import load_organism
from bus.pump.pump import Pump
from tests.support import pump_tools
from tests.pump.test_pump import answers
from tests.pump.test_pump import run_pump
from tests.pump.test_pump import write_organism

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def open_calls(bus: Bus) -> list[tuple[str, ...]]:
    """The paths of open threads other than the organisms' roots (which stay open)."""
    return [thread.path for thread in threads.list_threads(bus.conn, "open", 10_000)
            if not thread.is_root]


def calls_of(listener: str) -> list[tuple[object, object]]:
    return [(msg, ctx) for name, msg, ctx in pump_tools.CALLS if name == listener]


def test_an_answer_reaches_the_calling_handler_whatever_its_root_tag(bus, tmp_path):
    organism = write_organism(tmp_path, "asker", "calc.add")  # asker takes <ask>, gets <sum>
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.payload_xml) == (
        "asker", "console", "<result><source>asker</source><text>calc.add said 3</text></result>")
    (asked, first), (summed, second) = calls_of("asker")
    assert type(asked).__name__ == "Ask" and summed == pump_tools.Sum(3.0)
    assert second.thread == first.thread and second.from_ == "calc.add"
    assert open_calls(bus) == []


def test_answers_bubble_up_a_chain_of_callers_hop_by_hop(bus, tmp_path):
    organism = write_organism(tmp_path, "outer", "asker", "calc.add")
    sent = client.send(bus, "org", b"<echo><text>1 + 2?</text></echo>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.payload_xml) == (
        "outer", "<result><source>outer</source><text>calc.add said 3</text></result>")
    assert [(name, type(msg).__name__) for name, msg, _ in pump_tools.CALLS] == [
        ("outer", "Echo"), ("asker", "Ask"), ("calc.add", "Add"), ("asker", "Sum"),
        ("outer", "Result")]
    (_, outer_call), (_, outer_answer) = calls_of("outer")
    assert outer_answer.thread == outer_call.thread and outer_answer.from_ == "asker"
    assert open_calls(bus) == []


def test_an_answer_no_payload_class_describes_reaches_the_caller_as_an_element(bus, tmp_path):
    organism = write_organism(tmp_path, "definer", "dictionary")
    sent = client.send(bus, "org", b"<ask><text>word?</text></ask>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert got.payload_xml == ("<result><source>definer</source><text>&lt;meaning&gt; "
                               "word: a word</text></result>")
    _, (element, _) = calls_of("definer")
    assert isinstance(element, etree._Element)
    assert open_calls(bus) == []


def test_an_answer_the_pump_did_not_encode_is_checked_and_typed_for_its_caller(bus, tmp_path):
    """As after a restart (or from another pump): the pump remembers no envelope it wrote,
    so calc.add's <sum> goes through the envelope checks and Sum's schema before the asker
    gets it as a Sum."""
    organism = write_organism(tmp_path, "asker", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    pump = Pump(bus, load_organism(organism), oob=False)
    pump.steps.encoded = EncodedMemory(0)
    pump.run(until_idle=True)
    got, = answers(bus, sent)
    assert got.payload_xml.endswith("<text>calc.add said 3</text></result>")
    assert calls_of("asker")[1][0] == pump_tools.Sum(3.0)
    assert open_calls(bus) == []


def test_an_answer_its_payload_class_refuses_is_a_huh_not_a_call(bus, tmp_path):
    """The <sum> schema applies to answers too: a peer's malformed <sum> never reaches the
    asker's handler; the asker's caller (the client) hears of it."""
    organism = write_organism(tmp_path, "asker", "calc.add")
    organism.write_text(organism.read_text().replace("tests.support.pump_tools:add",
                                                     "tests.support.pump_tools:bad_sum"))
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    pump = Pump(bus, load_organism(organism), oob=False)
    pump.steps.encoded = EncodedMemory(0)
    pump.run(until_idle=True)
    got, = answers(bus, sent)
    assert got.root_tag == "huh" and 'code="payload-invalid"' in got.payload_xml
    assert [type(msg).__name__ for msg, _ in calls_of("asker")] == ["Ask"]
    assert open_calls(bus) == []


def test_a_final_answer_deep_in_a_chain_closes_the_callers_that_forwarded_to_it(bus,
                                                                                 tmp_path):
    organism = write_organism(tmp_path, "relay", "echo")
    sent = [client.send(bus, "org", f"<ask><text>hi {i}</text></ask>") for i in range(4)]
    run_pump(bus, organism)
    for i, request in enumerate(sent):
        got, = answers(bus, request)
        assert (got.sender, got.root_tag) == ("echo", "final-answer")
        assert f"hi {i}" in got.payload_xml
    assert open_calls(bus) == []  # not four org/console/relay threads


def test_a_caller_with_nothing_to_say_about_an_answer_ends_its_chain(bus, tmp_path):
    organism = write_organism(tmp_path, "ignorer", "calc.add")
    sent = client.send(bus, "org", b"<ask><text>1 + 2?</text></ask>")
    run_pump(bus, organism)
    assert answers(bus, sent) == []
    assert [type(msg).__name__ for msg, _ in calls_of("ignorer")] == ["Ask", "Sum"]
    assert open_calls(bus) == []


def test_a_broadcast_caller_stays_open_until_its_last_callee_is_done(bus):
    conn = bus.conn
    root = threads.initialize_root(conn, "org")
    caller = threads.extend_chain(conn, threads.extend_chain(conn, root.uuid, "console").uuid,
                                  "greeter")
    fast = threads.extend_chain(conn, caller.uuid, "search.fast")
    slow = threads.extend_chain(conn, caller.uuid, "search.slow")
    with write_transaction(conn):
        threads.close_thread(conn, fast.uuid)
        threads.close_done_chain(conn, caller.uuid, 1)
    assert threads.get_thread(conn, caller.uuid).status == "open"  # slow may still answer
    with write_transaction(conn):
        threads.close_thread(conn, slow.uuid)
        threads.close_done_chain(conn, caller.uuid, 2)
    assert open_calls(bus) == []


# --- the example organism -------------------------------------------------------------------


def example_organism(tmp_path: Path) -> Path:
    """examples/ copied (its handler module is imported from the organism's directory)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples" / "organism.yaml"


def test_the_example_runs_the_seed_001_flow_greeter_calculator_greeter_console(bus, tmp_path):
    organism = example_organism(tmp_path)
    sent = client.send(bus, "example", b"<greeting><name>Ada</name></greeting>")
    run_pump(bus, organism)
    got, = answers(bus, sent)
    assert (got.sender, got.to, got.payload_xml) == (
        "greeter", "console", "<hello><text>hello, Ada! your name has 3 letters</text></hello>")
    paths = [thread.path for thread in threads.list_threads(bus.conn, "closed", 100)]
    assert ("example", "console", "greeter", "calculator") in paths
    assert open_calls(bus) == []


def test_no_thread_is_left_open_after_a_hundred_requests_of_each_kind(bus, tmp_path):
    organism = example_organism(tmp_path)
    text = organism.read_text()  # search.slow sleeps 0.5 s: side by side, not one by one
    organism.write_text(text.replace("handler: example_tools:search_slow\n",
                                     "handler: example_tools:search_slow\n    concurrency: 100\n"))
    kinds = {
        "<greeting><name>Ada</name></greeting>": ("greeter", "hello"),
        "<greeting><name>Ada</name><loud>true</loud></greeting>": ("shouter", "final-answer"),
        "<add><a>1.5</a><b>2</b></add>": ("calculator", "sum"),
        "<search><query>q</query></search>": ("search.fast search.slow", "search-result"),
    }
    sent = {xml: [client.send(bus, "example", xml.encode()) for _ in range(100)]
            for xml in kinds}
    pump = Pump(bus, load_organism(organism), oob=False, max_in_flight=200)
    pump.run(until_idle=True)
    for xml, (sender, root_tag) in kinds.items():
        for request in sent[xml]:
            got = answers(bus, request)
            assert sorted((item.sender, item.root_tag) for item in got) == \
                [(name, root_tag) for name in sender.split()]
    assert open_calls(bus) == []
    assert threads.thread_count(bus.conn, "open") == 1  # the organism's root


def test_a_call_on_a_thread_pruned_meanwhile_is_refused_not_retried(bus, tmp_path):
    """The counter's thread closes (its chain ended elsewhere) while calc.add's answer waits
    for it: the counter's next call is refused with a thread-closed <huh> for the record,
    and its unit is done, not failed and retried until it is a dead letter."""
    organism = write_organism(tmp_path, "counter", "calc.add")
    sent = client.send(bus, "org", b"<sum><value>0</value></sum>")

    def prune(finished):
        for done in finished:
            if done.unit.listener == "counter" and done.unit.kind == "answer":
                with write_transaction(bus.conn):  # as the pump prunes a chain that ended
                    threads.close_thread(bus.conn, done.unit.thread)
                    threads.close_done_chain(bus.conn, sent.thread, now_ms())

    pump = run_pump(bus, organism, before_commit=prune)
    assert pump.stats.outcomes == {"replied": 3}  # counter, calc.add, counter
    _, (_, answered) = calls_of("counter")
    call_id = derived_id(answered.message_id, "counter", 0)  # the refused call, written
    refusal = work.message_by_id(bus.conn, derived_id(call_id, "system", "closed/calc.add"),
                                 bus.blobs)
    assert 'code="thread-closed"' in envelope_xml(refusal).decode()
    assert work.units_for_input(bus.conn, work.message_by_id(bus.conn, call_id,
                                                             bus.blobs).seq) == []
    assert open_calls(bus) == []
