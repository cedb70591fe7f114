"""Properties of the MCP server under arbitrary arguments, driven in-process by the SDK client.

Whatever an LLM sends, the server answers (a result or a tool error, never
a crash), a refused call writes nothing and says why with a documented code
in its own words (no pydantic text, no URL), and everything written is
written as the server's own agent.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client

from bus import Bus
from bus.mcpserver import AgentSession
from bus.mcpserver import build_server
from bus.mcpserver.channel_tools import ChannelTools
from bus.mcpserver.failures import CODES
from bus.mcpserver.log_tools import LogTools
from bus.mcpserver.task_tools import TaskTools
from bus.mcpserver.toolsets import ALL
from bus.mcpserver.toolsets import chosen_groups
from tests.mcp.test_mcp import snapshot
from tests.support.properties import scaled_settings
from workers.mcp_tools import WorkerTools

AGENT = "planner"
WAITING = {"wait_seconds", "timeout_seconds"}  # arbitrary waits would only make the test slow

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**63), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(["room", "t1", "note", "completed",
                                                           "text", "working", 0.5, 1, 2]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


# A call that works on the bus the test sets up, per tool; the strategy breaks them at random.
VALID = {
    "publish": {"type": "note", "payload": {"n": 1}, "to": "worker-1"},
    "poll": {"limit": 10}, "ack": {"seq": 1}, "liveness": {},
    "heartbeat": {"status": "working", "task": "t1", "progress": 0.5},
    "claim": {"task": "t1", "lease_ms": 60_000}, "renew": {"task": "t1"}, "release": {"task": "t1"},
    "channel_send": {"channel": "room", "type": "text", "content": "hi"},
    "channel_receive": {"channel": "room", "limit": 5},
    "channel_acknowledge": {"seq": 2, "status": "completed"},
    "channel_search": {"content_pattern": "h"}, "search": {"query": "hello", "limit": 5},
    "worker_status": {},
    "worker_start": {}, "worker_done": {}, "worker_heartbeat": {"progress": 0.5},
    "worker_diff": {"worker": "w1"},
    "publish_many": {"messages": [{"type": "note", "to": "worker-1"}, {"type": "done"}]},
    "cursor_reset": {"seq": 1}, "reply": {"seq": 1, "type": "answer", "payload": "ok"},
    "channel_create": {"name": "den", "type": "direct"},
    "channel_join": {"channel": "lobby", "role": "observer"}, "channel_list": {},
    "dlq_list": {"limit": 5}, "dlq_replay": {"id": 1},
}
NO_VALID_CALL = {"dlq_replay"}  # no dead letter exists here: its refusal is the valid answer
# The tools with a valid call above: not exchange (it waits for an answer nobody sends
# here), worker_spawn (it would branch the repository the tests run in), nor the task
# graph's and the pump's tools (they have their own tests).
TOOLS = {name: frozenset(inspect.signature(getattr(group, name)).parameters) - WAITING - {"self"}
         for group in (LogTools, ChannelTools, TaskTools, WorkerTools) for name in group.TOOLS
         if name in VALID}


@st.composite
def broken(draw, name: str) -> dict[str, Any]:
    """The tool's valid call with some arguments dropped, replaced or added (maybe none)."""
    arguments = dict(VALID[name])
    for key in sorted(TOOLS[name] | {"agent", "from_agent"}):
        change = draw(st.sampled_from(["keep", "keep", "drop", "replace"]))
        if change == "replace":
            arguments[key] = draw(values)
        elif change == "drop":
            arguments.pop(key, None)
    return arguments


async def call_all(bus: Bus, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, dict]]:
    """Each call's outcome (is_error) with the bus snapshot taken just before it."""
    outcomes = []
    session = AgentSession.open_on(bus, AGENT, chosen_groups(ALL))
    async with Client(build_server(session), cache=None) as client:
        for name, arguments in calls:
            before = snapshot(bus)
            result = await client.call_tool(name, arguments)
            assert result.content, (name, arguments)  # an answer, whatever happened
            if result.is_error:
                assert_coded(result, name, arguments)
            outcomes.append((result.is_error, before))
    return outcomes


def assert_coded(result: Any, name: str, arguments: dict[str, Any]) -> None:
    """A refusal as docs/mcp.md promises: a listed code, one sentence, no library's own words."""
    error = result.structured_content["error"]
    text = result.content[0].text
    assert error["code"] in CODES and error["code"] != "internal", (name, arguments, error)
    assert f"{error['code']}: {error['message']}" == text and "\n" not in text, (
        name, arguments, text)
    for foreign in ("pydantic", "http", "validation error", "Error executing tool", " --"):
        assert foreign not in text, (name, arguments, text)


def seed(bus: Bus) -> None:
    """What VALID's calls need: a message for the agent (seq 1), a channel message (seq 2),
    a channel to join."""
    bus.channels.create_channel("room", "group", "boss")
    bus.channels.create_channel("lobby", "broadcast", "boss")
    bus.channels.join_channel("room", AGENT)
    bus.publish("boss", "note", to=AGENT)
    bus.channels.send_message("room", "boss", "text", "hello")
    bus.enable_search()


def test_mcp_valid_calls_all_succeed(tmp_path):
    """The base of the strategy: without changes every call works (worker ones aside)."""
    with Bus.open(tmp_path / "bus.db") as bus:
        seed(bus)
        bus.channels.receive_messages(AGENT)
        calls = [(name, VALID[name]) for name in sorted(TOOLS) if not (
            name.startswith("worker_") and name != "worker_status" or name in NO_VALID_CALL)]
        assert [failed for failed, _ in asyncio.run(call_all(bus, calls))] == [False] * len(calls)


@pytest.mark.parametrize("name", sorted(TOOLS))
@scaled_settings(max_examples=15)
@given(data=st.data())
def test_mcp_any_arguments_get_an_answer_and_a_refusal_writes_nothing(tmp_path_factory, name, data):
    calls = [(name, data.draw(broken(name))) for _ in range(2)]
    with Bus.open(tmp_path_factory.mktemp("prop") / "bus.db") as bus:
        seed(bus)
        outcomes = asyncio.run(call_all(bus, calls))
        after = [before for _, before in outcomes[1:]] + [snapshot(bus)]
        for (failed, before), state in zip(outcomes, after):
            if failed:
                assert state == before
        senders = {row[0] for row in bus.conn.execute("SELECT from_agent FROM messages")}
        assert senders <= {AGENT, "boss"}
