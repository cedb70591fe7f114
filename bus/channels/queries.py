"""Channel messages as callers see them, and the filter that selects them.

`MessageFilter` is a channel query's filter (channel, time range, types, sender,
topic, status, content regex, sort, limit, offset); `filter_sql` turns it
into WHERE clauses over `channel_messages` (alias cm, indexed on channel,
sender, topic and time) and `messages` (alias m, indexed on correlation id),
with every value bound. A topic with wildcards and the content regex are SQL
functions registered on the connection (`connection_register_functions`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from typing import Any
from typing import Callable
from typing import Iterator

import apsw
import orjson

from bus.channels.store import Participant
from bus.channels.topics import MULTI
from bus.channels.topics import SINGLE
from bus.channels.topics import matches
from bus.channels.topics import validate_pattern
from bus.storage.errors import ValidationFailed
from bus.log.messages import iso_utc

MESSAGE_TYPES = ("text", "command", "query", "response", "acknowledgment", "notification",
                 "event")
MESSAGE_STATUSES = ("sent", "delivered", "acknowledged", "failed", "dead_letter", "expired")
SORT_COLUMNS = {"created_at": "cm.seq", "priority": "cm.priority", "sender": "cm.sender",
                "type": "cm.type", "topic": "cm.topic"}
SORT_ORDERS = {"asc": "ASC", "desc": "DESC"}
LIMIT_MAX = 10_000

# The columns of a ChannelMessage, in order (deliveries columns added by receive).
MESSAGE_COLUMNS = (
    "cm.seq, m.id, c.name, cm.sender, cm.type, m.payload, m.payload_ref, cm.topic, cm.priority,"
    " m.correlation_id, m.in_reply_to, cm.ts_ms, cm.status"
)
FROM_SQL = (
    " FROM channel_messages cm JOIN messages m ON m.seq = cm.seq"
    " JOIN channels c ON c.id = cm.channel_id"
)


@dataclass(frozen=True)
class ChannelMessage:
    """One message of a channel. `seq` is its number (its message id);
    `id` its UUID. For a received message, `recipient`, `delivery_status`,
    `attempt` (1 on first delivery) and `retry_count` describe the delivery.
    `content_error` says why content could not be read (a missing blob)."""

    seq: int
    id: str
    channel: str
    sender: str
    type: str
    content: Any
    topic: str | None
    priority: int
    correlation_id: str | None
    in_reply_to: str | None
    ts_ms: int
    status: str
    content_error: str | None = None
    recipient: str | None = None
    delivery_status: str | None = None
    attempt: int | None = None
    retry_count: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ts"] = iso_utc(self.ts_ms)
        return {k: v for k, v in out.items() if v is not None or k in _ALWAYS}


_ALWAYS = frozenset({"topic", "correlation_id", "in_reply_to", "content"})


class QueryResult:
    """A page of messages, how many matched before paging, and whether more follow.

    `total_count` may be computed on first use (receive does, because
    counting costs time in proportion to the backlog while handing out
    costs only the page): a consumer loop that reads `messages` and
    `has_more` never pays for the count.
    """

    __slots__ = ("messages", "has_more", "_total")

    def __init__(self, messages: list[ChannelMessage], total_count: int | Callable[[], int],
                 has_more: bool) -> None:
        self.messages = messages
        self.has_more = has_more
        self._total = total_count

    @property
    def total_count(self) -> int:
        if callable(self._total):
            self._total = self._total()
        return self._total

    def __iter__(self) -> Iterator[ChannelMessage]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: int) -> ChannelMessage:
        return self.messages[index]

    def __repr__(self) -> str:
        return (f"QueryResult({len(self.messages)} messages, total_count={self.total_count},"
                f" has_more={self.has_more})")


@dataclass(frozen=True)
class MessageFilter:
    """Which messages: every field is optional and they combine with AND.

    `after_ms` / `before_ms` bound the send time (inclusive / exclusive);
    `topic` is a topic or a pattern with `*` and `#`; `content_pattern` a
    Python regular expression searched in the content; `sort_order` None
    means the caller's default (receive: oldest first; queries: newest first).
    """

    channel: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None
    types: tuple[str, ...] | None = None
    sender: str | None = None
    topic: str | None = None
    status: tuple[str, ...] | None = None
    content_pattern: str | None = None
    correlation_id: str | None = None
    sort_by: str = "created_at"
    sort_order: str | None = None
    limit: int = 100
    offset: int = 0

    @classmethod
    def coerce(cls, value: MessageFilter | dict[str, Any] | None) -> MessageFilter:
        """A MessageFilter from itself, a dict of its fields, or None; validated."""
        if value is None:
            made = cls()
        elif isinstance(value, MessageFilter):
            made = value
        elif isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValidationFailed(f"filter.{unknown[0]}", "unknown filter field; accepted:"
                                                               f" {', '.join(sorted(known))}")
            made = cls(**{k: tuple(v) if k in ("types", "status") and v is not None else v
                          for k, v in value.items()})
        else:
            raise ValidationFailed("filter", "must be a MessageFilter, a dict or None")
        made._validate()
        return made

    def _validate(self) -> None:
        for name in ("after_ms", "before_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValidationFailed(f"filter.{name}", "must be epoch milliseconds (an integer)")
        _check_choices(self.types, "types", MESSAGE_TYPES)
        _check_choices(self.status, "status", MESSAGE_STATUSES)
        if self.topic is not None:
            validate_pattern(self.topic, "filter.topic")
        if self.content_pattern is not None:
            compile_pattern(self.content_pattern)
        if self.sort_by not in SORT_COLUMNS:
            raise ValidationFailed("filter.sort_by", f"{self.sort_by!r} is not one of"
                                                     f" {', '.join(SORT_COLUMNS)}")
        if self.sort_order is not None and self.sort_order not in SORT_ORDERS:
            raise ValidationFailed("filter.sort_order", f"{self.sort_order!r} is not asc or desc")
        if not isinstance(self.limit, int) or not 1 <= self.limit <= LIMIT_MAX:
            raise ValidationFailed("filter.limit", f"must be 1-{LIMIT_MAX}, got {self.limit!r}")
        if not isinstance(self.offset, int) or self.offset < 0:
            raise ValidationFailed("filter.offset", f"must be >= 0, got {self.offset!r}")


def _check_choices(values: tuple[str, ...] | None, name: str, choices: tuple[str, ...]) -> None:
    if values is None:
        return
    if not isinstance(values, tuple) or not values:
        raise ValidationFailed(f"filter.{name}", "must be a non-empty list")
    for value in values:
        if value not in choices:
            raise ValidationFailed(f"filter.{name}", f"{value!r} is not one of {', '.join(choices)}")


def compile_pattern(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ValidationFailed("filter.content_pattern", f"is not a valid regular expression:"
                                                         f" {exc}") from None


def filter_sql(flt: MessageFilter) -> tuple[list[str], dict[str, Any]]:
    """WHERE clauses (joined with AND by the caller) and their bindings."""
    clauses: list[str] = []
    params: dict[str, Any] = {}

    def add(clause: str, **values: Any) -> None:
        clauses.append(clause)
        params.update(values)

    if flt.channel is not None:
        add("c.name = :f_channel", f_channel=flt.channel)
    if flt.after_ms is not None:
        add("cm.ts_ms >= :f_after", f_after=flt.after_ms)
    if flt.before_ms is not None:
        add("cm.ts_ms < :f_before", f_before=flt.before_ms)
    if flt.types is not None:
        add("cm.type IN (SELECT value FROM json_each(:f_types))",
            f_types=orjson.dumps(list(flt.types)).decode())
    if flt.status is not None:
        add("cm.status IN (SELECT value FROM json_each(:f_status))",
            f_status=orjson.dumps(list(flt.status)).decode())
    if flt.sender is not None:
        add("cm.sender = :f_sender", f_sender=flt.sender)
    if flt.correlation_id is not None:
        add("m.correlation_id = :f_correlation", f_correlation=flt.correlation_id)
    if flt.topic is not None:
        _add_topic(flt.topic, add)
    if flt.content_pattern is not None:
        add("bus_content_matches(:f_content, m.payload, m.payload_ref)",
            f_content=flt.content_pattern)
    return clauses, params


def _add_topic(pattern: str, add: Callable[..., None]) -> None:
    if SINGLE not in pattern.split(".") and MULTI not in pattern.split("."):
        add("cm.topic = :f_topic", f_topic=pattern)  # exact: the topic index
        return
    add("cm.topic IS NOT NULL AND bus_topic_matches(:f_topic, cm.topic)", f_topic=pattern)


def order_sql(flt: MessageFilter, default_order: str, priority_first: bool = False) -> str:
    """ORDER BY from constants only; seq breaks ties oldest first, so equal keys stay FIFO."""
    direction = SORT_ORDERS[flt.sort_order or default_order]
    keys = []
    if priority_first:  # channels with priority_ordering: higher priority first
        keys.append("CASE WHEN c.priority_ordering THEN cm.priority ELSE 0 END DESC")
    column = SORT_COLUMNS[flt.sort_by]
    keys.append(f"{column} {direction}")
    if column != "cm.seq":  # equal keys keep their arrival order, whatever the direction
        keys.append("cm.seq ASC")
    return " ORDER BY " + ", ".join(keys)


def connection_register_functions(conn: apsw.Connection,
                                  load_content: Callable[[str | None, str | None], Any]) -> None:
    """The SQL functions filters use: topic patterns and the content regex."""
    conn.create_scalar_function("bus_topic_matches", _topic_matches, 2, deterministic=True)
    cache: dict[str, re.Pattern[str]] = {}

    def content_matches(pattern: str, payload: str | None, payload_ref: str | None) -> int:
        compiled = cache.get(pattern) or cache.setdefault(pattern, compile_pattern(pattern))
        content, _error = load_content(payload, payload_ref)
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        return 1 if compiled.search(text) else 0

    conn.create_scalar_function("bus_content_matches", content_matches, 3)


def _topic_matches(pattern: str, topic: str) -> int:
    return 1 if matches(topic, pattern) else 0


def row_to_message(row: tuple[Any, ...],
                   load_content: Callable[[str | None, str | None], Any]) -> ChannelMessage:
    seq, id_, channel, sender, type_, payload, ref, topic, priority, corr, reply, ts, status = row[:13]
    content, error = load_content(payload, ref)
    extra = row[13:]
    return ChannelMessage(seq, id_, channel, sender, type_, content, topic, priority, corr, reply,
                          ts, status, error, *extra)


# --- deliveries: each recipient's copy of a message ------------------------------------------

_DELIVERY_COLUMNS = ("d.recipient, d.status, d.attempts, d.retry_count, d.delivered_at_ms,"
                     " d.acked_at_ms, d.note, d.last_error")
_DELIVERIES_SQL = (f"SELECT {_DELIVERY_COLUMNS} FROM deliveries d WHERE d.seq = ?"
                   " ORDER BY d.recipient")
_NEWEST_DELIVERIES_SQL = (
    f"SELECT d.seq, {_DELIVERY_COLUMNS} FROM channel_messages m JOIN deliveries d"
    " ON d.seq = m.seq WHERE m.channel_id = ? ORDER BY m.seq DESC, d.recipient LIMIT ?"
)


@dataclass(frozen=True)
class Delivery:
    """One recipient's copy of a message and where it stands."""

    recipient: str
    status: str
    attempts: int
    retry_count: int
    delivered_at_ms: int | None
    acked_at_ms: int | None
    note: str | None
    last_error: str | None

    def to_json_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def deliveries_of(conn: apsw.Connection, seq: int) -> list[Delivery]:
    """Every recipient's delivery of message `seq` (none for a message of no channel)."""
    return [Delivery(*row) for row in conn.execute(_DELIVERIES_SQL, (seq,))]


def newest_deliveries(conn: apsw.Connection, channel_id: int,
                      limit: int) -> list[tuple[int, Delivery]]:
    """The channel's newest `limit` deliveries, as (seq, delivery), newest message first."""
    return [(row[0], Delivery(*row[1:]))
            for row in conn.execute(_NEWEST_DELIVERIES_SQL, (channel_id, limit))]


# --- the channels as the views list them ---------------------------------------------------

# Open deliveries are kept on the channel row; the ones awaiting an ack have a deadline
# (a partial index covers them); dead letters are counted per channel.
_SUMMARY_SQL = (
    "SELECT c.id, c.name, c.type, c.owner, c.state, c.delivery_mode, c.open_deliveries,"
    " (SELECT count(*) FROM deliveries d WHERE d.channel_id = c.id AND d.deadline_ms IS NOT NULL"
    " AND d.status != 'pending'),"
    " (SELECT count(*) FROM dead_letters l WHERE l.channel_id = c.id) FROM channels c"
)
_SUMMARIES_SQL = f"{_SUMMARY_SQL} ORDER BY c.name"
_SUMMARY_BY_NAME_SQL = f"{_SUMMARY_SQL} WHERE c.name = ?"


@dataclass(frozen=True)
class ChannelSummary:
    """A channel with its deliveries in flight and its dead letters, as the views show it."""

    name: str
    type: str
    owner: str
    state: str
    delivery_mode: str
    open_deliveries: int
    awaiting_ack: int  # handed out, not yet acked
    dead_letters: int


def channel_summaries(conn: apsw.Connection) -> list[ChannelSummary]:
    """Every channel, by name."""
    return [ChannelSummary(*row[1:]) for row in conn.execute(_SUMMARIES_SQL)]


def channel_summary(conn: apsw.Connection, name: str) -> tuple[int, ChannelSummary] | None:
    """The channel `name`'s id and summary, or None when there is none."""
    row = conn.execute(_SUMMARY_BY_NAME_SQL, (name,)).fetchone()
    return None if row is None else (row[0], ChannelSummary(*row[1:]))


# --- one channel's page: its people, its newest deliveries, its dead letters -----------------

_PARTICIPANTS_BY_AGENT_SQL = ("SELECT agent, role, joined_at_ms FROM participants"
                              " WHERE channel_id = ? ORDER BY agent")
_DEAD_LETTER_SUMMARIES_SQL = (
    "SELECT l.id, l.seq, c.name, l.recipient, l.retry_count, l.last_error,"
    " l.dead_lettered_at_ms FROM dead_letters l JOIN channels c ON c.id = l.channel_id"
    " WHERE (:channel IS NULL OR l.channel_id = :channel) ORDER BY l.id DESC LIMIT :limit"
)


@dataclass(frozen=True)
class DeadLetterSummary:
    """A dead letter as a list of them shows it: which message, to whom, why, and when,
    without the message's content (the `DeadLetter` of bus/channels/deadletters.py
    carries the whole message, for replay and `bus dlq show`)."""

    id: int
    seq: int
    channel: str
    recipient: str
    retry_count: int
    last_error: str
    dead_lettered_at_ms: int


def dead_letter_summaries(conn: apsw.Connection, channel_id: int | None = None,
                          limit: int = 1000) -> list[DeadLetterSummary]:
    """The newest dead letters first, of one channel or of all."""
    return [DeadLetterSummary(*row) for row in conn.execute(
        _DEAD_LETTER_SUMMARIES_SQL, {"channel": channel_id, "limit": limit})]


@dataclass(frozen=True)
class ChannelDetail:
    """A channel with its participants (by name), its newest deliveries (seq, delivery)
    and its newest dead letters."""

    channel: ChannelSummary
    participants: list[Participant]
    deliveries: list[tuple[int, Delivery]] = field(default_factory=list)
    dead_letters: list[DeadLetterSummary] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"channel": dataclasses.asdict(self.channel),
                "participants": [p.to_json_dict() for p in self.participants],
                "deliveries": [{"seq": s, "channel": self.channel.name, **d.to_json_dict()}
                               for s, d in self.deliveries],
                "dead_letters": [dataclasses.asdict(d) for d in self.dead_letters]}


def channel_detail(conn: apsw.Connection, name: str, limit: int = 100) -> ChannelDetail | None:
    """The channel `name` with the newest `limit` deliveries and dead letters; None when
    there is no such channel."""
    found = channel_summary(conn, name)
    if found is None:
        return None
    channel_id, channel = found
    participants = [Participant(*row)
                    for row in conn.execute(_PARTICIPANTS_BY_AGENT_SQL, (channel_id,))]
    return ChannelDetail(channel, participants, newest_deliveries(conn, channel_id, limit),
                         dead_letter_summaries(conn, channel_id, limit))
