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
import queue
import signal
import subprocess
import sys
import threading
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
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from bus import Bus
from bus.mcpserver.start_answers import LISTEN
from bus.mcpserver.start_answers import LISTEN_FILTER
from bus.mcpserver.start_answers import LISTENED
from bus.mcpserver.start_answers import LISTINGS
from bus.mcpserver.start_answers import SHIPPED_PATH
from bus.mcpserver.start_answers import SUBSCRIPTION_ID
from bus.mcpserver.toolsets import DAILY
from tests.mcp.test_mcp import checkout_env


# What a 2026-era client sends with every request, in place of a handshake.
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}


def server(db_path: Path, cache: Path, agent: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 env=checkout_env(XDG_CACHE_HOME=str(cache)),
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


START_QUESTIONS = {"initialize", *LISTINGS, LISTEN}


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
    assert [(m.from_agent, m.payload) for m in bus.poll("bob", 10, include_own=True)] == [("bob", "from bob")]


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
        assert count == len(DAILY) - 1 and polled == {"messages": [], "cursor": 0}  # no join


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
    assert sorted(m.payload for m in bus.poll("gina", 10, include_own=True)) == [1, 2, 3, 4, 5]


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
    assert [m.type for m in bus.poll("gina", 10, include_own=True)] == ["note"]


def _command(db_path: Path) -> list[str]:
    return [sys.executable, "-m", "bus.cli", "--db", str(db_path), "mcp", "--agent", "gina"]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, **checkout_env(XDG_CACHE_HOME=str(cache))}


class RawClient:
    """`bus mcp` as a process, spoken to in JSON-RPC lines: the answers exactly as sent."""

    def __init__(self, command: list[str], cache: Path, first_on_path: Path | None = None
                 ) -> None:
        env = _env(cache)
        if first_on_path is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(first_on_path),
                                                 *filter(None, [env.get("PYTHONPATH")])])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env)
        self.answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.unasked: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.answers.put(orjson.loads(line))

    def send(self, *messages: dict[str, Any]) -> None:
        self.process.stdin.write(b"".join(orjson.dumps(m) + b"\n" for m in messages))
        self.process.stdin.flush()

    def ask(self, *messages: dict[str, Any]) -> dict[Any, dict[str, Any]]:
        """Send `messages` at once; the answer to each request, by id (without the id)."""
        self.send(*messages)
        wanted = {m["id"] for m in messages if "id" in m}
        answered: dict[Any, dict[str, Any]] = {}
        while wanted - answered.keys():
            answer = self.answers.get(timeout=60)
            if answer.get("method") == LISTENED:  # a listen's answer begins its stream
                answer_id = answer["params"]["_meta"].pop(SUBSCRIPTION_ID)
            else:
                answer_id = answer.pop("id", None)
            if answer_id in wanted - answered.keys():
                answered[answer_id] = answer
            else:
                self.unasked.append(answer)
        return answered

    def left_over(self) -> list[dict[str, Any]]:
        """What the server sent that no request asked for, by now."""
        while not self.answers.empty():
            self.unasked.append(self.answers.get())
        return self.unasked

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=60)


def _hello(version: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "hello", "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}


def _listings(first_id: int, era: str) -> list[dict[str, Any]]:
    """Every listing; in the 2026 era with its envelope, and a listen (as Claude Code asks)."""
    if era == "handshake":
        return [{"jsonrpc": "2.0", "id": first_id + n, "method": method}
                for n, method in enumerate(LISTINGS)]
    listen = {"jsonrpc": "2.0", "id": first_id + len(LISTINGS), "method": LISTEN,
              "params": {"_meta": ENVELOPE, "notifications": LISTEN_FILTER}}
    return [*({"jsonrpc": "2.0", "id": first_id + n, "method": method,
               "params": {"_meta": ENVELOPE}} for n, method in enumerate(LISTINGS)), listen]


def _tool_call(request_id: int, era: str) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "poll", "arguments": {"limit": 1}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {**params, **({"_meta": ENVELOPE} if era == "2026" else {})}}


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("client", ["2025-06-18", "1999-never-seen", "2026"])
def test_every_start_question_is_answered_as_the_built_server_answers_it(
        bus: Bus, db_path: Path, tmp_path: Path, warm: bool, client: str):
    """Every listing at once after the handshake (or, in the 2026 era, with no handshake);
    then, once a tool call has handed the wire to the SDK's server, the same questions
    again: the answers are the same, whether the start table was shipped or cached, and
    for a client version never seen (the SDK then agrees on the newest it speaks)."""
    cache = tmp_path / "cache"
    era = "2026" if client == "2026" else "handshake"
    runs = 2 if warm else 1
    for _ in range(runs):  # a warm start is the second: the first one's table was cached
        server_process = RawClient(_command(db_path), cache)
        try:
            if era == "handshake":
                hello = server_process.ask(_hello(client))["hello"]["result"]
                agreed = client if client in HANDSHAKE_PROTOCOL_VERSIONS else \
                    LATEST_HANDSHAKE_VERSION
                assert hello["protocolVersion"] == agreed
                assert "You act as agent gina" in hello["instructions"]
                server_process.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            at_start = server_process.ask(*_listings(1, era))
            called = server_process.ask(_tool_call(100, era))[100]
            assert called["result"]["structuredContent"] == {"messages": [], "cursor": 0}
            served = server_process.ask(*_listings(1_001, era))
            twice = server_process.left_over()  # a listen acknowledged here and by the SDK?
        finally:
            server_process.close()
        assert twice == []
        assert sorted(at_start) == [n - 1_000 for n in sorted(served)]
        assert {n: at_start[n] for n in at_start} == {n: served[1_000 + n] for n in at_start}
    assert cached_questions(cache) == START_QUESTIONS


def test_a_joining_server_starts_cold_with_its_own_listing(bus: Bus, db_path: Path,
                                                           tmp_path: Path):
    server_process = RawClient(_command(db_path)[:-2], tmp_path / "cache")  # no --agent
    try:
        hello = server_process.ask(_hello("2025-11-25"))["hello"]["result"]
        assert "Call join(name) first" in hello["instructions"]
        server_process.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        at_start = server_process.ask(*_listings(1, "handshake"))
        joined = server_process.ask({"jsonrpc": "2.0", "id": 100, "method": "tools/call",
                                     "params": {"name": "join", "arguments": {"name": "ivy"}}})
        assert joined[100]["result"]["structuredContent"]["agent"] == "ivy"
        served = server_process.ask(*_listings(1_001, "handshake"))
    finally:
        server_process.close()
    assert "join" in [tool["name"] for tool in at_start[1]["result"]["tools"]]
    assert {n: at_start[1 + n] for n in range(len(LISTINGS))} == \
        {n: served[1_001 + n] for n in range(len(LISTINGS))}


def test_the_shipped_start_tables_are_the_sdks_answers(bus: Bus):
    """A first start answers from start_answers.json: after a change to a tool, a resource,
    the instructions or the SDK, `python -m bus.mcpserver.start_table` writes it again."""
    from bus.mcpserver.start_table import shipped_tables

    assert orjson.loads(SHIPPED_PATH.read_bytes()) == shipped_tables(bus), \
        "start_answers.json is stale: run python -m bus.mcpserver.start_table"


@pytest.mark.parametrize("serving", ["front", "sdk"])
def test_sigint_ends_the_server_at_once_and_quietly(bus: Bus, db_path: Path, tmp_path: Path,
                                                    serving: str):
    """Interrupted while the start's answers are given, or once the SDK serves: the process
    ends by the signal, as a filter program does (a shell shows status 130), with nothing
    on stderr."""
    server_process = RawClient(_command(db_path), tmp_path / "cache")
    try:
        server_process.ask(_hello("2025-11-25"))
        if serving == "sdk":
            server_process.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            server_process.ask(_tool_call(1, "handshake"))
        server_process.process.send_signal(signal.SIGINT)
        assert server_process.process.wait(timeout=60) == -signal.SIGINT
        assert server_process.process.stderr.read() == b""
    finally:
        server_process.close()


@pytest.mark.parametrize("client", ["1999-never-seen", "2026"])
def test_a_first_start_answers_every_start_question_without_the_sdk(
        bus: Bus, db_path: Path, tmp_path: Path, client: str):
    """With an SDK whose import never ends, a first start (no cache) still answers the
    handshake and every listing, from the tables shipped with the package, even those
    asked after a request only the server answers (a tool call here; Claude Code asks
    `subscriptions/listen` before its listings)."""
    never_imported = tmp_path / "sdk" / "mcp"
    never_imported.mkdir(parents=True)
    (never_imported / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    server_process = RawClient(_command(db_path), tmp_path / "cache",
                               first_on_path=never_imported.parent)
    era = "2026" if client == "2026" else "handshake"
    try:
        if era == "handshake":
            hello = server_process.ask(_hello(client))["hello"]["result"]
            assert hello["protocolVersion"] == LATEST_HANDSHAKE_VERSION
            server_process.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        server_process.send(_tool_call(100, era))  # waits for the server, which never comes
        at_start = server_process.ask(*_listings(1, era))
    finally:
        server_process.close()
    assert sorted(at_start) == list(range(1, len(LISTINGS) + 1 + (era == "2026")))
    assert "publish" in [tool["name"] for tool in at_start[1]["result"]["tools"]]
