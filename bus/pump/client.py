"""Client ingress: send a payload into an organism and wait for what comes back.

    with Bus.open("bus.db") as bus:
        sent = send(bus, "demo", b"<add><a>1</a><b>2</b></add>", to="calculator")
        for reply in wait_replies(bus, sent, timeout=10):
            print(reply.sender, reply.payload_xml)

The client gives the payload only. The envelope around it is built here with
the client's id as `<from>` and a new conversation thread (organism/client)
as `<thread>`: a payload that is itself an envelope is refused, so a client
cannot choose either. The envelope and its inbox row are written in one
transaction; the running pump routes it with its current routing table.
Replies are the envelopes on the conversation thread after the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from lxml import etree

from bus.storage.errors import BusError
from bus.coordination.heartbeats import STOPPED
from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import append
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from bus.log.messages import row_to_message
from bus.log.messages import validate_agent_id
from bus.pump import threads
from bus.pump import work
from bus.pump.envelopes import RESERVED_SENDERS
from bus.pump.envelopes import envelope_row
from bus.pump.envelopes import envelope_xml
from bus.pump.errors import Backpressure
from bus.pump.handlers import FINAL_ANSWER
from bus.pump.organism import DEFAULT_MAX_PENDING
from bus.xml.envelope import ENVELOPE_NS
from bus.xml.envelope import read_envelope
from bus.xml.parser import canonicalize
from bus.xml.parser import parse
from bus.xml.parser import parse_or_repair
from bus.xml.pipeline import BOOT
from bus.xml.pipeline import HUH

if TYPE_CHECKING:
    from bus.api import Bus

DEFAULT_CLIENT = "console"
PUMP_ROOT_TAGS = frozenset({BOOT, HUH})  # only the pump sends these
_THREAD_MESSAGES_SQL = (
    "SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload,"
    " payload_ref FROM messages WHERE correlation_id = ? AND seq > ? ORDER BY seq LIMIT 100"
)


@dataclass(frozen=True)
class Sent:
    """A request that was written: its message `seq` and `id`, and its conversation thread."""

    seq: int
    id: str
    thread: str
    client: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "id": self.id, "thread": self.thread, "client": self.client}


@dataclass(frozen=True)
class Received:
    """An envelope that came back to the client."""

    message: Message
    sender: str
    to: str | None
    root_tag: str
    payload_xml: str

    @property
    def final(self) -> bool:
        """A final answer or a `<huh>`: nothing more is coming for this request."""
        return self.root_tag in (FINAL_ANSWER, HUH)

    def to_json_dict(self) -> dict[str, Any]:
        return {"seq": self.message.seq, "id": self.message.id, "from": self.sender,
                "to": self.to, "thread": self.message.correlation_id,
                "in_reply_to": self.message.in_reply_to, "root_tag": self.root_tag,
                "xml": self.payload_xml}


# A pump beats every lease/3 seconds while it runs (bus/pump/services.py) and `stopped`
# when it ends cleanly; silent this long, it is taken for gone (liveness's "stale").
PUMP_SILENT_MS = 100_000
_BOOTED_SQL = "SELECT name FROM pump_organisms ORDER BY name"
_PUMP_BEAT_SQL = "SELECT ts_ms, status FROM heartbeats WHERE agent_id = ?"


class UnknownOrganism(ValidationFailed):
    """No pump ever booted an organism of this name on the bus."""

    error_code = "unknown_organism"

    def __init__(self, organism: str, booted: list[str]) -> None:
        listed = ", ".join(booted) if booted else "none yet"
        super().__init__("organism", f"no pump has booted an organism named {organism!r} on"
                                     f" this bus (booted: {listed}); check the name, which is"
                                     " organism.yaml's `name`")


class OrganismNotRunning(BusError):
    """The organism's pump is not running: a request would wait with nobody to answer it."""

    error_code = "organism_not_running"

    def __init__(self, organism: str, why: str) -> None:
        super().__init__(f"organism: the pump of {organism!r} is not running ({why}); nothing"
                         " was sent. Ask whoever runs it to start its pump, then send again")
        self.field = "organism"
        self.organism = organism


def check_running(bus: Bus, organism: str, now: int | None = None) -> None:
    """Raise UnknownOrganism or OrganismNotRunning unless a pump of `organism` runs now.

    The pump records its boot in pump_organisms and beats as `pump:<organism>`.
    """
    organism = validate_agent_id(organism, "organism")
    with bus.read() as conn:
        booted = [row[0] for row in conn.execute(_BOOTED_SQL)]
        beat = conn.execute(_PUMP_BEAT_SQL, (f"pump:{organism}",)).fetchone()
    if organism not in booted:
        raise UnknownOrganism(organism, booted)
    now = now_ms() if now is None else now
    if beat is None:
        raise OrganismNotRunning(organism, "its pump never beat")
    if beat[1] == STOPPED:
        raise OrganismNotRunning(organism, "its pump stopped")
    if now - beat[0] >= PUMP_SILENT_MS:
        raise OrganismNotRunning(organism, f"its pump last beat {(now - beat[0]) // 1000} s ago")


def send(bus: Bus, organism: str, xml: bytes | str, *, to: str | None = None,
         client: str = DEFAULT_CLIENT, max_pending: int = DEFAULT_MAX_PENDING) -> Sent:
    """Write a client's payload as an envelope for `organism`'s pump to route.

    `max_pending` is the organism's backpressure (its organism.yaml key of
    that name; `bus pump send` passes it): while that many inbox rows and
    unfinished work units wait, the send is refused with Backpressure (a
    BusBusy: retry later) and writes nothing, so a flooding client is slowed
    to the pace the pump answers at.

    Raises an XmlRejected subclass for XML that cannot be parsed (even after
    repair), ValidationFailed for an envelope or a bad `to` / `client`,
    Backpressure for a full queue.
    """
    organism = validate_agent_id(organism, "organism")
    client = _client_id(client, organism)
    if to is not None:
        validate_agent_id(to, "to")
    payload = _payload(xml)
    message_id = new_message_id()
    with bus.write() as conn:  # one commit: the pump wakes once, to a routable request
        waiting = work.waiting_count(conn, organism, max_pending)
        if waiting >= max_pending:
            raise Backpressure(organism, waiting, max_pending)
        now = now_ms()
        conversation = threads.open_conversation(conn, organism, client, now)
        row = envelope_row(payload, id=message_id, sender=client, thread=conversation,
                           to=to, organism=organism)
        [(seq, _)] = append(conn, [row], bus.payloads, now)
        work.insert_inbox(conn, seq, organism, payload.tag, to, now)
    return Sent(seq, message_id, conversation, client)


def _client_id(client: str, organism: str) -> str:
    """The client's id, unless it is a name only the bus writes as."""
    client = validate_agent_id(client, "client")
    if client in RESERVED_SENDERS or client == organism:
        reserved = ", ".join(sorted(RESERVED_SENDERS | {organism}))
        raise ValidationFailed("client", f"{client!r} is reserved ({reserved}: the pump and the"
                                         " bus write as these); send as your own id, e.g."
                                         f" {DEFAULT_CLIENT}")
    return client


def _payload(xml: bytes | str) -> etree._Element:
    raw = xml.encode() if isinstance(xml, str) else xml
    root = parse_or_repair(raw).root
    if etree.QName(root).namespace == ENVELOPE_NS:
        raise ValidationFailed("xml", "is an envelope; send the payload only: the pump "
                                      "stamps <from> and <thread> itself")
    if root.tag in PUMP_ROOT_TAGS:
        raise ValidationFailed("xml", f"<{root.tag}> is the pump's own message (boot: its first"
                                      " start, huh: its error reply); a client cannot send it")
    return root


def replies(bus: Bus, sent: Sent, after: int | None = None) -> list[Received]:
    """Envelopes on the request's conversation thread after seq `after` (default: the request)."""
    with bus.read() as conn:
        rows = conn.execute(_THREAD_MESSAGES_SQL, (sent.thread, after or sent.seq))
        found = [row_to_message(row, bus.blobs) for row in rows.fetchall()]
    # Only the request itself is the client's on its thread: a listener named like
    # the client still answers it.
    return [received(message) for message in found if message.id != sent.id]


def received(message: Message) -> Received:
    """What an envelope row holds: sender, recipient, payload root tag and XML."""
    envelope = read_envelope(parse(envelope_xml(message)))
    return Received(message, envelope.sender, envelope.to, envelope.root_tag,
                    canonicalize(envelope.element).decode())


def wait_replies(bus: Bus, sent: Sent, count: int = 1, timeout: float = 30.0) -> list[Received]:
    """Wait until `count` replies came back, or a final one (`<final-answer>`, `<huh>`).

    Returns what arrived within `timeout` seconds (maybe fewer, maybe none).
    """
    got: list[Received] = []

    def more() -> list[Received]:
        got.extend(replies(bus, sent, got[-1].message.seq if got else None))
        return got
    return bus.wait_for(more, timeout,
                        done=lambda found: len(found) >= count or any(r.final for r in found))
