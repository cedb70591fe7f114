"""Envelopes the pump encoded itself are decoded, not run through the pipeline again.

A handler's @xmlify reply is valid by construction (`to_element` checks
every value's type); when the pump routes it to a listener of the same
payload class, `checked_input` decodes the element it encoded instead of
parsing, canonicalizing and validating the committed XML. Client requests
and lxml elements a handler built itself are always checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.pump import Pump
from bus.pump import client
from bus.pump import commit
from bus.pump.organism import load_organism
from bus.xml.envelope import build_envelope
from bus.xml.parser import canonicalize
from bus.xml.payload import to_element
from bus.xml.pipeline import listener_pipeline
from bus.xml.pipeline import run
from tests.support import pump_tools

COUNTER = "name: org\nlisteners:\n" + pump_tools.counter_listeners() + """\
  - name: careless
    root_tag: ask
    payload: tests.support.pump_tools:Ask
    handler: tests.support.pump_tools:careless
    peers: [calc.add]
"""


@pytest.fixture
def pipeline_runs(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The XML each pipeline run got (a spy: the real pipeline still runs)."""
    runs: list[bytes] = []

    def spy(pipeline, raw: bytes):
        runs.append(raw)
        return run(pipeline, raw)
    monkeypatch.setattr(commit, "run_pipeline", spy)
    return runs


def run_pump(bus: Bus, tmp_path: Path) -> None:
    path = tmp_path / "organism.yaml"
    path.write_text(COUNTER)
    Pump(bus, load_organism(path), oob=False).run(until_idle=True)


def test_calls_and_answers_the_pump_encoded_skip_the_pipeline(bus, tmp_path, pipeline_runs):
    sent = client.send(bus, "org", "<sum><value>0</value></sum>", to="counter")
    run_pump(bus, tmp_path)
    got, = client.replies(bus, sent)
    assert got.payload_xml == "<final-answer><text>counted to 3</text></final-answer>"
    # counter and calc.add took turns seven times; only the client's request was checked
    assert [name for name, _, _ in pump_tools.CALLS] == ["counter", "calc.add"] * 3 + ["counter"]
    assert [msg for _, msg, _ in pump_tools.CALLS][1:3] == [pump_tools.Add(0.0, 1.0),
                                                            pump_tools.Sum(1.0)]
    assert len(pipeline_runs) == 1 and b"<value>0</value>" in pipeline_runs[0]


def test_an_element_a_handler_built_itself_is_still_checked(bus, tmp_path, pipeline_runs):
    sent = client.send(bus, "org", "<ask><text>1 + 2?</text></ask>", to="careless")
    run_pump(bus, tmp_path)
    got, = client.replies(bus, sent)
    assert got.payload_xml == ("<result><source>careless</source><text>calc.add said "
                               "payload-invalid</text></result>")
    assert any(pump_tools.BAD_ADD.encode() in raw for raw in pipeline_runs)


FINITE = st.floats(allow_nan=False, allow_infinity=False)


@given(a=FINITE, b=st.one_of(FINITE, st.integers(-10 ** 6, 10 ** 6)))
def test_decoding_the_encoded_element_gives_what_the_pipeline_gives(a, b):
    """The shortcut and the pipeline agree on every payload a handler can send."""
    element = to_element(pump_tools.Add(a, b))
    pipeline = listener_pipeline("calc.add", pump_tools.Add)
    envelope = build_envelope(element, sender="counter", thread="t-1", to="calc.add")
    checked = run(pipeline, canonicalize(envelope))
    decoded = pipeline.spec.decode(element)
    assert decoded == checked.payload
    assert [type(value) for value in (decoded.a, decoded.b)] == [
        type(value) for value in (checked.payload.a, checked.payload.b)]
