"""Tools over organisms' pumps: what an organism accepts, and a request with its replies."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Optional

from pydantic import Field

from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.log_tools import WAIT_MAX_S
from bus.mcpserver.session import AgentSession

Organism = Annotated[str, Field(description="The organism's name (organism.yaml `name`).")]


class PumpTools:
    """Requests to the organisms whose pumps run on this bus, as the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def organism_capabilities(
        self,
        organism: Organism,
        with_xsd: Annotated[bool, Field(description=(
            "Include each listener's full XSD schema too (long)."))] = False,
    ) -> dict[str, Any]:
        """The listeners of an organism you may send to, each with an example payload.

        From the schemas the organism's pump loaded at its last start: send an example,
        changed to your values, with pump_send_and_wait (to = the listener's name).
        """
        from bus.pump import client  # the pump's modules (lxml, YAML...): loaded when used
        from bus.pump import meta

        with self.bus.read() as conn:
            with_schemas = meta.recorded_capabilities(conn, organism)
        try:
            client.check_running(self.bus, organism)
            running = True
        except client.OrganismNotRunning:
            running = False
        if with_schemas is None:  # booted before pumps recorded them: still refused clearly
            raise client.OrganismNotRunning(organism, "its pump has not started since it"
                                                       " began recording its listeners")
        keys = ("name", "root_tag", "capability", "usage", "example") + (
            ("xsd",) if with_xsd else ())
        return {"organism": organism, "running": running,
                "listeners": [{key: entry.get(key) for key in keys} for entry in with_schemas]}

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

        Refused (nothing sent) when no pump of that organism runs. A reply with root tag
        `huh` explains what was wrong with the request. `timed_out` true: fewer replies
        than asked for came within timeout_seconds.
        """
        from bus.pump import client

        client.check_running(self.bus, organism)
        sent = client.send(self.bus, organism, xml, to=to, client=self.agent)
        got = client.wait_replies(self.bus, sent, replies, timeout_seconds)
        return {"sent": sent.to_json_dict(), "replies": [r.to_json_dict() for r in got],
                "timed_out": len(got) < replies and not any(r.final for r in got)}

    TOOLS = {"organism_capabilities": READS, "pump_send_and_wait": ADDS}
