"""The per-listener pipeline: raw bytes in, a typed `Envelope` or a `Huh` out.

    pipeline = listener_pipeline("calculator", CalculatorAdd)
    result = run(pipeline, raw_bytes)
    if isinstance(result, Huh):
        reply = result.to_element()      # <huh step=... code=... line=... column=...>
    else:
        result.payload                   # a CalculatorAdd

Steps, in order, each a small pure function of (pipeline, value) that
returns the next value or a `Huh`:

    repair       bytes -> Document     strict hardened parse; repair only if that fails
    c14n         Document -> Document  C14N 2.0 bytes of the whole message
    envelope     Document -> Document  a plain envelope from its C14N bytes, else envelope.xsd
    extract      Document -> Envelope  from, to, thread, payload; root tag check
    payload      Envelope -> Envelope  a plain payload from its C14N bytes, else the payload XSD
    deserialize  Envelope -> Envelope  the payload becomes the typed object

The system pipeline (``<boot/>`` and ``<huh>``) runs the same steps
without the payload XSD. A `Huh` names the step, a stable code, the first
error's line and column (column 0 when libxml2 gives none, as for schema
errors; after a repair the line still matches the input, the column is in
the repaired text) and the fix. It never names listeners, paths or routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from typing import Callable
from typing import NamedTuple

from lxml import etree

from bus.xml.envelope import PLAIN_END
from bus.xml.envelope import Envelope
from bus.xml.envelope import plain_fields
from bus.xml.envelope import read_envelope
from bus.xml.envelope import validate_envelope
from bus.xml.errors import XmlMalformed
from bus.xml.errors import XmlRejected
from bus.xml.errors import XmlValueInvalid
from bus.xml.parser import MAX_BYTES
from bus.xml.parser import Repair
from bus.xml.parser import canonicalize
from bus.xml.parser import parse
from bus.xml.parser import parse_repaired
from bus.xml.payload import XmlSpec
from bus.xml.payload import spec_of

HUH = "huh"
BOOT = "boot"
SYSTEM = "system"


@dataclass(frozen=True)
class Huh:
    """Why a message was refused, for the sender to learn from."""

    step: str  # repair, c14n, envelope, extract, payload, deserialize
    code: str  # stable: malformed, doctype, too-deep, envelope-invalid, unknown-root, ...
    message: str  # what is wrong and how to fix it
    line: int = 0
    column: int = 0

    @classmethod
    def from_error(cls, step: str, error: XmlRejected) -> Huh:
        return cls(step, error.code, error.reason, error.line, error.column)

    def to_element(self) -> etree._Element:
        """``<huh step=".." code=".." line="3" column="5">message</huh>`` (a payload)."""
        element = etree.Element(HUH, step=self.step, code=self.code, line=str(self.line),
                                column=str(self.column))
        element.text = self.message
        return element

    @classmethod
    def from_element(cls, element: etree._Element) -> Huh:
        """The `Huh` of a ``<huh>`` element; raises `XmlValueInvalid` if it is not one."""
        if element.tag != HUH or len(element):
            raise XmlValueInvalid(HUH, "expected <huh step= code= line= column=>text</huh>",
                                  element.sourceline)
        return cls(element.get("step", ""), element.get("code", ""), element.text or "",
                   _number(element.get("line")), _number(element.get("column")))


def _number(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0


@dataclass(frozen=True)
class Boot:
    """The system's startup message, ``<boot/>``."""


class Document(NamedTuple):
    """A parsed message before its envelope is read."""

    root: etree._Element
    repairs: tuple[Repair, ...] = ()
    canonical: bytes = b""
    fields: tuple[str, str | None, str, etree._Element] | None = None  # from plain_fields


@dataclass(frozen=True)
class Pipeline:
    """The steps a listener's messages go through; build with `listener_pipeline`."""

    listener: str  # for the pump's routing table; never put into a Huh
    payload: type | None  # the @xmlify class; None for the system pipeline
    steps: tuple[Callable[[Pipeline, Any], Any], ...]
    root_tags: frozenset[str]  # the payload root tags this pipeline accepts
    max_bytes: int = MAX_BYTES
    spec: XmlSpec | None = None  # the payload's, looked up once
    plain: re.Pattern[bytes] | None = None  # the plain payload in the C14N bytes (_plain)


def run(pipeline: Pipeline, raw: bytes) -> Envelope | Huh:
    """Run every step on `raw`; the first `Huh` stops the run and is returned.

    Never raises for the input's sake: a libxml2 failure no step names (a
    C14NError, say) is a `<huh code="unprocessable">` too.
    """
    value: Any = raw
    for step in pipeline.steps:
        try:
            value = step(pipeline, value)
        except etree.LxmlError as exc:
            return _unprocessable(step, exc)
        if type(value) is Huh:
            return value
    return value


def _unprocessable(step: Callable[..., Any], exc: etree.LxmlError) -> Huh:
    return Huh(step.__name__.removeprefix("step_"), "unprocessable",
               f"the XML could not be processed ({type(exc).__name__}: {exc}); send plain "
               "UTF-8 XML without DTDs or entity references")


# --- the steps ----------------------------------------------------------------
# The repair-free path builds six of these tuples per message. A NamedTuple's own
# constructor is a Python function; tuple.__new__ builds the same object at
# about half the cost (0.15 against 0.35 us here), so the steps call it with
# every field given, in order.
_new = tuple.__new__


def step_repair(pipeline: Pipeline, raw: bytes) -> Document | Huh:
    # parse_or_repair, unrolled: the strict parse is the hot path.
    try:
        return _new(Document, (parse(raw, pipeline.max_bytes), (), b"", None))
    except XmlMalformed:
        pass
    except XmlRejected as exc:
        return Huh.from_error("repair", exc)
    try:
        root, repairs = parse_repaired(raw, pipeline.max_bytes)
    except XmlRejected as exc:
        return Huh.from_error("repair", exc)
    return Document(root, repairs)


def step_c14n(pipeline: Pipeline, document: Document) -> Document:
    root, repairs, _, _ = document
    return _new(Document, (root, repairs, canonicalize(root), None))


def step_envelope(pipeline: Pipeline, document: Document) -> Document | Huh:
    root, repairs, canonical, _ = document
    fields = plain_fields(root, canonical)
    if fields is None:  # not written the usual way: envelope.xsd decides and names the error
        return _checked("envelope", validate_envelope, root, document)
    return _new(Document, (root, repairs, canonical, fields))


def step_extract(pipeline: Pipeline, document: Document) -> Envelope | Huh:
    root, repairs, canonical, fields = document
    if fields is None:
        return _check_root(pipeline, read_envelope(root, canonical, repairs))
    sender, to, thread, payload = fields
    if payload.tag not in pipeline.root_tags:
        return _unknown_root(payload)
    return _new(Envelope, (sender, thread, payload, payload, to, canonical, repairs))


def step_any_root(pipeline: Pipeline, document: Document) -> Envelope:
    """For `answer_pipeline`: the payload whatever its root tag, as its element."""
    root, repairs, canonical, fields = document
    if fields is None:
        return read_envelope(root, canonical, repairs)
    sender, to, thread, payload = fields
    return _new(Envelope, (sender, thread, payload, payload, to, canonical, repairs))


def step_bare(pipeline: Pipeline, document: Document) -> Envelope | Huh:
    """For `check_payload`: the document is the payload itself, without an envelope."""
    bare = Envelope("", "", document.root, document.root, None, document.canonical,
                    document.repairs)
    return _check_root(pipeline, bare)


def _check_root(pipeline: Pipeline, envelope: Envelope) -> Envelope | Huh:
    if envelope.root_tag in pipeline.root_tags:
        return envelope
    return _unknown_root(envelope.element)


def _unknown_root(payload: etree._Element) -> Huh:
    return Huh("extract", "unknown-root",
               f"no listener here accepts <{etree.QName(payload).localname}>; check "
               "the payload's root tag against the tool description", payload.sourceline or 0)


def step_payload(pipeline: Pipeline, envelope: Envelope) -> Envelope | Huh:
    found = None if pipeline.plain is None else pipeline.plain.search(envelope.canonical)
    if found is None:  # not written the usual way: the payload XSD decides and names the error
        return _checked("payload", pipeline.spec.validate, envelope.element, envelope)
    # The payload is the field texts until the deserialize step.
    sender, thread, _, element, to, canonical, repairs = envelope
    return _new(Envelope, (sender, thread, found.groups(), element, to, canonical, repairs))


def _checked(step: str, check: Callable[[etree._Element], None], element: etree._Element,
             value: Any) -> Any:
    """`value` if `check(element)` passes, else the `Huh` of its error."""
    try:
        check(element)
    except XmlRejected as exc:
        return Huh.from_error(step, exc)
    return value


def step_deserialize(pipeline: Pipeline, envelope: Envelope) -> Envelope | Huh:
    # Unpacked, not _replace(): this is the hot path, and _replace costs three times as much.
    sender, thread, payload, element, to, canonical, repairs = envelope
    try:
        if type(payload) is tuple:  # the field texts of a plain payload
            payload = pipeline.spec.decode_plain(payload)
        else:
            payload = _deserialize(pipeline, element)
    except XmlRejected as exc:
        return Huh.from_error("deserialize", exc)
    except (ValueError, TypeError) as exc:  # the dataclass's own __post_init__ checks
        return Huh("deserialize", "value-invalid", f"{type(exc).__name__}: {exc}",
                   element.sourceline or 0)
    return _new(Envelope, (sender, thread, payload, element, to, canonical, repairs))


def _deserialize(pipeline: Pipeline, element: etree._Element) -> Any:
    if pipeline.spec is not None:
        return pipeline.spec.decode(element)
    if element.tag == HUH:
        return Huh.from_element(element)
    if len(element) or (element.text or "").strip() or element.attrib:
        raise XmlValueInvalid(BOOT, "must be empty; send <boot/>", element.sourceline)
    return Boot()


# --- building pipelines ---------------------------------------------------------

LISTENER_STEPS = (step_repair, step_c14n, step_envelope, step_extract, step_payload,
                  step_deserialize)
SYSTEM_STEPS = (step_repair, step_c14n, step_envelope, step_extract, step_deserialize)
ANSWER_STEPS = (step_repair, step_c14n, step_envelope, step_any_root)
PAYLOAD_STEPS = (step_repair, step_c14n, step_bare, step_payload, step_deserialize)


def listener_pipeline(listener: str, payload: type, max_bytes: int = MAX_BYTES) -> Pipeline:
    """The pipeline of one listener and its ``@xmlify`` payload class.

    Raises `XmlifyUnsupported` if `payload` is not an ``@xmlify`` class.
    """
    spec = spec_of(payload)
    return Pipeline(listener, payload, LISTENER_STEPS, frozenset((spec.tag,)), max_bytes, spec,
                    _plain(spec, PLAIN_END))


def system_pipeline(max_bytes: int = MAX_BYTES) -> Pipeline:
    """The pipeline of ``<boot/>`` and ``<huh>`` messages: no payload XSD."""
    return Pipeline(SYSTEM, None, SYSTEM_STEPS, frozenset((HUH, BOOT)), max_bytes)


def answer_pipeline(max_bytes: int = MAX_BYTES) -> Pipeline:
    """The pipeline of an answer to a calling listener: the envelope checks, then the
    payload element whatever its root tag (a caller gets answers in its peers' payloads,
    not its own). Its payload schema is the caller's to apply: the pump knows it by tag."""
    return Pipeline(SYSTEM, None, ANSWER_STEPS, frozenset(), max_bytes)


def check_payload(payload: type, raw: bytes, max_bytes: int = MAX_BYTES) -> Envelope | Huh:
    """Run a bare payload document (no envelope) through the payload steps.

    The result's `sender` and `thread` are empty strings.
    """
    spec = spec_of(payload)
    return run(Pipeline("", payload, PAYLOAD_STEPS, frozenset((spec.tag,)), max_bytes, spec,
                        _plain(spec, b"")), raw)


def _plain(spec: XmlSpec, end: bytes) -> re.Pattern[bytes] | None:
    """The plain payload as the last child of the root (`end`: the root's end tag) or the root.

    Searched for in the C14N bytes, a match can only be that element: field
    texts hold no ``<``, so the match is one balanced element, and the root's
    end tag (or nothing) follows it.
    """
    return None if spec.plain is None else re.compile(spec.plain + end + rb"\Z")
