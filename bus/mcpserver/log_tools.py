"""Tools over the log: publish, poll, ack, exchange and reply; heartbeats, liveness, search."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import WithJsonSchema

from bus.api import LEASE_MS_MAX
from bus.api import POLL_LIMIT_MAX
from bus.api import TASK_ID_MAX
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import KEEP
from bus.coordination.heartbeats import STATUSES
from bus.log.search import LIMIT_MAX as SEARCH_LIMIT_MAX
from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.kinds import RESETS
from bus.mcpserver.kinds import SETS
from bus.mcpserver.session import AgentSession

# Any JSON value, spelled as strict validators accept it: one type per branch (an empty
# schema constrains nothing, and a list of types is lost on single-type dialects).
JSON_VALUE_SCHEMA = {"anyOf": [{"type": name} for name in (
    "string", "number", "boolean", "object", "array", "null")]}
JsonValue = Annotated[Any, WithJsonSchema(JSON_VALUE_SCHEMA)]
WAIT_MAX_S = 300.0
Wait = Annotated[float, Field(ge=0, le=WAIT_MAX_S, description=(
    "Seconds to wait when nothing waits now; 0 returns at once."))]
Limit = Annotated[int, Field(ge=1, le=POLL_LIMIT_MAX, description="The most messages to return.")]
Task = Annotated[str, Field(min_length=1, max_length=TASK_ID_MAX, description="The task's id.")]
LeaseMs = Annotated[int, Field(ge=1, le=LEASE_MS_MAX, description=(
    "Lease in milliseconds; once it runs out another agent may take the task."))]
Fence = Annotated[Optional[int], Field(ge=1, description=(
    "Your claim's fence: refused once another agent took the task over."))]


PUBLISH_MANY_MAX = 100


class Outgoing(BaseModel):
    """publish's arguments."""

    model_config = ConfigDict(extra="forbid")

    # Described once, in publish's own schema: every model request carries these.
    type: str
    payload: JsonValue = None
    to: Optional[str] = None
    correlation_id: Optional[str] = None
    in_reply_to: Optional[str] = None
    id: Optional[str] = None


def _found(message: Any) -> list[Any]:
    return [] if message is None else [message]


def _warned(result: dict[str, Any], warning: str | None) -> dict[str, Any]:
    """`result`, with the warning (a recipient never seen) when there is one."""
    return {**result, "warning": warning} if warning else result


class LogTools:
    """The log's operations, each as the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def publish(
        self,
        type: Annotated[str, Field(description="Message type, e.g. task_assign, note, result.")],
        payload: Annotated[JsonValue, Field(description="Any JSON value.")] = None,
        to: Annotated[Optional[str], Field(description=(
            "Recipient agent id; omit to broadcast to all."))] = None,
        correlation_id: Annotated[Optional[str], Field(description=(
            "Groups one conversation's messages."))] = None,
        in_reply_to: Annotated[Optional[str], Field(description=(
            "Id of the message this answers."))] = None,
        id: Annotated[Optional[str], Field(description=(
            "Your own UUID: publishing it again is a no-op, so retries are safe."))] = None,
        task: Annotated[Optional[str], Field(min_length=1, max_length=TASK_ID_MAX, description=(
            "The task this reports on (it becomes the correlation id)."))] = None,
        fence: Fence = None,
    ) -> dict[str, Any]:
        """Publish a message as yourself; returns its seq and id.

        `duplicate`: the id existed; nothing written. `warning`: `to` was never seen.
        """
        result = self.bus.publish(self.agent, type, payload, to=to, id=id,
                                  correlation_id=correlation_id, in_reply_to=in_reply_to,
                                  task=task, fence=fence)
        return _warned(result.to_json_dict(), self.bus.recipient_warning(to))

    def poll(self, limit: Limit = 100, wait_seconds: Wait = 0.0,
             ack_through: Annotated[Optional[int], Field(ge=1, description=(
                 "First ack up to this seq (the last you handled)."
             ))] = None,
             seq: Annotated[Optional[int], Field(ge=1, description=(
                 "Just this message, whole (a hook cut it)."
             ))] = None,
             ) -> dict[str, Any]:
        """Read your waiting messages (to you, or broadcast by others), oldest first.

        They come back until acked: ack_through, or `ack`.
        """
        if ack_through is not None:
            self.bus.ack(self.agent, ack_through)
        if seq is not None:
            found = self.bus.message_for(self.agent, seq)
        else:
            found = self.bus.poll(self.agent, limit, wait=wait_seconds)
        self.bus.record_delivered(self.agent, found, "mcp:poll")
        return {"messages": [m.to_json_dict() for m in found],
                "cursor": self.bus.cursor(self.agent)}

    def exchange(
        self,
        to: Annotated[str, Field(min_length=1, description="The agent to ask.")],
        type: Annotated[str, Field(description="Message type of the question, e.g. question.")],
        payload: Annotated[JsonValue, Field(description="Any JSON value: the question.")] = None,
        wait_seconds: Annotated[float, Field(gt=0, le=WAIT_MAX_S, description=(
            "The longest to wait for the answer."))] = 30.0,
        correlation_id: Annotated[Optional[str], Field(description=(
            "Groups one conversation's messages."))] = None,
    ) -> dict[str, Any]:
        """Ask an agent and wait for its answer (its message in_reply_to yours): one call.

        `acked`: the answer is acknowledged. `timed_out`: no answer yet (poll gets it
        later); `question` says whether yours was delivered and acked.
        """
        sent = self.bus.publish(self.agent, type, payload, to=to, correlation_id=correlation_id)
        warned = _warned({"sent": sent.to_json_dict()}, self.bus.recipient_warning(to))
        reply = self.bus.wait_for(lambda: _found(self.bus.reply_to(
            self.agent, sent.id, sent.seq)), wait_seconds)
        if not reply:  # the question's receipt: was it shown to `to`, did it ack it?
            receipt = self.bus.receipt(sent.seq)  # None only once compacted meanwhile
            return {**warned, "timed_out": True, "reply": None, "acked": False,
                    "question": receipt.state_json() if receipt else None}
        self.bus.record_delivered(self.agent, reply, "mcp:exchange")
        return {**warned, "timed_out": False, "reply": reply[0].to_json_dict(),
                "acked": self.bus.ack_if_next(self.agent, reply[0].seq)}

    def reply(
        self,
        seq: Annotated[int, Field(ge=1, description="The seq of the message you answer.")],
        type: Annotated[str, Field(description="Message type of the answer, e.g. answer.")],
        payload: Annotated[JsonValue, Field(description="Any JSON value: the answer.")] = None,
        wait_seconds: Wait = 0.0,
        limit: Limit = 100,
    ) -> dict[str, Any]:
        """Answer a message you polled, acknowledge it, then poll: one call.

        The answer goes to its sender, in_reply_to set (its `exchange` returns).
        """
        sent = self.bus.answer(self.agent, seq, type, payload)
        found = self.bus.poll(self.agent, limit, wait=wait_seconds)
        self.bus.record_delivered(self.agent, found, "mcp:reply")
        return {"sent": sent.to_json_dict(), "messages": [m.to_json_dict() for m in found],
                "cursor": self.bus.cursor(self.agent)}

    def publish_many(
        self,
        messages: Annotated[list[Outgoing], Field(min_length=1, max_length=PUBLISH_MANY_MAX,
                                                  description=(
            "The messages."))],
    ) -> dict[str, Any]:
        """Publish up to 100 messages in one transaction, all or nothing; each like publish.

        Returns each seq and id (and warning) in order; an error names the bad one
        (messages[3].type).
        """
        batch = [{"from_agent": self.agent, **m.model_dump(exclude_none=True)}
                 for m in messages]
        published = self.bus.publish_many(batch)
        warnings = {to: self.bus.recipient_warning(to) for to in {m.get("to") for m in batch}}
        return {"published": [_warned(result.to_json_dict(), warnings[m.get("to")])
                              for result, m in zip(published, batch)]}

    def cursor_reset(self, seq: Annotated[Optional[int], Field(ge=0, description=(
            "Where to put your cursor: 0 reads everything again; omit to skip everything"
            " waiting (the last seq)."))] = None) -> dict[str, Any]:
        """Move your own cursor to `seq`, backwards (to read again) or forwards (to skip).

        Skipped messages are never polled again; messages read again come back.
        """
        return {"cursor": self.bus.set_cursor(self.agent, seq, force=True, create=True)}

    def ack(self, seq: Annotated[int, Field(ge=1, description=(
            "The seq of the last message you handled; everything up to it is done."))]
            ) -> dict[str, Any]:
        """Mark every message up to `seq` as handled by you, so poll stops returning them."""
        return {"cursor": self.bus.ack(self.agent, seq)}

    def heartbeat(
        self,
        status: Annotated[Literal[STATUSES], Field(
            description="What you are doing.")] = "idle",
        task: Annotated[Optional[str], Field(description=(
            "The task you work on; left out, your last beat's task stays; \"\" clears it"
            " and the progress."))] = None,
        progress: Annotated[Optional[float], Field(ge=0, le=1, description=(
            "Fraction done, 0 to 1; left out, your last beat's stays (for the same task)."
        ))] = None,
    ) -> dict[str, Any]:
        """Tell the bus you are alive. Beat at least every 30 s, or others see you as silent."""
        at = self.bus.heartbeats.beat(self.agent, status, KEEP if task is None else (task or None),
                                      KEEP if progress is None else progress)
        return {"agent": self.agent, "ts_ms": at}

    def liveness(self) -> dict[str, Any]:
        """Every agent that ever beat: alive, warn (30 s silent), stale (100 s) or dead (5 min)."""
        return {"agents": [entry.to_json_dict() for entry in self.bus.heartbeats.liveness()]}

    def search(
        self,
        query: Annotated[str, Field(min_length=1, description=(
            'Full-text query over message payloads: words, "a phrase", OR, NOT, prefix*.'))],
        type: Annotated[Optional[str], Field(description="Only messages of this type.")] = None,
        published_by: Annotated[Optional[str], Field(description=(
            "Only messages this agent published."))] = None,
        limit: Annotated[int, Field(ge=1, le=SEARCH_LIMIT_MAX, description=(
            "The most messages to return."))] = 20,
    ) -> dict[str, Any]:
        """Search the log's message payloads by their words, best match first.

        Works once full-text search is enabled on the bus (`bus search --enable`); the error
        says so otherwise.
        """
        hits = self.bus.search(query, type=type, from_agent=published_by, limit=limit)
        return {"query": query, "hits": [hit.to_json_dict() for hit in hits]}

    TOOLS = {"publish": ADDS, "publish_many": ADDS, "exchange": ADDS, "reply": ADDS,
             "poll": SETS, "ack": SETS,
             "cursor_reset": RESETS, "heartbeat": SETS, "liveness": READS, "search": READS}
