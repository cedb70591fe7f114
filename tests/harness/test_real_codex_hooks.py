"""Codex with what `bus hook install codex` writes: the real `codex exec --json`.

The Codex fixture (tests/support/real_clients.py) makes a CODEX_HOME whose config.toml
names the scripted model (Responses API) and a `bus mcp` of its own; the
install merges the bus's hooks and its own [mcp_servers.agentbus] into that
file. Codex runs hooks someone added only once they are trusted; the runs
pass --dangerously-bypass-hook-trust, as automation that vets its hooks does.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from bus import Bus
from tests.support.hook_harness import run
from tests.support.model_api import ScriptedModel
from tests.support.model_api import Text
from tests.support.real_clients import SERVER
from tests.support.real_clients import Codex
from tests.support.real_clients import client_bus  # noqa: F401 - fixture
from tests.support.real_clients import codex  # noqa: F401 - fixture
from tests.support.real_clients import run_client
from tests.support.real_clients import scripted_model  # noqa: F401 - fixture

pytestmark = pytest.mark.real_clients
TRUSTED = "--dangerously-bypass-hook-trust"


@pytest.fixture
def installed_codex(codex: Codex, client_bus: Path) -> Codex:
    (codex.home / "config.toml").write_text(codex.config())  # the fixture's own file, first
    run("bus", ["--db", str(client_bus), "hook", "install", "codex", "--agent", "ann",
                "--codex-home", str(codex.home)], codex.env, codex.cwd)
    config = tomllib.loads((codex.home / "config.toml").read_text())
    assert config["model_provider"] == "scripted"  # the file's own settings are kept
    assert config["mcp_servers"][SERVER]["args"][-3:] == ["mcp", "--agent", "ann"]
    return codex


def run_installed(codex: Codex, prompt: str) -> None:
    """`codex exec` on the installed file as it is (Codex.run would write the fixture's)."""
    run_client(codex.argv(prompt, TRUSTED), codex.env, codex.cwd).check()


def test_codex_hook_delivers_a_waiting_message_and_acks_it(
        installed_codex: Codex, scripted_model: ScriptedModel, client_bus: Path) -> None:
    with Bus.open(client_bus) as bus:
        seq = bus.publish("bob", "note", "read me first", to="ann").seq
    scripted_model.script = [Text("read")]
    run_installed(installed_codex, "hello")
    [first] = scripted_model.agent_requests()
    assert f"#{seq} bob -> ann note" in first.text() and "read me first" in first.text()
    with Bus.open(client_bus) as bus:
        assert bus.poll("ann") == []  # shown, so acknowledged


def test_codex_first_start_has_the_bus_tools(
        installed_codex: Codex, scripted_model: ScriptedModel) -> None:
    scripted_model.script = [Text("listed")]
    run_installed(installed_codex, "hello")
    [first] = scripted_model.agent_requests()
    assert SERVER in json.dumps(first.body["tools"])  # Codex names them mcp__agentbus...
