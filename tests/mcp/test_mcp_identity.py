"""`bus mcp` without --agent: the agent joins under a name, and takes it back with its token.

Real server processes on one bus file, driven by the SDK's stdio client.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from mcp import Client
from mcp import StdioServerParameters

from bus import Bus
from tests.mcp.test_mcp import call
from tests.mcp.test_mcp import checkout_env
from tests.mcp.test_mcp import refusal
from tests.mcp.test_mcp import rows


@asynccontextmanager
async def unnamed(db_path: Path) -> AsyncIterator[Client]:
    """A client of a fresh `bus mcp` process started without --agent."""
    params = StdioServerParameters(command=sys.executable, cwd=str(db_path.parent),
                                   env=checkout_env(),
                                   args=["-m", "bus.cli", "--db", str(db_path), "mcp"])
    async with Client(params, cache=None) as client:
        yield client


def test_mcp_without_agent_refuses_every_tool_until_join(bus: Bus, db_path: Path):
    async def scenario():
        async with unnamed(db_path) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            before = await refusal(client, "publish", type="note")
            joined = await call(client, "join", name="alice")
            published = await call(client, "publish", type="note", to="bob")
            again = await refusal(client, "join", name="carol")
            return tools, before, joined, published, again

    tools, before, joined, published, again = asyncio.run(scenario())
    assert {"join", "publish", "poll", "exchange"} <= tools
    assert (before["code"], before["argument"]) == ("not_joined", None)
    assert before["message"] == ("publish: you have no agent name yet; call join(name) first,"
                                 " then call this again")
    assert joined["agent"] == "alice" and len(joined["reclaim_token"]) >= 32
    assert rows(bus, "SELECT seq, from_agent FROM messages") == [(published["seq"], "alice")]
    assert (again["code"], again["argument"]) == ("already_joined", "name")


def test_mcp_a_live_name_is_refused_to_a_second_session(bus: Bus, db_path: Path):
    bus.heartbeats.beat("planner", "working")  # an agent that beats, started with --agent

    async def scenario():
        async with unnamed(db_path) as first, unnamed(db_path) as second:
            await call(first, "join", name="alice")
            taken = await refusal(second, "join", name="alice")
            beating = await refusal(second, "join", name="planner")
            other = await call(second, "join", name="bob")
            return taken, beating, other

    taken, beating, other = asyncio.run(scenario())
    assert (taken["code"], taken["argument"]) == ("name_taken", "name")
    assert taken["message"] == ("name: 'alice' is taken (another session holds it); choose"
                                " another name, or give the reclaim_token join returned for it")
    assert beating["code"] == "name_taken" and "an agent of that name beat" in beating["message"]
    assert other["agent"] == "bob"


def test_mcp_reclaim_token_takes_the_name_back_after_a_restart(bus: Bus, db_path: Path):
    async def first_run():
        async with unnamed(db_path) as client:
            joined = await call(client, "join", name="alice")
            await call(client, "publish", type="note", to="bob")
            return joined["reclaim_token"]

    async def restarted(token: str):
        async with unnamed(db_path) as client, unnamed(db_path) as rival:
            stolen = await refusal(rival, "join", name="alice")  # the hold outlives the server
            wrong = await refusal(client, "join", name="alice", reclaim_token=token + "x")
            never = await refusal(client, "join", name="zed", reclaim_token=token)
            back = await call(client, "join", name="alice", reclaim_token=token)
            inbox = await call(client, "poll")
            return stolen, wrong, never, back, inbox

    token = asyncio.run(first_run())
    bus.publish("bob", "note", "while alice was away", to="alice")
    stolen, wrong, never, back, inbox = asyncio.run(restarted(token))
    assert stolen["code"] == "name_taken"
    assert (wrong["code"], wrong["argument"]) == ("bad_reclaim_token", "reclaim_token")
    assert never["code"] == "bad_reclaim_token" and "nobody ever joined" in never["message"]
    assert back == {"agent": "alice", "reclaim_token": token}
    assert [(m["from"], m["type"]) for m in inbox["messages"]] == [("bob", "note")]
    stored = rows(bus, "SELECT key, value FROM meta WHERE key LIKE 'agent_name:%'")
    assert [key for key, _ in stored] == ["agent_name:alice"]
    assert token not in stored[0][1]  # only its hash is in the file
