"""The message envelope: `<env:message>` with from, optional to, thread, one payload.

    <env:message xmlns:env="urn:agentbus:envelope:1">
      <env:from>planner</env:from>
      <env:to>calculator</env:to>            (omit to broadcast)
      <env:thread>root.calc</env:thread>
      <add><a>1.5</a><b>2</b></add>          (the payload, namespaces untouched)
    </env:message>

`envelope.xsd` (package data) is the contract; `build_envelope` makes one
with lxml constructors only, `read_envelope` turns a validated one into an
`Envelope`.
"""

from __future__ import annotations

import copy
import importlib.resources
import re
from typing import Any
from typing import NamedTuple

from lxml import etree

from bus.errors import ValidationFailed
from bus.messages import validate_agent_id
from bus.xml.errors import XmlInvalid
from bus.xml.parser import Repair
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
_xsd: bytes | None = None


class Envelope(NamedTuple):
    """A message that passed the pipeline (or is passing it); immutable.

    `payload` is the payload element until the deserialization step, then
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


def reply_envelope(envelope: Envelope, payload: Any, *, sender: str) -> etree._Element:
    """An envelope answering `envelope`: to its sender, in its thread, from `sender`."""
    return build_envelope(payload, sender=sender, thread=envelope.thread, to=envelope.sender)


def _payload_element(payload: Any) -> etree._Element:
    if is_xmlified(type(payload)):
        return to_element(payload)
    if not isinstance(payload, etree._Element) or not isinstance(payload.tag, str):
        raise ValidationFailed("payload", f"must be an @xmlify instance or an lxml element, "
                                          f"got {type(payload).__name__}")
    if etree.QName(payload).namespace == ENVELOPE_NS:
        raise ValidationFailed("payload", f"is in the envelope namespace {ENVELOPE_NS}; use "
                                          "the payload's own namespace or none")
    return copy.deepcopy(payload)


def _validate_thread(thread: object) -> str:
    if isinstance(thread, str) and 0 < len(thread) <= THREAD_MAX and _THREAD.fullmatch(thread):
        return thread
    raise ValidationFailed("thread", f"{thread!r} is not a thread id; use 1-{THREAD_MAX} "
                                     "letters, digits and . _ : -")
