"""The task graph over MCP: two agents as real `bus mcp` servers, driven by the SDK's client."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus import Bus
from tests.mcp.test_mcp import call
from tests.mcp.test_mcp import connected
from tests.mcp.test_mcp import refused
from tests.mcp.test_mcp import rows


def test_mcp_tasks_two_agents_work_through_a_graph(bus: Bus, db_path: Path):
    async def scenario():
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            await call(alice, "task_add", task="design", title="Design it", priority=1)
            await call(alice, "task_add", task="build", after=["design"])
            unknown = await refused(alice, "task_add", task="ship", after=["nope"])
            cycle = await refused(alice, "task_depend", task="design", after=["build"])
            ready = await call(bob, "task_ready")
            taken = await call(bob, "task_claim_next", lease_ms=60_000)
            nothing = await call(alice, "task_claim_next")
            not_holder = await refused(alice, "task_done", task="design")
            done = await call(bob, "task_done", task="design", fence=taken["fence"])
            shown = await call(alice, "task_show", task="build")
            listed = await call(alice, "task_list", state="done")
            cancelled = await call(alice, "task_cancel", task="build", reason="enough")
            return (unknown, cycle, ready, taken, nothing, not_holder, done, shown, listed,
                    cancelled)

    (unknown, cycle, ready, taken, nothing, not_holder, done, shown, listed,
     cancelled) = asyncio.run(scenario())
    assert "after: no task 'nope' in the task graph" in unknown
    assert "design -> build -> design" in cycle
    assert [t["task"] for t in ready["tasks"]] == ["design"]
    assert (taken["claimed"], taken["task"], taken["agent"]) == (True, "design", "bob")
    assert nothing == {"claimed": False}  # no task: left out
    assert "alice does not hold design (bob holds it)" in not_holder
    assert (done["state"], done["finished_by"]) == ("done", "bob")
    assert (shown["ready"], shown["dependencies"][0]["state"]) == (True, "done")
    assert [t["task"] for t in listed["tasks"]] == ["design"]
    assert cancelled["state"] == "cancelled"
    assert rows(bus, "SELECT from_agent, type, correlation_id FROM messages ORDER BY seq") == [
        ("bob", "task_done", "design"), ("alice", "task_cancelled", "build")]
    assert rows(bus, "SELECT task_id, state FROM tasks ORDER BY seq") == [
        ("design", "done"), ("build", "cancelled")]
