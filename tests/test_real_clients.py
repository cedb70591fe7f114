"""The agents' real clients against the bus: Claude Code, Codex and the MCP Inspector.

Each test runs the pinned npm packages (`make clients`; they skip, saying so,
when node is missing) with a scripted model on 127.0.0.1 (tests/model_api.py),
and asserts on what the model was shown and what reached the bus file.
Select them with `pytest -m real_clients`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus import Bus
from tests.model_api import ScriptedModel
from tests.model_api import Text
from tests.model_api import ToolUse
from tests.real_clients import BUS_TOOLS
from tests.real_clients import ClaudeCode
from tests.real_clients import claude_code  # noqa: F401 - fixture
from tests.real_clients import client_bus  # noqa: F401 - fixture
from tests.real_clients import scripted_model  # noqa: F401 - fixture

pytestmark = pytest.mark.real_clients


def stored_messages(db: Path) -> list[dict]:
    """Every message in the file, in order, whoever it is for."""
    with Bus.open(db) as bus:
        return [{"from": row[0], "to": row[1], "type": row[2], "payload": json.loads(row[3]),
                 "id": row[4]} for row in bus.conn.execute(
                     "SELECT from_agent, to_agent, type, payload, id FROM messages ORDER BY seq")]


def test_claude_code_tool_call_reaches_the_bus_and_its_result_the_model(
        claude_code: ClaudeCode, scripted_model: ScriptedModel, client_bus: Path) -> None:
    scripted_model.script = [
        ToolUse(f"{BUS_TOOLS}publish", {"type": "note", "to": "bob", "payload": {"n": 1}}),
        Text("published")]
    run = claude_code.run("tell bob n=1").check()
    assert run.events[-1]["type"] == "result" and run.events[-1]["result"] == "published"
    [message] = stored_messages(client_bus)
    assert (message["from"], message["to"], message["type"], message["payload"]) == (
        "ann", "bob", "note", {"n": 1})
    first, second = scripted_model.agent_requests()
    assert f"{BUS_TOOLS}publish" in first.visible_tools(BUS_TOOLS)
    [result] = second.tool_results()
    assert json.loads(result)["id"] == message["id"]
