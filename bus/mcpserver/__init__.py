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
        build_server(AgentSession.open_on(bus, "planner")).run("stdio")  # until stdin ends
"""

from __future__ import annotations

from bus.mcpserver.server import build_server
from bus.mcpserver.server import call_tool
from bus.mcpserver.server import catalog
from bus.mcpserver.session import AgentSession

__all__ = ["AgentSession", "build_server", "call_tool", "catalog"]
