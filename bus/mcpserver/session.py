"""Who the server acts as, on which bus and with which tools: fixed at the start, or by join."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from bus.api import Bus
from bus.log.messages import validate_agent_id


@dataclass
class AgentSession:
    """The open bus and the one agent id every tool acts as.

    No tool takes an agent argument: identity comes from here only, so an
    LLM cannot publish, ack or claim as anyone else. `agent` is None until the
    `join` tool names it (a server started without --agent); it is set once.
    `tools` names the tool groups listed beside the daily loop (toolsets.py).
    """

    bus: Bus
    agent: str | None
    tools: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def open_on(cls, bus: Bus, agent: str | None,
                tools: frozenset[str] = frozenset()) -> AgentSession:
        """A session for `agent` (None: to be joined) on an open bus, listing the daily
        loop and the groups `tools`; raises ValidationFailed for a bad agent id."""
        return cls(bus, None if agent is None else validate_agent_id(agent, "agent"), tools)
