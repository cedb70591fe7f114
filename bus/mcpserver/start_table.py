"""What the SDK's server answers to each question a client asks at its start, in one table.

`bus mcp` answers a client's first requests before the MCP SDK is imported
(stdio.py, start_answers.py). Those answers are the SDK's own, taken from the
server built for the same options and asked over its own stdio transport, once
per protocol version it speaks: `initialize` in each handshake-era version (and
in one it does not speak, to learn which it offers instead), then every
listing in that version; and every listing in each 2026-era version, with the
per-request envelope. The answers cannot depend on the client: none takes an
argument.

The table for each default set of options ships with the package
(start_answers.json), so that a first start needs no SDK; a test checks it
against the SDK's answers. After changing a tool, a resource, the instructions
or the SDK, write it again:

    python -m bus.mcpserver.start_table
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from typing import AsyncIterator
from typing import Iterable

import anyio
import orjson
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bus.api import Bus
from bus.mcpserver.instructions import instructions
from bus.mcpserver.session import AgentSession
from bus.mcpserver.start_answers import ENVELOPE_VERSION
from bus.mcpserver.start_answers import LISTEN
from bus.mcpserver.start_answers import LISTEN_FILTER
from bus.mcpserver.start_answers import LISTENED
from bus.mcpserver.start_answers import LISTINGS
from bus.mcpserver.start_answers import SHIPPED_PATH
from bus.mcpserver.start_answers import SUBSCRIPTION_ID
from bus.mcpserver.start_answers import question
from bus.mcpserver.start_answers import selection

UNSPOKEN_VERSION = "0000-00-00"  # no SDK speaks it: its answer names the version offered instead
# The options whose tables ship, as (agent, tool groups): the defaults, with a fixed agent
# (whose table is the same for every name but the instructions) and with one that joins;
# and a worker's (README: `bus mcp --agent auto --tools workers` in the worktree's .mcp.json).
SHIPPED_OPTIONS: list[tuple[str | None, frozenset[str]]] = [
    ("agent", frozenset()), (None, frozenset()), ("agent", frozenset({"workers"}))]


def start_table(server: MCPServer, agent: str | None) -> dict[str, Any]:
    """The server's answer to every start question, its instructions left out (the agent's
    name is filled in when answering: see start_answers.StartAnswers)."""
    answers: dict[str, Any] = {}
    for version in (*HANDSHAKE_PROTOCOL_VERSIONS, UNSPOKEN_VERSION):
        answers.update(anyio.run(_handshake_era, server, version))
    for version in MODERN_PROTOCOL_VERSIONS:
        answers.update(anyio.run(_modern_era, server, version))
    offered = answers.pop(question("initialize", UNSPOKEN_VERSION))["result"]["protocolVersion"]
    for key in [key for key in answers if key.endswith(f" {UNSPOKEN_VERSION}")]:
        del answers[key]  # the listings in the version offered instead are there already
    templated = sorted(key for key, answer in answers.items()
                       if answer.get("result", {}).get("instructions") == instructions(agent))
    for key in templated:
        del answers[key]["result"]["instructions"]
    return {"offered": offered, "templated": templated, **_distinct(answers)}


def _distinct(answers: dict[str, Any]) -> dict[str, Any]:
    """{"answers": {question: index}, "distinct": [answer, ...]}: most versions' listings are
    the same, and are stored once."""
    distinct: dict[bytes, int] = {}
    indexed = {key: distinct.setdefault(orjson.dumps(answer, option=orjson.OPT_SORT_KEYS),
                                        len(distinct))
               for key, answer in answers.items()}
    return {"answers": indexed, "distinct": [orjson.loads(text) for text in distinct]}


def tool_listings(server: MCPServer, versions: Iterable[str | None]) -> dict[str, Any]:
    """The server's tool listing in each of `versions` (a table as start_table's, of fewer
    questions): what a client was told at the start, asked again."""
    answers: dict[str, Any] = {}
    for version in versions:
        if version in HANDSHAKE_PROTOCOL_VERSIONS:
            answers.update(anyio.run(_handshake_era, server, version, ("tools/list",)))
        elif version in MODERN_PROTOCOL_VERSIONS:
            answers.update(anyio.run(_modern_era, server, version, ("tools/list",)))
    return _distinct(answers)


async def _handshake_era(server: MCPServer, version: str,
                         methods: tuple[str, ...] = LISTINGS) -> dict[str, Any]:
    hello = {"protocolVersion": version, "capabilities": {},
             "clientInfo": {"name": "agentbus-start-table", "version": "1"}}
    asked = [("initialize", hello), ("notifications/initialized", None),
             *((method, None) for method in methods)]
    return await _ask(server, version, asked)


async def _modern_era(server: MCPServer, version: str,
                      methods: tuple[str, ...] = (*LISTINGS, LISTEN)) -> dict[str, Any]:
    envelope = {"_meta": {ENVELOPE_VERSION: version,
                          "io.modelcontextprotocol/clientCapabilities": {}}}
    return await _ask(server, version, [
        (method, {**envelope, **({"notifications": LISTEN_FILTER} if method == LISTEN else {})})
        for method in methods])


async def _ask(server: MCPServer, version: str,
               asked: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """Each request's answer, by question, from one connection to `server`."""
    requests = [{"jsonrpc": "2.0", "method": method,
                 **({} if method.startswith("notifications/") else {"id": number}),
                 **({} if params is None else {"params": params})}
                for number, (method, params) in enumerate(asked)]
    answered: dict[int, dict[str, Any]] = {}
    all_answered = anyio.Event()

    class Collected:
        async def write(self, text: str) -> None:
            message = orjson.loads(text)
            if "id" in message:  # not a listen's end, when stdin ends: its answer came first
                answered.setdefault(message["id"], {k: v for k, v in message.items()
                                                    if k in ("result", "error")})
            elif message.get("method") == LISTENED:  # a listen's first answer
                notification = {k: v for k, v in message.items() if k != "jsonrpc"}
                answered[message["params"]["_meta"][SUBSCRIPTION_ID]] = {
                    "notification": notification}
            if len(answered) == sum("id" in request for request in requests):
                all_answered.set()

        async def flush(self) -> None:
            pass

    async def lines() -> AsyncIterator[str]:
        for request in requests:
            yield orjson.dumps(request).decode() + "\n"
        await all_answered.wait()  # stdin ends once every answer is in

    lowlevel = server._lowlevel_server  # noqa: SLF001 - what run_stdio_async runs
    async with stdio_server(stdin=lines(), stdout=Collected()) as streams:  # type: ignore[arg-type]
        await lowlevel.run(*streams, lowlevel.create_initialization_options())
    return {question(request["method"], version): answered[request["id"]]
            for request in requests if "id" in request}


def shipped_tables(bus: Bus) -> dict[str, Any]:
    """The tables for SHIPPED_OPTIONS, each by its options (start_answers.selection)."""
    from bus.mcpserver.server import build_server

    tables = {}
    for agent, tools in SHIPPED_OPTIONS:
        session = AgentSession.open_on(bus, agent, tools)
        tables[selection(session)] = start_table(build_server(session), agent)
    return tables


def write_shipped(path: Path = SHIPPED_PATH) -> None:
    """Write the shipped tables, from a scratch bus (no tool reads the bus to be listed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        with Bus.open(Path(scratch) / "bus.db") as bus:
            tables = shipped_tables(bus)
    path.write_bytes(orjson.dumps(tables, option=orjson.OPT_SORT_KEYS) + b"\n")


if __name__ == "__main__":
    write_shipped()
    print(f"wrote {SHIPPED_PATH}")
