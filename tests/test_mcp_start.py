"""`bus mcp`'s start: the handshake and every listing answered while the SDK loads.

Real server processes, driven by the SDK's own stdio clients of both protocol
eras: `ClientSession` (the handshake era: initialize, then requests) and
`Client` (the 2026 era: every request carries its envelope), and by raw
JSON-RPC lines where a test compares answers byte for byte. Each test has its
own cache directory (XDG_CACHE_HOME).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from typing import AsyncIterator

import mcp.types as types
import orjson
import pytest
from mcp import Client
from mcp import ClientSession
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

from bus import Bus
from bus.mcpserver.start_answers import LISTINGS


# What a 2026-era client sends with every request, in place of a handshake.
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}


def server(db_path: Path, cache: Path, agent: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, env={"XDG_CACHE_HOME": str(cache)},
                                 args=["-m", "bus.cli", "--db", str(db_path), "mcp",
                                       "--agent", agent])


@asynccontextmanager
async def handshake_era(params: StdioServerParameters,
                        notes: list[Any] | None = None) -> AsyncIterator[ClientSession]:
    async def noted(message: Any) -> None:
        if notes is not None:
            notes.append(message)

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=noted) as session:
            yield session


def cached_questions(cache: Path) -> set[str]:
    stored = orjson.loads((cache / "agentbus" / "mcp-start.json").read_bytes())
    return {q.split(" ")[0] for entry in stored.values() for q in entry["table"]["answers"]}


START_QUESTIONS = {"initialize", *LISTINGS}


def described(tools: list[Any]) -> dict[str, str]:
    return {tool.name: tool.description for tool in tools}


def test_a_warm_start_answers_from_the_cache_in_the_agents_name_and_then_serves(
        bus: Bus, db_path: Path, tmp_path: Path):
    cache = tmp_path / "cache"

    async def start(agent: str) -> tuple[str, dict[str, str], Any]:
        async with handshake_era(server(db_path, cache, agent)) as session:
            hello = await session.initialize()
            tools = (await session.list_tools()).tools
            sent = await session.call_tool("publish", {"type": "note", "to": agent,
                                                       "payload": f"from {agent}"})
            return hello.instructions or "", described(tools), sent.structured_content

    cold_instructions, cold_tools, _ = asyncio.run(start("alice"))
    assert cached_questions(cache) == START_QUESTIONS
    warm_instructions, warm_tools, sent = asyncio.run(start("bob"))

    assert "You act as agent bob" in warm_instructions
    assert warm_instructions == cold_instructions.replace("alice", "bob")
    assert warm_tools == cold_tools
    assert sent["duplicate"] is False
    assert [(m.from_agent, m.payload) for m in bus.poll("bob", 10)] == [("bob", "from bob")]


def test_a_2026_era_client_starts_warm_too(bus: Bus, db_path: Path, tmp_path: Path):
    cache = tmp_path / "cache"

    async def start() -> tuple[dict[str, str], Any]:
        async with Client(server(db_path, cache, "carol"), cache=None) as client:
            tools = (await client.list_tools()).tools
            polled = await client.call_tool("poll", {"limit": 5})
            return described(tools), polled.structured_content

    bus.publish("dave", "note", "hello", to="carol")
    cold_tools, cold_poll = asyncio.run(start())
    assert cached_questions(cache) == START_QUESTIONS
    warm_tools, warm_poll = asyncio.run(start())
    assert warm_tools == cold_tools
    assert [m["payload"] for m in warm_poll["messages"]] == ["hello"] == \
        [m["payload"] for m in cold_poll["messages"]]


def test_a_stale_cached_listing_is_corrected_and_the_client_told(
        bus: Bus, db_path: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    stored_at = cache / "agentbus" / "mcp-start.json"

    async def listing(notes: list[Any] | None = None, *, until_told: bool = False
                      ) -> tuple[dict[str, str], dict[str, str]]:
        async with handshake_era(server(db_path, cache, "erin"), notes) as session:
            await session.initialize()
            first = described((await session.list_tools()).tools)
            await session.call_tool("poll", {"limit": 1})  # the server is built, its table kept
            if until_told:  # the correction comes once the SDK has answered the same question
                deadline = time.monotonic() + 30
                while not any(_list_changed(n) for n in notes or []):
                    assert time.monotonic() < deadline, f"no list_changed in {notes!r}"
                    await asyncio.sleep(0.01)
            second = described((await session.list_tools()).tools)
            return first, second

    real, _ = asyncio.run(listing())
    stored = orjson.loads(stored_at.read_bytes())
    for entry in stored.values():  # the cache as an older version of the tools left it
        for answer in entry["table"]["distinct"]:
            if "tools" in answer.get("result", {}):
                answer["result"]["tools"][0]["description"] = "STALE"
    stored_at.write_bytes(orjson.dumps(stored))

    notes: list[Any] = []
    first, second = asyncio.run(listing(notes, until_told=True))
    assert "STALE" in first.values(), "the first listing should have come from the cache"
    assert second == real
    assert b"STALE" not in stored_at.read_bytes()
    again, _ = asyncio.run(listing())
    assert again == real


def _list_changed(note: Any) -> bool:
    return isinstance(getattr(note, "root", note), types.ToolListChangedNotification)


def test_an_unusable_cache_directory_only_costs_the_wait(bus: Bus, db_path: Path,
                                                         tmp_path: Path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")

    async def start() -> tuple[int, Any]:
        async with handshake_era(server(db_path, not_a_directory, "frank")) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            polled = await session.call_tool("poll", {"limit": 1})
            return len(tools), polled.structured_content

    for _ in range(2):
        count, polled = asyncio.run(start())
        assert count > 30 and polled == {"messages": [], "cursor": 0}


@pytest.mark.parametrize("given", ["pipe", "file"])
def test_stdin_ending_before_any_request_ends_the_server(bus: Bus, db_path: Path,
                                                          tmp_path: Path, given: str):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with open(empty, "rb") as file:
        served = subprocess.run(_command(db_path), capture_output=True, timeout=60,
                                env=_env(tmp_path / "cache"),
                                **({"input": b""} if given == "pipe" else {"stdin": file}))
    assert (served.returncode, served.stdout) == (0, b""), served.stderr


@pytest.mark.parametrize("given", ["pipe", "file"])
def test_requests_written_at_once_then_stdin_closed_are_all_answered(
        bus: Bus, db_path: Path, tmp_path: Path, given: str):
    """`bus mcp < requests.jsonl`: the calls still running when stdin ends are answered."""
    requests = [{"jsonrpc": "2.0", "id": n, "method": "tools/call",
                 "params": {"name": "publish", "arguments": {"type": "note", "to": "gina",
                                                             "payload": n},
                            "_meta": ENVELOPE}} for n in range(1, 6)]
    (tmp_path / "requests.jsonl").write_bytes(
        b"".join(orjson.dumps(request) + b"\n" for request in requests))
    with open(tmp_path / "requests.jsonl", "rb") as file:
        served = subprocess.run(_command(db_path), capture_output=True, timeout=60,
                                env=_env(tmp_path / "cache"),
                                **({"input": file.read()} if given == "pipe" else {"stdin": file}))
    assert served.returncode == 0, served.stderr
    answers = [orjson.loads(line) for line in served.stdout.splitlines()]
    assert sorted(answer["id"] for answer in answers) == [1, 2, 3, 4, 5]
    assert all("result" in answer for answer in answers), answers
    assert sorted(m.payload for m in bus.poll("gina", 10)) == [1, 2, 3, 4, 5]


def test_a_client_closing_stdin_after_its_answers_ends_the_server(bus: Bus, db_path: Path,
                                                                   tmp_path: Path):
    requests = [{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "publish", "arguments": {"type": "note", "to": "gina"},
                            "_meta": ENVELOPE}}]
    server_process = subprocess.Popen(_command(db_path), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=_env(tmp_path / "cache"))
    try:
        for request in requests:
            server_process.stdin.write(orjson.dumps(request) + b"\n")
            server_process.stdin.flush()
            answer = orjson.loads(server_process.stdout.readline())
            assert answer["id"] == request["id"] and "result" in answer, answer
        server_process.stdin.close()
        assert server_process.wait(timeout=60) == 0
    finally:
        server_process.kill()
    assert [m.type for m in bus.poll("gina", 10)] == ["note"]


def _command(db_path: Path) -> list[str]:
    return [sys.executable, "-m", "bus.cli", "--db", str(db_path), "mcp", "--agent", "gina"]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}
