"""The send pipeline of channels: validate, assign id and time, route, persist.

`prepare` checks everything that needs no database (sender, type, content,
priority, topic form); `send` runs inside the caller's write transaction and
checks the rest (channel state, membership, size, the query or command a
reply answers), picks the recipients and writes the message row, its
channel row and one delivery row per recipient. A failed check raises
ValidationFailed before anything is written, and the transaction is the
caller's, so a message and its deliveries are committed together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Callable
from typing import TYPE_CHECKING

import apsw
import orjson

from bus.log import messages
from bus.channels.queries import MESSAGE_TYPES
from bus.channels.store import SENDING_STATES
from bus.channels.store import Channel
from bus.channels.store import add_open_deliveries
from bus.channels.store import participants
from bus.channels.store import role_of
from bus.channels.topics import TopicIndex
from bus.channels.topics import validate_topic
from bus.storage.errors import ValidationFailed

if TYPE_CHECKING:
    from bus.log.payloads import PayloadPolicy

PRIORITY_MIN, PRIORITY_MAX = 0, 4
DEFAULT_PRIORITY = 2
# A reply type must answer an earlier message of the type it names.
ANSWERS = {"response": "query", "acknowledgment": "command"}

_INSERT_CHANNEL_MESSAGE_SQL = (
    "INSERT INTO channel_messages (seq, channel_id, sender, type, ts_ms, topic, priority,"
    " expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_ANSWERED_SQL = (
    "SELECT m.id, cm.seq FROM messages m JOIN channel_messages cm ON cm.seq = m.seq"
    " WHERE m.correlation_id = ? AND cm.channel_id = ? AND cm.type = ? ORDER BY m.seq LIMIT 1"
)
_CLEAR_QUERY_DEADLINE_SQL = (
    "UPDATE channel_messages SET expires_at_ms = NULL WHERE seq = ? AND expires_at_ms IS NOT NULL"
)
_INSERT_DELIVERY_SQL = (
    "INSERT INTO deliveries (seq, recipient, channel_id, status, visible_at_ms, deadline_ms)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_DEDUP_HIT_SQL = (
    "SELECT 1 FROM dedup WHERE correlation_id = ? AND recipient = ? AND expires_at_ms > ?"
)
_DEDUP_UPSERT_SQL = (
    "INSERT INTO dedup (correlation_id, recipient, seq, expires_at_ms) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO UPDATE SET seq = excluded.seq, expires_at_ms = excluded.expires_at_ms"
)
# A large fan-out: one statement per batch of recipients (a JSON array), not one per recipient.
FANOUT_BATCH = 1000
_INSERT_DELIVERIES_SQL = (
    "INSERT INTO deliveries (seq, recipient, channel_id, status, visible_at_ms, deadline_ms)"
    " SELECT ?, value, ?, ?, ?, ? FROM json_each(?)"
)
_DEDUP_HITS_SQL = (
    "SELECT recipient FROM dedup WHERE correlation_id = ? AND expires_at_ms > ?"
    " AND recipient IN (SELECT value FROM json_each(?))"
)
# `WHERE true`: an upsert's SELECT needs a WHERE, or its ON is parsed as a join's
# (https://sqlite.org/lang_upsert.html, "Parsing Ambiguity").
_DEDUP_UPSERT_MANY_SQL = (
    "INSERT INTO dedup (correlation_id, recipient, seq, expires_at_ms)"
    " SELECT ?, value, ?, ? FROM json_each(?) WHERE true"
    " ON CONFLICT DO UPDATE SET seq = excluded.seq, expires_at_ms = excluded.expires_at_ms"
)


@dataclass(frozen=True)
class Outgoing:
    """A send that passed the checks needing no database."""

    channel: str
    sender: str
    type: str
    row: messages.Row  # the `messages` row, content as JSON (or a blob reference)
    size: int  # bytes of content
    topic: str | None
    priority: int
    timeout_ms: int | None  # a query's answer deadline


def prepare(channel: str, sender: str, type: str, content: Any, *, topic: str | None = None,
            priority: int = DEFAULT_PRIORITY, correlation_id: str | None = None,
            in_reply_to: str | None = None, timeout: float | None = None) -> Outgoing:
    """Validate what needs no database; raises ValidationFailed naming the field."""
    messages.validate_agent_id(channel, "channel")
    messages.validate_agent_id(sender, "sender")
    if type not in MESSAGE_TYPES:
        raise ValidationFailed("type", f"{type!r} is not one of {', '.join(MESSAGE_TYPES)}")
    if content is None or content == "" or content == {} or content == []:
        raise ValidationFailed("content", "must not be empty")
    if not isinstance(priority, int) or isinstance(priority, bool) \
            or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValidationFailed("priority", f"must be an integer {PRIORITY_MIN}-{PRIORITY_MAX}"
                               f" (0 lowest, 2 normal, 4 highest), got {priority!r}")
    if topic is not None:
        validate_topic(topic)
    if ANSWERS.get(type) and correlation_id is None:
        raise ValidationFailed("correlation_id", f"a {type} needs the correlation_id of the"
                                                 f" {ANSWERS[type]} it answers")
    if timeout is not None and type != "query":
        raise ValidationFailed("timeout", f"only a query waits for an answer; drop the timeout"
                                          f" or send type query (this is a {type})")
    row = messages.prepare_row(sender, type, content, correlation_id=correlation_id,
                               in_reply_to=in_reply_to)
    if type == "query" and correlation_id is None:
        row = row._replace(correlation_id=row.id)  # what responses quote
    return Outgoing(channel, sender, type, row, content_size(content, row.payload), topic,
                    priority, _timeout_ms(timeout))


def content_size(content: Any, encoded: str) -> int:
    """Bytes max_message_size counts: a text's UTF-8 bytes (not its JSON quoting and
    escapes), anything else's JSON encoding."""
    return len((content if isinstance(content, str) else encoded).encode())


def _timeout_ms(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValidationFailed("timeout", f"must be seconds > 0, got {timeout!r}")
    return max(1, round(timeout * 1000))


def check_channel(conn: apsw.Connection, channel: Channel, out: Outgoing) -> None:
    """The checks that need the channel: state, membership, size, topic, the answered message."""
    if channel.state not in SENDING_STATES:
        raise ValidationFailed("channel", f"channel {channel.name!r} is {channel.state}; it accepts"
                                          " messages only while active"
                               + ("" if channel.state == "closed" else
                                  f" (bus channel resume {channel.name})"))
    role = role_of(conn, channel, out.sender)
    if role is None:
        raise ValidationFailed("sender", f"{out.sender} is not a participant of channel"
                                         f" {channel.name!r}; join it first")
    if role == "observer":
        raise ValidationFailed("sender", f"{out.sender} observes channel {channel.name!r} and"
                                         " cannot send; join it as a member")
    if channel.type == "broadcast" and role != "owner":
        raise ValidationFailed("sender", f"only the owner ({channel.owner}) sends on broadcast"
                                         f" channel {channel.name!r}")
    if out.size > channel.config.max_message_size:
        raise ValidationFailed("content", f"Message content exceeds channel max_message_size"
                                          f" ({channel.config.max_message_size} bytes)",
                               value_length=out.size)
    if channel.type == "pubsub" and out.topic is None:
        raise ValidationFailed("topic", f"channel {channel.name!r} is pubsub: a message needs a"
                                        " topic like build.frontend.success")


def answered(conn: apsw.Connection, channel: Channel, out: Outgoing) -> tuple[str, int] | None:
    """(id, seq) of the query or command a response or acknowledgment answers."""
    wanted = ANSWERS.get(out.type)
    if wanted is None:
        return None
    found = conn.execute(_ANSWERED_SQL, (out.row.correlation_id, channel.id, wanted)).fetchone()
    if found is None:
        raise ValidationFailed("correlation_id", f"no {wanted} with correlation_id"
                                                 f" {out.row.correlation_id!r} on channel"
                                                 f" {channel.name!r}; every {out.type} must"
                                                 " answer one")
    return found


def recipients(conn: apsw.Connection, channel: Channel, out: Outgoing,
               topic_index: Callable[[], TopicIndex]) -> list[str]:
    """Who receives the message, by channel type."""
    echo = channel.config.echo
    if channel.type == "pubsub":
        found = topic_index().match(out.topic)
    else:
        found = {p.agent for p in participants(conn, channel)
                 if channel.type != "broadcast" or p.role != "owner"}
    if not echo:
        found.discard(out.sender)
    elif channel.type != "pubsub":
        found.add(out.sender)
    return sorted(found)


def insert(conn: apsw.Connection, payloads: PayloadPolicy | None, channel: Channel,
           out: Outgoing, targets: list[str], now_ms: int) -> tuple[int, str | None]:
    """Write the message, its channel row and its deliveries; return (seq, correlation id).

    Through the log's write path (`messages.append`), with the bus's `payloads` policy.
    """
    row = out.row
    if channel.config.delivery_mode == "exactly_once" and row.correlation_id is None:
        row = row._replace(correlation_id=row.id)  # the dedup key: every send gets one
    [(seq, _duplicate)] = messages.append(conn, [row._replace(to_agent=channel.address)],
                                          payloads, now_ms)
    expires = now_ms + out.timeout_ms if out.type == "query" and out.timeout_ms else None
    conn.execute(_INSERT_CHANNEL_MESSAGE_SQL, (seq, channel.id, out.sender, out.type, now_ms,
                                               out.topic, out.priority, expires))
    fresh = _insert_deliveries(conn, channel, seq, row.correlation_id, targets, now_ms)
    if fresh:
        add_open_deliveries(conn, channel.id, fresh)
    return seq, row.correlation_id


def _insert_deliveries(conn: apsw.Connection, channel: Channel, seq: int,
                       correlation_id: str | None, targets: list[str], now_ms: int) -> int:
    """One delivery per recipient; exactly_once marks a repeat of a correlation id duplicate.

    The ack timer starts here, at send, so a recipient
    that never receives is retried and dead-lettered all the same.
    """
    if len(targets) > FANOUT_BATCH:
        return _insert_delivery_batches(conn, channel, seq, correlation_id, targets, now_ms)
    exactly_once = channel.config.delivery_mode == "exactly_once"
    expires = now_ms + 2 * channel.config.ack_timeout_ms
    deadline = send_deadline(channel, now_ms)
    fresh = 0
    for recipient in targets:
        status = "pending"
        if exactly_once:
            if conn.execute(_DEDUP_HIT_SQL, (correlation_id, recipient, now_ms)).get:
                status = "duplicate"
            else:
                conn.execute(_DEDUP_UPSERT_SQL, (correlation_id, recipient, seq, expires))
        conn.execute(_INSERT_DELIVERY_SQL, (seq, recipient, channel.id, status, now_ms,
                                            deadline if status == "pending" else None))
        fresh += status == "pending"
    return fresh


def _insert_delivery_batches(conn: apsw.Connection, channel: Channel, seq: int,
                             correlation_id: str | None, targets: list[str], now_ms: int) -> int:
    """The deliveries of a large fan-out, FANOUT_BATCH recipients per statement:
    the same rows as one INSERT per recipient, in a few statements.

    All batches are in the send's one transaction: a message and its
    deliveries are committed together or not at all.
    """
    exactly_once = channel.config.delivery_mode == "exactly_once"
    expires = now_ms + 2 * channel.config.ack_timeout_ms
    deadline = send_deadline(channel, now_ms)
    fresh = 0
    for start in range(0, len(targets), FANOUT_BATCH):
        batch = targets[start:start + FANOUT_BATCH]
        duplicates: list[str] = []
        if exactly_once:
            hits = {r for (r,) in conn.execute(_DEDUP_HITS_SQL, (correlation_id, now_ms,
                                                                 _json_list(batch)))}
            duplicates = [r for r in batch if r in hits]
            batch = [r for r in batch if r not in hits]
            if batch:
                conn.execute(_DEDUP_UPSERT_MANY_SQL, (correlation_id, seq, expires,
                                                      _json_list(batch)))
        if batch:
            conn.execute(_INSERT_DELIVERIES_SQL, (seq, channel.id, "pending", now_ms, deadline,
                                                  _json_list(batch)))
        if duplicates:
            conn.execute(_INSERT_DELIVERIES_SQL, (seq, channel.id, "duplicate", now_ms, None,
                                                  _json_list(duplicates)))
        fresh += len(batch)
    return fresh


def _json_list(values: list[str]) -> str:
    return orjson.dumps(values).decode()


def send_deadline(channel: Channel, now_ms: int) -> int | None:
    """When a delivery sent now is retried unless acknowledged; None: no timer yet."""
    config = channel.config
    return now_ms + config.ack_timeout_ms if config.timer_at_send else None


def close_query_deadline(conn: apsw.Connection, query_seq: int) -> None:
    """A query that got an answer no longer expires."""
    conn.execute(_CLEAR_QUERY_DEADLINE_SQL, (query_seq,))
