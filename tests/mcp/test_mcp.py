"""`bus mcp`: a real server subprocess driven by the MCP SDK's own stdio client.

Each test starts `bus --db ... mcp --agent ...` as a child process, talks to
it over stdin/stdout with `mcp.Client`, then reads the bus file with SQL.
"""

from __future__ import annotations

import asyncio
import json
import re
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from typing import AsyncIterator

import pytest
from mcp import Client
from mcp import MCPError
from mcp import StdioServerParameters

from bus import Bus
from bus.mcpserver.channel_tools import ChannelTools
from bus.mcpserver.failures import CODES
from bus.mcpserver.failures import in_tool_terms
from bus.mcpserver.log_tools import LogTools
from bus.mcpserver.pump_tools import PumpTools
from bus.mcpserver.reservation_tools import ReservationTools
from bus.mcpserver.resources import Resources
from bus.mcpserver.task_tools import TaskTools
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT
from tests.support.waiting import wait_until
from workers.mcp_tools import WorkerTools

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "organism.yaml"
ALL_TOOLS = {*LogTools.TOOLS, *ChannelTools.TOOLS, *PumpTools.TOOLS, *TaskTools.TOOLS,
             *ReservationTools.TOOLS, *WorkerTools.TOOLS}
IDENTITY_ARGUMENTS = {"agent", "from", "from_agent", "sender", "worker_id", "client"}


def checkout_env(**extra: str) -> dict[str, str]:
    """What a `bus mcp` child gets besides the SDK's safe defaults: this checkout's code first
    (the SDK passes no PYTHONPATH of its own), and `extra`."""
    return {"PYTHONPATH": str(REPO_ROOT), **extra}


@asynccontextmanager
async def connected(db_path: Path, agent: str, tools: str = "all") -> AsyncIterator[Client]:
    """An MCP client session with a fresh `bus mcp --agent AGENT --tools TOOLS` child process
    (every tool group by default: these tests call tools of each)."""
    params = StdioServerParameters(
        command=sys.executable, cwd=str(db_path.parent), env=checkout_env(),
        args=["-m", "bus.cli", "--db", str(db_path), "mcp", "--agent", agent,
              *(["--tools", tools] if tools else [])])
    async with Client(params, cache=None) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's JSON result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The text of a tool error; fails the test if the call succeeded."""
    return (await refusal(client, tool, **arguments))["message"]


async def refusal(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool error's {code, argument, message}, checked to be as docs/mcp.md promises: a
    listed code, the message as the text beside it, no pydantic text, no URL, no CLI flag."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    error = {"argument": None, **result.structured_content["error"]}
    assert error["code"] in CODES, error
    assert [c.text for c in result.content] == [f"{error['code']}: {error['message']}"]
    for foreign in ("pydantic", "http", "validation error", "Error executing tool", " --"):
        assert foreign not in error["message"], error
    return error


def hint_values(hints: Any) -> dict[str, bool]:
    """The three hints as a client reads them: a hint left out is MCP's default for it."""
    return {"read_only": bool(hints.read_only_hint), "idempotent": bool(hints.idempotent_hint),
            "destructive": hints.destructive_hint is not False}


async def read(client: Client, uri: str) -> dict[str, Any]:
    contents = (await client.read_resource(uri)).contents
    return json.loads(contents[0].text)


def rows(bus: Bus, sql: str, *params: Any) -> list[tuple]:
    return bus.conn.execute(sql, params).fetchall()


def snapshot(bus: Bus) -> dict[str, list[tuple]]:
    """Everything an agent's tool call could change."""
    tables = ("messages", "cursors", "heartbeats", "task_claims", "deliveries", "workers")
    return {table: rows(bus, f"SELECT * FROM {table}") for table in tables}


def test_mcp_lists_every_tool_and_resource_and_none_takes_an_identity(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "planner") as client:
            tools = (await client.list_tools()).tools
            resources = (await client.list_resources()).resources
            templates = (await client.list_resource_templates()).resource_templates
            return tools, resources, templates

    tools, resources, templates = asyncio.run(scenario())
    assert {tool.name for tool in tools} == ALL_TOOLS
    for tool in tools:
        assert tool.description and len(tool.description) > 20, tool.name
        assert not any(line.startswith(" ") for line in tool.description.splitlines()), tool.name
        assert not IDENTITY_ARGUMENTS & set(tool.input_schema["properties"]), tool.name
        assert tool.annotations.open_world_hint is False, tool.name
    hints = {tool.name: hint_values(tool.annotations) for tool in tools}
    assert hints["liveness"] == {"read_only": True, "idempotent": True, "destructive": False}
    assert hints["publish"] == {"read_only": False, "idempotent": False, "destructive": False}
    assert hints["ack"] == {"read_only": False, "idempotent": True, "destructive": False}
    assert hints["cursor_reset"]["destructive"] and hints["dlq_replay"]["destructive"]
    assert {str(r.uri) for r in resources} == {"bus://status", "bus://inbox"}
    assert {t.uri_template for t in templates} == {"bus://workers/{worker}",
                                                   "bus://threads/{correlation_id}",
                                                   "bus://messages/{seq}"}


def test_mcp_poll_by_seq_gives_one_message_whole_and_leaves_the_cursor(bus: Bus,
                                                                        db_path: Path):
    long = bus.publish("boss", "note", "z" * 5000, to="planner").seq
    other = bus.publish("boss", "note", "not for the planner", to="ann").seq

    async def scenario():
        async with connected(db_path, "planner") as client:
            return (await call(client, "poll", seq=long), await call(client, "poll", seq=other),
                    await call(client, "poll", seq=long + 99))

    whole, not_mine, none = asyncio.run(scenario())
    assert [(m["seq"], m["payload"]) for m in whole["messages"]] == [(long, "z" * 5000)]
    assert not_mine["messages"] == [] and none["messages"] == []
    assert bus.cursor("planner") == 0


def test_mcp_log_tools_act_as_the_agent(bus: Bus, db_path: Path):
    bus.publish("boss", "task_assign", {"task": "t1"}, to="planner")

    async def scenario():
        async with connected(db_path, "planner") as client:
            published = await call(client, "publish", type="note", payload={"n": 1}, to="w1",
                                   correlation_id="t1")
            again = await call(client, "publish", type="note", id=published["id"])
            polled = await call(client, "poll")
            acked = await call(client, "ack", seq=polled["messages"][-1]["seq"])
            beat = await call(client, "heartbeat", status="working", task="t1", progress=0.5)
            claimed = await call(client, "claim", task="t1", lease_ms=60_000)
            renewed = await call(client, "renew", task="t1")
            alive = await call(client, "liveness")
            released = await call(client, "release", task="t1")
            return published, again, polled, acked, beat, claimed, renewed, alive, released

    published, again, polled, acked, beat, claimed, renewed, alive, released = \
        asyncio.run(scenario())
    assert published.pop("warning").startswith("no agent named 'w1' is known to this bus")
    assert again == {**published, "duplicate": True}  # no `to`: nobody to warn of
    assert [m["type"] for m in polled["messages"]] == ["task_assign"] and polled["cursor"] == 0
    assert acked == {"cursor": 1}
    assert claimed["granted"] and claimed["claim"]["agent"] == "planner"
    assert renewed == {"task": "t1", "renewed": True}
    assert [a["agent"] for a in alive["agents"]] == ["planner"]
    assert released == {"task": "t1", "released": True}
    assert rows(bus, "SELECT seq, from_agent, to_agent, type, correlation_id, payload"
                     " FROM messages WHERE seq = ?", published["seq"]) == [
        (2, "planner", "w1", "note", "t1", '{"n":1}')]
    assert rows(bus, "SELECT agent_id, last_acked_seq FROM cursors") == [("planner", 1)]
    assert rows(bus, "SELECT agent_id, status, current_task, progress, ts_ms FROM heartbeats") == [
        ("planner", "working", "t1", 0.5, beat["ts_ms"])]
    assert rows(bus, "SELECT count(*) FROM task_claims") == [(0,)]


def test_mcp_heartbeat_without_task_keeps_it_and_empty_task_clears_it(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "planner") as client:
            await call(client, "heartbeat", status="working", task="t1", progress=0.5)
            await call(client, "heartbeat", status="blocked")
            kept = rows(bus, "SELECT status, current_task, progress FROM heartbeats")
            await call(client, "heartbeat", status="idle", task="")
            return kept

    kept = asyncio.run(scenario())
    assert kept == [("blocked", "t1", 0.5)]
    assert rows(bus, "SELECT status, current_task, progress FROM heartbeats") == [
        ("idle", None, None)]


def test_mcp_invalid_arguments_are_tool_errors_that_change_nothing(bus: Bus, db_path: Path):
    bus.publish("boss", "hello", to="planner")
    before = snapshot(bus)

    async def scenario():
        async with connected(db_path, "planner") as client:
            errors = [
                await refusal(client, "publish", type=""),
                await refusal(client, "publish", type="note", to="not an agent!"),
                await refusal(client, "publish", type="note", from_agent="boss"),
                await refusal(client, "ack", seq="abc"),
                await refusal(client, "ack", seq=99),
                await refusal(client, "claim", task="t1", lease_ms=-5),
                await refusal(client, "channel_send", channel="nowhere", type="text",
                              content="hi"),
                await refusal(client, "worker_start"),
                await refusal(client, "no_such_tool"),
                await refusal(client, "claim"),
                await refusal(client, "heartbeat", status="sleeping"),
                await refusal(client, "publish_many", messages=[{"type": "a"}, {"type": ""}]),
                await refusal(client, "publish_many", messages=[{"type": "a", "from": "x"}]),
                await refusal(client, "publish_many", messages=[{"type": "a"}] * 101),
                await refusal(client, "dlq_replay", id=7),
                await refusal(client, "channel_join", channel="nowhere"),
                await refusal(client, "search", query="x"),
                await refusal(client, "cursor_reset", seq=50),
            ]
            still_serving = await call(client, "poll")
            return errors, still_serving

    errors, still_serving = asyncio.run(scenario())
    assert [(e["code"], e["argument"]) for e in errors] == [
        ("invalid_argument", "type"), ("invalid_argument", "to"),
        ("unknown_argument", "from_agent"), ("invalid_argument", "seq"),
        ("invalid_argument", "seq"), ("invalid_argument", "lease_ms"),
        ("not_found", "channel"), ("not_found", None), ("unknown_tool", None),
        ("missing_argument", "task"), ("invalid_argument", "status"),
        ("invalid_argument", "messages[1].type"), ("invalid_argument", "messages[0].from"),
        ("invalid_argument", "messages"), ("invalid_argument", "id"),
        ("not_found", "channel"), ("search_disabled", "search"), ("invalid_argument", "seq")]
    messages = [e["message"] for e in errors]
    assert messages[0] == "type: must not be empty"
    assert messages[2] == ("from_agent: publish takes no such argument; it takes correlation_id,"
                           " fence, id, in_reply_to, payload, task, to, type. You always act as"
                           " your own agent: no tool takes an agent id")
    assert messages[3] == "seq: must be an integer, got 'abc'"
    assert messages[4] == "seq: no message has seq 99; the last seq is 1"
    assert messages[5] == "lease_ms: must be >= 1, got -5"
    assert messages[6] == ("channel: no channel named 'nowhere'; create it with channel_create"
                           " or list them with channel_list")
    assert messages[7] == "no worker 'planner'; worker_status lists them"
    assert messages[8].startswith("no tool is named 'no_such_tool'; the tools are ack, ")
    assert messages[9] == "task: is required; give it (The task's id)"
    assert messages[10] == "status: must be one of 'idle', 'working', 'blocked' or 'stopped'," \
                           " got 'sleeping'"
    assert messages[11] == "messages[1].type: must not be empty"
    assert messages[13].startswith("messages: must have at most 100 items, got [{'type': 'a'}")
    assert messages[14] == "id: no dead letter with id 7; list them with dlq_list"
    assert "channel_search" in messages[16]
    assert [m["type"] for m in still_serving["messages"]] == ["hello"]
    assert snapshot(bus) == before


def test_mcp_two_agents_exchange_messages_and_hand_a_task_over(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            # bob waits first; alice's publish is what ends his wait.
            waiting = asyncio.create_task(call(bob, "poll", wait_seconds=60))
            await call(alice, "publish", type="task_offer", payload={"task": "t1"}, to="bob")
            offer = (await waiting)["messages"]
            first = await call(alice, "claim", task="t1")
            blocked = await call(bob, "claim", task="t1")
            await call(bob, "ack", seq=offer[0]["seq"])
            await call(alice, "release", task="t1")
            taken = await call(bob, "claim", task="t1")
            await call(bob, "publish", type="task_taken", payload={"task": "t1"}, to="alice")
            reply = await call(alice, "poll")
            return offer, first, blocked, taken, reply

    offer, first, blocked, taken, reply = asyncio.run(scenario())
    assert [(m["from"], m["type"], m["payload"]) for m in offer] == [
        ("alice", "task_offer", {"task": "t1"})]
    assert first["granted"] and not blocked["granted"]
    assert blocked["claim"]["agent"] == "alice"
    assert taken["granted"]
    assert [(m["from"], m["type"]) for m in reply["messages"]] == [("bob", "task_taken")]
    assert rows(bus, "SELECT task_id, claimed_by FROM task_claims") == [("t1", "bob")]
    assert rows(bus, "SELECT agent_id, last_acked_seq FROM cursors") == [("bob", offer[0]["seq"])]
    assert rows(bus, "SELECT from_agent, to_agent, type FROM messages ORDER BY seq") == [
        ("alice", "bob", "task_offer"), ("bob", "alice", "task_taken")]


def test_mcp_receipts_delivered_by_poll_and_reply_and_in_a_timed_out_exchange(
        bus: Bus, db_path: Path):
    """A timed-out exchange says whether its question reached bob's session and whether bob
    acked it; poll and reply record what they hand bob; a name never seen is warned of."""
    bus.heartbeats.beat("bob")

    async def bob_reads(bob, ack: bool) -> None:
        [question] = (await call(bob, "poll", wait_seconds=60))["messages"]
        if ack:
            await call(bob, "ack", seq=question["seq"])

    async def asked_while(alice, bob, ack: bool) -> dict:
        reading = asyncio.create_task(bob_reads(bob, ack))
        # bob answers nothing: alice's wait runs out after bob has read (and acked)
        asked = await call(alice, "exchange", to="bob", type="question", wait_seconds=3)
        await reading
        return asked

    async def scenario():
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            typo = await call(alice, "exchange", to="bobb", type="question", wait_seconds=0.1)
            published = await call(alice, "publish", to="bobb", type="note")
            batch = await call(alice, "publish_many", messages=[
                {"to": "bobb", "type": "note"}, {"to": "bob", "type": "note"},
                {"type": "broadcast"}, {"to": "bobb", "type": "note"}])
            unread = await call(alice, "exchange", to="bob", type="question", wait_seconds=0.1)
            await call(bob, "ack", seq=unread["sent"]["seq"])
            read = await asked_while(alice, bob, ack=False)
            await call(bob, "ack", seq=read["sent"]["seq"])
            acked = await asked_while(alice, bob, ack=True)
            note = await call(alice, "publish", to="bob", type="note")
            await call(bob, "reply", seq=acked["sent"]["seq"], type="answer", wait_seconds=5)
            return typo, published, batch, unread, read, acked, note

    typo, published, batch, unread, read, acked, note = asyncio.run(scenario())
    assert typo["warning"].startswith("no agent named 'bobb' is known to this bus")
    assert typo["question"] == {"state": "sent", "delivered": False, "acked": False}
    assert published["warning"] == typo["warning"]
    assert [m.get("warning") for m in batch["published"]] == [typo["warning"], None, None,
                                                               typo["warning"]]
    assert "warning" not in unread and "warning" not in note
    assert unread["timed_out"] and unread["question"] == {
        "state": "sent", "delivered": False, "acked": False}
    for result, state in ((read, "delivered"), (acked, "acked")):
        assert result["timed_out"] and "reply" not in result
        question = result["question"]
        assert (question["state"], question["delivered"], question["acked"]) == (
            state, True, state == "acked")
        assert (question["deliveries"], question["via"]) == (1, "mcp:poll")
    receipt = bus.receipt(note["seq"])
    assert (receipt.state, receipt.delivery.via) == ("delivered", "mcp:reply")


def test_mcp_search_finds_payload_words_once_search_is_enabled(bus: Bus, db_path: Path):
    bus.publish("boss", "note", {"text": "the frontend deploy failed"})
    bus.publish("boss", "note", {"text": "backend deployed"})

    async def scenario():
        async with connected(db_path, "planner") as client:
            before = await refused(client, "search", query="frontend")
            bus.enable_search()
            hits = await call(client, "search", query="frontend", type="note")
            none = await call(client, "search", query="frontend", published_by="nobody")
            return before, hits, none

    before, hits, none = asyncio.run(scenario())
    assert before == ("search: full-text search is not enabled on this bus; the bus's operator"
                      " enables it once; until then use channel_search")
    assert [(h["seq"], h["from"]) for h in hits["hits"]] == [(1, "boss")]
    assert none["hits"] == []


def test_mcp_channel_tools_send_receive_acknowledge_search(bus: Bus, db_path: Path):
    channels = bus.channels
    channels.create_channel("jobs", "direct", "boss")
    channels.join_channel("jobs", "executor")
    channels.send_message("jobs", "boss", "command", "resize images")

    async def scenario():
        async with connected(db_path, "executor") as client:
            received = await call(client, "channel_receive", channel="jobs")
            seq = received["messages"][0]["seq"]
            acked = await call(client, "channel_acknowledge", seq=seq, status="completed",
                               note="done")
            sent = await call(client, "channel_send", channel="jobs", type="text",
                              content="all resized")
            found = await call(client, "channel_search", content_pattern="resize")
            again = await call(client, "channel_receive")
            return received, acked, sent, found, again

    received, acked, sent, found, again = asyncio.run(scenario())
    assert [(m["sender"], m["content"]) for m in received["messages"]] == [
        ("boss", "resize images")]
    assert acked["status"] == "completed" and again["messages"] == []
    assert sent["sender"] == "executor" and sent["channel"] == "jobs"
    assert [m["content"] for m in found["messages"]] == ["all resized", "resize images"]
    assert rows(bus, "SELECT recipient, status, note FROM deliveries ORDER BY seq") == [
        ("executor", "completed", "done"), ("boss", "pending", None)]


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    root.mkdir()
    git("init", "-q", "-b", "main", cwd=root)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init",
        cwd=root)
    return root


def test_mcp_worker_tools_drive_the_agents_own_worker(bus: Bus, db_path: Path, repo: Path):
    from workers.lifecycle import Workers

    spawned = Workers(bus).spawn("fix-login", "w1", repo)
    worktree = Path(spawned.worktree)

    async def scenario():
        async with connected(db_path, "w1") as client:
            started = await call(client, "worker_start")
            beat = await call(client, "worker_heartbeat", progress=0.5)
            (worktree / "auth.py").write_text("def login(): return True\n")
            dirty = await refused(client, "worker_done")
            stash = worktree.parent / "auth.py.aside"
            (worktree / "auth.py").rename(stash)  # a clean worktree with nothing committed
            empty = await refused(client, "worker_done")
            stash.rename(worktree / "auth.py")
            git("add", "auth.py", cwd=worktree)
            git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "Fix", cwd=worktree)
            done = await call(client, "worker_done", message="login fixed")
            status = await call(client, "worker_status")
            state = await read(client, "bus://workers/w1")
            return started, beat, dirty, empty, done, status, state

    started, beat, dirty, empty, done, status, state = asyncio.run(scenario())
    assert (started["state"], beat["state"], done["state"]) == ("WORKING", "WORKING", "IN_REVIEW")
    assert "uncommitted changes (auth.py)" in dirty
    assert empty.endswith("or pass allow_empty=true to review an empty branch")  # its argument
    assert [w["worker"] for w in status["workers"]] == ["w1"]
    assert state["state"] == "IN_REVIEW" and state["head_commit"] == done["head_commit"]
    assert rows(bus, "SELECT state, note FROM workers") == [("IN_REVIEW", "login fixed")]
    # The beat carried the progress; done left a last beat that says the agent stopped.
    assert [m.payload.get("progress") for m in bus.list_messages(limit=1000)
            if m.type == "task_progress"] == [0.5]
    assert rows(bus, "SELECT agent_id, status FROM heartbeats") == [("w1", "stopped")]


def test_mcp_worker_heartbeat_refuses_stopped_as_worker_heartbeat_does(
        bus: Bus, db_path: Path, repo: Path):
    """`stopped` is the beat done, fail and cancel write: a WORKING worker that beat it
    would show as stopped on every view while it still holds its task."""
    from workers.lifecycle import Workers

    Workers(bus).spawn("fix-login", "w1", repo)
    assert run(["mcp", "--agent", "w1", "--tools", "workers", "--call", "worker_start"], db_path).exit_code == 0
    before = rows(bus, "SELECT status FROM heartbeats WHERE agent_id = 'w1'")
    stopped = run(["mcp", "--agent", "w1", "--tools", "workers", "--call", "worker_heartbeat", "--args",
                   '{"status": "stopped"}'], db_path)
    assert stopped.exit_code == 1
    assert "status" in stopped.stderr and "'idle', 'working' or 'blocked'" in stopped.stderr
    assert rows(bus, "SELECT status FROM heartbeats WHERE agent_id = 'w1'") == before
    blocked = run(["mcp", "--agent", "w1", "--tools", "workers", "--call", "worker_heartbeat", "--args",
                   '{"status": "blocked"}'], db_path)
    assert blocked.exit_code == 0, blocked.output
    assert rows(bus, "SELECT status FROM heartbeats WHERE agent_id = 'w1'") == [("blocked",)]


def test_mcp_resources_status_inbox_and_thread(bus: Bus, db_path: Path):
    bus.publish("boss", "hello", to="planner")
    bus.publish("boss", "other", to="someone-else")
    channels = bus.channels
    channels.create_channel("talk", "group", "boss")
    channels.join_channel("talk", "planner")
    query = channels.send_query("talk", "boss", "Pool size?")
    channels.send_response("talk", "planner", query.correlation_id, "20")

    async def scenario():
        async with connected(db_path, "planner") as client:
            with pytest.raises(MCPError) as missing:
                await read(client, "bus://workers/nobody")
            with pytest.raises(MCPError) as no_message:
                await read(client, "bus://messages/99")
            return (await read(client, "bus://status"), await read(client, "bus://inbox"),
                    await read(client, f"bus://threads/{query.correlation_id}"), missing.value,
                    await read(client, f"bus://messages/{query.seq}"), no_message.value)

    status, inbox, thread, missing, message, no_message = asyncio.run(scenario())
    assert message["message"]["seq"] == query.seq and message["channel"]["name"] == "talk"
    assert [d["recipient"] for d in message["deliveries"]] == ["planner"]
    assert [m["type"] for m in message["thread"]] == ["query", "response"]
    assert str(no_message) == "seq: no message with seq 99; bus://status has the last seq"
    assert str(missing) == "no worker 'nobody'; worker_status lists them"
    assert status["file"]["path"] == str(db_path)
    assert (status["log"]["messages"], status["log"]["last_seq"]) == (4, 4)
    assert [c["name"] for c in status["channels"]] == ["talk"]
    assert [(m["from"], m["type"]) for m in inbox["messages"]] == [("boss", "hello")]
    assert [(m["sender"], m["content"]) for m in thread["messages"]] == [
        ("boss", "Pool size?"), ("planner", "20")]


def test_mcp_pump_send_and_wait_gets_the_organisms_reply(bus: Bus, db_path: Path, python_env):
    async def before_any_pump():
        async with connected(db_path, "planner") as client:
            return (await refusal(client, "pump_send_and_wait", organism="example",
                                  xml="<add><a>1</a><b>2</b></add>"),
                    await refusal(client, "organism_capabilities", organism="example"))

    unknown, unknown_capabilities = asyncio.run(before_any_pump())
    pump = subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(db_path), "pump", "run",
                             str(EXAMPLE), "--no-oob"], env=python_env, cwd=db_path.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def running():
        async with connected(db_path, "planner") as client:
            return (await call(client, "pump_send_and_wait", organism="example",
                               xml="<add><a>1.5</a><b>2</b></add>", to="calculator",
                               timeout_seconds=60),
                    await call(client, "organism_capabilities", organism="example"))

    async def stopped():
        async with connected(db_path, "planner") as client:
            return await refusal(client, "pump_send_and_wait", organism="example",
                                 xml="<add><a>1</a><b>2</b></add>")

    try:
        wait_until(lambda: rows(bus, "SELECT count(*) FROM heartbeats"
                                     " WHERE agent_id = 'pump:example'") == [(1,)], "the boot")
        answered, capabilities = asyncio.run(running())
    finally:
        pump.send_signal(signal.SIGTERM)
        pump.wait(timeout=30)
    sent_before = rows(bus, "SELECT count(*) FROM messages")
    not_running = asyncio.run(stopped())
    assert (unknown["code"], unknown["argument"]) == ("unknown_organism", "organism")
    assert unknown["message"].startswith("organism: no pump has booted an organism named"
                                         " 'example' on this bus (booted: none yet)")
    assert unknown_capabilities["code"] == "unknown_organism"
    assert (not_running["code"], not_running["argument"]) == ("organism_not_running", "organism")
    assert "its pump stopped" in not_running["message"]
    assert rows(bus, "SELECT count(*) FROM messages") == sent_before  # nothing was sent
    assert answered["sent"]["client"] == "planner" and not answered["timed_out"]
    assert [(r["from"], r["to"], r["xml"]) for r in answered["replies"]] == [
        ("calculator", "planner", "<sum><value>3.5</value></sum>")]
    assert rows(bus, "SELECT from_agent FROM messages WHERE seq = ?", answered["sent"]["seq"]) == [
        ("planner",)]
    listeners = {entry["name"]: entry for entry in capabilities["listeners"]}
    assert capabilities["running"] and set(listeners) == {
        "greeter", "shouter", "calculator", "search.fast", "search.slow"}
    assert listeners["calculator"]["root_tag"] == "add"
    assert listeners["calculator"]["example"].startswith("<add>")


def test_cli_mcp_list_prints_tools_and_resources(bus: Bus, db_path: Path):
    listed = run(["mcp", "--agent", "planner", "--tools", "all", "--list", "--json"], db_path)
    assert listed.exit_code == 0, listed.output
    catalog = json.loads(listed.stdout)
    assert {tool["name"] for tool in catalog["tools"]} == ALL_TOOLS
    assert catalog["more"] == []
    resources = set(Resources.URIS) | set(WorkerTools.URIS)
    assert {r["name"] for r in catalog["resources"]} == resources
    text = run(["mcp", "--agent", "planner", "--list"], db_path)
    assert text.stdout.startswith("tools:\n  publish ")
    assert "more with --tools GROUP:\n  admin " in text.stdout
    assert "\n  files                            reservations, reserve_check\n" in text.stdout


def test_cli_mcp_bad_agent_or_missing_bus_is_an_error(bus: Bus, db_path: Path, tmp_path: Path):
    bad = run(["mcp", "--agent", "not ok!"], db_path)
    assert bad.exit_code == 2
    assert last_error(bad.stderr) == bad_value(
        "--agent", "contains ' '; allowed are letters, digits and . _ : -")
    missing = run(["mcp", "--agent", "planner"], tmp_path / "none.db")
    assert missing.exit_code == 1 and missing.stderr.startswith("Error: no bus database at ")


def test_cli_mcp_call_runs_one_tool_as_the_agent(bus: Bus, db_path: Path):
    bus.heartbeats.beat("worker-1")  # a name the bus knows: no warning in the result
    published = run(["mcp", "--agent", "planner", "--call", "publish", "--args",
                     '{"type": "task_assign", "to": "worker-1", "payload": {"task": "t1"}}'],
                    db_path)
    assert published.exit_code == 0, published.output
    assert json.loads(published.stdout) == {"seq": 1, "id": bus.list_messages()[0].id,
                                            "duplicate": False, "durable": "commit"}
    polled = run(["mcp", "--agent", "worker-1", "--call", "poll"], db_path)
    assert [m["from"] for m in json.loads(polled.stdout)["messages"]] == ["planner"]
    assert rows(bus, "SELECT from_agent, to_agent FROM messages") == [("planner", "worker-1")]


def test_cli_mcp_call_errors_exit_1_and_bad_args_exit_2(bus: Bus, db_path: Path):
    unknown = run(["mcp", "--agent", "worker-1", "--tools", "tasks", "--call", "claim", "--args",
                   '{"task": "t1", "agent": "planner"}'], db_path)
    assert (unknown.exit_code, unknown.stderr) == (
        1, "Error: unknown_argument: agent: claim takes no such argument; it takes lease_ms,"
           " task. You always act as your own agent: no tool takes an agent id\n")
    bad_seq = run(["mcp", "--agent", "worker-1", "--call", "ack", "--args", '{"seq": 5}'], db_path)
    assert (bad_seq.exit_code, bad_seq.stderr) == (
        1, "Error: invalid_argument: seq: no message has seq 5; the last seq is 0\n")
    for junk in ("[1]", "{not json"):
        usage = run(["mcp", "--agent", "worker-1", "--call", "ack", "--args", junk], db_path)
        assert usage.exit_code == 2 and "--args" in usage.stderr
    assert rows(bus, "SELECT count(*) FROM task_claims") == [(0,)]


def test_mcp_server_killed_before_the_ack_hands_the_message_out_again(bus: Bus, db_path: Path):
    """At-least-once through the server: kill -9 between poll and ack loses nothing."""
    bus.publish("boss", "task_assign", {"task": "t1"}, to="worker-1")
    pidfile = db_path.parent / "server.pid"
    # sh writes its pid, then becomes the server (exec), so the pid is the server's.
    params = StdioServerParameters(command="sh", cwd=str(db_path.parent), env=checkout_env(),
                                   args=[
        "-c", f'echo $$ > {pidfile}; exec "$0" -m bus.cli --db "$1" mcp --agent worker-1',
        sys.executable, str(db_path)])

    async def poll_then_die() -> dict[str, Any]:
        client = Client(params, cache=None)
        await client.__aenter__()
        polled = await call(client, "poll")
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        try:
            await client.__aexit__(None, None, None)
        except BaseException:  # the transport sees its server vanish; that is the point
            pass
        return polled

    async def poll_and_ack_again() -> tuple[dict[str, Any], dict[str, Any]]:
        async with connected(db_path, "worker-1") as client:
            polled = await call(client, "poll")
            return polled, await call(client, "ack", seq=polled["messages"][0]["seq"])

    first = asyncio.run(poll_then_die())
    second, acked = asyncio.run(poll_and_ack_again())
    assert first["messages"] == second["messages"] and len(first["messages"]) == 1
    assert acked == {"cursor": 1}
    assert rows(bus, "SELECT agent_id, last_acked_seq FROM cursors") == [("worker-1", 1)]


def test_mcp_error_codes_are_the_documented_list():
    """docs/mcp.md's table is the list `CODES` gives out, in the same order and words."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    codes = doc.split("The codes:", 1)[1]  # the tool groups' table comes before it
    table = re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", codes, re.M)
    assert table == list(CODES.items())


def test_mcp_worker_spawn_diff_and_status(bus: Bus, db_path: Path, repo: Path):
    params = StdioServerParameters(  # started in the repository, as a project's client does
        command=sys.executable, cwd=str(repo), env=checkout_env(),
        args=["-m", "bus.cli", "--db", str(db_path), "mcp", "--agent", "lead", "--tools",
              "workers"])

    async def scenario():
        async with Client(params, cache=None) as client:
            spawned = await call(client, "worker_spawn", task="fix-login", worker="w1")
            worktree = Path(spawned["worktree"])
            (worktree / "auth.py").write_text("def login():\n    return True\n")
            git("add", "auth.py", cwd=worktree)
            git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "Fix",
                cwd=worktree)
            diff = await call(client, "worker_diff", worker="w1")
            short = await call(client, "worker_diff", worker="w1", max_chars=100)
            status = await call(client, "worker_status", worker="w1")
            missing = await refusal(client, "worker_diff")  # lead is no worker
            taken = await refusal(client, "worker_spawn", task="other", worker="w1")
            return spawned, diff, short, status, missing, taken

    spawned, diff, short, status, missing, taken = asyncio.run(scenario())
    assert (spawned["worker"], spawned["state"], spawned["branch"]) == (
        "w1", "ASSIGNED", "w1/fix-login")
    assert (diff["base"], diff["branch"]) == ("main", "w1/fix-login")
    assert [line.split("|")[0].strip() for line in diff["files"]] == ["auth.py"]
    assert diff["summary"] == "1 file changed, 2 insertions(+)"
    assert "+def login():" in diff["patch"] and not diff["truncated"]
    assert short["truncated"] and len(short["patch"]) == 100
    assert [w["state"] for w in status["workers"]] == ["ASSIGNED"]
    assert (missing["code"], missing["message"]) == (
        "not_found", "no worker 'lead'; worker_status lists them")
    assert taken["code"] == "conflict" and "choose another worker id" in taken["message"]
    assert rows(bus, "SELECT worker_id, state FROM workers") == [("w1", "ASSIGNED")]


@pytest.mark.parametrize("cli, tool", [
    ("channel: no channel named 'x'; create it with `bus channel create` or list them with"
     " `bus channel list`",
     "channel: no channel named 'x'; create it with channel_create or list them with"
     " channel_list"),
    ("task t1 is taken: worker w2 (WORKING) holds it; wait until it finishes, or"
     " `worker cancel w2`",
     "task t1 is taken: worker w2 (WORKING) holds it; wait until it finishes, or ask whoever"
     " leads to cancel worker w2"),
    ("/r has no commits yet; make a first commit (git commit --allow-empty -m initial) and"
     " spawn again", "/r has no commits yet; make a first commit and spawn again"),
    ("/r has a detached HEAD; pass --base with the branch to work from",
     "/r has a detached HEAD; give base, the branch to work from"),
    ("or pass allow_empty=True to review an empty branch",
     "or pass allow_empty=true to review an empty branch"),
])
def test_mcp_library_hints_are_rewritten_in_tool_terms(cli: str, tool: str):
    assert in_tool_terms(cli) == tool


def test_cli_mcp_call_error_with_json_names_the_argument(bus: Bus, db_path: Path):
    refused = run(["mcp", "--agent", "w1", "--call", "ack", "--args", '{"seq": 9}', "--json"],
                  db_path)
    assert refused.exit_code == 1
    assert json.loads(refused.stderr) == {
        "error": "invalid_argument: seq: no message has seq 9; the last seq is 0",
        "field": "seq"}
