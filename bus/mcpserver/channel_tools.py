"""Tools over the channels (the message engine): send, receive, acknowledge, search."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import Field

from bus.channels.delivery import ACK_STATUSES
from bus.channels.queries import MESSAGE_TYPES
from bus.channels.queries import QueryResult
from bus.channels.store import CHANNEL_TYPES
from bus.channels.store import JOIN_ROLES
from bus.mcpserver.log_tools import JsonValue
from bus.mcpserver.log_tools import Wait
from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import DISCARDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.kinds import SETS
from bus.mcpserver.session import AgentSession

ChannelName = Annotated[str, Field(description="The channel's name.")]
OptionalChannel = Annotated[Optional[str], Field(description="Only this channel; omit for all.")]
PageLimit = Annotated[int, Field(ge=1, le=1000, description="The most messages to return.")]


class ChannelTools:
    """The channels' message operations, each as the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def channel_send(
        self,
        channel: ChannelName,
        type: Annotated[Literal[MESSAGE_TYPES], Field(description=(
            "query asks (and gets a correlation_id); response answers one (give its"
            " correlation_id); event is for pubsub channels (give a topic)."))],
        content: Annotated[JsonValue, Field(description="Text, or any JSON value.")],
        topic: Annotated[Optional[str], Field(description=(
            "Dotted topic on a pubsub channel, e.g. build.frontend.success."))] = None,
        correlation_id: Annotated[Optional[str], Field(description=(
            "For a response: the query's correlation_id."))] = None,
        in_reply_to: Annotated[Optional[str], Field(description=(
            "Id of the message this answers."))] = None,
        priority: Annotated[int, Field(ge=0, le=4, description="0 (low) to 4 (urgent).")] = 2,
        timeout_seconds: Annotated[Optional[float], Field(gt=0, description=(
            "For a query: mark it expired if nobody answers within this many seconds."))] = None,
    ) -> dict[str, Any]:
        """Send a message on a channel you are a participant of. Returns the message."""
        sent = self.bus.channels.send_message(
            channel, self.agent, type, content, topic=topic, priority=priority,
            correlation_id=correlation_id, in_reply_to=in_reply_to, timeout=timeout_seconds)
        return sent.to_json_dict()

    def channel_receive(self, channel: OptionalChannel = None, limit: PageLimit = 10,
                        wait_seconds: Wait = 0.0) -> dict[str, Any]:
        """Take the channel messages waiting for you, oldest first.

        Each one returned counts as delivered: acknowledge it with `channel_acknowledge`
        (completed or failed), or it is delivered again after the channel's ack timeout.
        """
        flt = {"channel": channel, "limit": limit}
        found = self.bus.wait_for(lambda: _Page(self.bus.channels.receive_messages(
            self.agent, flt)), wait_seconds)
        return found.to_json_dict()

    def channel_acknowledge(
        self,
        seq: Annotated[int, Field(ge=1, description="The message's seq, from channel_receive.")],
        status: Annotated[Literal[ACK_STATUSES], Field(
            description=("received / in_progress: still working (extends the ack timeout);"
                         " completed / failed: done."))],
        note: Annotated[Optional[str], Field(description="What happened, for the sender.")] = None,
    ) -> dict[str, Any]:
        """Acknowledge a channel message you received; the sender sees your status and note."""
        delivery = self.bus.channels.acknowledge_message(seq, self.agent, status, note)
        return {"seq": seq, "status": delivery}

    def channel_search(
        self,
        channel: OptionalChannel = None,
        content_pattern: Annotated[Optional[str], Field(description=(
            "A regular expression searched in the content."))] = None,
        sent_by: Annotated[Optional[str], Field(description="Only from this agent.")] = None,
        topic: Annotated[Optional[str], Field(description=(
            "A topic, or a pattern with * (one segment) and # (the rest)."))] = None,
        correlation_id: Annotated[Optional[str], Field(description=(
            "Only this conversation."))] = None,
        limit: PageLimit = 20,
    ) -> dict[str, Any]:
        """Search the channels' history, newest first. Reading delivers and changes nothing."""
        flt = {key: value for key, value in (
            ("channel", channel), ("content_pattern", content_pattern), ("sender", sent_by),
            ("topic", topic), ("correlation_id", correlation_id)) if value is not None}
        return _Page(self.bus.channels.query_messages({**flt, "limit": limit})).to_json_dict()

    def channel_create(
        self,
        name: ChannelName,
        type: Annotated[Literal[CHANNEL_TYPES], Field(description=(
            "direct: each message to one member; group: to every member; broadcast: the owner"
            " speaks, members listen; pubsub: to the subscribers of its topic."))],
        ack_timeout_seconds: Annotated[Optional[float], Field(gt=0, description=(
            "Seconds a receiver has to acknowledge before the message is delivered again;"
            " default 30."))] = None,
        max_retries: Annotated[Optional[int], Field(ge=0, description=(
            "Deliveries again before the message goes to the dead letters; default 3."))] = None,
    ) -> dict[str, Any]:
        """Create a channel that you own (and are a participant of)."""
        settings = {key: value for key, value in (("ack_timeout", ack_timeout_seconds),
                                                  ("max_retries", max_retries))
                    if value is not None}
        return self.bus.channels.create_channel(name, type, self.agent,
                                                **settings).to_json_dict()

    def channel_join(
        self,
        channel: ChannelName,
        role: Annotated[Literal[JOIN_ROLES], Field(description=(
            "member sends and receives; observer only receives."))] = "member",
        topic_pattern: Annotated[Optional[str], Field(description=(
            "On a pubsub channel: subscribe to this topic pattern, e.g. build.* or build.#."
        ))] = None,
    ) -> dict[str, Any]:
        """Join a channel, so you receive its messages (and may send on it as a member)."""
        channels = self.bus.channels
        channels.join_channel(channel, self.agent, role)
        if topic_pattern is not None:
            channels.subscribe(channel, self.agent, topic_pattern)
        return {"channel": channel, "agent": self.agent, "role": role,
                "topic_pattern": topic_pattern}

    def channel_list(self) -> dict[str, Any]:
        """Every channel: its name, type, owner, state and settings."""
        return {"channels": [c.to_json_dict() for c in self.bus.channels.list_channels()]}

    def dlq_list(self, limit: PageLimit = 100) -> dict[str, Any]:
        """The dead letters: channel messages a recipient never acknowledged, and why."""
        return {"dead_letters": [d.to_json_dict()
                                 for d in self.bus.channels.dead_letters(limit)]}

    def dlq_replay(self, id: Annotated[int, Field(ge=1, description=(
            "The dead letter's id, from dlq_list."))]) -> dict[str, Any]:
        """Deliver a dead letter to its recipient again, with its retries reset."""
        seq, recipient = self.bus.channels.replay_dead_letter(id)
        return {"id": id, "seq": seq, "recipient": recipient}

    TOOLS = {"channel_send": ADDS, "channel_receive": ADDS, "channel_acknowledge": SETS,
             "channel_search": READS, "channel_create": ADDS, "channel_join": SETS,
             "channel_list": READS, "dlq_list": READS, "dlq_replay": DISCARDS}


class _Page:
    """A QueryResult sized by its page, for waiting, and in JSON without the costly count."""

    def __init__(self, result: QueryResult) -> None:
        self.result = result

    def __len__(self) -> int:
        return len(self.result.messages)

    def to_json_dict(self) -> dict[str, Any]:
        return {"messages": [m.to_json_dict() for m in self.result.messages],
                "has_more": self.result.has_more}
