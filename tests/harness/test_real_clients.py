"""The agents' real clients against the bus: Claude Code, Codex and the MCP Inspector.

Each test runs the pinned npm packages (`make clients`; they skip, saying so,
when node is missing) with a scripted model on 127.0.0.1 (tests/support/model_api.py),
and asserts on what the model was shown and what reached the bus file.
Select them with `pytest -m real_clients`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from bus import Bus
from tests.support.hook_harness import run
from tests.support.model_api import ModelRequest
from tests.support.model_api import ScriptedModel
from tests.support.model_api import Text
from tests.support.model_api import ToolUse
from tests.support.real_clients import BUS_TOOLS
from tests.support.real_clients import CLIENT_TIMEOUT
from tests.support.real_clients import ClaudeCode
from tests.support.real_clients import Codex
from tests.support.real_clients import Inspector
from tests.support.real_clients import InteractiveClaude
from tests.support.real_clients import bus_mcp_argv
from tests.support.real_clients import claude_code  # noqa: F401 - fixture
from tests.support.real_clients import claude_version
from tests.support.real_clients import client_bus  # noqa: F401 - fixture
from tests.support.real_clients import codex  # noqa: F401 - fixture
from tests.support.real_clients import inspector  # noqa: F401 - fixture
from tests.support.real_clients import interactive_claude  # noqa: F401 - fixture
from tests.support.real_clients import scripted_model  # noqa: F401 - fixture
from tests.support.real_clients import stall_the_sdk
from tests.support.real_clients import tap_log
from tests.mcp.test_remote import McpServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_clients

PUBLISH = f"{BUS_TOOLS}publish"
START_CACHE_TIMEOUT = 60.0


def stored_messages(db: Path) -> list[dict]:
    """Every message in the file, in order, whoever it is for."""
    with Bus.open(db) as bus:
        return [{"from": row[0], "to": row[1], "type": row[2],
                 "payload": None if row[3] is None else json.loads(row[3]), "id": row[4]}
                for row in bus.conn.execute(
                     "SELECT from_agent, to_agent, type, payload, id FROM messages ORDER BY seq")]


def first_agent_request(model: ScriptedModel, since: int) -> ModelRequest:
    """The first request of the agent's turn among those after the `since` first ones."""
    return next(r for r in model.requests[since:] if r.offers_tools())


# --- Claude Code: the bus's tools at every start ------------------------------------------


def start_cache(claude: ClaudeCode) -> Path:
    """`bus mcp`'s start cache (bus/mcpserver/stdio.py) in the client's XDG_CACHE_HOME."""
    return claude.cache / "agentbus" / "mcp-start.json"


def warm_start_cache(claude: ClaudeCode, model: ScriptedModel) -> None:
    """One start whose model holds its turn until `bus mcp` has written its start cache, so
    the server lives until the SDK has answered the client's first requests."""
    def hold(request: ModelRequest) -> Text:
        wait_until(start_cache(claude).exists, "bus mcp's start cache", START_CACHE_TIMEOUT)
        return Text("warm")
    model.script = [hold]
    claude.run("hello").check()


def forget_client_version(claude: ClaudeCode) -> None:
    """Make the cache's answers those of another Claude Code version than the one that starts
    (where the cache names the client's version at all)."""
    cache = start_cache(claude)
    cache.write_text(cache.read_text().replace(claude_version(), "0.0.1-never-seen"))


START_MODES = [("cold", 7), ("warm", 7), ("unseen_version", 6)]  # 20 starts in all


@pytest.mark.parametrize(("mode", "starts"), START_MODES)
def test_claude_code_first_request_offers_the_bus_tools_at_every_start(
        mode: str, starts: int, claude_code: ClaudeCode, scripted_model: ScriptedModel) -> None:
    if mode != "cold":
        warm_start_cache(claude_code, scripted_model)
    missing, waits = [], []
    for start in range(starts):
        if mode == "cold":
            shutil.rmtree(claude_code.cache / "agentbus", ignore_errors=True)
        elif mode == "unseen_version":
            forget_client_version(claude_code)
        since = len(scripted_model.requests)
        scripted_model.script = [Text("done")]
        started = time.monotonic()
        claude_code.run("hello").check()
        first = first_agent_request(scripted_model, since)
        waits.append(round(first.at - started, 2))
        if PUBLISH not in first.visible_tools(BUS_TOOLS):
            missing.append(start)
    assert not missing, (f"{mode} starts: the bus's tools were missing from the first model "
                         f"request of starts {missing} (of {starts}); the first request came "
                         f"after {waits} s")


def test_claude_code_first_request_offers_the_bus_tools_before_the_sdk_has_loaded(
        scripted_model: ScriptedModel, client_bus: Path, tmp_path: Path) -> None:
    """Everything Claude Code asks at start is answered by `bus mcp`'s fast start: with an
    SDK that never loads, its first request offers the tools all the same."""
    traffic = tmp_path / "mcp-traffic.jsonl"
    claude = ClaudeCode(tmp_path, scripted_model, client_bus, mcp_log=traffic)
    stall_the_sdk(claude.env, tmp_path)
    scripted_model.script = [Text("done")]
    claude.run("hello").check()
    offered = first_agent_request(scripted_model, 0).visible_tools(BUS_TOOLS)
    unanswered = unanswered_requests(tap_log(traffic))
    assert PUBLISH in offered, f"the first model request offered {sorted(offered)}; " \
                               f"`bus mcp` left unanswered: {unanswered}"
    # Claude Code holds its first request until the server acknowledges its
    # subscriptions/listen, and cancels it after 27 s: an answer only the SDK gives
    # delays every start by the SDK's load.
    assert not unanswered, f"`bus mcp` left unanswered: {unanswered}"


def unanswered_requests(traffic: list[dict]) -> list[str]:
    """The methods of the client's requests the server never answered, from the tap's log.
    A `subscriptions/listen` is answered by the notification that acknowledges it."""
    asked = {entry["message"]["id"]: entry["message"]["method"] for entry in traffic
             if entry["from"] == "client" and "method" in entry["message"]
             and "id" in entry["message"]}
    for entry in traffic:
        message = entry["message"]
        if entry["from"] != "server":
            continue
        meta = (message.get("params") or {}).get("_meta") or {}
        asked.pop(meta.get("io.modelcontextprotocol/subscriptionId")
                  if "method" in message else message.get("id"), None)
    return sorted(asked.values())


def test_claude_code_tool_call_reaches_the_bus_and_its_result_the_model(
        claude_code: ClaudeCode, scripted_model: ScriptedModel, client_bus: Path) -> None:
    scripted_model.script = [ToolUse(PUBLISH, {"type": "note", "to": "bob", "payload": {"n": 1}}),
                             Text("published")]
    run = claude_code.run("tell bob n=1").check()
    assert run.events[-1]["type"] == "result" and run.events[-1]["result"] == "published"
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"], message["type"], message["payload"]) == (
        "ann", "bob", "note", {"n": 1})
    first, second = scripted_model.agent_requests()
    assert PUBLISH in first.visible_tools(BUS_TOOLS)
    [result] = second.tool_results()
    assert json.loads(result)["id"] == message["id"]


def test_claude_code_shows_the_model_a_waiting_message_through_the_installed_hooks(
        claude_code: ClaudeCode, scripted_model: ScriptedModel, client_bus: Path) -> None:
    claude_code.install_hooks("--agent", "ann")
    with Bus.open(client_bus) as bus:
        bus.publish("bob", "note", {"text": "the build is red"}, to="ann")
    scripted_model.script = [Text("seen")]
    run = claude_code.run("hello").check()
    assert "the build is red" in scripted_model.agent_requests()[0].text()
    hooks = run.hook_responses()
    assert hooks and all(hook["exit_code"] == 0 for hook in hooks), hooks


def test_claude_code_interactive_session_with_the_hooks_goes_idle_and_takes_a_prompt(
        interactive_claude: InteractiveClaude, scripted_model: ScriptedModel,
        client_bus: Path) -> None:
    interactive_claude.claude.install_hooks("--agent", "ann")
    interactive_claude.start()
    scripted_model.script = [ToolUse(PUBLISH, {"type": "note", "to": "bob"}), Text("sent it")]
    since = interactive_claude.prompt("tell bob hello")
    scripted_model.wait_for_text("tell bob hello", since, CLIENT_TIMEOUT)
    screen = interactive_claude.wait_idle("the session idle again after its turn")
    assert "sent it" in screen
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"], message["type"]) == ("ann", "bob", "note")


# --- Codex ---------------------------------------------------------------------------------


def test_codex_exec_first_start_offers_the_bus_tools_and_calls_them(
        codex: Codex, scripted_model: ScriptedModel, client_bus: Path) -> None:
    scripted_model.script = [ToolUse(PUBLISH, {"type": "note", "to": "bob", "payload": {"n": 2}}),
                             Text("published")]
    run = codex.run("tell bob n=2").check()
    first = scripted_model.agent_requests("responses")[0]
    assert PUBLISH in first.visible_tools(BUS_TOOLS), (
        "codex exec's first request had no bus tools: `bus mcp` was not ready in time")
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"], message["payload"]) == ("ann", "bob", {"n": 2})
    [result] = scripted_model.agent_requests("responses")[1].tool_results()
    assert message["id"] in result
    assert [e["item"]["text"] for e in run.events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"] == ["published"]


def test_codex_exec_first_request_offers_the_bus_tools_before_the_sdk_has_loaded(
        scripted_model: ScriptedModel, client_bus: Path, tmp_path: Path) -> None:
    traffic = tmp_path / "mcp-traffic.jsonl"
    codex = Codex(tmp_path, scripted_model, client_bus, mcp_log=traffic)
    stall_the_sdk(codex.env, tmp_path)
    scripted_model.script = [Text("done")]
    codex.run("hello").check()
    offered = scripted_model.agent_requests("responses")[0].visible_tools(BUS_TOOLS)
    unanswered = unanswered_requests(tap_log(traffic))
    assert PUBLISH in offered, f"the first model request offered {sorted(offered)}; " \
                               f"`bus mcp` left unanswered: {unanswered}"
    assert not unanswered, f"`bus mcp` left unanswered: {unanswered}"


# --- the MCP Inspector ---------------------------------------------------------------------


def test_inspector_lists_and_calls_the_tools_over_stdio(inspector: Inspector,
                                                        client_bus: Path) -> None:
    server = bus_mcp_argv(client_bus, "ann")
    listed = inspector.result(server, "tools/list")
    assert "publish" in [tool["name"] for tool in listed["tools"]]
    called = inspector.result(server, "tools/call", "--tool-name", "publish",
                              "--tool-arg", "type=note", "to=bob")
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"], message["type"]) == ("ann", "bob", "note")
    assert called["structuredContent"]["id"] == message["id"]


def test_inspector_lists_and_calls_the_tools_over_http_with_a_token(
        inspector: Inspector, client_bus: Path, tmp_path: Path) -> None:
    token = json.loads(run("bus", ["--db", str(client_bus), "token", "create", "--agent", "ann",
                                   "--json"], inspector.env, tmp_path).stdout)["token"]
    server = McpServer(client_bus, inspector.env)
    try:
        target = [server.mcp, "--transport", "http"]
        bearer = ("--header", f"Authorization: Bearer {token}")
        listed = inspector.result(target, "tools/list", *bearer)
        assert "publish" in [tool["name"] for tool in listed["tools"]]
        called = inspector.result(target, "tools/call", "--tool-name", "publish",
                                  "--tool-arg", "type=note", "to=bob", *bearer)
        refused = inspector.call(target, "tools/list")
    finally:
        server.stop()
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"]) == ("ann", "bob")
    assert called["structuredContent"]["id"] == message["id"]
    assert refused.returncode != 0 and "publish" not in refused.stdout  # no token, no tools
