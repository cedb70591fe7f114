"""The MCP server: the bus and the worker lifecycle as tools for LLM agents.

`bus mcp --agent ID` runs it over stdio (without --agent, the agent joins
under a name of its own first). Every tool acts as that one agent (it
publishes, acks, claims and beats as ID and nothing else), and each is a
thin call into the library: `Bus`, `bus.channels`, `bus.pump.client`, and
the tool groups other packages register under the `agentbus.mcp_tools` entry
point (`workers` registers the worker lifecycle's). Refusals come back as
tool errors with a code, the argument and one sentence with the fix
(failures.py; docs/mcp.md).

    with Bus.open("bus.db") as bus:
        serve_stdio(AgentSession.open_on(bus, "planner"))  # until stdin ends
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name from the module that defines it, on first use: `bus mcp` answers its first
# requests before the SDK is imported (stdio.py), and server.py imports the SDK.
_HOMES = {"AgentSession": "bus.mcpserver.session", "build_server": "bus.mcpserver.server",
          "call_tool": "bus.mcpserver.server", "catalog": "bus.mcpserver.server",
          "serve_stdio": "bus.mcpserver.stdio"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
