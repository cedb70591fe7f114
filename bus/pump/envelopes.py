"""Envelopes as bus messages: every envelope the pump handles is one `messages` row.

    from_agent      the sender: a listener, the client (ingress) or "system"
    to_agent        "@<organism>": agent ids cannot hold '@', so `bus poll`
                    never hands an envelope to an agent (channels use '#')
    type            "envelope"
    correlation_id  the envelope's thread UUID
    in_reply_to     the input envelope's id (for everything the pump writes)
    payload         {"xml": "<the envelope, C14N 2.0>"}

So `bus tail`, the JSONL export and the Spark `threads` query (latency of
each reply after the row named by its `in_reply_to`) see every conversation.
Ids of what the pump writes are derived from the input id, the listener and
the reply's index, so a retried commit inserts nothing new.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
from lxml import etree

from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import Row
from bus.xml.envelope import envelope_c14n
from bus.xml.envelope import read_envelope
from bus.xml.errors import XmlRejected
from bus.xml.parser import parse
from bus.xml.pipeline import HUH
from bus.xml.pipeline import Huh

ENVELOPE_TYPE = "envelope"
SYSTEM_SENDER = "system"
# Names only the bus itself writes as: the pump ("system") and the channel engine's
# notices ("bus"). A client may not send as either (client.send refuses them).
RESERVED_SENDERS = frozenset({SYSTEM_SENDER, "bus"})
# uuid5 namespace of the ids the pump derives (a fixed, random UUID).
_ID_NAMESPACE = uuid.UUID("6a0c7f0e-0f4b-4d0e-9a0b-2f1f4f6f1c7a")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def address(organism: str) -> str:
    """The to_agent of an organism's envelopes: not a valid agent id, so never polled."""
    return f"@{organism}"


def derived_id(input_id: str, listener: str, label: object) -> str:
    """The id of output `label` (an index, "dead", ...) of `listener` for input `input_id`.

    Deterministic, so a retried commit writes nothing twice: a version 8 UUID
    (RFC 9562, custom) whose first 48 bits are those of `input_id` and whose
    other 74 bits come from SHA-1 of namespace and name. The bus's own ids are
    time-ordered (version 7), so a reply's id sorts beside its request's and
    the unique index on `messages.id` takes it near its right edge, as it does
    a new id: a hash there (uuid5) put every reply on a random page of the
    index, one more page to write per reply in a transaction of many.
    """
    h = hashlib.sha1(_ID_NAMESPACE_BYTES + f"{input_id}/{listener}/{label}".encode()).hexdigest()
    return f"{input_id[:8]}-{input_id[9:13]}-8{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def envelope_row(payload: Any, *, id: str, sender: str, thread: str, to: str | None,
                 organism: str, in_reply_to: str | None = None) -> Row:
    """The messages row of the envelope around `payload` (an @xmlify instance or an lxml
    element; its canonical XML in the row's payload). ValidationFailed as `build_envelope`."""
    xml = envelope_c14n(payload, sender=sender, thread=thread, to=to).decode()
    return Row(id=id, from_agent=sender, to_agent=address(organism), type=ENVELOPE_TYPE,
               correlation_id=thread, in_reply_to=in_reply_to,
               payload=orjson.dumps({"xml": xml}).decode())


def envelope_xml(message: Message) -> bytes:
    """The envelope XML a message row holds; ValidationFailed if it holds none."""
    payload: Any = message.payload
    if message.type != ENVELOPE_TYPE or not isinstance(payload, dict) \
            or not isinstance(payload.get("xml"), str):
        problem = message.payload_error or f"type {message.type!r}, payload {payload!r:.80}"
        raise ValidationFailed("payload", f"message {message.seq} is not a pump envelope "
                                          f"({problem}); only rows the pump wrote can be routed")
    return payload["xml"].encode()


def huh_element(code: str, message: str, step: str = "pump") -> etree._Element:
    """A `<huh>` payload the pump itself raises (routing, handler failure, dead letter)."""
    return Huh(step, code, message).to_element()


def is_huh(message: Message) -> bool:
    """Whether an envelope row carries a `<huh>` (False for a row that holds no envelope)."""
    try:
        xml = envelope_xml(message)
    except ValidationFailed:
        return False
    if b"<huh" not in xml:  # the common case, without a parse
        return False
    try:
        return read_envelope(parse(xml)).root_tag == HUH
    except XmlRejected:
        return False
