"""An agent: an MCP client drives the installed `bus mcp` over stdio, and the operator watches.

The operator makes a git repository, a bus and a worker with the installed
`git`, `bus` and `worker` commands. The agent is the MCP SDK's own stdio
client (this test's venv), which starts the installed `bus mcp --agent ID`
as a client's configuration would (absolute command, BUS_DB, started
outside the project): it starts its worker (taking the task's lease), beats,
commits its work in its worktree, publishes its result and hands the work
in with `worker_done`. The operator then reads `bus status`, `worker status`
and `bus tail`.

The journey runs once (a module fixture); each test checks one thing a
person would look at.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

pytestmark = pytest.mark.slow

AGENT = "agent-1"
TASK = "write-report"
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "Journey", "GIT_AUTHOR_EMAIL": "journey@example.org",
                "GIT_COMMITTER_NAME": "Journey", "GIT_COMMITTER_EMAIL": "journey@example.org"}
RESULT = {"report": "the login bug was a stale session cookie", "files": ["report.md"]}


@dataclass(frozen=True)
class Journey:
    """What the agent's tools returned and what the operator's commands printed."""

    repo: Path
    tools: set[str]
    started: dict[str, Any]
    beat: dict[str, Any]
    published: dict[str, Any]
    done: dict[str, Any]
    status_working: subprocess.CompletedProcess[str]
    workers_after: subprocess.CompletedProcess[str]
    tail_after: subprocess.CompletedProcess[str]


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's JSON result; a tool error fails the journey with the bus's message."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, (tool, [getattr(c, "text", c) for c in result.content])
    return result.structured_content


@pytest.fixture(scope="module")
def journey(installed, tmp_path_factory: pytest.TempPathFactory) -> Journey:
    repo = tmp_path_factory.mktemp("app")
    env = installed.env(**GIT_IDENTITY)

    def operator(*argv: str) -> subprocess.CompletedProcess[str]:
        done = installed.run(*argv, cwd=repo, env=env)
        assert done.returncode == 0, (argv, done.stderr)
        return done

    for argv in (["git", "init", "-q", "-b", "main"],
                 ["git", "commit", "-q", "--allow-empty", "-m", "initial"]):
        subprocess.run(argv, cwd=repo, env=env, check=True)
    operator("bus", "init")
    operator("worker", "spawn", "--task", TASK, "--worker", AGENT)
    db = repo / ".worker-state" / "bus.db"
    worktree = repo / ".worker-state" / "worktrees" / AGENT
    # As a client's configuration registers it: the absolute command, BUS_DB, and
    # started somewhere else than the project.
    server = StdioServerParameters(command=installed.command("bus"),
                                   args=["mcp", "--agent", AGENT, "--tools", "workers"],
                                   env=installed.env(BUS_DB=str(db), **GIT_IDENTITY),
                                   cwd=str(installed.home))

    async def agent() -> Journey:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            started = await call(session, "worker_start")
            beat = await call(session, "worker_heartbeat", progress=0.5)
            status_working = operator("bus", "status", "--json")
            # The agent's work: a commit in its worktree, made with git as any agent would.
            (worktree / "report.md").write_text(RESULT["report"] + "\n")
            for argv in (["git", "add", "report.md"], ["git", "commit", "-q", "-m", "Report"]):
                subprocess.run(argv, cwd=worktree, env=env, check=True)
            published = await call(session, "publish", type="result", to="operator",
                                   correlation_id=TASK, payload=RESULT)
            done = await call(session, "worker_done", message="report written")
        return Journey(repo, tools, started, beat, published, done, status_working,
                       operator("worker", "status", "--json"),
                       operator("bus", "tail", "--json", "-n", "20"))

    return asyncio.run(agent())


def test_the_agent_starts_its_worker_and_holds_the_tasks_lease(journey: Journey) -> None:
    assert {"worker_start", "worker_heartbeat", "publish", "worker_done"} <= journey.tools
    assert (journey.started["worker"], journey.started["task"], journey.started["state"]) == (
        AGENT, TASK, "WORKING")
    status = json.loads(journey.status_working.stdout)
    (claim,) = status["claims"]["claims"]
    assert (claim["task_id"], claim["agent"]) == (TASK, AGENT)


def test_the_operator_sees_the_agent_beat_while_it_works(journey: Journey) -> None:
    assert journey.beat["state"] == "WORKING"
    status = json.loads(journey.status_working.stdout)
    (agent,) = [a for a in status["agents"] if a["agent"] == AGENT]
    assert (agent["state"], agent["status"], agent["task"], agent["progress"]) == (
        "alive", "working", TASK, 0.5)
    assert status["workers"] == {"WORKING": 1}


def test_the_result_the_agent_published_is_in_the_log(journey: Journey) -> None:
    messages = [json.loads(line) for line in journey.tail_after.stdout.splitlines()]
    (result,) = [m for m in messages if m["type"] == "result"]
    assert result["seq"] == journey.published["seq"]
    assert (result["from"], result["to"], result["correlation_id"], result["payload"]) == (
        AGENT, "operator", TASK, RESULT)
    handed_in = [m for m in messages if m["type"] == "review_request"]
    assert [m["payload"]["message"] for m in handed_in] == ["report written"]


def test_worker_done_hands_the_agents_commit_in_for_review(journey: Journey) -> None:
    head = subprocess.run(["git", "rev-parse", f"{AGENT}/{TASK}"], cwd=journey.repo,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (journey.done["state"], journey.done["head_commit"]) == ("IN_REVIEW", head)
    (worker,) = [json.loads(line) for line in journey.workers_after.stdout.splitlines()]
    assert (worker["worker"], worker["state"], worker["head_commit"], worker["liveness"]) == (
        AGENT, "IN_REVIEW", head, "stopped")


def test_bus_status_shows_the_agent_done_and_in_review(journey: Journey, installed) -> None:
    shown = installed.run("bus", "status", "--json", cwd=journey.repo)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["workers"] == {"IN_REVIEW": 1}
    (agent,) = [a for a in status["agents"] if a["agent"] == AGENT]
    assert (agent["state"], agent["status"]) == ("stopped", "stopped")
    assert status["log"]["last_seq"] > journey.published["seq"]
    text = installed.run("bus", "status", cwd=journey.repo)
    assert text.returncode == 0, text.stderr
    assert "workers: 1 IN_REVIEW" in text.stdout
    agent_row, worker_row = [line.split() for line in text.stdout.splitlines()
                             if line.split()[:1] == [AGENT]]
    assert agent_row[1:2] == ["stopped"]  # the agents table: its last beat
    assert worker_row[1:3] == [TASK, "IN_REVIEW"]  # the workers table: its lifecycle
