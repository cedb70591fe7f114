"""The message envelope: `<env:message>` with from, optional to, thread, one payload.

    <env:message xmlns:env="urn:agentbus:envelope:1">
      <env:from>planner</env:from>
      <env:to>calculator</env:to>            (omit to broadcast)
      <env:thread>root.calc</env:thread>
      <add><a>1.5</a><b>2</b></add>          (the payload, namespaces untouched)
    </env:message>

`envelope.xsd` (package data) is the contract; `build_envelope` makes one
with lxml constructors only, `read_envelope` turns a validated one into an
`Envelope`. `plain_fields` reads an envelope written the way `build_envelope`
writes it (the common case) from its canonical bytes, without the XSD.
"""

from __future__ import annotations

import copy
import importlib.resources
import re
from typing import Any
from typing import NamedTuple

from lxml import etree

from bus.storage.errors import ValidationFailed
from bus.log.messages import validate_agent_id
from bus.xml.errors import XmlInvalid
from bus.xml.parser import Repair
from bus.xml.parser import canonicalize
from bus.xml.parser import compiled_schema
from bus.xml.payload import is_xmlified
from bus.xml.payload import to_element

ENVELOPE_NS = "urn:agentbus:envelope:1"
PREFIX = "env"
MESSAGE = f"{{{ENVELOPE_NS}}}message"
FROM = f"{{{ENVELOPE_NS}}}from"
TO = f"{{{ENVELOPE_NS}}}to"
THREAD = f"{{{ENVELOPE_NS}}}thread"
THREAD_MAX = 256
_THREAD = re.compile(r"[A-Za-z0-9._:-]+")
# The canonical (exclusive C14N) text of the envelope around a payload (envelope_c14n).
_C14N_OPEN = f'<{PREFIX}:message xmlns:{PREFIX}="{ENVELOPE_NS}">'
_C14N_CLOSE = f"</{PREFIX}:message>".encode()
_xsd: bytes | None = None

# A plain envelope as exclusive C14N writes it: the env prefix, no attributes,
# only whitespace between the children, tokens that match envelope.xsd's
# patterns, then the start of one more element (the payload). [ \t\n] is the
# XML whitespace xs:token trims, minus CR, which C14N writes as &#xD; (such
# an envelope is not plain and goes to the XSD).
_SPACE = rb"[ \t\n]*"
_AGENT = rb"([A-Za-z0-9._:-]{1,128})"
_PLAIN = re.compile(
    b'<env:message xmlns:env="' + re.escape(ENVELOPE_NS.encode()) + b'">'
    + _SPACE + b"<env:from>" + _SPACE + _AGENT + _SPACE + b"</env:from>"
    + b"(?:" + _SPACE + b"<env:to>" + _SPACE + _AGENT + _SPACE + b"</env:to>)?"
    + _SPACE + b"<env:thread>" + _SPACE + rb"([A-Za-z0-9._:-]{1,%d})" % THREAD_MAX + _SPACE
    + b"</env:thread>" + _SPACE + b"<[^/]")
# What follows the payload in a message's C14N bytes when the envelope is plain.
PLAIN_END = _SPACE + b"</env:message>"
_ENVELOPE_TAG = f"{{{ENVELOPE_NS}}}"
_XML_SPACE = " \t\n\r"


class Envelope(NamedTuple):
    """A message that passed the pipeline (or is passing it); immutable.

    `payload` is the payload element until the deserialization step (the
    field texts, a tuple, after the payload step read a plain payload), then
    the typed object; `element` stays the payload element as received.
    `canonical` is the C14N 2.0 form of the whole message as received and
    `repairs` lists what the repair step changed (empty for clean input).
    A NamedTuple rather than a frozen dataclass: it is built once or twice
    per message on the pump's hot path, and this is several times cheaper.
    """

    sender: str
    thread: str
    payload: Any
    element: etree._Element
    to: str | None = None
    canonical: bytes = b""
    repairs: tuple[Repair, ...] = ()

    @property
    def root_tag(self) -> str:
        """The payload's tag (``{namespace}name`` when namespaced): the routing key."""
        return self.element.tag


def envelope_schema() -> etree.XMLSchema:
    """The compiled `envelope.xsd` (read from the installed package once, compiled per thread)."""
    global _xsd
    if _xsd is None:
        _xsd = importlib.resources.files("bus.xml").joinpath("envelope.xsd").read_bytes()
    return compiled_schema(_xsd)


def validate_envelope(root: etree._Element) -> None:
    """Raise `XmlInvalid` ("envelope-invalid") with the first error's line."""
    schema = envelope_schema()
    if not schema.validate(root):
        first = schema.error_log[0]
        raise XmlInvalid("envelope", first.message, first.line, first.column)


def plain_fields(root: etree._Element,
                 canonical: bytes) -> tuple[str, str | None, str, etree._Element] | None:
    """Sender, recipient, thread and payload of a plain envelope; None for any other.

    `canonical` is the C14N form of `root` (`canonicalize`), where attributes,
    namespace declarations, character references and empty elements have one
    spelling each, so one regular expression over it and two looks at the
    tree decide "plain": what `build_envelope` writes, give or take
    whitespace around the children and the tokens. Every plain envelope is
    valid under envelope.xsd (tests/xml/test_xml_pipeline.py checks this on many
    variants), and this costs a third of an XSD validation. None decides
    nothing: `validate_envelope` then decides, and names the error.
    """
    found = _PLAIN.match(canonical)
    if found is None:
        return None
    sender, to, thread = found.groups()
    if len(root) != (3 if to is None else 4):
        return None
    payload = root[-1]
    tag = payload.tag
    if type(tag) is not str or tag.startswith(_ENVELOPE_TAG):
        return None  # a comment or PI (our parser drops them), or an envelope element
    tail = payload.tail
    if tail is not None and tail.strip(_XML_SPACE):
        return None
    return sender.decode(), None if to is None else to.decode(), thread.decode(), payload


def read_envelope(root: etree._Element, canonical: bytes = b"",
                  repairs: tuple[Repair, ...] = ()) -> Envelope:
    """The `Envelope` of a message that `validate_envelope` accepted."""
    children = list(root)
    to = children[1].text.strip() if children[1].tag == TO else None
    payload = children[-1]
    return Envelope(children[0].text.strip(), children[-2].text.strip(), payload, payload,
                    to, canonical, repairs)


def build_envelope(payload: Any, *, sender: str, thread: str,
                   to: str | None = None) -> etree._Element:
    """A new `<env:message>` element around a copy of `payload`.

    `payload` is an ``@xmlify`` instance or an lxml element (copied, so the
    caller's tree is left alone). Raises `ValidationFailed` naming the field
    for a bad sender, recipient or thread, or a payload in the envelope
    namespace.
    """
    element = _payload_element(payload)
    message = etree.Element(MESSAGE, nsmap={PREFIX: ENVELOPE_NS})
    etree.SubElement(message, FROM).text = validate_agent_id(sender, "sender")
    if to is not None:
        etree.SubElement(message, TO).text = validate_agent_id(to, "to")
    etree.SubElement(message, THREAD).text = _validate_thread(thread)
    message.append(element)
    return message


def envelope_c14n(payload: Any, *, sender: str, thread: str, to: str | None = None) -> bytes:
    """`canonicalize(build_envelope(...))`, without building the envelope's tree.

    Exclusive C14N writes an element's namespace declarations where it uses
    them, so the payload's canonical form is the same alone as inside the
    envelope, and the envelope's own elements hold only ids that need no
    escaping (checked as `build_envelope` checks them). About a third of the
    cost of the tree, its copy of the payload and its serialization.
    """
    element = _payload_element(payload, copy_element=False)
    head = [_C14N_OPEN, _c14n_field("from", validate_agent_id(sender, "sender"))]
    if to is not None:
        head.append(_c14n_field("to", validate_agent_id(to, "to")))
    head.append(_c14n_field("thread", _validate_thread(thread)))
    return b"".join(("".join(head).encode(), canonicalize(element), _C14N_CLOSE))


def _c14n_field(name: str, value: str) -> str:
    return f"<{PREFIX}:{name}>{value}</{PREFIX}:{name}>"


def reply_envelope(envelope: Envelope, payload: Any, *, sender: str) -> etree._Element:
    """An envelope answering `envelope`: to its sender, in its thread, from `sender`."""
    return build_envelope(payload, sender=sender, thread=envelope.thread, to=envelope.sender)


def _payload_element(payload: Any, copy_element: bool = True) -> etree._Element:
    """The payload as an element of its own: a copy of an lxml element unless
    `copy_element` is False (the caller only reads it)."""
    if is_xmlified(type(payload)):
        return to_element(payload)
    if not isinstance(payload, etree._Element) or not isinstance(payload.tag, str):
        raise ValidationFailed("payload", f"must be an @xmlify instance or an lxml element, "
                                          f"got {type(payload).__name__}")
    if etree.QName(payload).namespace == ENVELOPE_NS:
        raise ValidationFailed("payload", f"is in the envelope namespace {ENVELOPE_NS}; use "
                                          "the payload's own namespace or none")
    return copy.deepcopy(payload) if copy_element else payload


def _validate_thread(thread: object) -> str:
    if isinstance(thread, str) and 0 < len(thread) <= THREAD_MAX and _THREAD.fullmatch(thread):
        return thread
    raise ValidationFailed("thread", f"{thread!r} is not a thread id; use 1-{THREAD_MAX} "
                                     "letters, digits and . _ : -")
