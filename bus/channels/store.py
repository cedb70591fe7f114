"""Channels, participants and subscriptions: what they are and their SQL.

A channel has a type that decides who receives what (direct, group,
broadcast, pubsub), a state that decides whether it accepts and delivers
messages, and a config: size limit, delivery mode, ack timeout, retries and
backoff, max_pending, echo and priority ordering. The functions here run
inside the caller's transaction; `bus.channels.engine.Channels` is the public facade.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from typing import Any

import apsw

from bus.channels.errors import UnknownChannel
from bus.channels.topics import validate_pattern
from bus.storage.errors import ValidationFailed
from bus.log.messages import validate_agent_id

CHANNEL_TYPES = ("direct", "group", "broadcast", "pubsub")
STATES = ("active", "paused", "draining", "closed")
ROLES = ("owner", "member", "observer")
JOIN_ROLES = ("member", "observer")  # the owner is set when the channel is created
DELIVERY_MODES = ("at_most_once", "at_least_once", "exactly_once")
# Which states accept sends and which hand out deliveries: a paused channel
# holds both; a draining one delivers what it has but takes nothing new.
SENDING_STATES = frozenset({"active"})
DELIVERING_STATES = frozenset({"active", "draining"})
NAME_PREFIX = "#"  # a channel message is addressed to '#<channel>' in `messages`

_CHANNEL_COLUMNS = (
    "id, name, type, owner, state, created_at_ms, max_message_size, delivery_mode,"
    " ack_timeout_ms, max_retries, retry_backoff_ms, max_pending, echo, priority_ordering,"
    " open_deliveries, subscriptions_version"
)
_INSERT_CHANNEL_SQL = (
    "INSERT INTO channels (name, type, owner, created_at_ms, max_message_size, delivery_mode,"
    " ack_timeout_ms, max_retries, retry_backoff_ms, max_pending, echo, priority_ordering)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING RETURNING id"
)
_CHANNEL_BY_NAME_SQL = f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE name = ?"
_LIST_CHANNELS_SQL = f"SELECT {_CHANNEL_COLUMNS} FROM channels ORDER BY name"
_SET_STATE_SQL = "UPDATE channels SET state = ? WHERE id = ?"
_UPSERT_PARTICIPANT_SQL = (
    "INSERT INTO participants (channel_id, agent, role, joined_at_ms) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (channel_id, agent) DO UPDATE SET role = excluded.role"
    " WHERE participants.role != 'owner'"
)
_PARTICIPANT_ROLE_SQL = "SELECT role FROM participants WHERE channel_id = ? AND agent = ?"
_PARTICIPANTS_SQL = (
    "SELECT agent, role, joined_at_ms FROM participants WHERE channel_id = ? ORDER BY joined_at_ms,"
    " agent"
)
_PARTICIPANT_COUNT_SQL = "SELECT count(*) FROM participants WHERE channel_id = ?"
_DELETE_PARTICIPANT_SQL = "DELETE FROM participants WHERE channel_id = ? AND agent = ?"
_INSERT_SUBSCRIPTION_SQL = (
    "INSERT INTO subscriptions (channel_id, agent, pattern, created_at_ms) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_DELETE_SUBSCRIPTION_SQL = (
    "DELETE FROM subscriptions WHERE channel_id = ? AND agent = ? AND pattern = ?"
)
# A leaving agent's unfinished deliveries on the channel: nobody will receive them.
_CANCEL_OPEN_DELIVERIES_SQL = (
    "UPDATE deliveries SET status = 'cancelled', deadline_ms = NULL,"
    " last_error = 'the recipient left the channel' WHERE channel_id = :channel"
    " AND recipient = :agent AND (status = 'pending' OR deadline_ms IS NOT NULL)"
)
_ADD_OPEN_DELIVERIES_SQL = (
    "UPDATE channels SET open_deliveries = open_deliveries + ? WHERE id = ?"
)
_DELETE_AGENT_SUBSCRIPTIONS_SQL = "DELETE FROM subscriptions WHERE channel_id = ? AND agent = ?"
_BUMP_SUBSCRIPTIONS_SQL = (
    "UPDATE channels SET subscriptions_version = subscriptions_version + 1 WHERE id = ?"
)
_SUBSCRIPTIONS_SQL = (
    "SELECT pattern, agent FROM subscriptions WHERE channel_id = ? ORDER BY agent, pattern"
)


@dataclass(frozen=True)
class ChannelConfig:
    """A channel's settings, each with its default."""

    max_message_size: int = 1_048_576  # bytes of UTF-8 content
    delivery_mode: str = "at_least_once"
    ack_timeout: float = 30.0  # seconds
    max_retries: int = 3
    retry_backoff_ms: int = 1000
    max_pending: int | None = None  # None: unlimited
    echo: bool = False
    priority_ordering: bool = False

    @classmethod
    def build(cls, **config: Any) -> ChannelConfig:
        """Validate keyword settings; unknown keys and bad values raise ValidationFailed."""
        known = {f.name for f in fields(cls)}
        for key in config:
            if key not in known:
                raise ValidationFailed(key, "unknown channel setting; accepted:"
                                            f" {', '.join(sorted(known))}")
        made = cls(**config)
        made._validate()
        return made

    def _validate(self) -> None:
        _positive_int(self.max_message_size, "max_message_size")
        if self.delivery_mode not in DELIVERY_MODES:
            raise ValidationFailed("delivery_mode", f"{self.delivery_mode!r} is not one of"
                                                    f" {', '.join(DELIVERY_MODES)}")
        if not isinstance(self.ack_timeout, (int, float)) or isinstance(self.ack_timeout, bool) \
                or not 0.001 <= self.ack_timeout <= 7 * 86400:
            raise ValidationFailed("ack_timeout", f"must be seconds between 0.001 and 604800,"
                                                  f" got {self.ack_timeout!r}")
        _non_negative_int(self.max_retries, "max_retries")
        _non_negative_int(self.retry_backoff_ms, "retry_backoff_ms")
        if self.max_pending is not None:
            _positive_int(self.max_pending, "max_pending")
        for name in ("echo", "priority_ordering"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationFailed(name, f"must be true or false, got {getattr(self, name)!r}")

    @property
    def ack_timeout_ms(self) -> int:
        return max(1, round(self.ack_timeout * 1000))

    @property
    def timer_at_send(self) -> bool:
        """Whether a delivery's ack timer starts at send.

        at_most_once has no timer. A channel with max_pending hands out only
        so many at a time, so its timer starts when `receive` hands one out.
        """
        return self.delivery_mode != "at_most_once" and self.max_pending is None


def _positive_int(value: object, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValidationFailed(field, f"must be an integer >= 1, got {value!r}")


def _non_negative_int(value: object, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationFailed(field, f"must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class Channel:
    """A channel as stored; `open_deliveries` counts deliveries not yet finished."""

    id: int
    name: str
    type: str
    owner: str
    state: str
    created_at_ms: int
    config: ChannelConfig
    open_deliveries: int
    subscriptions_version: int

    @property
    def address(self) -> str:
        """The `to` of this channel's rows in `messages`."""
        return NAME_PREFIX + self.name

    def to_json_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "type": self.type, "owner": self.owner,
                "state": self.state, "created_at_ms": self.created_at_ms,
                "open_deliveries": self.open_deliveries, **self.config.__dict__}


@dataclass(frozen=True)
class Participant:
    agent: str
    role: str
    joined_at_ms: int

    def to_json_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _channel_from_row(row: tuple[Any, ...]) -> Channel:
    (id_, name, type_, owner, state, created, size, mode, ack_ms, retries, backoff, max_pending,
     echo, ordering, open_deliveries, version) = row
    config = ChannelConfig(size, mode, ack_ms / 1000, retries, backoff, max_pending, bool(echo),
                           bool(ordering))
    return Channel(id_, name, type_, owner, state, created, config, open_deliveries, version)


def validate_name(value: object, field: str = "channel") -> str:
    """A channel name follows the agent id rules (letters, digits and . _ : -)."""
    return validate_agent_id(value, field)


def validate_choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValidationFailed(field, f"{value!r} is not one of {', '.join(choices)}")
    return value  # type: ignore[return-value]


# --- SQL, inside the caller's transaction ----------------------------------


def insert_channel(conn: apsw.Connection, name: str, type_: str, owner: str,
                   config: ChannelConfig, now_ms: int) -> Channel:
    """Create the channel with `owner` as its owner participant; refuses a taken name."""
    channel_id = conn.execute(_INSERT_CHANNEL_SQL, (
        name, type_, owner, now_ms, config.max_message_size, config.delivery_mode,
        config.ack_timeout_ms, config.max_retries, config.retry_backoff_ms, config.max_pending,
        int(config.echo), int(config.priority_ordering))).get
    if channel_id is None:
        raise ValidationFailed("name", f"a channel named {name!r} exists already; pick another"
                                       " name or use the existing channel")
    conn.execute(_UPSERT_PARTICIPANT_SQL, (channel_id, owner, "owner", now_ms))
    return get_channel(conn, name)


def find_channel(conn: apsw.Connection, name: str) -> Channel | None:
    row = conn.execute(_CHANNEL_BY_NAME_SQL, (name,)).fetchone()
    return None if row is None else _channel_from_row(row)


def get_channel(conn: apsw.Connection, name: str) -> Channel:
    channel = find_channel(conn, name)
    if channel is None:
        raise UnknownChannel(name)
    return channel


def list_channels(conn: apsw.Connection) -> list[Channel]:
    return [_channel_from_row(row) for row in conn.execute(_LIST_CHANNELS_SQL)]


def set_state(conn: apsw.Connection, channel: Channel, state: str) -> None:
    if channel.state == "closed" and state != "closed":
        raise ValidationFailed("state", f"channel {channel.name!r} is closed; a closed channel"
                                        " cannot be reopened, create a new one")
    conn.execute(_SET_STATE_SQL, (state, channel.id))


def role_of(conn: apsw.Connection, channel: Channel, agent: str) -> str | None:
    return conn.execute(_PARTICIPANT_ROLE_SQL, (channel.id, agent)).get


def add_participant(conn: apsw.Connection, channel: Channel, agent: str, role: str,
                    now_ms: int) -> None:
    """Join `agent` (or change its role); a direct channel takes two participants."""
    if role == "owner":
        raise ValidationFailed("role", "a channel has one owner, set when it is created;"
                                       " join as member or observer")
    if channel.state == "closed":
        raise ValidationFailed("channel", f"channel {channel.name!r} is closed")
    current = role_of(conn, channel, agent)
    if current == "owner":
        return
    if channel.type == "direct" and current is None \
            and conn.execute(_PARTICIPANT_COUNT_SQL, (channel.id,)).get >= 2:
        raise ValidationFailed("channel", f"direct channel {channel.name!r} has its two"
                                          " participants already; use a group channel for more")
    conn.execute(_UPSERT_PARTICIPANT_SQL, (channel.id, agent, role, now_ms))


def remove_participant(conn: apsw.Connection, channel: Channel, agent: str) -> bool:
    """Leave the channel; the owner cannot.

    The agent's subscriptions go, and so do its unfinished deliveries on the
    channel (status cancelled): nobody would ever receive them, and they
    would count against the store's limit for good.
    """
    if agent == channel.owner:
        raise ValidationFailed("agent", f"{agent} owns channel {channel.name!r} and cannot leave"
                                        " it; close the channel instead")
    conn.execute(_CANCEL_OPEN_DELIVERIES_SQL, {"channel": channel.id, "agent": agent})
    cancelled = conn.changes()
    if cancelled:
        add_open_deliveries(conn, channel.id, -cancelled)
    conn.execute(_DELETE_AGENT_SUBSCRIPTIONS_SQL, (channel.id, agent))
    if conn.changes():
        conn.execute(_BUMP_SUBSCRIPTIONS_SQL, (channel.id,))
    conn.execute(_DELETE_PARTICIPANT_SQL, (channel.id, agent))
    return conn.changes() > 0


def add_open_deliveries(conn: apsw.Connection, channel_id: int, delta: int) -> None:
    """Keep `channels.open_deliveries` (the store limit's count) in step with `deliveries`:
    +n when deliveries are created or revived, -1 when one is finished, buried or cancelled."""
    conn.execute(_ADD_OPEN_DELIVERIES_SQL, (delta, channel_id))


def participants(conn: apsw.Connection, channel: Channel) -> list[Participant]:
    return [Participant(*row) for row in conn.execute(_PARTICIPANTS_SQL, (channel.id,))]


def add_subscription(conn: apsw.Connection, channel: Channel, agent: str, pattern: str,
                     now_ms: int) -> bool:
    """Subscribe `agent`, joining it as a member first if needed; True if new."""
    if channel.type != "pubsub":
        raise ValidationFailed("channel", f"channel {channel.name!r} is a {channel.type} channel;"
                                          " topic subscriptions need a pubsub channel")
    validate_pattern(pattern)
    if role_of(conn, channel, agent) is None:
        add_participant(conn, channel, agent, "member", now_ms)
    conn.execute(_INSERT_SUBSCRIPTION_SQL, (channel.id, agent, pattern, now_ms))
    added = conn.changes() > 0
    if added:
        conn.execute(_BUMP_SUBSCRIPTIONS_SQL, (channel.id,))
    return added


def remove_subscription(conn: apsw.Connection, channel: Channel, agent: str,
                        pattern: str) -> bool:
    conn.execute(_DELETE_SUBSCRIPTION_SQL, (channel.id, agent, pattern))
    removed = conn.changes() > 0
    if removed:
        conn.execute(_BUMP_SUBSCRIPTIONS_SQL, (channel.id,))
    return removed


def subscriptions(conn: apsw.Connection, channel: Channel) -> list[tuple[str, str]]:
    """(pattern, agent) pairs of the channel."""
    return list(conn.execute(_SUBSCRIPTIONS_SQL, (channel.id,)))
