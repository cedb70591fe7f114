"""Seed 000's pipelines side by side (bus/pump/pipelines.py): each listener's
pipeline runs on a worker thread of its own, so two listeners' pipelines
overlap, while what comes out (replies, `<huh>`s) and the order in which one
listener's handler sees its inputs stay what they were on the event loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bus import Bus
from bus.pump import Pump
from bus.pump import client
from bus.pump import pipelines
from bus.pump.organism import load_organism
from tests.support import pump_tools

MEET = "root_tag: meet\n    payload: tests.support.pump_tools:Meet\n    handler: tests.support.pump_tools:meet"
ECHO = ("root_tag: echo\n    payload: tests.support.pump_tools:Echo\n    handler: tests.support.pump_tools:echo\n"
        "    concurrency: 8")
BIG = "x" * pipelines.MIN_BYTES  # an envelope this long goes to its listener's worker
ON_THE_LOOP = 1 << 62  # MIN_BYTES that keeps every pipeline on the loop, as before


def organism(directory: Path, **listeners: str) -> Path:
    body = "".join(f"  - name: {name}\n    {entry}\n" for name, entry in listeners.items())
    path = directory / "organism.yaml"
    path.write_text(f"name: org\nlisteners:\n{body}")
    return path


def run_until_idle(bus: Bus, path: Path) -> Pump:
    pump = Pump(bus, load_organism(path), oob=False)
    runner = threading.Thread(target=pump.run, kwargs={"until_idle": True})
    runner.start()
    runner.join(timeout=60)  # a deadline, not a measurement
    pump.stop()
    runner.join()
    return pump


def test_two_listeners_pipelines_overlap(bus: Bus, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A broadcast to two listeners: each pipeline waits in deserialization until the
    other's has started too. On the loop, one after another, the first would wait
    alone until the barrier broke, and both senders would get a <huh>."""
    monkeypatch.setattr(pump_tools, "RENDEZVOUS", threading.Barrier(2, timeout=20))
    monkeypatch.setattr(pump_tools, "PIPELINE_EVENTS", [])
    path = organism(tmp_path, left=MEET, right=MEET)
    sent = client.send(bus, "org", f"<meet><text>{BIG}</text></meet>".encode())

    pump = run_until_idle(bus, path)

    got = sorted((item.sender, item.root_tag, item.payload_xml)
                 for item in client.replies(bus, sent))
    assert got == [(name, "result", f"<result><source>{name}</source><text>met {len(BIG)}"
                                    "</text></result>") for name in ("left", "right")]
    assert pump.stats.outcomes == {"replied": 2}
    events = pump_tools.PIPELINE_EVENTS
    assert [event for event, _ in events] == ["start", "start", "end", "end"], events
    assert {name for _, name in events[:2]} == {"pump-pipeline-left_0", "pump-pipeline-right_0"}


def requests() -> list[bytes]:
    """Small and large, valid, repaired and refused, interleaved."""
    return [f"<echo><text>{text}</text>{extra}</echo>".encode() for text, extra in (
        (f"a{BIG}", ""), ("b", ""), (f"c{BIG}", "<count>2</count>"),
        (f"d{BIG}", "<count>many</count>"),  # payload-invalid
        ("e", ""), ("f & g", ""),  # repaired: the stray & is escaped
        (f"h{BIG}", "<count>0</count>"), ("i", "<count>x</count>"),
        (f"j{BIG} & k", ""), ("l", "<mode>raise</mode>"), (f"m{BIG}", ""), ("n", ""))]


def outcome(bus: Bus, tmp_path: Path, min_bytes: int,
            monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, dict]:
    """Every request's replies, the texts the handler saw in order, the outcomes."""
    monkeypatch.setattr(pipelines, "MIN_BYTES", min_bytes)
    pump_tools.CALLS.clear()
    sent = [client.send(bus, "org", xml, to="echo") for xml in requests()]
    pump = run_until_idle(bus, organism(tmp_path, echo=ECHO))
    replies = [[(item.sender, item.root_tag, item.payload_xml.replace(BIG, "~"))
                for item in client.replies(bus, one)] for one in sent]
    seen = [msg.text.replace(BIG, "~") for _, msg, _ in pump_tools.CALLS]
    return replies, seen, pump.stats.outcomes


def test_results_errors_and_order_are_those_of_pipelines_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same requests through a pump that checks all inputs on the loop, one that
    checks the large ones on the listener's worker (the default) and one that checks
    them all there: the same replies and <huh>s, and the handler sees its inputs in the
    order they were sent in each."""
    runs = {}
    for name, min_bytes in (("loop", ON_THE_LOOP), ("default", pipelines.MIN_BYTES),
                            ("worker", 0)):
        (tmp_path / name).mkdir()
        with Bus.open(tmp_path / name / "bus.db") as bus:
            runs[name] = outcome(bus, tmp_path / name, min_bytes, monkeypatch)
    replies, seen, outcomes = runs["loop"]
    assert runs["default"] == runs["worker"] == runs["loop"]
    assert seen == ["a~", "b", "c~", "e", "f & g", "h~", "j~ & k", "l", "m~", "n"]
    codes = [[xml.split('code="')[1].split('"')[0] for _, tag, xml in got if tag == "huh"]
             for got in replies]
    assert codes == [[], [], [], ["payload-invalid"], [], [], [], ["payload-invalid"], [],
                     ["handler-error"], [], []]
    assert outcomes == {"huh": 3, "replied": 9}


def test_pipeline_workers_end_with_the_pump(bus: Bus, tmp_path: Path) -> None:
    client.send(bus, "org", f"<echo><text>{BIG}</text></echo>".encode(), to="echo")
    pump = run_until_idle(bus, organism(tmp_path, echo=ECHO))
    assert pump.stats.outcomes == {"replied": 1}
    assert not [thread.name for thread in threading.enumerate()
                if thread.name.startswith("pump-pipeline-")]
