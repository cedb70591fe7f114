"""The per-listener pipeline: typed envelopes, and one `<huh>` per kind of failure."""

from __future__ import annotations

import dataclasses
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from bus.storage.errors import ValidationFailed
from bus.xml import ENVELOPE_NS
from bus.xml import Boot
from bus.xml import Envelope
from bus.xml import Huh
from bus.xml import build_envelope
from bus.xml import canonicalize
from bus.xml import check_payload
from bus.xml import listener_pipeline
from bus.xml import parse
from bus.xml import reply_envelope
from bus.xml import run
from bus.xml import system_pipeline
from bus.xml import xmlify
from bus.xml.envelope import plain_fields
from bus.xml.envelope import read_envelope
from bus.xml.envelope import validate_envelope
from bus.xml.errors import XmlRejected
from bus.xml.pipeline import LISTENER_STEPS
from bus.xml.pipeline import Document
from bus.xml.pipeline import SYSTEM_STEPS
from tests.support.properties import scaled_settings

LISTENER = "calculator-7f"  # must never show up in a Huh
HEAD = f'<env:message xmlns:env="{ENVELOPE_NS}">'


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers."""
    a: float
    b: float


@xmlify(root="ratio")
@dataclass
class Ratio:
    num: int
    den: int

    def __post_init__(self) -> None:
        if self.den == 0:
            raise ValueError("den must not be 0")


@pytest.fixture
def pipeline():
    return listener_pipeline(LISTENER, Add)


def message(payload: str, *, sender: str = "planner", to: str | None = None,
            thread: str = "root") -> bytes:
    to_part = f"\n  <env:to>{to}</env:to>" if to else ""
    return (f"{HEAD}\n  <env:from>{sender}</env:from>{to_part}\n  <env:thread>{thread}"
            f"</env:thread>\n  {payload}\n</env:message>").encode()


def assert_huh(result: object, step: str, code: str, line: int, column: int = 0) -> Huh:
    assert isinstance(result, Huh), result
    assert (result.step, result.code, result.line, result.column) == (step, code, line, column)
    text = etree.tostring(result.to_element()).decode()
    assert LISTENER not in text and "calculator" not in text  # no topology
    return result


def test_pipeline_clean_message_becomes_typed_envelope(pipeline) -> None:
    raw = message("<add><a>1.5</a><b>2</b></add>", to="calculator")
    result = run(pipeline, raw)
    assert isinstance(result, Envelope)
    assert (result.sender, result.to, result.thread) == ("planner", "calculator", "root")
    assert result.payload == Add(1.5, 2.0)
    assert result.root_tag == "add" and result.repairs == ()
    assert result.canonical == etree.tostring(etree.fromstring(raw), method="c14n2")


def test_pipeline_steps_are_in_seed_order(pipeline) -> None:
    assert [s.__name__ for s in pipeline.steps] == [
        "step_repair", "step_c14n", "step_envelope", "step_extract", "step_payload",
        "step_deserialize"]
    assert pipeline.steps == LISTENER_STEPS
    assert system_pipeline().steps == tuple(s for s in LISTENER_STEPS if s.__name__ !=
                                            "step_payload") == SYSTEM_STEPS


def test_pipeline_repaired_message_reports_repairs(pipeline) -> None:
    raw = b"Here you go:\n" + message("<add><a>1</a><b>2</b></add>", thread="R&D")
    result = run(pipeline, raw)
    # The repaired thread "R&D" is data, not markup: the envelope XSD refuses it.
    assert_huh(result, "envelope", "envelope-invalid", 4)
    raw = b"Here you go:\n" + message("<add><a>1</a><b>2</b></add>") + b"\nthanks & bye"
    result = run(pipeline, raw)
    assert isinstance(result, Envelope) and result.payload == Add(1.0, 2.0)
    assert [r.kind for r in result.repairs] == ["stripped-prose", "stripped-prose"]


def test_huh_malformed(pipeline) -> None:
    raw = message("<add><a>1</a><b>2</b></ad>")
    huh = assert_huh(run(pipeline, raw), "repair", "malformed", 4, 29)
    assert "mismatch" in huh.message


def test_huh_envelope_invalid(pipeline) -> None:
    raw = f"{HEAD}\n<env:from>planner</env:from>\n<add><a>1</a><b>2</b></add>\n" \
          f"</env:message>".encode()
    huh = assert_huh(run(pipeline, raw), "envelope", "envelope-invalid", 3)
    assert "thread" in huh.message


def test_huh_payload_invalid(pipeline) -> None:
    raw = message("<add>\n<a>one</a>\n<b>2</b></add>")
    huh = assert_huh(run(pipeline, raw), "payload", "payload-invalid", 5)
    assert "'one' is not a valid value" in huh.message


def test_huh_unknown_root_tag(pipeline) -> None:
    huh = assert_huh(run(pipeline, message("<subtract><a>1</a></subtract>")),
                     "extract", "unknown-root", 4)
    assert "<subtract>" in huh.message


def test_huh_deserialize_reports_the_dataclass_check() -> None:
    result = run(listener_pipeline("x", Ratio), message("<ratio><num>1</num><den>0</den></ratio>"))
    huh = assert_huh(result, "deserialize", "value-invalid", 4)
    assert huh.message == "ValueError: den must not be 0"


@pytest.mark.parametrize("raw, code", [
    (b"", "empty"),
    (b'<!DOCTYPE m [<!ENTITY e "x">]><m>&e;</m>', "doctype"),
    (b"<a>" * 300 + b"</a>" * 300, "too-deep"),
    (b"<m/><m/>", "multiple-roots"),
    (b"<m>\xff</m>", "encoding"),
])
def test_huh_for_hostile_input(pipeline, raw: bytes, code: str) -> None:
    result = run(pipeline, raw)
    assert isinstance(result, Huh) and (result.step, result.code) == ("repair", code)


def test_huh_element_round_trip() -> None:
    huh = Huh("payload", "payload-invalid", "Element 'a': bad & <worse>", 3, 0)
    element = huh.to_element()
    assert etree.tostring(element) == (b'<huh step="payload" code="payload-invalid" line="3" '
                                       b'column="0">Element \'a\': bad &amp; &lt;worse&gt;</huh>')
    assert Huh.from_element(etree.fromstring(etree.tostring(element))) == huh


def test_system_pipeline_boot_and_huh() -> None:
    system = system_pipeline()
    boot = run(system, message("<boot/>", sender="system"))
    assert isinstance(boot, Envelope) and boot.payload == Boot()
    huh = Huh("payload", "payload-invalid", "x", 2, 0)
    back = run(system, etree.tostring(build_envelope(huh.to_element(), sender="system",
                                                     thread="root")))
    assert back.payload == huh
    assert_huh(run(system, message("<add><a>1</a><b>2</b></add>")), "extract", "unknown-root", 4)
    assert_huh(run(system, message("<boot>now</boot>")), "deserialize", "value-invalid", 4)


def test_build_envelope_uses_a_prefix_and_leaves_payload_namespaces() -> None:
    payload = etree.fromstring(b'<q:search xmlns:q="urn:search" q:lang="en">weather</q:search>')
    element = build_envelope(payload, sender="planner", thread="root.search", to="google")
    assert element.nsmap == {"env": ENVELOPE_NS}
    assert payload.getparent() is None  # the caller's element was copied, not moved
    assert canonicalize(element[3]) == b'<q:search xmlns:q="urn:search" q:lang="en">' \
                                       b'weather</q:search>'
    assert etree.tostring(element).startswith(f'<env:message xmlns:env="{ENVELOPE_NS}">'
                                              "<env:from>planner</env:from>".encode())


def test_build_envelope_round_trips_through_the_pipeline(pipeline) -> None:
    raw = etree.tostring(build_envelope(Add(1.0, 2.5), sender="planner", thread="t-1"))
    result = run(pipeline, raw)
    assert result.payload == Add(1.0, 2.5) and result.to is None
    reply = reply_envelope(result, Add(3.5, 0.0), sender="calculator")
    answer = run(pipeline, etree.tostring(reply))
    assert (answer.sender, answer.to, answer.thread) == ("calculator", "planner", "t-1")


@pytest.mark.parametrize("kwargs, field", [
    ({"sender": "", "thread": "t"}, "sender"),
    ({"sender": "a b", "thread": "t"}, "sender"),
    ({"sender": "a", "thread": "t", "to": "x/y"}, "to"),
    ({"sender": "a", "thread": "t" * 257}, "thread"),
])
def test_build_envelope_refuses_bad_fields(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        build_envelope(Add(1, 2), **kwargs)
    assert raised.value.field == field


def test_build_envelope_refuses_payload_in_envelope_namespace() -> None:
    with pytest.raises(ValidationFailed, match="envelope namespace"):
        build_envelope(etree.Element(f"{{{ENVELOPE_NS}}}from"), sender="a", thread="t")
    with pytest.raises(ValidationFailed, match="@xmlify instance or an lxml element"):
        build_envelope("<add/>", sender="a", thread="t")


def test_check_payload_without_envelope() -> None:
    assert check_payload(Add, b"<add><a>1</a><b>2</b></add>").payload == Add(1.0, 2.0)
    huh = check_payload(Add, b"<add><a>1</a></add>")
    assert (huh.step, huh.code, huh.line) == ("payload", "payload-invalid", 1)


def test_envelope_xsd_ships_as_package_data() -> None:
    import importlib.resources
    text = importlib.resources.files("bus.xml").joinpath("envelope.xsd").read_text()
    assert f'targetNamespace="{ENVELOPE_NS}"' in text


def test_pipeline_runs_in_threads_without_mixing_errors(pipeline) -> None:
    """lxml schemas keep one error log each: every thread gets its own compiled copy."""
    good = message("<add><a>1</a><b>2</b></add>")
    bad = message("<add><a>q</a><b>2</b></add>")
    wrong: list[object] = []

    def work(raw: bytes, ok: bool) -> None:
        for _ in range(300):
            result = run(pipeline, raw)
            if isinstance(result, Huh) == ok or (not ok and "'q'" not in result.message):
                wrong.append(result)

    threads = [threading.Thread(target=work, args=(bad, False) if i % 2 else (good, True))
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


# An envelope as build_envelope writes it, mostly; then one odd part: another
# prefix or a default namespace, attributes (xsi: ones are valid), whitespace
# (CR too), text between the children, odd tokens, a child too many or too few,
# a payload in the envelope namespace.
ODD_TOKENS = st.sampled_from(["", " planner ", "\tp\n", "a b", "x/y", "&amp;", "&#x41;b", "é",
                              "p\r", "t" * 128, "t" * 129, "t" * 256, "t" * 257, "<![CDATA[p]]>",
                              "p<!--c-->q", "&#13;p"])
SPACE = st.sampled_from(["", "", "\n  ", " ", "\t", "\r\n", "&#13;", "x", "<!--c-->"])


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    prefix = draw(st.sampled_from(["env:"] * 5 + ["e:", ""]))
    declare = f'xmlns{":" + prefix[:-1] if prefix else ""}="{ENVELOPE_NS}"'
    root_attrs = draw(st.sampled_from(
        [""] * 6 + [' a="1"', f' xmlns:xsi="{XSI}" xsi:schemaLocation="{ENVELOPE_NS} e.xsd"',
                    ' xmlns:q="urn:q"']))
    tokens = {"from": "planner", "to": draw(st.none() | st.just("calculator")), "thread": "root"}
    if draw(st.booleans()):
        tokens[draw(st.sampled_from(list(tokens)))] = draw(ODD_TOKENS)
    names = [name for name, token in tokens.items() if token is not None]
    if draw(st.integers(0, 5)) == 0:
        names = draw(st.permutations(names))
    payload = draw(st.sampled_from(["<add><a>1</a><b>2</b></add>"] * 4 + [
        "<add/>", f'<q:add xmlns:q="urn:q">1</q:add>', f"<{prefix}thread>x</{prefix}thread>",
        '<add xmlns="">1</add>', "<add><a>1</a></add><add/>", ""]))
    attrs = draw(st.sampled_from([""] * 8 + [' a="1"', f' xmlns:xsi="{XSI}" xsi:nil="false"']))
    children = "".join(f"{draw(SPACE)}<{prefix}{n}{attrs if i == 0 else ''}>{tokens[n]}</{prefix}{n}>"
                       for i, n in enumerate(names))
    return (f"<{prefix}message {declare}{root_attrs}>{children}{draw(SPACE)}{payload}"
            f"{draw(SPACE)}</{prefix}message>").encode()


XSI = "http://www.w3.org/2001/XMLSchema-instance"


def test_plain_envelope_is_valid_and_reads_like_the_xsd_path() -> None:
    """plain_fields accepts only envelopes envelope.xsd accepts, and reads them alike."""
    hits = []
    examples = scaled_settings(max_examples=1000)

    @examples
    @given(envelopes())
    def check(raw: bytes) -> None:
        try:
            root = parse(raw)
        except XmlRejected:
            return
        fields = plain_fields(root, canonicalize(root))
        if fields is None:
            return
        hits.append(raw)
        validate_envelope(root)  # raises XmlInvalid if the fast path let an invalid one in
        read = read_envelope(root)
        assert fields == (read.sender, read.to, read.thread, read.element)

    check()
    # the strategy reaches plain envelopes: the test is not vacuous
    assert len(hits) > examples.max_examples // 40  # about one in ten reaches it


@scaled_settings(max_examples=300)
@given(envelopes())
def test_pipeline_plain_and_schema_paths_agree(raw: bytes) -> None:
    """The same result, Huh or Envelope, with the plain fast paths and with the XSDs only."""
    fast = run(listener_pipeline(LISTENER, Add), raw)
    with mock.patch("bus.xml.pipeline.plain_fields", lambda root, canonical: None):
        slow = run(dataclasses.replace(listener_pipeline(LISTENER, Add), plain=None), raw)
    assert type(fast) is type(slow)
    if isinstance(fast, Huh):
        assert fast == slow
    else:
        assert fast._replace(element=None) == slow._replace(element=None)
        assert (fast.element.tag, fast.element.sourceline) == (slow.element.tag,
                                                               slow.element.sourceline)


def test_pipeline_takes_the_plain_paths_for_build_envelope_output(pipeline) -> None:
    raw = etree.tostring(build_envelope(Add(1.5, 2.0), sender="planner", thread="t-1",
                                        to="calculator"))
    value: object = raw
    for step in pipeline.steps[:5]:
        value = step(pipeline, value)
    assert type(value.payload) is tuple  # the field texts: both XSDs were skipped
    assert pipeline.steps[5](pipeline, value).payload == Add(1.5, 2.0)


def test_plain_patterns_stay_linear_on_hostile_input(pipeline) -> None:
    """Many candidate payload starts and long texts: the patterns do not backtrack (2 s bound)."""
    head = f"{HEAD}<env:from>p</env:from><env:thread>t</env:thread>"
    inner = "<x><add><a>1</a><b>2</b></add></x>" * 20_000
    many_starts = f"{head}<add>{inner}</add></env:message>".encode()
    long_tail = f"{head}<add><a>1</a><b>2</b></add>{' ' * 1_000_000}</env:message>".encode()

    def expire(signum, frame):
        raise AssertionError("a plain pattern took more than two seconds")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        assert run(pipeline, many_starts).code == "payload-invalid"
        assert run(pipeline, long_tail).payload == Add(1.0, 2.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- what no step names still comes back as a <huh> ------------------------------------

CORPUS = Path(__file__).parent.parent / "data" / "xml"


@pytest.mark.parametrize("name", ["doctype_utf16.xml", "doctype_utf32.xml", "entity_utf16.xml",
                                  "entity_utf32.xml"])
def test_pipeline_refuses_a_doctype_in_any_encoding(name: str) -> None:
    result = check_payload(Add, (CORPUS / name).read_bytes())
    assert isinstance(result, Huh) and (result.step, result.code) == ("repair", "doctype")


def test_pipeline_turns_an_unforeseen_lxml_failure_into_a_huh() -> None:
    """An entity reference reaching C14N (lxml raises C14NError) is a <huh>, not an exception."""
    root = etree.fromstring(b"<add><a>1</a><b>2</b></add>")
    root[0].append(etree.Entity("n"))

    def step_smuggle(_pipeline, _raw):
        return Document(root, (), b"", None)

    smuggling = dataclasses.replace(listener_pipeline(LISTENER, Add),
                                    steps=(step_smuggle, *LISTENER_STEPS[1:]))
    result = run(smuggling, b"")
    assert isinstance(result, Huh)
    assert (result.step, result.code) == ("c14n", "unprocessable")
    assert "C14NError" in result.message
