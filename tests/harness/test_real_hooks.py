"""The bus's hooks as the real Claude Code runs them: what its model is shown, and what is acked.

Each test installs the hooks with `bus hook install claude`, runs the pinned
Claude Code against the scripted model (tests/support/model_api.py) and a bus file,
then reads both: the model's requests say what it saw, the file what was
acknowledged. Nothing acked may be missing from what the model saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bus import Bus
from tests.support.hook_harness import run
from tests.support.model_api import ModelRequest
from tests.support.model_api import ScriptedModel
from tests.support.model_api import Text
from tests.support.model_api import ToolUse
from tests.support.procs_workers import git
from tests.support.procs_workers import make_repo
from tests.support.real_clients import BUS_TOOLS
from tests.support.real_clients import ClaudeCode
from tests.support.real_clients import ClientRun
from tests.support.real_clients import claude_code  # noqa: F401 - fixture
from tests.support.real_clients import client_bus  # noqa: F401 - fixture
from tests.support.real_clients import scripted_model  # noqa: F401 - fixture

pytestmark = pytest.mark.real_clients

PUBLISH = f"{BUS_TOOLS}publish"


def seen_by_model(model: ScriptedModel) -> str:
    """Everything the agent's requests carried, as one text."""
    return "\n".join(request.text() for request in model.agent_requests())


def no_hook_failed(run: ClientRun) -> None:
    hooks = run.hook_responses()
    assert hooks, "Claude Code ran the bus's hooks"
    assert all(hook["exit_code"] == 0 for hook in hooks), hooks


def publishing(db: Path, text: str, sender: str = "bob", to: str | None = "ann"):
    """A planned turn that first publishes `text` to `to` (as another agent would, meanwhile),
    then ends the turn."""
    def turn(request: ModelRequest) -> Text:
        with Bus.open(db) as bus:
            bus.publish(sender, "note", text, to=to)
        return Text(f"noted before {text}")
    return turn


def test_a_stop_cap_below_max_continues_loses_no_message(
        claude_code: ClaudeCode, scripted_model: ScriptedModel, client_bus: Path) -> None:
    """Claude Code honours CLAUDE_CODE_STOP_HOOK_BLOCK_CAP blocking Stops in a row, then ends the
    turn whatever the hook says. With the cap at 2 below the installed --max-continues 5, every
    turn leaves a new message waiting: the hook blocks twice, and the third message stays
    unacked for the next session instead of being acked into a Stop the client ignores."""
    claude_code.install_hooks("--agent", "ann", "--max-continues", "5", "--no-rewake")
    claude_code.env["CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"] = "2"
    texts = [f"message {n}" for n in range(1, 6)]
    scripted_model.script = [publishing(client_bus, text) for text in texts]
    run = claude_code.run("work").check()
    no_hook_failed(run)
    seen = seen_by_model(scripted_model)
    with Bus.open(client_bus) as bus:
        waiting = [m.payload for m in bus.poll("ann")]
        acked = [m.payload for m in bus.list_messages(0, 100) if m.seq <= bus.cursor("ann")]
    assert acked == ["message 1", "message 2"]  # shown by the two Stops the client honoured
    assert all(text in seen for text in acked)
    assert waiting == ["message 3"]  # not lost: it waits, unacked
    assert "message 3" not in seen


def test_no_agent_is_shown_its_own_messages_and_post_tool_use_is_context_not_an_error(
        claude_code: ClaudeCode, scripted_model: ScriptedModel, client_bus: Path) -> None:
    claude_code.install_hooks("--agent", "ann", "--no-rewake")
    with Bus.open(client_bus) as bus:
        bus.publish("ann", "state_change", {"to": "WORKING"})  # her own broadcast
        bus.publish("ann", "note", "a note to herself", to="ann")  # her own, to herself
        bus.publish("bob", "note", "hello from bob", to="ann")

    def publish_then_wait(request: ModelRequest) -> ToolUse:
        with Bus.open(client_bus) as bus:  # arrives while the tool runs: PostToolUse shows it
            bus.publish("cy", "review", "cy reviewed it", to="ann")
        return ToolUse(PUBLISH, {"type": "task_done", "payload": {"task": "t1"}})

    scripted_model.script = [publish_then_wait, Text("done")]
    run = claude_code.run("finish t1").check()
    no_hook_failed(run)
    first, second = scripted_model.agent_requests()
    assert "hello from bob" in first.text()
    assert "cy reviewed it" in second.text()
    seen = seen_by_model(scripted_model)
    assert "ann -> *" not in seen  # neither her state_change nor her task_done came back
    assert "a note to herself" not in seen
    assert "blocking error" not in seen.lower()
    with Bus.open(client_bus) as bus:
        assert bus.poll("ann") == []
        pending = {cursor.agent: cursor.pending for cursor in bus.list_cursors()}
    assert pending["ann"] == 0  # her own broadcasts do not stand as backlog


def test_a_lead_and_two_workers_share_one_checkout_with_no_failing_hook(
        tmp_path: Path, scripted_model: ScriptedModel) -> None:
    repo = make_repo(tmp_path / "app")
    for session in ("lead", "ann", "bob"):
        (tmp_path / session).mkdir()  # each session's own home and cache
    db = repo / ".worker-state" / "bus.db"
    lead = ClaudeCode(tmp_path / "lead", scripted_model, db, agent="auto")
    env = lead.env
    run("bus", ["--db", str(db), "init"], env, repo)
    lead.cwd = repo
    lead.install_hooks("--agent", "auto", "--no-rewake")
    git(repo, "add", ".claude/settings.json")
    git(repo, "commit", "-qm", "agents: bus hooks")
    lead.install_hooks("--agent", "lead", "--local")
    for worker in ("ann", "bob"):
        run("worker", ["--db", str(db), "spawn", "--task", f"t-{worker}", "--worker", worker],
            env, repo)
    with Bus.open(db) as bus:
        for agent in ("lead", "ann", "bob"):
            bus.publish("orchestrator", "note", f"for {agent} only", to=agent)
    for agent in ("lead", "ann", "bob"):
        claude = (lead if agent == "lead"
                  else ClaudeCode(tmp_path / agent, scripted_model, db, agent="auto"))
        claude.cwd = repo if agent == "lead" else repo / ".worker-state" / "worktrees" / agent
        since = len(scripted_model.requests)
        scripted_model.script = [Text(f"{agent} here")]
        session = claude.run("hello").check()
        no_hook_failed(session)
        [first] = [r for r in scripted_model.requests[since:] if r.offers_tools()]
        assert f"for {agent} only" in first.text()
        assert not [other for other in ("lead", "ann", "bob")
                    if other != agent and f"for {other} only" in first.text()]
        assert first.visible_tools(BUS_TOOLS), "its MCP server started as its agent"
