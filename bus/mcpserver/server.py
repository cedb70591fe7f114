"""The MCP server itself: tool groups and resources on the official SDK, served over stdio.

Adding a tool group
-------------------
A group is a class built on the session (`Group(session)`), whose tools are
its methods, typed with `Annotated[..., Field(description=...)]` arguments and
returning a JSON-able dict, and which declares each tool with what it does:

    from bus.mcpserver.kinds import ADDS, READS

    class ReservationTools:
        def __init__(self, session: AgentSession) -> None:
            self.bus = session.bus
            self.agent = session.agent       # the joined name: the group is built after join

        def reserve(self, paths: ...) -> dict[str, Any]:
            \"\"\"One line for the model. Then what a caller must know.\"\"\"

        TOOLS = {"reserve": ADDS, "reservation_list": READS}

and is registered with one line: an entry in `OWN_GROUPS` (toolsets.py) for a
group of this package, or, for a package above bus (which bus may not import),
an entry point in the `agentbus.mcp_tools` group naming the class (workers
registers its worker tools so; setup.cfg). The entry's name is the group's
name for `bus mcp --tools`; its tools in `toolsets.DAILY` are listed whatever
the choice. A group may also serve resources (always served):
`URIS = {uri_template: method_name}`. The server then gives every tool of the group,
with nothing more to write: MCP annotations from its kind (kinds.py); its
docstring without indentation as the description; argument errors, unknown
arguments and the library's `BusError`s as `{"error": {"code", "argument",
"message"}}` in the argument's words (failures.py); a refusal until the
session has joined; a lean input schema (schemas.py); a compact structured
result (results.py) and a compact text beside it. A group that declares a tuple
of names instead of kinds is refused when the server is built.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Sequence

import anyio
import orjson
from mcp import Client
from mcp.server.context import CallNext
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult
from mcp.types import TextContent
from mcp.types import ToolAnnotations
from pydantic import ValidationError

from bus import __version__
from bus.storage.errors import BusError
from bus.mcpserver.failures import Failure
from bus.mcpserver.failures import failure_of
from bus.mcpserver.failures import invalid_arguments
from bus.mcpserver.failures import unexpected
from bus.mcpserver.identity_tools import IdentityTools
from bus.mcpserver.instructions import instructions
from bus.mcpserver.kinds import ToolKind
from bus.mcpserver.resources import Resources
from bus.mcpserver.results import compact
from bus.mcpserver.schemas import lean_schema
from bus.mcpserver.session import AgentSession
from bus.mcpserver.toolsets import DAILY
from bus.mcpserver.toolsets import group_entries


def tool_groups() -> dict[str, type]:
    """Every tool group by name (toolsets.py), ours then the registered ones, loaded."""
    return {name: entry.load() for name, entry in group_entries().items()}


def build_server(session: AgentSession, *, middleware: Sequence[Any] = ()) -> MCPServer:
    """An MCPServer whose tools and resources act on `session`'s bus as its agent.

    It lists the daily loop and the tools of the groups in `session.tools`, and
    serves every group's resources. A session without an agent yet serves `join`
    too, and refuses every other tool until join has named it. `middleware` runs
    after the server's own (bus/mcpserver/http.py adds the refusal of writes for a
    read-only token).
    """
    groups = {**({None: IdentityTools} if session.agent is None else {}), **tool_groups()}
    served = _Groups(session)
    gate = _Gate(session)
    with _without_rich():
        server = MCPServer(
            name="agentbus", version=__version__, log_level="WARNING",
            middleware=[gate, *middleware],
            instructions=instructions(session.agent))
    gate.server = server
    for group, name, kind in _listed(groups, session.tools, gate.unlisted):
        method = getattr(group, name)
        # No output schema: an object with any fields says nothing a client can use.
        server.add_tool(served.tool(group, name), name=name,
                        description=inspect.cleandoc(method.__doc__ or ""),
                        annotations=_annotations(kind), structured_output=False)
        tool = server._tool_manager.get_tool(name)  # the SDK's registry, as _Gate reads it
        tool.parameters = lean_schema(tool.parameters)
    for group in [Resources, *groups.values()]:
        for uri, name in getattr(group, "URIS", {}).items():
            server.resource(uri, name=name, mime_type="application/json")(
                served.resource(group, name))
    return server


def _listed(groups: dict[str | None, type], chosen: frozenset[str],
            unlisted: dict[str, str | None]) -> list[tuple[type, str, ToolKind]]:
    """(group, tool, kind) of each tool listed: the daily loop first, in its order, then the
    chosen groups' other tools; each tool left out goes into `unlisted` with its group."""
    daily, more = [], []
    for group_name, group in groups.items():
        for name, kind in _declared(group).items():
            if name in DAILY:
                daily.append((group, name, kind))
            elif group_name in chosen:
                more.append((group, name, kind))
            else:
                unlisted[name] = group_name
    return sorted(daily, key=lambda listed: DAILY.index(listed[1])) + more


@contextlib.contextmanager
def _without_rich() -> Iterator[None]:
    """The SDK's plain stderr log handler, as with the mcp extra alone.

    MCPServer logs through `rich` when it can import it (the views extra brings it,
    with textual): that import alone was a quarter of building the server (about
    5% of the time to the first tool listing), for colours on a stderr nobody reads. A None entry in sys.modules makes
    the import fail (the SDK then uses logging.StreamHandler); it is put back after.
    """
    missing = object()
    saved = sys.modules.get("rich.console", missing)
    if saved is not missing:  # rich was loaded already (by `bus top` in this process?)
        yield
        return
    sys.modules["rich.console"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        del sys.modules["rich.console"]


def _declared(group: type) -> dict[str, ToolKind]:
    tools = getattr(group, "TOOLS", None)
    if not isinstance(tools, dict) or not all(isinstance(k, ToolKind) for k in tools.values()):
        raise TypeError(f"{group.__name__}.TOOLS must map each tool name to its kind"
                        " (bus.mcpserver.kinds: READS, ADDS, SETS, DISCARDS, RESETS)")
    return tools


def _annotations(kind: ToolKind) -> ToolAnnotations:
    """The kind's hints, each left out where MCP's default says the same (readOnlyHint and
    idempotentHint default to false, destructiveHint and openWorldHint to true)."""
    return ToolAnnotations(read_only_hint=kind.read_only or None,
                           idempotent_hint=kind.idempotent or None,
                           destructive_hint=None if kind.destructive else False,
                           open_world_hint=False)


class _Groups:
    """Each tool group built once, on first use: after join, so it sees the joined name."""

    def __init__(self, session: AgentSession) -> None:
        self.session = session
        self.built: dict[type, Any] = {}

    def instance(self, group: type) -> Any:
        if group not in self.built:
            self.built[group] = group(self.session)
        return self.built[group]

    def tool(self, group: type, name: str) -> Callable[..., Any]:
        """A function with the method's signature (less self) that calls it and reports."""
        def called(**arguments: Any) -> Any:
            try:
                value = getattr(self.instance(group), name)(**arguments)
            except BusError as exc:
                return failed(failure_of(exc))
            except Exception as exc:  # noqa: BLE001 - the agent gets a code, not a traceback
                return failed(unexpected(exc))
            return succeeded(name, value)

        return _as_method(called, getattr(group, name))

    def resource(self, group: type, name: str) -> Callable[..., Any]:
        def read(**arguments: Any) -> Any:
            if self.session.agent is None:
                raise ResourceError("not_joined: call the join tool first")
            try:
                return getattr(self.instance(group), name)(**arguments)
            except BusError as exc:
                raise ResourceError(failure_of(exc).message) from exc

        return _as_method(read, getattr(group, name))


def _as_method(function: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    """`function(**arguments)` dressed as the bound `method`: its name, description,
    signature less `self` and evaluated annotations, which the SDK reads for the schema."""
    signature = inspect.signature(method, eval_str=True)
    parameters = list(signature.parameters.values())[1:]
    function.__name__ = method.__name__
    function.__doc__ = inspect.cleandoc(method.__doc__ or "")
    function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in parameters}
    function.__annotations__["return"] = signature.return_annotation
    return function


def succeeded(tool: str, value: dict[str, Any]) -> CallToolResult:
    """The structured result, compact (results.py), and beside it the same in short text."""
    value = compact(value)
    return CallToolResult(content=[TextContent(type="text", text=compact_text(tool, value))],
                          structured_content=value)


def failed(failure: Failure) -> CallToolResult:
    """A tool error; its text carries the code, as some clients show the model only the text."""
    return CallToolResult(is_error=True, structured_content=failure.to_json_dict(),
                          content=[TextContent(type="text", text=failure.text())])


def compact_text(tool: str, value: dict[str, Any]) -> str:
    """One summary line (scalars as key=value, lists by their length), then each list's items,
    one compact JSON line each: what the model reads, in far fewer tokens than indented JSON."""
    summary, bodies = [], []
    for key, item in value.items():
        if isinstance(item, list):
            summary.append(f"{len(item)} {key}")
            bodies += [_json(entry) for entry in item]
        else:
            summary.append(f"{key}={_json(item)}")
    return "\n".join([f"{tool}: {', '.join(summary)}", *bodies])


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


class _Gate:
    """Middleware: what the SDK would report as its own text, reported as our coded errors.

    The SDK drops unknown arguments silently (so `publish` with `"from": "other"`
    would publish as this agent anyway) and reports bad ones as pydantic's text
    with a URL; unknown tools and an unjoined session are refused here too.
    """

    def __init__(self, session: AgentSession) -> None:
        self.session = session
        self.server: MCPServer | None = None  # set once the server exists
        self.unlisted: dict[str, str | None] = {}  # tool -> its group, for tools not chosen

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        refusal = self.refusal(ctx.params) if ctx.method == "tools/call" else None
        if refusal is not None:
            return failed(refusal)
        return await call_next(ctx)

    def refusal(self, params: Any) -> Failure | None:
        """Why a tools/call request is refused, or None to let the SDK call the tool."""
        name = params.get("name") if isinstance(params, dict) else None
        arguments = params.get("arguments") if isinstance(params, dict) else None
        if not isinstance(name, str):
            return None  # a malformed request: the SDK's protocol error
        # The SDK's own registry: it validates the same arguments again when it calls the tool.
        tools = self.server._tool_manager  # type: ignore[union-attr]
        tool = tools.get_tool(name)
        if tool is None:
            return self.unknown(name, sorted(t.name for t in tools.list_tools()))
        if self.session.agent is None and name != IdentityTools.JOIN:
            return Failure("not_joined", None, f"{name}: you have no agent name yet; call"
                                               " join(name) first, then call this again")
        arguments = arguments if isinstance(arguments, dict) else {}
        properties = tool.parameters.get("properties", {})
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return Failure("unknown_argument", unknown[0], (
                f"{', '.join(unknown)}: {name} takes no such argument; it takes"
                f" {', '.join(sorted(properties)) or 'none'}. You always act as your own"
                " agent: no tool takes an agent id"))
        try:
            tool.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            return invalid_arguments(exc.errors(), properties)
        return None

    def unknown(self, name: str, listed: list[str]) -> Failure:
        group = self.unlisted.get(name)
        if group is not None:
            return Failure("unknown_tool", None, (
                f"{name}: this server does not list it; it is in the tool group {group},"
                f" which the server lists when started with --tools {group}. The tools"
                f" listed are {', '.join(listed)}"))
        return Failure("unknown_tool", None, f"no tool is named {name!r}; the tools are"
                                             f" {', '.join(listed)}")


def catalog(server: MCPServer, session: AgentSession) -> dict[str, list[dict[str, Any]]]:
    """The server's tools, resources and resource templates, as a client would list them, and
    under "more" each tool group not chosen with the tools it would add."""
    async def listed() -> dict[str, list[dict[str, Any]]]:
        return {"tools": [_summary(t, "name") for t in await server.list_tools()],
                "resources": [_summary(r, "uri") for r in await server.list_resources()]
                + [_summary(r, "uri_template") for r in await server.list_resource_templates()]}
    unlisted: dict[str, str | None] = {}
    _listed(tool_groups(), session.tools, unlisted)
    more: dict[str, list[str]] = {}
    for tool, group in unlisted.items():
        more.setdefault(str(group), []).append(tool)
    return {**anyio.run(listed),
            "more": [{"name": group, "tools": tools} for group, tools in more.items()]}


def call_tool(server: MCPServer, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """Call one tool in-process, as a client would; (is_error, JSON result or error object)."""
    async def called() -> tuple[bool, Any]:
        async with Client(server, cache=None) as client:
            result = await client.call_tool(name, arguments)
        if result.is_error and result.structured_content is None:  # an SDK error, as text
            text = " ".join(c.text for c in result.content if isinstance(c, TextContent))
            return True, Failure("internal", None, text).to_json_dict()
        return result.is_error, result.structured_content
    return anyio.run(called)


def _summary(item: Any, key: str) -> dict[str, Any]:
    return {"name": getattr(item, key), "description": inspect.cleandoc(item.description or "")}
