"""The pump's send-and-wait as an MCP tool: ask an organism's running pump, get its replies."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Optional

from pydantic import Field

from bus.mcpserver.log_tools import WAIT_MAX_S
from bus.mcpserver.session import AgentSession
from bus.pump import client


class PumpTools:
    """Requests to a running pump, sent as the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def pump_send_and_wait(
        self,
        organism: Annotated[str, Field(description="The organism's name (organism.yaml `name`).")],
        xml: Annotated[str, Field(description=(
            "The payload element only, e.g. <add><a>1</a><b>2</b></add>; the pump adds the"
            " envelope."))],
        to: Annotated[Optional[str], Field(description=(
            "The listener to ask; omit to ask every listener of the payload's root tag."))] = None,
        replies: Annotated[int, Field(ge=1, le=100, description=(
            "How many replies to wait for (a broadcast can get several)."))] = 1,
        timeout_seconds: Annotated[float, Field(gt=0, le=WAIT_MAX_S, description=(
            "The longest to wait for them."))] = 30.0,
    ) -> dict[str, Any]:
        """Send an XML request to an organism's running pump and wait for the replies.

        A reply with root tag `huh` explains what was wrong with the request.
        """
        sent = client.send(self.bus, organism, xml, to=to, client=self.agent)
        got = client.wait_replies(self.bus, sent, replies, timeout_seconds)
        return {"sent": sent.to_json_dict(), "replies": [r.to_json_dict() for r in got]}

    TOOLS = ("pump_send_and_wait",)
