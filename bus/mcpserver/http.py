"""`bus serve --mcp`: the MCP server over Streamable HTTP at /mcp, beside the page.

The SDK's own transport serves each request (its `StreamableHTTPSessionManager`,
stateless, JSON responses). bus/views/guard.py has already checked Host,
Origin and the bearer token; the token decides the agent. Each (agent,
read-only) pair gets its own server, built by `build_server` on an
`AgentSession` for that agent: a request acts as its token's agent because
the only server it can reach is that agent's, and no tool takes an agent id.

A client without a valid token gets a 401 whose challenge points to the
protected-resource metadata (RFC 9728) served here: it names /mcp as the
resource, the Authorization header as the way to give a token, and no
authorization server, since tokens come from `bus token create` and from
nowhere else (the SDK's `create_protected_resource_routes` requires one).

A read-only token reaches a server whose middleware refuses every tool not
annotated read-only. The SDK runs our synchronous tools in worker threads,
so a call that writes waits for the bus's write lock (and its group commit)
without holding the event loop; the `Bus` gives each thread its own
connection.
"""

from __future__ import annotations

import contextlib
from typing import Any
from typing import AsyncIterator

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.abc import TaskStatus
from mcp.server.context import CallNext
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive
from starlette.types import Scope
from starlette.types import Send

from bus.api import Bus
from bus.mcpserver.failures import Failure
from bus.mcpserver.server import build_server
from bus.mcpserver.server import failed
from bus.mcpserver.session import AgentSession
from bus.coordination.tokens import Token
from bus.views.guard import MCP_PATH
from bus.views.guard import RESOURCE_METADATA_PATH
from bus.views.guard import TOKEN_HELP
from bus.views.guard import TOKEN_SCOPE_KEY
from bus.views.guard import WELL_KNOWN_RESOURCE
from bus.views.guard import request_origin

WORKER_THREADS = 256  # tool calls at once (each a thread; a waiting poll holds one)

def read_only_tool(annotations: Any) -> bool:
    """Whether a tool changes nothing, by its readOnlyHint (every tool of ours carries one)."""
    return bool(getattr(annotations, "read_only_hint", False))


class RefuseWrites:
    """Middleware for a read-only token's server: a tool that writes is a tool error."""

    def __init__(self) -> None:
        self.server: MCPServer | None = None
        self._read_only: frozenset[str] | None = None

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        if ctx.method == "tools/call":
            name = ctx.params.get("name") if isinstance(ctx.params, dict) else None
            if name not in await self.read_only_names():
                return failed(Failure("read_only_token", None, (
                    f"{name}: this token is read-only; it may call only the tools that change"
                    " nothing (readOnlyHint); use a token made without read-only to call it")))
        return await call_next(ctx)

    async def read_only_names(self) -> frozenset[str]:
        if self._read_only is None:
            assert self.server is not None
            self._read_only = frozenset(tool.name for tool in await self.server.list_tools()
                                        if read_only_tool(tool.annotations))
        return self._read_only


class McpEndpoint:
    """The ASGI app at /mcp: routes each request to its token's agent's server."""

    def __init__(self, bus: Bus, tools: frozenset[str] = frozenset()) -> None:
        self.bus = bus
        self.tools = tools  # the tool groups listed beside the daily loop (toolsets.py)
        self._managers: dict[tuple[str, bool], StreamableHTTPSessionManager] = {}
        self._lock = anyio.Lock()
        self._tasks: TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For as long as the app runs: the managers started on demand live in here."""
        # Every tool call takes a worker thread, and a poll that waits holds its thread
        # for up to wait_seconds: anyio's default of 40 would queue the 41st agent.
        anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
                self._tasks = None

    def routes(self) -> list[Route]:
        """/mcp, and its protected-resource metadata where RFC 9728 puts it (after the
        well-known prefix) and at the bare prefix, where some clients look first."""
        return [Route(MCP_PATH, endpoint=self, methods=["GET", "POST", "DELETE"]),
                *(Route(path, endpoint=resource_metadata, methods=["GET"])
                  for path in (RESOURCE_METADATA_PATH, WELL_KNOWN_RESOURCE))]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token: Token | None = scope.get(TOKEN_SCOPE_KEY)
        if token is None:  # the guard lets no request through without one; never act as no one
            return await PlainTextResponse("no token", status_code=401)(scope, receive, send)
        manager = await self._manager(token.agent, token.read_only)
        await manager.handle_request(scope, receive, send)

    async def _manager(self, agent: str, read_only: bool) -> StreamableHTTPSessionManager:
        key = (agent, read_only)
        async with self._lock:
            if key not in self._managers:
                assert self._tasks is not None, "McpEndpoint.running() must be entered first"
                manager = _session_manager(self.bus, agent, read_only, self.tools)
                await self._tasks.start(_run_manager, manager)
                self._managers[key] = manager
        return self._managers[key]


async def resource_metadata(request: Request) -> JSONResponse:
    """RFC 9728 protected-resource metadata for /mcp: a bearer token in the header, and no
    authorization server (`authorization_servers` is left out, as the RFC allows)."""
    return JSONResponse({
        "resource": f"{request_origin(request.scope)}{MCP_PATH}",
        "bearer_methods_supported": ["header"],
        "resource_name": "agentbus",
        "agentbus_tokens": TOKEN_HELP,
    })


def _session_manager(bus: Bus, agent: str, read_only: bool,
                     tools: frozenset[str]) -> StreamableHTTPSessionManager:
    refuse_writes = RefuseWrites() if read_only else None
    server = build_server(AgentSession.open_on(bus, agent, tools),
                          middleware=[refuse_writes] if refuse_writes else [])
    if refuse_writes is not None:
        refuse_writes.server = server
    # Stateless: no session state to lose when the server is killed, so a client
    # goes on after a restart; the guard already checked Host and Origin, so the
    # SDK's own check is not repeated. Building the app creates the session manager.
    server.streamable_http_app(stateless_http=True, json_response=True,
                               transport_security=TransportSecuritySettings(
                                   enable_dns_rebinding_protection=False))
    return server.session_manager


async def _run_manager(manager: StreamableHTTPSessionManager, *,
                       task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    async with manager.run():
        task_status.started()
        await anyio.sleep_forever()
