"""Who the server acts as, on which bus and with which tools: fixed at the start, or by join."""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Callable
from typing import Sized

from bus.api import Bus
from bus.messages import validate_agent_id


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


WAIT_SLICE_S = 1.0  # wake at least this often while waiting, in case a change went unnoticed


def wait_for_any(bus: Bus, fetch: Callable[[], Sized], wait_seconds: float) -> Any:
    """`fetch()` again each time the bus changes, until it finds something or time runs out."""
    found = fetch()
    deadline = time.monotonic() + wait_seconds
    while not len(found) and (remaining := deadline - time.monotonic()) > 0:
        bus.wait_for_change(min(WAIT_SLICE_S, remaining))
        found = fetch()
    return found
