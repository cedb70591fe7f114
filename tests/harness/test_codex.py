"""bus/harness/codex.py and `bus hook install codex` / `bus hook codex`: Codex's config.toml and hooks."""

from __future__ import annotations

import json
import tomllib

import pytest

from bus import Bus
from bus.harness import codex
from bus.storage.errors import ValidationFailed
from tests.support.hook_harness import child_env
from tests.support.hook_harness import run

USERS = """# my settings
model = "o3"  # the one I like

[mcp_servers.other]
command = "other-server"

[[hooks.Stop]]
[[hooks.Stop.hooks]]
type = "command"
command = "./notify.sh"
"""
SERVER = ["/bin/bus", "--db", "/p/bus.db", "mcp", "--agent", "w1"]


def merged(text: str, agent: str = "w1") -> str:
    commands = codex.hook_commands(["/bin/bus", "--db", "/p/bus.db"], agent)
    return codex.merge_config(text, commands, 60, SERVER, {})


def test_codex_merge_keeps_the_users_settings_comments_and_hooks():
    text = merged(USERS)
    assert text.startswith(USERS.split("[[hooks.Stop]]")[0])  # comments and layout as they were
    config = tomllib.loads(text)
    assert config["model"] == "o3" and config["mcp_servers"]["other"] == {
        "command": "other-server"}
    assert config["mcp_servers"]["agentbus"] == {"command": "/bin/bus", "args": SERVER[1:]}
    stop_hooks = [h["command"] for entry in config["hooks"]["Stop"] for h in entry["hooks"]]
    assert stop_hooks == ["./notify.sh", "/bin/bus --db /p/bus.db hook codex --agent w1"]
    assert set(config["hooks"]) == {"SessionStart", "UserPromptSubmit", "Stop"}


def test_codex_merge_twice_gives_the_same_text_and_replaces_ours_in_place():
    once = merged(USERS)
    assert merged(once) == once
    other = tomllib.loads(merged(once, agent="w2"))
    commands = [h["command"] for e in other["hooks"]["Stop"] for h in e["hooks"]]
    assert commands == ["./notify.sh", "/bin/bus --db /p/bus.db hook codex --agent w2"]


@pytest.mark.parametrize("text, field", [("[hooks", "codex-home"), ("hooks = 3\n", "hooks")])
def test_codex_merge_refuses_a_file_codex_would_not_read(text, field):
    with pytest.raises(ValidationFailed) as raised:
        merged(text)
    assert raised.value.field == field


def test_install_codex_writes_the_file_and_says_so_as_json(tmp_path):
    env = child_env(tmp_path)
    db = tmp_path / "bus.db"
    Bus.open(db, create=True).close()
    home = tmp_path / "codex-home"
    args = ["--db", str(db), "hook", "install", "codex", "--agent", "w1", "--codex-home",
            str(home), "--json"]
    first = json.loads(run("bus", args, env, tmp_path).stdout)
    assert first == {"config": str(home / "config.toml"), "changed": True,
                     "events": ["SessionStart", "UserPromptSubmit", "Stop"],
                     "mcp_server": "agentbus"}
    assert json.loads(run("bus", args, env, tmp_path).stdout)["changed"] is False
    bad = run("bus", [*args[:5], "w 1", *args[6:]], env, tmp_path, check=False)
    assert bad.returncode == 2 and b"agent" in bad.stderr


def test_hook_codex_answers_as_the_claude_hook_does(tmp_path):
    env = child_env(tmp_path)
    db = tmp_path / "bus.db"
    with Bus.open(db, create=True) as bus:
        seq = bus.publish("planner", "note", "hi", to="w1").seq
    event = {"session_id": "s1", "cwd": str(tmp_path), "hook_event_name": "UserPromptSubmit",
             "prompt": "go"}
    done = run("bus", ["--db", str(db), "hook", "codex", "--agent", "w1"], env, tmp_path,
               input=json.dumps(event).encode())
    context = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert f"#{seq} planner -> w1 note" in context
    with Bus.open(db) as bus:
        assert bus.poll("w1") == []
