"""What `bus mcp` lists and how its results read: the lean default, `--tools`, compact results.

The listing is read as a client gets it, from a real `bus mcp` process over its
pipes, and measured in bytes: every model request carries it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bus import Bus
from bus.mcpserver.log_tools import JSON_VALUE_SCHEMA
from bus.mcpserver.results import compact
from bus.mcpserver.schemas import lean_schema
from bus.mcpserver.task_tools import TaskTools
from bus.mcpserver.toolsets import DAILY
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT

LISTING_MAX_BYTES = 8 * 1024
HANDSHAKE = [
    {"jsonrpc": "2.0", "id": 0, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"}]


def served(db_path: Path, cache: Path, *args: str, requests: list[dict[str, Any]]
           ) -> list[dict[str, Any]]:
    """What `bus mcp ARGS` wrote for the handshake and `requests` (ids from 1), in order."""
    lines = b"".join(orjson.dumps(message) + b"\n" for message in HANDSHAKE + requests)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cache), "XDG_CACHE_HOME": str(cache),
           "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "bus.cli", "--db", str(db_path), "mcp", *args],
                          input=lines, capture_output=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return [orjson.loads(line) for line in done.stdout.splitlines()]


def answer(messages: list[dict[str, Any]], request_id: int) -> dict[str, Any]:
    [found] = [m for m in messages if m.get("id") == request_id]
    return found["result"]


def listing(db_path: Path, cache: Path, *args: str) -> tuple[dict[str, Any], list[Any]]:
    """The tools/list result, and everything the server wrote."""
    messages = served(db_path, cache, *args, requests=[
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}])
    return answer(messages, 1), messages


def test_mcp_lists_the_daily_loop_by_default_in_under_8_kb(bus: Bus, db_path: Path,
                                                           tmp_path: Path):
    messages = served(db_path, tmp_path / "cache", requests=[
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 2, "method": "resources/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "resources/templates/list"}])
    tools = answer(messages, 1)
    assert [tool["name"] for tool in tools["tools"]] == list(DAILY)
    assert len(orjson.dumps(tools)) <= LISTING_MAX_BYTES
    # The resources stay discoverable, the worker's too (its group is not listed).
    assert {r["uri"] for r in answer(messages, 2)["resources"]} == {"bus://status", "bus://inbox"}
    assert "bus://workers/{worker}" in {
        t["uriTemplate"] for t in answer(messages, 3)["resourceTemplates"]}
    fixed, _ = listing(db_path, tmp_path / "cache", "--agent", "planner")
    assert [tool["name"] for tool in fixed["tools"]] == [n for n in DAILY if n != "join"]


def test_mcp_listed_schemas_are_lean_and_type_every_payload(bus: Bus, db_path: Path,
                                                            tmp_path: Path):
    tools, _ = listing(db_path, tmp_path / "cache", "--agent", "planner", "--tools", "all")
    schemas = {tool["name"]: tool["inputSchema"] for tool in tools["tools"]}
    assert "title" not in json.dumps(schemas).replace('"title": {', "")  # task_add's argument
    assert "outputSchema" not in json.dumps(tools)
    assert schemas["publish"]["properties"]["to"] == {
        "type": "string", "description": "Recipient agent id; omit to broadcast to all."}
    assert schemas["publish"]["required"] == ["type"]
    for tool, argument in (("publish", "payload"), ("exchange", "payload"),
                           ("reply", "payload"), ("channel_send", "content")):
        typed = schemas[tool]["properties"][argument]
        assert typed["anyOf"] == JSON_VALUE_SCHEMA["anyOf"], tool
    outgoing = schemas["publish_many"]["$defs"]["Outgoing"]["properties"]["payload"]
    assert outgoing["anyOf"] == JSON_VALUE_SCHEMA["anyOf"]


def test_mcp_tools_option_adds_groups_and_names_them_for_an_unknown_one(bus: Bus,
                                                                          db_path: Path):
    chosen = run(["mcp", "--agent", "planner", "--tools", "tasks, files", "--list", "--json"],
                 db_path)
    assert chosen.exit_code == 0, chosen.output
    catalog = json.loads(chosen.stdout)
    names = [tool["name"] for tool in catalog["tools"]]
    daily = [name for name in DAILY if name != "join"]
    tasks = [name for name in TaskTools.TOOLS if name not in DAILY]
    assert names == daily + ["reservations", "reserve_check"] + tasks
    assert [group["name"] for group in catalog["more"]] == ["admin", "channels", "pump",
                                                            "workers"]
    unknown = run(["mcp", "--agent", "planner", "--tools", "tasks,chanels", "--list"], db_path)
    assert unknown.exit_code == 2
    assert last_error(unknown.stderr) == (
        "Error: Invalid value for '--tools': no tool group is named chanels; the groups are"
        " admin, channels, files, pump, tasks, workers, or all (the daily loop is always"
        " listed)\n")
    alone = run(["serve", "--tools", "tasks"], db_path)
    assert alone.exit_code == 2 and "give --mcp too" in alone.stderr


def test_mcp_a_tool_of_a_group_not_listed_is_refused_naming_its_group(bus: Bus, db_path: Path):
    refused = run(["mcp", "--agent", "planner", "--call", "claim", "--args", '{"task": "t1"}'],
                  db_path)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        "Error: unknown_tool: claim: this server does not list it; it is in the tool group"
        " tasks, which the server lists when started with --tools tasks.")
    assert bus.conn.execute("SELECT count(*) FROM task_claims").fetchone() == (0,)


def test_mcp_start_cache_answers_each_tool_choice_with_its_own_listing(bus: Bus, db_path: Path,
                                                                       tmp_path: Path):
    cache = tmp_path / "cache"
    for _ in range(2):  # the second start of each choice is answered from the cache
        lean, _ = listing(db_path, cache, "--agent", "planner")
        every, wrote = listing(db_path, cache, "--agent", "planner", "--tools", "all")
        assert len(lean["tools"]) == len(DAILY) - 1
        assert len(every["tools"]) > 40
        assert "notifications/tools/list_changed" not in {m.get("method") for m in wrote}


def test_mcp_results_leave_out_empty_fields_and_the_twin_of_a_time(bus: Bus, db_path: Path):
    bus.publish("boss", "note", {"keep": None, "empty": []}, to="planner")
    polled = run(["mcp", "--agent", "planner", "--call", "poll"], db_path)
    [message] = json.loads(polled.stdout)["messages"]
    assert set(message) == {"seq", "id", "ts", "from", "to", "type", "payload"}
    assert message["payload"] == {"keep": None, "empty": []}  # what the agent sent, as sent
    nothing = run(["mcp", "--agent", "planner", "--call", "task_claim_next"], db_path)
    assert json.loads(nothing.stdout) == {"claimed": False}


@pytest.mark.parametrize("result, compacted", [
    ({"messages": [], "cursor": 0}, {"messages": [], "cursor": 0}),
    ({"reply": None, "timed_out": True, "acked": False}, {"timed_out": True, "acked": False}),
    ({"sent": {"seq": 1, "ts_ms": 5, "ts": "T", "to": None, "payload": None}},
     {"sent": {"seq": 1, "ts": "T"}}),
    ({"tasks": [{"task": "a", "waiting_on": [], "title": "", "created_at_ms": 5}]},
     {"tasks": [{"task": "a", "created_at_ms": 5}]}),
    ({"reservations": [{"expires_at_ms": 5, "expires": "T", "reason": None}]},
     {"reservations": [{"expires": "T"}]}),
    ({"content": {"a": None}, "payload": ""}, {"content": {"a": None}, "payload": ""}),
])
def test_compact_keeps_each_field_once_and_no_empty_one(result: dict, compacted: dict):
    assert compact(result) == compacted


def test_lean_schema_keeps_an_argument_named_title_and_a_required_nullable():
    schema = {"title": "addArguments", "type": "object", "required": ["when"], "properties": {
        "title": {"title": "Title", "anyOf": [{"type": "string"}, {"type": "null"}],
                  "default": None, "description": "What it is."},
        "when": {"title": "When", "anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    assert lean_schema(schema) == {"type": "object", "required": ["when"], "properties": {
        "title": {"type": "string", "description": "What it is."},
        "when": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}


def test_mcp_docs_table_of_groups_is_what_each_group_adds():
    """docs/mcp.md's "Tools listed" table names each group's tools beyond the daily loop."""
    from bus.mcpserver.server import tool_groups

    doc = (REPO_ROOT / "docs" / "mcp.md").read_text().split("The codes:", 1)[0]
    table = {group: re.findall(r"`([a-z_]+)`", tools) for group, tools in
             re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", doc, re.M)}
    assert table == {name: [tool for tool in group.TOOLS if tool not in DAILY]
                     for name, group in tool_groups().items()}


def test_bus_mcp_help_names_every_tool_of_the_daily_loop() -> None:
    from bus.cli.agents import TOOLS_HELP
    assert [name for name in DAILY if name not in TOOLS_HELP] == []
