"""`envelope_c14n` writes the bytes `canonicalize(build_envelope(...))` would.

The pump stores every envelope as its canonical XML; it now writes that text
around the payload's own canonical form instead of building the envelope's
tree. Exclusive C14N makes the two agree; these properties check it on
generated payloads: namespaces declared on the payload, on an ancestor it
was cut from, the `env` prefix bound elsewhere, text that needs escaping.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from bus.storage.errors import ValidationFailed
from bus.xml.envelope import ENVELOPE_NS
from bus.xml.envelope import build_envelope
from bus.xml.envelope import envelope_c14n
from bus.xml.parser import canonicalize
from bus.xml.parser import parse
from bus.xml.payload import to_element
from tests.support.pump_tools import Add

IDS = st.text("abcXYZ019._:-", min_size=1, max_size=12)
NAMES = st.sampled_from(["a", "sum", "b-c", "x.y", "data"])
NAMESPACES = st.sampled_from([None, "urn:a", "urn:b", "http://example.com/x"])
PREFIXES = st.sampled_from([None, "p", "env", "q"])
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("&<>\"'\t\n\r"),
               max_size=8)


def _tag(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{{{namespace}}}{name}"


@st.composite
def payloads(draw: st.DrawFn, depth: int = 0) -> etree._Element:
    namespace, prefix = draw(NAMESPACES), draw(PREFIXES)
    nsmap = {} if namespace is None else {prefix: namespace}
    element = etree.Element(_tag(namespace, draw(NAMES)), nsmap=nsmap)
    for name in draw(st.lists(NAMES, max_size=2, unique=True)):
        element.set(name, draw(TEXT))
    element.text = draw(TEXT) or None
    if depth < 2:
        for child in draw(st.lists(payloads(depth + 1), max_size=2)):
            child.tail = draw(TEXT) or None
            element.append(child)
    return element


@given(payloads(), IDS, IDS, st.none() | IDS, st.booleans())
def test_the_same_bytes_as_the_envelope_tree(payload: etree._Element, sender: str, thread: str,
                                             to: str | None, cut: bool) -> None:
    if cut:  # a payload cut from a tree that declares the namespaces its children use
        holder = etree.Element("{urn:holder}h", nsmap={"h": "urn:holder", "p": "urn:a"})
        holder.append(payload)
    built = canonicalize(build_envelope(payload, sender=sender, thread=thread, to=to))
    assert envelope_c14n(payload, sender=sender, thread=thread, to=to) == built
    assert parse(built) is not None  # well-formed, as the pipeline will read it


def test_an_xmlify_payload_is_encoded_as_build_envelope_encodes_it() -> None:
    reply = Add(1.5, 2.0)
    built = canonicalize(build_envelope(reply, sender="calc", thread="t-1", to="bench"))
    assert envelope_c14n(reply, sender="calc", thread="t-1", to="bench") == built
    assert envelope_c14n(to_element(reply), sender="calc", thread="t-1", to="bench") == built


@pytest.mark.parametrize(("field", "kwargs"), [
    ("sender", {"sender": "a b", "thread": "t"}),
    ("to", {"sender": "a", "thread": "t", "to": "<x>"}),
    ("thread", {"sender": "a", "thread": "t&u"}),
])
def test_a_bad_id_is_refused_naming_its_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValidationFailed) as raised:
        envelope_c14n(etree.Element("x"), **kwargs)
    assert raised.value.field == field


def test_a_payload_in_the_envelope_namespace_is_refused() -> None:
    with pytest.raises(ValidationFailed) as raised:
        envelope_c14n(etree.Element(f"{{{ENVELOPE_NS}}}message"), sender="a", thread="t")
    assert raised.value.field == "payload"
