"""Resources: what an agent reads without calling a tool (status, inbox, a thread)."""

from __future__ import annotations

from typing import Any

from bus.storage.db import connect
from bus.storage.errors import ValidationFailed
from bus.mcpserver.session import AgentSession
from bus.views import queries
from bus.views.status import read_status

INBOX_LIMIT = 100


class Resources:
    """Read-only views; none moves a cursor or delivers anything."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def status(self) -> dict[str, Any]:
        """The whole bus at a glance, as `bus status --json` shows it.

        The file, the log, consumers, agents, claims, workers, channels, the pump and the export.
        """
        return read_status(self.bus.path, self.bus.durability).to_json_dict()

    def inbox(self) -> dict[str, Any]:
        """Your waiting messages (the first 100 above your cursor), as `poll` returns them."""
        return {"agent": self.agent, "cursor": self.bus.cursor(self.agent),
                "messages": [m.to_json_dict() for m in self.bus.poll(self.agent, INBOX_LIMIT)]}

    def thread(self, correlation_id: str) -> dict[str, Any]:
        """A channel conversation: the messages sharing a correlation id, oldest first."""
        found = self.bus.channels.get_thread(correlation_id)
        return {"correlation_id": correlation_id, "messages": [m.to_json_dict() for m in found]}

    def message(self, seq: str) -> dict[str, Any]:
        """One message with its question, replies, thread, channel and deliveries.

        The same answer as `bus serve`'s message page (bus/views/queries.py message_detail).
        """
        if not seq.isdigit():
            raise ValidationFailed("seq", f"must be a message's seq (a whole number), got {seq!r}")
        conn = connect(self.bus.path, readonly=True)
        try:
            with conn:
                detail = queries.message_detail(conn, int(seq), self.bus.blobs)
        finally:
            conn.close()
        if detail is None:
            raise ValidationFailed("seq", f"no message with seq {seq}; bus://status has the"
                                          " last seq")
        return detail.to_json_dict()

    # URI -> method name: what `bus mcp` serves.
    URIS = {"bus://status": "status", "bus://inbox": "inbox",
            "bus://threads/{correlation_id}": "thread", "bus://messages/{seq}": "message"}
