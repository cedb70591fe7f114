"""The `Channels` facade of the message engine, on an open Bus.

    ch = bus.channels
    ch.create_channel("ci-events", "pubsub", "ci-agent")
    ch.subscribe("ci-events", "deploy-agent", "build.*.success")
    ch.publish("ci-events", "ci-agent", "build.frontend.success", "847 tests passed")
    for message in ch.receive_messages("deploy-agent"):
        ch.acknowledge_message(message, "deploy-agent", "completed")

Every operation is one short transaction on the calling thread's connection
(`BEGIN IMMEDIATE` for writes), so any number of processes can use one bus
file. Messages come back as `ChannelMessage`.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Protocol

import apsw

from bus.log import messages
from bus.channels import deadletters
from bus.channels import delivery
from bus.channels import sending
from bus.channels import store
from bus.channels import system
from bus.channels.deadletters import DeadLetter
from bus.channels.delivery import TickReport
from bus.channels.errors import StoreCapacity
from bus.channels.errors import StoreFull
from bus.channels.queries import ChannelMessage
from bus.channels.queries import Delivery
from bus.channels.queries import FROM_SQL
from bus.channels.queries import MESSAGE_COLUMNS
from bus.channels.queries import MessageFilter
from bus.channels.queries import QueryResult
from bus.channels.queries import connection_register_functions
from bus.channels.queries import deliveries_of
from bus.channels.queries import filter_sql
from bus.channels.queries import order_sql
from bus.channels.queries import row_to_message
from bus.channels.store import CHANNEL_TYPES
from bus.channels.store import Channel
from bus.channels.store import ChannelConfig
from bus.channels.store import JOIN_ROLES
from bus.channels.store import Participant
from bus.channels.store import STATES
from bus.channels.store import validate_choice
from bus.channels.store import validate_name
from bus.channels.topics import TopicIndex
from bus.storage.db import refuse_write
from bus.storage.errors import ValidationFailed
from bus.log.messages import load_payload
from bus.log.messages import now_ms
from bus.log.messages import validate_agent_id
from bus.log.messages import validate_positive_int

if TYPE_CHECKING:
    from blobs.store import BlobStore
    from bus.log.payloads import PayloadPolicy

_PRESSURE_SQL = (
    "SELECT (SELECT coalesce(sum(open_deliveries), 0) FROM channels),"
    " (SELECT page_count * page_size FROM pragma_page_count, pragma_page_size)"
)
_WARNED_AT_SQL = "SELECT value FROM meta WHERE key = 'store_capacity_warned_at_ms'"
_SET_WARNED_AT_SQL = (
    "INSERT INTO meta (key, value) VALUES ('store_capacity_warned_at_ms', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
CAPACITY_WARNING_TYPE = "_system.store.capacity"
CAPACITY_WARNING_EVERY_MS = 60_000
_THREAD_SQL = (
    "SELECT " + MESSAGE_COLUMNS + FROM_SQL + " WHERE m.correlation_id = ? ORDER BY cm.seq"
)


@dataclass(frozen=True)
class StoreLimits:
    """Backpressure on the whole bus: its memory and disk.

    `max_active`: unfinished deliveries (waiting or unacknowledged) beyond
    which sends fail with StoreFull. `max_file_bytes` and `reserve_bytes`:
    sends fail with StoreCapacity once the file is within `reserve_bytes` of
    `max_file_bytes`; within `warn_bytes` of it, a send still succeeds but a
    `_system.store.capacity` message is broadcast (at most once a minute),
    so someone compacts before sends start failing.
    """

    max_active: int = 100_000
    max_file_bytes: int = 2 * 1024 ** 3
    reserve_bytes: int = 100 * 1024 ** 2
    warn_bytes: int = 200 * 1024 ** 2


class Log(Protocol):
    """What the engine uses of the bus it runs on: `Bus` hands itself over.

    A protocol rather than an import of `bus.api`, which imports this module:
    the engine sits below the facade and knows only the log's parts.
    """

    blobs: BlobStore
    payloads: PayloadPolicy

    def read(self) -> AbstractContextManager[apsw.Connection]: ...

    def write(self) -> AbstractContextManager[apsw.Connection]: ...


class Channels:
    """Channels, delivery, acks, retries and dead letters on one Bus.

    `clock` returns epoch milliseconds (tests inject one and step it);
    `limits` is the store's backpressure.
    """

    def __init__(self, bus: Log, clock: Callable[[], int] = now_ms,
                 limits: StoreLimits = StoreLimits()) -> None:
        self.bus = bus
        self.payloads = bus.payloads
        self.clock = clock
        self.limits = limits
        self._indexes: dict[int, tuple[int, TopicIndex]] = {}
        self._indexes_lock = threading.Lock()
        self._local = threading.local()

    # --- the connection: through the bus's doors --------------------------------

    @contextmanager
    def _read(self) -> Iterator[apsw.Connection]:
        """`bus.read()`, on a connection with the filter functions registered."""
        with self.bus.read() as conn:
            yield self._registered(conn)

    @contextmanager
    def _write(self) -> Iterator[apsw.Connection]:
        """`bus.write()`, on a connection with the filter functions registered."""
        with self.bus.write() as conn:
            yield self._registered(conn)

    def _registered(self, conn: apsw.Connection) -> apsw.Connection:
        """`conn` with the filter functions registered, once per thread's connection."""
        if getattr(self._local, "registered", None) is not conn:
            connection_register_functions(conn, self._load_content)
            self._local.registered = conn
        return conn

    def _load_content(self, payload: str | None, ref: str | None) -> tuple[Any, str | None]:
        return load_payload(payload, ref, self.bus.blobs)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group several operations into one transaction and one commit.

        The flush policy: one commit per message by default
        (each survives a crash once its call returns; with durability
        "full", power loss too), or one per batch, for throughput.
        """
        with self._write():
            yield

    # --- channels ------------------------------------------------------------

    def create_channel(self, name: str, type: str, owner: str, **config: Any) -> Channel:
        """Create a channel owned (and joined) by `owner`; settings as in ChannelConfig."""
        validate_name(name, "name")
        system.refuse_name(name)
        validate_choice(type, "type", CHANNEL_TYPES)
        validate_agent_id(owner, "owner")
        settings = ChannelConfig.build(**config)
        with self._write() as conn:
            return store.insert_channel(conn, name, type, owner, settings, self.clock())

    def get_channel(self, name: str) -> Channel:
        validate_name(name)
        with self._read() as conn:
            return store.get_channel(conn, name)

    def list_channels(self) -> list[Channel]:
        with self._read() as conn:
            return store.list_channels(conn)

    def participants(self, channel: str) -> list[Participant]:
        with self._read() as conn:
            return store.participants(conn, self.get_channel(channel))

    def subscriptions(self, channel: str) -> list[tuple[str, str]]:
        """(topic_pattern, agent) pairs of a pubsub channel."""
        with self._read() as conn:
            return store.subscriptions(conn, self.get_channel(channel))

    def join_channel(self, channel: str, agent: str, role: str = "member") -> None:
        validate_agent_id(agent)
        if role != "owner":  # add_participant explains why an owner cannot join
            validate_choice(role, "role", JOIN_ROLES)
        system.refuse_member(channel, role)
        self._write_on(channel, lambda conn, c: store.add_participant(conn, c, agent, role,
                                                                       self.clock()))

    def leave_channel(self, channel: str, agent: str) -> bool:
        """Leave (dropping the agent's subscriptions); False if it was not a participant."""
        validate_agent_id(agent)
        return self._write_on(channel, lambda conn, c: store.remove_participant(conn, c, agent))

    def subscribe(self, channel: str, agent: str, topic_pattern: str) -> bool:
        """Subscribe `agent` (joining it as a member if needed); False if it already was.

        The bus's own `_system` channel (dead-letter notices on
        `_system.message.deadletter`) is created on demand, and joined as an observer.
        """
        validate_agent_id(agent)
        if channel == system.SYSTEM_CHANNEL:
            with self._write() as conn:
                return system.subscribe(conn, agent, topic_pattern, self.clock())
        return self._write_on(channel, lambda conn, c: store.add_subscription(
            conn, c, agent, topic_pattern, self.clock()))

    def unsubscribe(self, channel: str, agent: str, topic_pattern: str) -> bool:
        validate_agent_id(agent)
        return self._write_on(channel, lambda conn, c: store.remove_subscription(
            conn, c, agent, topic_pattern))

    def set_channel_state(self, channel: str, state: str) -> None:
        """active, paused (no sends, no deliveries), draining (deliveries only) or closed."""
        validate_choice(state, "state", STATES)
        self._write_on(channel, lambda conn, c: self._set_state(conn, c, state))

    def _set_state(self, conn: apsw.Connection, channel: Channel, state: str) -> None:
        store.set_state(conn, channel, state)
        if state == "closed":  # closing settles what waits: dead letters, "channel closed"
            delivery.settle_closed(conn, channel.id, self.clock())
        elif state == "paused":  # nothing is handed out, so nothing waiting times out
            delivery.hold_timers(conn, channel.id)
        elif channel.state == "paused":
            delivery.restart_timers(conn, channel, self.clock())

    def _write_on(self, name: str, action: Callable[[apsw.Connection, Channel], Any]) -> Any:
        validate_name(name)
        with self._write() as conn:
            return action(conn, store.get_channel(conn, name))

    # --- sending -------------------------------------------------------------

    def send_message(self, channel: str, sender: str, type: str, content: Any, *,
                     topic: str | None = None, priority: int = sending.DEFAULT_PRIORITY,
                     correlation_id: str | None = None, in_reply_to: str | None = None,
                     timeout: float | None = None) -> ChannelMessage:
        """Validate, route and persist one message with its deliveries, in one transaction.

        `type` is one of text, command, query, response, acknowledgment,
        notification, event. A query without `correlation_id` gets its own
        id as one; only a query takes a `timeout` (seconds). Raises
        ValidationFailed (naming the field) or UnknownChannel and writes
        nothing; StoreFull / StoreCapacity when the store is under pressure.
        """
        return self._send(sending.prepare(channel, sender, type, content, topic=topic,
                                          priority=priority, correlation_id=correlation_id,
                                          in_reply_to=in_reply_to, timeout=timeout))

    def publish(self, channel: str, sender: str, topic: str, content: Any,
                priority: int = sending.DEFAULT_PRIORITY) -> ChannelMessage:
        """Publish an event on a pubsub channel to every matching subscription."""
        return self.send_message(channel, sender, "event", content, topic=topic,
                                 priority=priority)

    def send_query(self, channel: str, sender: str, content: Any, timeout: float | None = None,
                   *, topic: str | None = None,
                   priority: int = sending.DEFAULT_PRIORITY) -> ChannelMessage:
        """Ask a question; its `correlation_id` (its own id) is what responses quote.

        With `timeout` (seconds) the query is marked expired if no response
        came by then.
        """
        return self.send_message(channel, sender, "query", content, topic=topic,
                                 priority=priority, timeout=timeout)

    def send_response(self, channel: str, sender: str, correlation_id: str, content: Any, *,
                      topic: str | None = None,
                      priority: int = sending.DEFAULT_PRIORITY) -> ChannelMessage:
        """Answer the query with `correlation_id` on the same channel."""
        return self.send_message(channel, sender, "response", content, topic=topic,
                                 priority=priority, correlation_id=correlation_id)

    def _send(self, out: sending.Outgoing) -> ChannelMessage:
        self.payloads.check_size(out.row, "content")
        if out.size > self.payloads.blob_threshold:
            self._check_before_blob(out)
        # A refused send deletes the blob it wrote (PayloadPolicy.staging).
        with self.payloads.staging():
            # A large content goes to the blob store before the transaction, outside the lock.
            out = replace(out, row=self.payloads.place(out.row))
            with self._write() as conn:
                channel = store.get_channel(conn, out.channel)
                sending.check_channel(conn, channel, out)
                answered = sending.answered(conn, channel, out)
                if answered and out.row.in_reply_to is None:
                    out = replace(out, row=out.row._replace(in_reply_to=answered[0]))
                targets = sending.recipients(conn, channel, out,
                                             lambda: self._topic_index(channel))
                now = self.clock()
                self._check_limits(conn, len(targets), now)
                seq, correlation_id = sending.insert(conn, self.payloads, channel, out,
                                                             targets, now)
                if answered:
                    self._settle_answered(conn, out, answered[1], now)
        content, error = self._load_content(out.row.payload, out.row.payload_ref)
        return ChannelMessage(seq, out.row.id, channel.name, out.sender, out.type, content,
                              out.topic, out.priority, correlation_id, out.row.in_reply_to, now,
                              "sent", error)

    def _check_before_blob(self, out: sending.Outgoing) -> None:
        """The channel's checks, read-only, before a large content is written as a blob.

        The transaction checks again: the channel may change in between.
        """
        with self._read() as conn:
            refuse_write(conn)
            sending.check_channel(conn, store.get_channel(conn, out.channel), out)

    @staticmethod
    def _settle_answered(conn: apsw.Connection, out: sending.Outgoing, answered_seq: int,
                         now: int) -> None:
        """An answer acknowledges what it answers for its sender, so it is not redelivered."""
        delivery.complete_answered(conn, answered_seq, out.sender, out.row.id, now)
        if out.type == "response":
            sending.close_query_deadline(conn, answered_seq)

    def _topic_index(self, channel: Channel) -> TopicIndex:
        """The channel's subscriptions as a TopicIndex, rebuilt only when they changed."""
        with self._indexes_lock:
            cached = self._indexes.get(channel.id)
        if cached is not None and cached[0] == channel.subscriptions_version:
            return cached[1]
        with self._read() as conn:
            index = TopicIndex(store.subscriptions(conn, channel))
        with self._indexes_lock:
            self._indexes[channel.id] = (channel.subscriptions_version, index)
        return index

    def _check_limits(self, conn: apsw.Connection, new_deliveries: int, now: int) -> None:
        limits = self.limits
        active, size = conn.execute(_PRESSURE_SQL).fetchone()
        if active + new_deliveries > limits.max_active:
            raise StoreFull(active, limits.max_active)
        if size > limits.max_file_bytes - limits.reserve_bytes:
            raise StoreCapacity(size, limits.max_file_bytes, limits.reserve_bytes)
        if size > limits.max_file_bytes - limits.warn_bytes:
            _warn_capacity(conn, self.payloads, size, limits, now)

    # --- receiving and acknowledging -------------------------------------------

    def receive_messages(self, agent: str,
                         filter: MessageFilter | dict[str, Any] | None = None) -> QueryResult:
        """Hand out `agent`'s waiting messages (oldest first unless the filter sorts).

        Each returned message counts as delivered: on an at_least_once or
        exactly_once channel it comes back after ack_timeout unless
        acknowledged. Runs `tick` first, so due retries are included.
        """
        validate_agent_id(agent)
        flt = self._checked_filter(filter)
        candidates = None
        if flt.content_pattern is not None:  # the user's regex runs outside the write lock
            with self._read() as conn:
                candidates = delivery.content_candidates(conn, agent, flt, self.clock())
        with self._write() as conn:
            now = self.clock()
            delivery.tick(conn, now)
            return delivery.receive(conn, agent, flt, now, self._load_content, self._count,
                                    candidates)

    def _count(self, sql: str, params: dict[str, Any]) -> int:
        with self._read() as conn:
            return conn.execute(sql, params).get

    def acknowledge_message(self, message: ChannelMessage | int, agent: str, status: str,
                            note: str | None = None) -> str:
        """Record `agent`'s ack (received, in_progress, completed, failed) of a message.

        received / in_progress keep an unfinished delivery alive for another
        ack_timeout; completed / failed end it. Returns the delivery's status.
        """
        seq = message.seq if isinstance(message, ChannelMessage) else message
        validate_positive_int(seq, "message")
        validate_agent_id(agent)
        with self._write() as conn:
            return delivery.acknowledge(conn, seq, agent, status, note, self.clock())

    def deliveries(self, message: ChannelMessage | int) -> list[Delivery]:
        """Every recipient's delivery of a message: the sender's view of its acks."""
        seq = message.seq if isinstance(message, ChannelMessage) else message
        validate_positive_int(seq, "message")
        with self._read() as conn:
            return deliveries_of(conn, seq)

    def tick(self, now: int | None = None) -> TickReport:
        """Run every timer due by `now` (default: the clock): retries, dead letters, expiries."""
        with self._write() as conn:
            return delivery.tick(conn, self.clock() if now is None else now)

    # --- queries ---------------------------------------------------------------

    def query_messages(self, filter: MessageFilter | dict[str, Any] | None = None) -> QueryResult:
        """Messages of every channel matching the filter, newest first by default."""
        flt = self._checked_filter(filter)
        clauses, params = filter_sql(flt)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        params.update(limit=flt.limit, offset=flt.offset)
        with self._read() as conn:
            total = conn.execute("SELECT count(*)" + FROM_SQL + where, params).get
            rows = conn.execute("SELECT " + MESSAGE_COLUMNS + FROM_SQL + where
                                + order_sql(flt, "desc") + " LIMIT :limit OFFSET :offset", params)
            found = [row_to_message(row, self._load_content) for row in rows]
        return QueryResult(found, total, total > flt.offset + len(found))

    def _checked_filter(self, filter: MessageFilter | dict[str, Any] | None) -> MessageFilter:
        """The filter, validated; a channel it names must exist (UnknownChannel)."""
        flt = MessageFilter.coerce(filter)
        if flt.channel is not None:
            self.get_channel(flt.channel)
        return flt

    def get_thread(self, correlation_id: str) -> list[ChannelMessage]:
        """The messages sharing `correlation_id` (a query and its responses), oldest first."""
        if not isinstance(correlation_id, str) or not correlation_id:
            raise ValidationFailed("correlation_id", "must be a non-empty string")
        with self._read() as conn:
            rows = conn.execute(_THREAD_SQL, (correlation_id,))
            return [row_to_message(row, self._load_content) for row in rows]

    # --- dead letters ----------------------------------------------------------

    def dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        validate_positive_int(limit, "limit")
        with self._read() as conn:
            return deadletters.list_dead_letters(conn, self._load_content, limit)

    def dead_letter(self, dead_letter_id: int) -> DeadLetter:
        validate_positive_int(dead_letter_id, "id")
        with self._read() as conn:
            return deadletters.get_dead_letter(conn, dead_letter_id, self._load_content)

    def replay_dead_letter(self, dead_letter_id: int) -> tuple[int, str]:
        """Deliver it again, retries reset; returns (seq, recipient)."""
        validate_positive_int(dead_letter_id, "id")
        with self._write() as conn:
            return deadletters.replay(conn, dead_letter_id, self.clock())

    def discard_dead_letter(self, dead_letter_id: int) -> None:
        validate_positive_int(dead_letter_id, "id")
        with self._write() as conn:
            deadletters.discard(conn, dead_letter_id)

    def purge_dead_letters(self, older_than: float | timedelta) -> int:
        """Discard dead letters older than `older_than` (seconds or a timedelta)."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            raise ValidationFailed("older_than", f"must be seconds >= 0, got {older_than!r}")
        with self._write() as conn:
            return deadletters.purge(conn, self.clock() - round(seconds * 1000))


def _warn_capacity(conn: apsw.Connection, payloads: PayloadPolicy, size: int,
                   limits: StoreLimits, now: int) -> None:
    """Broadcast that the file nears its limit, at most once a minute (inside the send)."""
    warned_at = conn.execute(_WARNED_AT_SQL).get
    if warned_at is not None and now - int(warned_at) < CAPACITY_WARNING_EVERY_MS:
        return
    conn.execute(_SET_WARNED_AT_SQL, (str(now),))
    notice = messages.prepare_row(system.SYSTEM_AGENT, CAPACITY_WARNING_TYPE, {
        "file_bytes": size, "max_file_bytes": limits.max_file_bytes,
        "refused_above": limits.max_file_bytes - limits.reserve_bytes,
        "fix": "run `bus compact` or purge dead letters"})
    messages.append(conn, [notice], payloads, now)
