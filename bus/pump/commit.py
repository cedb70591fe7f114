"""What the pump writes: the batch of one write transaction, from routing to commit.

A `Batch` holds the transaction's connection, clock and routing table, and
what the transaction did. It routes envelopes (work units for every
listener that receives them, or a `<huh>` when none does), commits units
whose handlers are done (`Batch.commit`: claimed units whose claim is
still ours, and inline units, every reply envelope, the thread rows, the
unit marked done: all or nothing per unit) and buries dead units with a
`<huh>` for their sender. A batch is made for one transaction and read by
the pump once that committed; nothing in it is reset or reused.

Threads: an envelope's `<thread>` is the sender's thread. A call to listener
L runs on a new thread under it (`extend_uuid`); L's answer goes to the
calling handler, whatever its root tag, on the caller's thread (`answer_to`
closes L's): the chain is pruned a hop per answer. A caller
whose thread is the conversation itself (organism/client) is the client:
the answer is egress, written but not routed, and the conversation closes
once nothing under it is open (a broadcast's last answer, a handler that
had nothing to say). A FinalAnswer closes its whole chain (`close_chain`);
a handler with nothing to say closes the threads above it that wait for
nothing else (`close_done_chain`).

A `<huh>` goes where an answer would: to the calling listener, routed on
its thread (its handler gets a `Huh` and may correct itself), or to the
client. A `<huh>` never answers a `<huh>`: the error of a message that is
one, or that a handler sent while handling one, goes to the client instead,
so two listeners cannot bounce errors at each other. A reply the commit
must refuse (an envelope as payload, ...) becomes a `bad-reply` `<huh>` at once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Callable
from typing import Iterable

import apsw
from lxml import etree

from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import Row
from bus.log.messages import append
from bus.log.messages import new_message_id
from bus.pump import meta
from bus.pump import threads
from bus.pump import work
from bus.pump.envelopes import SYSTEM_SENDER
from bus.pump.envelopes import derived_id
from bus.pump.envelopes import envelope_row
from bus.pump.envelopes import envelope_xml
from bus.pump.envelopes import huh_element
from bus.pump.envelopes import is_huh
from bus.pump.errors import ThreadClosed
from bus.pump.errors import ThreadNotFound
from bus.pump.handlers import ReadyReply
from bus.pump.routing import Listener
from bus.pump.routing import Routes
from bus.pump.threads import CONVERSATION_DEPTH
from bus.pump.threads import Caller
from bus.pump.work import Unit
from bus.xml.envelope import Envelope
from bus.xml.errors import XmlRejected
from bus.xml.pipeline import BOOT
from bus.xml.pipeline import HUH
from bus.xml.pipeline import Huh
from bus.xml.pipeline import answer_pipeline
from bus.xml.pipeline import run as run_pipeline

if TYPE_CHECKING:
    from bus.api import Bus

log = logging.getLogger("bus.pump")
ANSWER_PIPELINE = answer_pipeline()  # envelope checks only: for the answers a caller gets
# Handles a call to a listener in the routing transaction; True if it did (Batch.route).
Inline = Callable[[Listener, str], bool]
# A call `route` leaves to `open_calls`: (seq, id, sender, listener, thread).
Call = tuple[int, str, str, Listener, str]
# An envelope the pump routed to a listener: the payload class that encoded its element.
Encoded = tuple[type, etree._Element]


@dataclass(frozen=True)
class Finished:
    """A unit whose handler is done: its outputs, or the `<huh>` its sender gets instead."""

    unit: Unit
    input: Message
    outputs: tuple[ReadyReply, ...] = ()
    huh: etree._Element | None = None


# A unit to commit: its results, the owner of its claim (None: an inline unit, which has
# no work row) and, for an inline unit, the thread its own is opened under.
Item = tuple[Finished, str | None, str | None]


def checked_input(unit: Unit, message: Message, listener: Listener,
                  encoded: Encoded | None = None) -> Envelope | Finished:
    """The input through its pipeline: the typed envelope, or the unit finished with the
    `<huh>` its sender gets. An answer to a call the listener made comes in its peer's
    payload, whatever its root tag (`_typed_answer`); a `<huh>` reaches the handler as a Huh.

    `encoded`: what the pump knows of the input because it wrote it (`Batch.encoded`).
    When the listener's payload class encoded it (or, for an answer, any class),
    the element is valid by construction and only decoded: parsing, C14N and the
    schema would find nothing to refuse. Client input never gets here (it is always
    checked).
    """
    if encoded is not None:
        cls, element = encoded
        if cls is listener.pipeline.payload or unit.kind == "answer":
            return Envelope(message.from_agent, message.correlation_id,
                            cls.__xmlify__.decode(element), element)
    answer = unit.kind == "answer"
    try:
        result = run_pipeline(ANSWER_PIPELINE if answer else listener.pipeline,
                              envelope_xml(message))
    except ValidationFailed as exc:
        return Finished(unit, message, huh=huh_element("not-an-envelope", str(exc)))
    if answer and not isinstance(result, Huh):
        result = _typed_answer(result, listener)
    if isinstance(result, Huh):
        return Finished(unit, message, huh=result.to_element())
    return result


def _typed_answer(envelope: Envelope, listener: Listener) -> Envelope | Huh:
    """An answer's payload element checked and decoded by the @xmlify class of its tag
    (`Listener.answers`): a `<huh>` as a Huh; a tag no class has stays an lxml element."""
    element = envelope.element
    try:
        if element.tag == HUH:
            return envelope._replace(payload=Huh.from_element(element))
        spec = (listener.answers or {}).get(element.tag)
        if spec is None:
            return envelope
        spec.validate(element)
        return envelope._replace(payload=spec.decode(element))
    except XmlRejected as exc:
        return Huh.from_error("payload", exc)
    except (ValueError, TypeError) as exc:  # the dataclass's own __post_init__ checks
        return Huh("deserialize", "value-invalid", f"{type(exc).__name__}: {exc}",
                   element.sourceline or 0)


def _only_answers(done: Finished) -> bool:
    """Whether a unit's handler answered its caller and did nothing else."""
    return done.huh is None and bool(done.outputs) and not any(
        output.to is not None or output.final for output in done.outputs)


class _NotOpen(BusError):
    """A thread a call was routed on is not open (Batch.open_calls)."""


class EncodedMemory:
    """The envelopes this pump encoded for listeners and committed, by message id, for
    `checked_input`; the oldest are forgotten past `limit` (their units ran by then).
    Filled on the database thread, read on the loop's: hence the lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: dict[str, Encoded] = {}
        self._lock = threading.Lock()

    def remember(self, items: list[tuple[str, Encoded]]) -> None:
        with self._lock:
            self._items.update(items)
            while len(self._items) > self.limit:
                del self._items[next(iter(self._items))]

    def take(self, message_id: str) -> Encoded | None:
        with self._lock:
            return self._items.pop(message_id, None)


class Batch:
    """The pump units of one write transaction, from routing to commit, and what it wrote.

    `conn` is in a write transaction, `now` its clock, `routes` the table it
    routes by. A batch lives for one transaction and is never reused: the pump
    reads `settled` and `encoded` once it committed (`Stepper._batch`, bus/pump/step.py).
    """

    def __init__(self, bus: Bus, conn: apsw.Connection, organism: str, routes: Routes,
                 now: int) -> None:
        self.bus, self.conn, self.organism, self.routes, self.now = (bus, conn, organism,
                                                                     routes, now)
        # Every unit this transaction committed (claimed or inline), with its outcome:
        # counted by the pump once the transaction committed, not before.
        self.settled: list[tuple[Finished, str]] = []
        # Envelopes routed to listeners, by message id, from an @xmlify payload (for
        # checked_input once the transaction committed); a rolled back unit drops its own.
        self.encoded: list[tuple[str, Encoded]] = []
        # Whether it made work units: the pump may claim them at once (its own commit is
        # no change its scan would notice).
        self.made_units = False
        self._messages: dict[int, Message] = {}  # read in this transaction, by seq

    def messages(self, seqs: list[int]) -> dict[int, Message]:
        """The messages at `seqs` that exist, each read once per batch: a request the
        batch routes is the input of the unit it claims for it."""
        missing = [seq for seq in seqs if seq not in self._messages]
        if missing:
            self._messages.update(work.messages_by_seq(self.conn, missing, self.bus.blobs))
        return {seq: self._messages[seq] for seq in seqs if seq in self._messages}

    # --- the organism's work, in this transaction --------------------------------------

    def take_inbox(self, limit: int) -> list[work.Inbound]:
        """Remove and return up to `limit` waiting client envelopes, oldest first."""
        return work.take_inbox(self.conn, self.organism, limit)

    def last_inbox_seq(self) -> int:
        return work.last_inbox_seq(self.conn, self.organism)

    def record_capabilities(self) -> None:
        """What the organism's listeners offer, as meta questions read it."""
        meta.record_capabilities(self.conn, self.organism, self.routes.listeners)

    def bury_exhausted(self) -> list[Unit]:
        return work.bury_exhausted(self.conn, self.organism, self.now)

    def bury_orphans(self) -> list[Unit]:
        """The unleased units of listeners the routing table no longer has, marked dead."""
        return work.bury_orphans(self.conn, self.organism, self.routes.listeners, self.now)

    def find_suspect(self, listeners: Iterable[str]) -> int | None:
        return work.find_suspect(self.conn, self.organism, listeners, self.now)

    def lease(self, ids: list[int], owner: str, lease_ms: int) -> list[Unit]:
        return work.lease(self.conn, ids, owner, lease_ms, self.now)

    def claim(self, listener: str, owner: str, lease_ms: int, limit: int) -> list[Unit]:
        return work.claim(self.conn, self.organism, listener, owner, lease_ms, limit, self.now)

    # --- envelopes -------------------------------------------------------------------

    def write(self, payload: etree._Element, *, id: str, sender: str, thread: str,
              to: str | None, in_reply_to: str | None) -> tuple[int, bool]:
        """Insert one envelope; (seq, duplicate)."""
        row = envelope_row(payload, id=id, sender=sender, thread=thread, to=to,
                           organism=self.organism, in_reply_to=in_reply_to)
        return append(self.conn, [row], self.bus.payloads, self.now)[0]

    def boot(self, root: str) -> bool:
        """Send <boot/> on the organism's first start; False on a restart (sent before)."""
        boot_id = derived_id(root, SYSTEM_SENDER, BOOT)
        if not work.mark_booted(self.conn, self.organism, boot_id, self.now):
            return False
        conversation = threads.extend_chain(self.conn, root, SYSTEM_SENDER, self.now)
        seq, _ = self.write(etree.Element(BOOT), id=boot_id, sender=SYSTEM_SENDER,
                            thread=conversation.uuid, to=None, in_reply_to=None)
        if self.routes.targets(BOOT, None):  # nobody listening is no error here
            self.route(seq, boot_id, SYSTEM_SENDER, BOOT, None, conversation.uuid)
        else:  # nothing will answer it
            threads.close_thread(self.conn, conversation.uuid, self.now)
        return True

    def reply_as_system(self, payload: etree._Element, message: Message, label: str) -> None:
        """The pump's own answer to a client's request, on its conversation, which it ends."""
        self.write(payload, id=derived_id(message.id, SYSTEM_SENDER, label), sender=SYSTEM_SENDER,
                   thread=message.correlation_id, to=message.from_agent, in_reply_to=message.id)
        self._close_conversation(message.correlation_id)

    def route(self, seq: int, message_id: str, sender: str, root_tag: str, to: str | None,
              thread: str, kind: str = "call", in_reply_to: str | None = None,
              inline: Inline | None = None, calls: list[Call] | None = None) -> int:
        """Make the work units of an envelope; a `<huh>` to its sender if nobody takes it.

        `inline(listener, thread)`, if given, may handle a call to a listener
        here and now, in this transaction, on a thread under `thread` (True:
        no work unit is needed). `calls`, if given, collects the calls for
        `open_calls` to write together.
        """
        # An answer goes to the calling handler whatever its root tag.
        targets = self.routes.caller(to) if kind == "answer" else \
            self.routes.targets(root_tag, to)
        if not targets:
            self._no_route(message_id, sender, root_tag, to, thread, kind, in_reply_to)
            return 0
        for listener in targets:
            if inline is not None and inline(listener, thread):
                continue  # committed with its thread by the router (`commit`)
            if kind == "call" and calls is not None:  # written by open_calls
                calls.append((seq, message_id, sender, listener, thread))
                continue
            try:
                self._open_call(seq, listener, kind, thread)
            except (ThreadNotFound, ThreadClosed) as exc:
                if kind != "call":
                    raise
                # A handler that calls on a thread pruned meanwhile (an answer that came
                # after its chain ended): refused, not retried until it is a dead letter.
                self._refuse_closed(message_id, sender, listener.name, thread, exc)
        return len(targets)

    def _open_call(self, seq: int, listener: Listener, kind: str, thread: str) -> None:
        """The work unit of an envelope for `listener`: a call runs on a new thread under
        its sender's `thread`, an answer on the thread it answers."""
        unit_thread = thread if kind == "answer" else \
            threads.extend_uuid(self.conn, thread, listener.name, self.now)
        self.made_units = True
        work.insert_unit(self.conn, self.organism, seq, listener.name, kind, unit_thread,
                         listener.spec.max_attempts, self.now)

    def open_calls(self, calls: list[Call]) -> None:
        """Write the calls `route` left: together when there are several, else (or when a
        sender's thread is not open) one by one, refusing a call whose sender's thread is
        not open (`_refuse_closed`)."""
        if len(calls) > 1 and self._open_calls_together(calls):
            return
        for seq, message_id, sender, listener, thread in calls:
            try:
                self._open_call(seq, listener, "call", thread)
            except (ThreadNotFound, ThreadClosed) as exc:
                self._refuse_closed(message_id, sender, listener.name, thread, exc)

    def _open_calls_together(self, calls: list[Call]) -> bool:
        """The calls' threads, then their units, a statement each for all of them; False,
        with nothing written, when a sender's thread is not open."""
        children = [(new_message_id(), listener.name, thread)
                    for _, _, _, listener, thread in calls]
        try:
            with write_transaction(self.conn):  # a savepoint
                if len(threads.add_children(self.conn, children, self.now)) < len(calls):
                    raise _NotOpen("a thread a call was routed on is not open")
                self.made_units = True
                work.insert_calls(self.conn, self.organism, [
                    (seq, listener.name, child, listener.spec.max_attempts)
                    for (seq, _, _, listener, _), (child, _, _) in zip(calls, children)],
                    self.now)
        except _NotOpen:
            return False
        return True

    def _refuse_closed(self, message_id: str, sender: str, listener: str, thread: str,
                       exc: BusError) -> str:
        """A request whose thread is no longer open (closed by hand, cleared) when its unit
        would be opened, or its inline results written: nothing of it is written but a
        `<huh>` that says why, on that thread for the record. "huh"."""
        log.warning("request %s to %s refused: %s", message_id, listener, exc)
        huh = huh_element("thread-closed", f"the conversation this was sent on ({thread}) is"
                                           " closed or gone; send the request again, on a new"
                                           " conversation")
        self.write(huh, id=derived_id(message_id, SYSTEM_SENDER, f"closed/{listener}"),
                   sender=SYSTEM_SENDER, thread=thread, to=sender, in_reply_to=message_id)
        return "huh"

    def _no_route(self, message_id: str, sender: str, root_tag: str, to: str | None,
                  thread: str, kind: str, in_reply_to: str | None) -> None:
        """The `<huh>` of a call nobody takes: to the client, or to the calling listener."""
        huh = huh_element("no-route", (
            f"nothing here accepts <{root_tag}>{f' for {to!r}' if to else ''}; check the "
            "payload's root tag and recipient against the tool description"))
        huh_id = derived_id(message_id, SYSTEM_SENDER, "no-route")
        caller = self._caller_at(thread) if kind == "call" else None
        if caller is not None:  # the sender's own thread: it hears of it as of an answer
            self._deliver_huh(huh, huh_id, SYSTEM_SENDER, message_id, caller,
                              self._is_huh_id(in_reply_to))
        else:  # an answer whose caller was removed since its call: written for the record
            self.write(huh, id=huh_id, sender=SYSTEM_SENDER, thread=thread, to=sender,
                       in_reply_to=message_id)
            if kind == "answer":  # and the chain that waited for it ends
                self._end_chain(thread)

    def send(self, payload: etree._Element, *, id: str, sender: str, thread: str,
             to: str | None, in_reply_to: str | None, kind: str = "call",
             encoded_from: type | None = None) -> None:
        """Write an envelope and route it (unless it was written before)."""
        seq, duplicate = self.write(payload, id=id, sender=sender, thread=thread, to=to,
                                    in_reply_to=in_reply_to)
        if duplicate:
            return
        if self.route(seq, id, sender, payload.tag, to, thread, kind, in_reply_to) \
                and encoded_from is not None:
            self.encoded.append((id, (encoded_from, payload)))

    # --- committing units ----------------------------------------------------------------

    def commit(self, items: list[Item]) -> list[str]:
        """Write the results of units, claimed or inline, in one savepoint; the outcome of
        each, also added to `settled`.

        The one path for any number of units: a batch of one is the per-unit
        case. When writing fails, the savepoint rolls back and each half is
        committed on its own, down to the one unit that fails: only it
        fails (`_failed`). A claimed unit another pump took over is "lost"
        (nothing is written for it); one that fails is "failed" (its lease
        expires and it is tried again, and finally buried).
        """
        mark = len(self.encoded)
        try:
            with write_transaction(self.conn):  # a savepoint
                outcomes = self._write(items)
        except BusError as exc:
            del self.encoded[mark:]  # a rolled back unit drops its own
            if len(items) == 1:
                return self._failed(items[0], exc)
            half = len(items) // 2
            return self.commit(items[:half]) + self.commit(items[half:])
        self.settled += zip([done for done, _, _ in items], outcomes)
        return outcomes

    def _failed(self, item: Item, exc: BusError) -> list[str]:
        """A unit whose results could not be written: a reply no retry could write becomes
        the `bad-reply` `<huh>` its handler hears at once (committed as any unit);
        anything else fails, and the unit is tried again after its lease."""
        done, owner, parent = item
        if isinstance(exc, (ValidationFailed, XmlRejected)) and done.huh is None:
            return self.commit([(replace(done, outputs=(), huh=huh_element(
                "bad-reply", f"the pump cannot send the handler's reply: {exc}", "handler")),
                owner, parent)])
        if isinstance(exc, (ValidationFailed, XmlRejected)):
            log.error("committing the <huh> of unit %s failed: %s", done.unit.id, exc)
        else:
            log.error("committing unit %s (input %s, listener %s) failed: %s",
                      done.unit.id, done.input.id, done.unit.listener, exc)
        self.settled.append((done, "failed"))
        return ["failed"]

    def _write(self, items: list[Item]) -> list[str]:
        """Each unit's results, in order; calls that only answered (`_write_answers`) as a
        set when there are several."""
        answered = {index: item for index, item in enumerate(items)
                    if item[0].unit.kind == "call" and _only_answers(item[0])}
        owners = {owner for _, owner, _ in answered.values() if owner is not None}
        outcomes = self._write_answers(answered) if len(answered) > 1 and len(owners) <= 1 \
            else {}
        return [outcomes[index] if index in outcomes else self._finish_with_thread(*item)
                for index, item in enumerate(items)]

    def _write_answers(self, answered: dict[int, Item]) -> dict[int, str]:
        """Calls whose handlers only answered, all at once: the claimed ones still held done
        and their threads closed, the inline ones' threads written closed, a statement
        each; then the replies to clients (`_write_client_answers`). A unit whose caller
        is no client (a listener, or a thread not open) is written on its own, as the
        per-unit path would after those statements. The outcome of each, by index."""
        claimed = {index: item for index, item in answered.items() if item[1] is not None}
        outcomes, callers = {}, {}
        if claimed:
            owner = next(iter(claimed.values()))[1]
            held = work.finish_all_held(self.conn, [done.unit for done, _, _ in claimed.values()],
                                        owner, "replied", self.now)
            outcomes = {index: "lost" for index, (done, _, _) in claimed.items()
                        if done.unit.id not in held}
            callers = threads.close_calls(self.conn, [
                done.unit.thread for index, (done, _, _) in claimed.items()
                if index not in outcomes], self.now)
        inline = [(done.unit.thread, done.unit.listener, parent)
                  for done, owner, parent in answered.values() if owner is None]
        if inline:
            callers.update(threads.add_children(self.conn, inline, self.now, closed=True))
        to_clients = []
        for index, (done, owner, parent) in answered.items():
            if index in outcomes:
                continue
            caller = callers.get(done.unit.thread)
            if caller is not None and caller.depth == CONVERSATION_DEPTH:
                to_clients.append((done, caller))
                outcomes[index] = "replied"
            elif caller is None and owner is None:  # its thread was not written
                outcomes[index] = self._finish_with_thread(done, None, parent)
            else:
                outcomes[index] = self._replies(done, caller)
        if to_clients:
            self._write_client_answers(to_clients)
        return outcomes

    def _write_client_answers(self, answered: list[tuple[Finished, Caller]]) -> None:
        """The replies of units that answered a client's request (the caller of each unit's
        thread, now closed), then those clients' conversations closed: a statement for
        all of them where the per-unit path takes two per unit."""
        rows = [self._client_reply(done, caller, index, output.element)
                for done, caller in answered for index, output in enumerate(done.outputs)]
        append(self.conn, rows, self.bus.payloads)
        threads.close_all_if_done(self.conn, [caller.uuid for _, caller in answered], self.now)

    def _client_reply(self, done: Finished, caller: Caller, index: int,
                      element: etree._Element) -> Row:
        """The row of answer `index` of a unit to the client `caller`."""
        message = done.input
        return envelope_row(element, id=derived_id(message.id, done.unit.listener, index),
                            sender=done.unit.listener, thread=caller.uuid, to=caller.name,
                            organism=self.organism, in_reply_to=message.id)

    def _finish_with_thread(self, done: Finished, owner: str | None,
                            parent: str | None) -> str:
        """`_finish`, after writing an inline unit's thread (`parent` not None)."""
        try:
            caller = None if parent is None else self._inline_thread(done, parent)
        except (ThreadNotFound, ThreadClosed) as exc:
            message = done.input
            return self._refuse_closed(message.id, message.from_agent, done.unit.listener,
                                       parent, exc)
        return self._finish(done, owner, caller)

    def _inline_thread(self, done: Finished, parent: str) -> Caller | None:
        """Write an inline unit's thread under `parent`: closed at once when the handler
        only answered (then the caller its answers go to), else open."""
        unit = done.unit
        if _only_answers(done):
            return threads.answered_child(self.conn, parent, unit.thread, unit.listener,
                                          self.now)
        threads.extend_uuid(self.conn, parent, unit.listener, self.now, unit.thread)
        return None

    def _finish(self, done: Finished, owner: str | None, caller: Caller | None = None) -> str:
        """Ack the unit if its claim is still ours (one statement), then write its results.

        `owner` None: an inline unit, which has no work row. `caller`: who the
        unit's answers go to, when its thread is closed already (_inline_thread).
        """
        outcome = "replied" if done.huh is None else "huh"
        if owner is not None and not work.finish_held(self.conn, done.unit, owner, outcome,
                                                      self.now):
            return "lost"
        if done.huh is None:
            self._replies(done, caller)
        else:
            self._huh(done)
        return outcome

    def _huh(self, done: Finished, label: object = 0) -> str:
        unit, message = done.unit, done.input
        huh_id = derived_id(message.id, unit.listener, label)
        caller = self._huh_caller(unit, message)
        if caller is None:  # the sender's thread is gone: write it for the record only
            self.write(done.huh, id=huh_id, sender=unit.listener,
                       thread=message.correlation_id, to=message.from_agent,
                       in_reply_to=message.id)
        else:
            self._deliver_huh(done.huh, huh_id, unit.listener, message.id, caller,
                              is_huh(message) or self._is_huh_id(message.in_reply_to))
        return "huh"

    def _deliver_huh(self, huh: etree._Element, huh_id: str, sender: str, in_reply_to: str,
                     caller: Caller, answers_huh: bool) -> None:
        """A `<huh>` goes where an answer would, except that it never answers a `<huh>`:
        then the calling listener's thread ends and the client hears of it instead."""
        if caller.depth > CONVERSATION_DEPTH and answers_huh:
            caller = threads.close_chain(self.conn, caller.uuid, self.now)
        self._answer(huh, huh_id, sender, in_reply_to, caller)

    def _caller_at(self, uuid: str) -> Caller | None:
        try:
            return threads.caller_at(self.conn, uuid)
        except ThreadNotFound:  # cleared (ThreadRegistry.clear) since it was sent
            return None

    def _huh_caller(self, unit: Unit, message: Message) -> Caller | None:
        """Who hears of a failed unit: a call's sender, on the thread it sent on; for a
        failed answer, the caller of the listener that got it (the chain ends there)."""
        try:
            if unit.kind == "answer":
                return threads.answer_to(self.conn, unit.thread, self.now)
            threads.close_thread(self.conn, unit.thread, self.now)
        except ThreadNotFound:
            return None
        return self._caller_at(message.correlation_id)

    def _is_huh_id(self, message_id: str | None) -> bool:
        """Whether message `message_id` is a `<huh>` (what a handler was handling)."""
        found = message_id and work.message_by_id(self.conn, message_id, self.bus.blobs)
        return bool(found) and is_huh(found)

    def _replies(self, done: Finished, caller: Caller | None = None) -> str:
        unit, message = done.unit, done.input
        # Forwards first: they extend the listener's thread, which answering closes.
        indexed = list(enumerate(done.outputs))
        for index, output in [item for item in indexed if item[1].to is not None]:
            self.send(output.element, id=derived_id(message.id, unit.listener, index),
                      sender=unit.listener, thread=unit.thread, to=output.to,
                      in_reply_to=message.id, encoded_from=output.encoded_from)
        answers = [item for item in indexed if item[1].to is None]
        closed = False  # whether the caller's thread closed with the unit's (answer_call)
        if answers and caller is None and unit.kind == "call" and \
                not any(output.final for _, output in answers):
            caller = threads.answer_call(self.conn, unit.thread, message.correlation_id,
                                         self.now)
            closed = caller is not None
        if answers and caller is None:
            caller = threads.answer_to(self.conn, unit.thread, self.now)
        for index, output in answers:
            reply_id = derived_id(message.id, unit.listener, index)
            if output.final:
                self._final(output, reply_id, unit, message)
            else:
                self._answer(output.element, reply_id, unit.listener, message.id, caller,
                             output.encoded_from, close=not closed)
        if not done.outputs:  # nothing to say: the chain ends here, pruned as far as it is done
            if unit.kind == "call":
                threads.close_thread(self.conn, unit.thread, self.now)
                threads.close_done_chain(self.conn, message.correlation_id, self.now)
            else:  # an answer its caller did nothing with: the caller's thread is done
                threads.close_done_chain(self.conn, unit.thread, self.now)
        return "replied"

    def _end_chain(self, uuid: str) -> None:
        """Close thread `uuid` and its callers' up to the conversation, which closes if
        nothing else under it is open."""
        try:
            conversation = threads.close_chain(self.conn, uuid, self.now)
        except ThreadNotFound:
            return
        threads.close_if_done(self.conn, conversation.uuid, self.now)

    def _close_conversation(self, uuid: str) -> None:
        """Close `uuid` if it is a client's conversation and nothing under it is open."""
        caller = self._caller_at(uuid)
        if caller is not None and caller.depth == CONVERSATION_DEPTH:
            threads.close_if_done(self.conn, uuid, self.now)

    def _answer(self, element: etree._Element, reply_id: str, sender: str, in_reply_to: str,
                caller: Caller, encoded_from: type | None = None, close: bool = True) -> None:
        """Send an answer (or a `<huh>`) to `caller`: routed to a listener, egress to a client
        (whose conversation then closes if done, unless `close` is False: done already)."""
        if caller.depth <= CONVERSATION_DEPTH:
            to = caller.name if caller.depth else SYSTEM_SENDER  # egress: written only
            self.write(element, id=reply_id, sender=sender, thread=caller.uuid,
                       to=to, in_reply_to=in_reply_to)
            if caller.depth and close:  # the reply reached its client: the request is done
                threads.close_if_done(self.conn, caller.uuid, self.now)
        else:
            self.send(element, id=reply_id, sender=sender, thread=caller.uuid,
                      to=caller.name, in_reply_to=in_reply_to, kind="answer",
                      encoded_from=encoded_from)

    def _final(self, output: ReadyReply, reply_id: str, unit: Unit, message: Message) -> None:
        """A FinalAnswer goes to the client on its conversation thread: the chain from the
        unit's thread up (the callers that forwarded to it) and the conversation close."""
        conversation = threads.close_chain(self.conn, unit.thread, self.now)
        self.write(output.element, id=reply_id, sender=unit.listener, thread=conversation.uuid,
                   to=conversation.name, in_reply_to=message.id)
        threads.close_thread(self.conn, conversation.uuid, self.now)

    # --- dead units ----------------------------------------------------------------------

    def bury(self, units: list[Unit], reason: Callable[[Unit], str]) -> None:
        """Tell the senders of dead units why (a `<huh>` each), close their call threads."""
        inputs = self.messages([unit.input_seq for unit in units])
        for unit in units:
            message = inputs.get(unit.input_seq)
            if message is None:  # compacted away: nobody left to tell
                continue
            huh = huh_element(*reason(unit).split(":", 1))
            self._huh(Finished(unit, message, huh=huh), label="dead")
