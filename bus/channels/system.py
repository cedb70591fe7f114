"""The bus's own pubsub channel, `_system`: notices an agent can subscribe to.

The bus emits a notification on the `_system.message.deadletter` topic
when a delivery becomes a dead letter. Topics live on pubsub channels, so
the bus keeps one of its own, `_system`, owned by the agent `bus` and
created on demand: by the first notice, or by the first subscription
(`bus channel subscribe _system --agent ops --pattern '_system.#'`). A
notice is an ordinary channel message of type `notification` with its topic,
so a subscriber receives it with `bus channel receive`, and `bus tail`, the
export and Spark see it like any other message.

The channel is at_most_once: a notice handed out is done. With a timer,
a notice nobody acknowledges would become a dead letter, announced by
another notice, and so on for ever. Subscribers join as observers, so
no agent can publish a forged notice on it, and no user channel may take
its name.
"""

from __future__ import annotations

import apsw

from bus.channels import sending
from bus.channels import store
from bus.channels.store import SENDING_STATES
from bus.channels.store import Channel
from bus.channels.store import ChannelConfig
from bus.channels.topics import TopicIndex
from bus.storage.errors import ValidationFailed

SYSTEM_CHANNEL = "_system"
SYSTEM_AGENT = "bus"  # the sender of what the bus announces itself
DEADLETTER_TOPIC = "_system.message.deadletter"
_CONFIG = ChannelConfig(delivery_mode="at_most_once")


def ensure_channel(conn: apsw.Connection, now_ms: int) -> Channel:
    """The `_system` channel, created now if it does not exist yet."""
    found = store.find_channel(conn, SYSTEM_CHANNEL)
    if found is not None:
        return found
    return store.insert_channel(conn, SYSTEM_CHANNEL, "pubsub", SYSTEM_AGENT, _CONFIG, now_ms)


def refuse_name(name: str) -> None:
    """No user channel may be called `_system`: the bus's notices go there."""
    if name == SYSTEM_CHANNEL:
        raise ValidationFailed("name", f"{SYSTEM_CHANNEL} is the bus's own channel of notices;"
                                       " pick another name (subscribe to it with `bus channel"
                                       f" subscribe {SYSTEM_CHANNEL} --pattern '_system.#'`)")


def refuse_member(channel: str, role: str) -> None:
    """Only observers join `_system`: a member could publish a forged notice."""
    if channel == SYSTEM_CHANNEL and role != "observer":
        raise ValidationFailed("role", f"{SYSTEM_CHANNEL} takes observers only (the bus alone"
                                       " publishes on it); join it with role observer, or"
                                       " subscribe to it")


def subscribe(conn: apsw.Connection, agent: str, pattern: str, now_ms: int) -> bool:
    """Subscribe `agent` to notices matching `pattern`, as an observer; True if new."""
    channel = ensure_channel(conn, now_ms)
    if store.role_of(conn, channel, agent) is None:
        store.add_participant(conn, channel, agent, "observer", now_ms)
    return store.add_subscription(conn, channel, agent, pattern, now_ms)


def announce(conn: apsw.Connection, topic: str, content: dict, now_ms: int) -> int:
    """Publish a notice on `topic` to the matching subscribers, inside the caller's
    transaction; return its seq.

    It skips the send checks (the bus is no participant of its channels) but
    not the record: on a paused or closed `_system` the notice is still
    written, to nobody.
    """
    channel = ensure_channel(conn, now_ms)
    out = sending.prepare(SYSTEM_CHANNEL, SYSTEM_AGENT, "notification", content, topic=topic)
    targets: list[str] = []
    if channel.state in SENDING_STATES:
        index = TopicIndex(store.subscriptions(conn, channel))
        targets = sending.recipients(conn, channel, out, lambda: index)
    # No PayloadPolicy down here: a notice is a few short fields, written inline.
    seq, _correlation_id = sending.insert(conn, None, channel, out, targets, now_ms)
    return seq
