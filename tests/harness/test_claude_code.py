"""Claude Code's hook contract in the library (bus/harness/claude_code.py): the settings merge as
a Hypothesis property over settings files of every shape Claude Code reads, the event
parser, and the per-session continue counter on real files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.harness import claude_code
from bus.storage.errors import ValidationFailed
from tests.support.properties import scaled_settings

BASE = ["/venv/bin/bus", "--db", "/p/.worker-state/bus.db"]
OURS = claude_code.hook_commands(BASE, "auto", 300, 5)
TIMEOUTS = {event: 60 for event in OURS} | {"Stop": 330}

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                      st.floats(allow_nan=False))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
foreign_command = st.sampled_from(["./check.sh", "npx prettier --write", "bus status",
                                   "python hook.py claude", "jq . >> log"])
our_command = st.sampled_from([OURS["Stop"], "bus hook claude --agent w1",
                               "/old/bin/bus --db x hook claude --agent a --wait 9"])
hook_entry = st.fixed_dictionaries({"type": st.just("command"),
                                    "command": st.one_of(foreign_command, our_command)},
                                   optional={"timeout": st.integers(1, 600)})
matcher_group = st.fixed_dictionaries({"hooks": st.lists(hook_entry, max_size=3)},
                                      optional={"matcher": st.sampled_from(["*", "Edit", ""])})
event_name = st.sampled_from([*claude_code.EVENTS, "PreToolUse", "Notification", "SessionEnd"])
settings_file = st.fixed_dictionaries(
    {}, optional={"hooks": st.dictionaries(event_name, st.lists(matcher_group, max_size=3),
                                           max_size=5),
                  "permissions": json_value, "env": json_value, "model": st.text(max_size=8)})


def ours_in(entries: list) -> list[dict]:
    return [h for group in entries for h in group["hooks"] if claude_code.is_ours(h["command"])]


def foreign_in(entries: list) -> list[dict]:
    return [h for group in entries for h in group["hooks"]
            if not claude_code.is_ours(h["command"])]


@scaled_settings(max_examples=200, deadline=None)
@given(settings_file)
def test_claude_code_merge_keeps_everything_else_and_is_idempotent(before):
    merged = claude_code.merge_settings(before, OURS, TIMEOUTS)
    assert {k: v for k, v in merged.items() if k != "hooks"} == {
        k: v for k, v in before.items() if k != "hooks"}
    old_hooks = before.get("hooks", {})
    for event, entries in old_hooks.items():
        assert foreign_in(merged["hooks"][event]) == foreign_in(entries)  # order kept too
        if event not in OURS:
            assert merged["hooks"][event] == entries
    for event, command in OURS.items():
        assert ours_in(merged["hooks"][event]) == [
            {"type": "command", "command": command, "timeout": TIMEOUTS[event]}]
    assert claude_code.merge_settings(merged, OURS, TIMEOUTS) == merged
    written = claude_code.settings_bytes(merged)
    assert json.loads(written) == merged  # what is written reads back whole
    assert claude_code.settings_bytes(claude_code.merge_settings(merged, OURS, TIMEOUTS)) == (
        claude_code.settings_bytes(merged))


def test_claude_code_merge_refuses_shapes_claude_code_would_not_read():
    with pytest.raises(ValidationFailed, match="hooks: in the settings file is not a JSON object"):
        claude_code.merge_settings({"hooks": []}, OURS, TIMEOUTS)
    with pytest.raises(ValidationFailed, match="hooks.Stop: in the settings file is not a list"):
        claude_code.merge_settings({"hooks": {"Stop": {}}}, OURS, TIMEOUTS)
    allow = claude_code.mcp_allow_rules("agentbus")
    with pytest.raises(ValidationFailed, match="permissions: .* is not a JSON object"):
        claude_code.merge_settings({"permissions": ["x"]}, OURS, TIMEOUTS, allow)
    with pytest.raises(ValidationFailed, match="permissions.allow: .* is not a JSON list"):
        claude_code.merge_settings({"permissions": {"allow": "x"}}, OURS, TIMEOUTS, allow)
    with pytest.raises(ValidationFailed, match="env: .* is not a JSON object"):
        claude_code.merge_env({"env": []}, "BUS_AGENT", "lead")


def test_claude_code_merge_adds_the_mcp_rule_once_and_keeps_every_other_rule():
    before = {"permissions": {"allow": ["Bash(npm test)"], "deny": ["Read(.env)"]}}
    allow = claude_code.mcp_allow_rules("bus-team")
    assert allow == ["mcp__bus-team__*"]
    merged = claude_code.merge_settings(before, OURS, TIMEOUTS, allow)
    assert merged["permissions"] == {"allow": ["Bash(npm test)", "mcp__bus-team__*"],
                                     "deny": ["Read(.env)"]}
    assert claude_code.merge_settings(merged, OURS, TIMEOUTS, allow) == merged
    with pytest.raises(ValidationFailed, match="mcp-server: 'a b' is not an MCP server name"):
        claude_code.mcp_allow_rules("a b")


def test_claude_code_merge_env_names_the_agent_and_keeps_the_rest():
    merged = claude_code.merge_env({"env": {"FOO": "1"}, "model": "x"}, "BUS_AGENT", "lead")
    assert merged == {"env": {"FOO": "1", "BUS_AGENT": "lead"}, "model": "x"}


@pytest.mark.parametrize("value, cap", [(None, 8), ("3", 3), (" 12 ", 12), ("0", 0), ("-1", 8),
                                        ("two", 8), ("", 8), ("2.5", 8)])
def test_claude_code_stop_cap_reads_claude_codes_variable_else_its_default(value, cap):
    environ = {} if value is None else {"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": value}
    assert claude_code.stop_block_cap(environ) == cap
    assert claude_code.continues_allowed(10, environ) == min(10, cap)  # never beyond the cap
    assert claude_code.continues_allowed(1, environ) == min(1, cap)


def test_claude_code_max_continues_above_the_cap_is_refused_with_the_fix():
    claude_code.check_max_continues(8, {})
    with pytest.raises(ValidationFailed, match=r"max-continues: is 9, but Claude Code honours at"
                       r" most 8 Stop blocks in a row \(CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"):
        claude_code.check_max_continues(9, {})
    claude_code.check_max_continues(20, {"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "20"})


def test_claude_code_is_ours_knows_bus_hook_claude_only():
    assert claude_code.is_ours("/x/bin/bus --db '/a b/bus.db' hook claude --agent auto")
    assert not claude_code.is_ours("bus hooks install")
    assert not claude_code.is_ours("mybus hook claude")
    assert not claude_code.is_ours("bus 'unclosed")
    assert not claude_code.is_ours(None)


def test_claude_code_parse_event_reads_the_documented_fields():
    event = claude_code.parse_event(json.dumps({
        "session_id": "abc", "transcript_path": "/t", "cwd": "/w", "hook_event_name": "Stop",
        "stop_hook_active": True}).encode())
    assert event == claude_code.HookEvent("Stop", "abc", "/w", True, "/t")
    assert event.known
    other = claude_code.parse_event(b'{"hook_event_name": "Notification", "stop_hook_active": 1}')
    assert other == claude_code.HookEvent("Notification", None, None, False)
    assert not other.known


def test_claude_code_continue_counter_lives_beside_the_bus_while_a_streak_lasts(tmp_path):
    db = tmp_path / "bus.db"
    counter = claude_code.ContinueCounter(db, "0b6a1f52-3f6e-4f1c-9d55-6c1f0b3c9a10")
    assert counter.count() == 0
    counter.record(2)
    assert claude_code.ContinueCounter(db, "0b6a1f52-3f6e-4f1c-9d55-6c1f0b3c9a10").count() == 2
    assert counter.path == tmp_path / "claude-hooks" / "0b6a1f52-3f6e-4f1c-9d55-6c1f0b3c9a10.json"
    counter.reset()
    assert not counter.path.exists() and counter.count() == 0
    odd = claude_code.ContinueCounter(db, "../../etc/passwd")
    odd.record(1)
    assert odd.path.parent == tmp_path / "claude-hooks" and odd.count() == 1
    odd.path.write_bytes(b'{"contin')  # cut short: counted afresh, never an error
    assert odd.count() == 0
    assert claude_code.ContinueCounter(db, None).count() == 0


def test_claude_code_write_settings_keeps_the_mode_and_reports_no_change(tmp_path):
    path = tmp_path / ".claude" / "settings.json"
    assert claude_code.write_settings(path, {"a": 1})
    path.chmod(0o640)
    assert not claude_code.write_settings(path, {"a": 1})
    assert claude_code.write_settings(path, {"a": 2})
    assert path.stat().st_mode & 0o777 == 0o640
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]


def test_claude_code_streaks_of_sessions_gone_for_a_day_are_pruned(tmp_path):
    db = tmp_path / "bus.db"
    gone = claude_code.ContinueCounter(db, "gone")
    recent = claude_code.ContinueCounter(db, "recent")
    gone.record(1)
    recent.record(1)
    day_ago = time.time() - claude_code.STALE_STREAK_S - 60
    os.utime(gone.path, (day_ago, day_ago))
    claude_code.ContinueCounter(db, "now").record(1)
    assert sorted(p.name for p in (tmp_path / "claude-hooks").iterdir()) == [
        "now.json", "recent.json"]
