"""The MCP server itself: tools and resources on the official SDK, served over stdio."""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from typing import Any
from typing import Callable

import anyio
from mcp import Client
from mcp.server.context import CallNext
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from mcp.types import TextContent

from bus import __version__
from bus.errors import BusError
from bus.mcpserver.channel_tools import ChannelTools
from bus.mcpserver.log_tools import LogTools
from bus.mcpserver.pump_tools import PumpTools
from bus.mcpserver.reservation_tools import ReservationTools
from bus.mcpserver.resources import Resources
from bus.mcpserver.session import AgentSession
from bus.mcpserver.task_tools import TaskTools

# Tool groups of packages above `bus` (the worker lifecycle): each entry point
# names a class built on the session, with TOOLS and optionally URIS, like ours.
TOOL_GROUPS_ENTRY_POINT = "agentbus.mcp_tools"

INSTRUCTIONS = (
    "agentbus: a message bus shared by agents, in one SQLite file. You act as agent {agent};"
    " every tool publishes, acks, claims and beats as {agent} and as no one else. Poll for"
    " messages and ack what you handled; claim a task before working on it and renew the"
    " lease while you do; beat with heartbeat so others know you are alive. Errors name the"
    " argument at fault and how to fix it."
)


def build_server(session: AgentSession) -> MCPServer:
    """An MCPServer whose tools and resources act on `session`'s bus as its agent."""
    groups = [group(session) for group in tool_groups()]
    tools = {name: getattr(group, name) for group in groups for name in group.TOOLS}
    server = MCPServer(name="agentbus", version=__version__, log_level="WARNING",
                       instructions=INSTRUCTIONS.format(agent=session.agent),
                       middleware=[UnknownArguments(tools)])
    for name, tool in tools.items():
        server.add_tool(_reporting(tool, ToolError), name=name)
    for group in [Resources(session), *groups]:
        for uri, name in getattr(group, "URIS", {}).items():
            server.resource(uri, name=name, mime_type="application/json")(
                _reporting(getattr(group, name), ResourceError))
    return server


def tool_groups() -> list[type]:
    """Our own tool groups, then those registered under TOOL_GROUPS_ENTRY_POINT by name."""
    registered = {point.name: point for point in
                  importlib.metadata.entry_points(group=TOOL_GROUPS_ENTRY_POINT)}
    return [LogTools, ChannelTools, PumpTools, TaskTools, ReservationTools,
            *(registered[name].load() for name in sorted(registered))]


def catalog(server: MCPServer) -> dict[str, list[dict[str, Any]]]:
    """The server's tools, resources and resource templates, as a client would list them."""
    async def listed() -> dict[str, list[dict[str, Any]]]:
        return {"tools": [_summary(t, "name") for t in await server.list_tools()],
                "resources": [_summary(r, "uri") for r in await server.list_resources()]
                + [_summary(r, "uri_template") for r in await server.list_resource_templates()]}
    return anyio.run(listed)


def call_tool(server: MCPServer, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """Call one tool in-process, as a client would; (is_error, JSON result or error text)."""
    async def called() -> tuple[bool, Any]:
        async with Client(server, cache=None) as client:
            result = await client.call_tool(name, arguments)
        if result.is_error:
            return True, " ".join(c.text for c in result.content if isinstance(c, TextContent))
        return False, result.structured_content
    return anyio.run(called)


def _summary(item: Any, key: str) -> dict[str, Any]:
    return {"name": getattr(item, key), "description": inspect.cleandoc(item.description or "")}


class UnknownArguments:
    """Middleware: a tool call with an argument the tool does not take is a tool error.

    The SDK drops unknown arguments silently, so `publish` with `"from": "other"`
    would publish as this agent anyway; refusing says so and writes nothing.
    """

    def __init__(self, tools: dict[str, Callable[..., Any]]) -> None:
        self.parameters = {name: frozenset(inspect.signature(tool).parameters)
                           for name, tool in tools.items()}

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        refusal = self.refusal(ctx.params) if ctx.method == "tools/call" else None
        if refusal is not None:
            return CallToolResult(is_error=True, content=[TextContent(type="text", text=refusal)])
        return await call_next(ctx)

    def refusal(self, params: Any) -> str | None:
        """Why a tools/call request is refused, or None to let the SDK handle it."""
        name = params.get("name") if isinstance(params, dict) else None
        arguments = params.get("arguments") if isinstance(params, dict) else None
        known = self.parameters.get(name) if isinstance(name, str) else None
        if known is None or not isinstance(arguments, dict) or not set(arguments) - known:
            return None  # unknown tools and malformed requests: the SDK's own errors
        return (f"{name}: unknown argument(s) {', '.join(sorted(set(arguments) - known))};"
                f" it takes {', '.join(sorted(known)) or 'none'}. You always act as the"
                " server's own agent: no tool takes an agent id.")


def _reporting(call: Callable[..., Any], error: type[Exception]) -> Callable[..., Any]:
    """`call`, with the bus's own errors raised as the SDK's anticipated `error`.

    The SDK shows an anticipated error's message to the model, but only
    "Error executing tool" for anything else; the bus's messages name the
    argument and the fix, so they must get through.
    """
    @functools.wraps(call)
    def reported(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except BusError as exc:
            raise error(str(exc)) from exc
    return reported
