"""`bus hook claude`, `bus hook install claude` and `bus inbox`, through the installed `bus`.

Contract tests send each documented event's JSON on stdin and check the JSON
on stdout (bus/harness/claude_code.py cites Claude Code's hooks reference). A scripted
session (tests/support/hook_harness.py) follows the documented Stop behaviour end to
end, with the hooks `bus hook install claude` wrote. Waits are conditions with
deadlines; nothing asserts a duration.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

import bus.migrations
from bus import Bus
from bus.log import glance
from tests.support.hook_harness import ClaudeSession
from tests.support.hook_harness import child_env
from tests.support.hook_harness import has_inotify_fd
from tests.support.hook_harness import installed
from tests.support.hook_harness import run
from tests.support.procs_workers import make_repo
from tests.support.waiting import wait_until

WAIT_S = 30  # a Stop hook's --wait, far above how long a wake takes


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return child_env(tmp_path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "bus.db"
    path.parent.mkdir()
    Bus.open(path).close()
    return path


def hook(db: Path, env: dict, event: dict, *flags: str, agent: str = "w1", cwd: Path | None = None,
         raw: bytes | None = None) -> subprocess.CompletedProcess:
    stdin = raw if raw is not None else json.dumps(event).encode()
    return run("bus", ["--db", str(db), "hook", "claude", "--agent", agent, *flags], env,
               cwd or db.parent, input=stdin, check=False)


def event(name: str, **extra) -> dict:
    return {"session_id": "0b6a1f52-3f6e-4f1c-9d55-6c1f0b3c9a10", "transcript_path": "/t.jsonl",
            "cwd": "/", "hook_event_name": name, **extra}


def publish(db: Path, *messages: tuple[str, object], to: str = "w1") -> list[int]:
    with Bus.open(db) as bus:
        return [bus.publish("planner", kind, payload, to=to).seq for kind, payload in messages]


def cursor(db: Path, agent: str = "w1") -> int:
    with Bus.open(db) as bus:
        return bus.cursor(agent)


def answer(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    return json.loads(done.stdout)


# --- the contract, event by event ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["SessionStart", "UserPromptSubmit"])
def test_hook_context_events_add_the_messages_as_context_and_ack_them(db, env, name):
    seqs = publish(db, ("task_assign", {"task": "t1"}), ("note", "read the README first"))
    out = answer(hook(db, env, event(name)))
    assert set(out) == {"hookSpecificOutput"}
    assert out["hookSpecificOutput"]["hookEventName"] == name
    text = out["hookSpecificOutput"]["additionalContext"]
    lines = text.splitlines()
    assert lines[0] == "agentbus: 2 messages for w1:"
    assert lines[1].startswith(f"#{seqs[0]} planner -> w1 task_assign id=")
    assert lines[2] == '{"task":"t1"}'
    assert lines[3].startswith(f"#{seqs[1]} planner -> w1 note id=")
    assert lines[4] == "read the README first"
    assert cursor(db) == seqs[-1]
    again = hook(db, env, event(name))
    assert (again.returncode, again.stdout, again.stderr) == (0, b"", b"")


def test_hook_post_tool_use_adds_the_messages_as_context_not_as_a_block(db, env):
    """`decision: block` after a tool is shown as a "hook blocking error": messages are not."""
    [seq] = publish(db, ("review", {"file": "a.py", "verdict": "fix the typo"}))
    out = answer(hook(db, env, event("PostToolUse", tool_name="Edit", tool_input={},
                                     tool_response={})))
    assert set(out) == {"hookSpecificOutput"}
    assert out["hookSpecificOutput"]["hookEventName"] == "PostToolUse"
    text = out["hookSpecificOutput"]["additionalContext"]
    assert text.startswith("agentbus: 1 message for w1:\n#")
    assert '{"file":"a.py","verdict":"fix the typo"}' in text
    assert cursor(db) == seq
    quiet = hook(db, env, event("PostToolUse", tool_name="Edit"))
    assert (quiet.returncode, quiet.stdout) == (0, b"")


def test_hook_stop_with_messages_blocks_and_without_lets_the_session_stop(db, env):
    quiet = hook(db, env, event("Stop", stop_hook_active=False))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, b"", b"")
    [seq] = publish(db, ("question", "which branch?"))
    out = answer(hook(db, env, event("Stop", stop_hook_active=False)))
    assert out["decision"] == "block" and "which branch?" in out["reason"]
    assert cursor(db) == seq


def test_hook_stop_continues_at_most_max_continues_times_in_a_row(db, env):
    def stop(active: bool) -> subprocess.CompletedProcess:
        publish(db, ("ping", None))
        return hook(db, env, event("Stop", stop_hook_active=active), "--max-continues", "2")

    assert answer(stop(False))["decision"] == "block"
    assert answer(stop(True))["decision"] == "block"
    acked = cursor(db)
    third = stop(True)  # a third continue in a row: the session may stop
    assert (third.returncode, third.stdout) == (0, b"")
    assert cursor(db) == acked  # the message it did not show waits for the next turn
    assert answer(stop(False))["decision"] == "block"  # a new turn starts a new count


def test_hook_stop_streak_file_exists_only_during_a_streak(db, env):
    publish(db, ("ping", None))
    answer(hook(db, env, event("Stop", stop_hook_active=False)))
    [state] = list((db.parent / "claude-hooks").iterdir())
    assert json.loads(state.read_text()) == {"continues": 1}
    quiet = hook(db, env, event("Stop", stop_hook_active=True))
    assert quiet.stdout == b""
    assert list((db.parent / "claude-hooks").iterdir()) == []


@pytest.mark.parametrize("name", ["Notification", "PreCompact", "SubagentStop", "PreToolUse"])
def test_hook_unknown_events_are_a_no_op(db, env, name):
    [seq] = publish(db, ("note", "x"))
    done = hook(db, env, event(name))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert cursor(db) == 0 and seq == 1


@pytest.mark.parametrize("raw, says", [
    (b"not json", "is not JSON"),
    (b"[1, 2]", "is JSON list, not the object"),
    (b'{"session_id": "s"}', "has no hook_event_name"),
    (b"", "is not JSON"),
])
def test_hook_malformed_stdin_is_a_non_blocking_error(db, env, raw, says):
    publish(db, ("note", "x"))
    done = hook(db, env, {}, raw=raw)
    assert done.returncode == 1  # not 2: Claude Code reads 2 as "block"
    assert done.stdout == b""
    assert done.stderr.decode().startswith("Error: stdin: ") and says in done.stderr.decode()
    assert cursor(db) == 0


def test_hook_usage_errors_exit_1_not_2(db, env):
    done = run("bus", ["--db", str(db), "hook", "claude", "--agent", "w1", "--wait", "-1"], env,
               db.parent, input=b"{}", check=False)
    assert done.returncode == 1 and b"--wait" in done.stderr
    missing = run("bus", ["--db", str(db), "hook", "claude"], env, db.parent, input=b"{}",
                  check=False)
    assert missing.returncode == 1 and b"--agent" in missing.stderr


def test_hook_shows_what_fits_and_acks_only_that(db, env):
    seqs = publish(db, *[("note", f"n{i}") for i in range(3)])
    out = answer(hook(db, env, event("UserPromptSubmit"), "--limit", "2"))
    text = out["hookSpecificOutput"]["additionalContext"]
    assert "n0" in text and "n1" in text and "n2" not in text
    assert text.splitlines()[-1].startswith("More messages wait for w1")
    assert cursor(db) == seqs[1]
    rest = answer(hook(db, env, event("UserPromptSubmit")))
    assert "n2" in rest["hookSpecificOutput"]["additionalContext"]


def test_hook_long_bodies_are_cut_and_the_text_keeps_its_budget(db, env):
    inline, blob, *_ = publish(db, ("inline", "y" * 3000),
                               *[("blob", "x" * 5000) for _ in range(8)])
    out = answer(hook(db, env, event("SessionStart")))
    text = out["hookSpecificOutput"]["additionalContext"]
    assert len(text) < 10_000
    assert ("y" * 2000 + f"... (cut; 3000 bytes in all: poll with seq={inline} for the rest)"
            in text)
    # in the blob store: its JSON, read in part
    assert f"... (cut; 5002 bytes in all: poll with seq={blob} for the rest)" in text
    assert cursor(db) < 9  # the rest wait for the next hook


# --- the documented Stop behaviour, end to end --------------------------------------------------


def installed_session(tmp_path: Path, db: Path, env: dict, cwd: Path, *flags: str
                      ) -> ClaudeSession:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "w1", "--project",
                str(project), *flags], env, tmp_path)
    settings = json.loads((project / ".claude" / "settings.json").read_text())
    commands = {name: entries[0]["hooks"][0]["command"]
                for name, entries in settings["hooks"].items()}
    return ClaudeSession(commands, cwd, env)


def test_hook_session_waiting_in_stop_hears_a_message_published_meanwhile(tmp_path, db, env):
    session = installed_session(tmp_path, db, env, tmp_path, "--wait", str(WAIT_S))
    publish(db, ("task_assign", {"task": "t1"}))
    session.session_start()
    assert '{"task":"t1"}' in session.inputs[-1]
    session.prompt("go")
    assert session.tool().output is None  # nothing new after the tool
    proc = session.start_stop()
    try:
        # The hook looked, found nothing, and now waits on the bus (its inotify watch).
        wait_until(lambda: has_inotify_fd(proc.pid) or proc.poll() is not None,
                   "the Stop hook to start waiting", 20)
        assert proc.poll() is None, "the Stop hook returned before anything was published"
        sent = run("bus", ["--db", str(db), "publish", "--from", "planner", "--to", "w1",
                           "--type", "review", "--payload", '{"verdict": "redo"}'], env, tmp_path)
        assert sent.returncode == 0
        # It answers long before its --wait ends: woken by the commit, not by its timer.
        stopped = session.finish_stop(proc, timeout=WAIT_S - 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not stopped
    assert '{"verdict":"redo"}' in session.inputs[-1]
    assert session.stop_hook_active


def test_hook_session_with_nothing_pending_stops(tmp_path, db, env):
    session = installed_session(tmp_path, db, env, tmp_path)
    session.session_start()
    session.prompt("hello")
    assert session.stop()
    assert session.inputs == ["hello"]


def test_hook_session_continues_then_stops_when_the_work_is_done(tmp_path, db, env):
    session = installed_session(tmp_path, db, env, tmp_path, "--max-continues", "3")
    session.prompt("start")
    publish(db, ("task", "one"))
    assert not session.stop()
    assert session.stop()  # nothing more: the streak ends, the session stops
    assert session.inputs[-1].endswith("\none")


# --- --agent auto from a worker's worktree -------------------------------------------------------


def test_hook_agent_auto_in_a_spawned_worktree_is_that_worker(tmp_path, env):
    repo = make_repo(tmp_path / "repo")
    db = tmp_path / "state" / "bus.db"
    spawned = run("worker", ["--db", str(db), "spawn", "--task", "t1", "--worker", "w7",
                             "--json"], env, repo)
    worktree = Path(json.loads(spawned.stdout)["worktree"])
    publish(db, ("hint", "look at src/"), to="w7")
    # The event's cwd decides, wherever Claude Code started the hook process.
    out = answer(run("bus", ["--db", str(db), "hook", "claude", "--agent", "auto"], env,
                     tmp_path, input=json.dumps(event("SessionStart") | {
                         "cwd": str(worktree)}).encode(), check=False))
    text = out["hookSpecificOutput"]["additionalContext"]
    assert text.startswith("agentbus: ") and " for w7:" in text.splitlines()[0]
    assert "look at src/" in text
    publish(db, ("hint", "and tests/"), to="w7")
    listed = run("bus", ["--db", str(db), "inbox", "--agent", "auto", "--format", "json"], env,
                 worktree)
    assert json.loads(listed.stdout)["agent"] == "w7"
    outside = run("bus", ["--db", str(db), "inbox", "--agent", "auto"], env, repo, check=False)
    assert outside.returncode == 2 and outside.stdout == b""
    assert b"auto found no worker whose worktree contains" in outside.stderr
    # Claude Code names the session's project directory; Claude may have cd'ed out of it.
    publish(db, ("hint", "third"), to="w7")
    moved = answer(run("bus", ["--db", str(db), "hook", "claude", "--agent", "auto"],
                       env | {"CLAUDE_PROJECT_DIR": str(worktree)}, tmp_path,
                       input=json.dumps(event("UserPromptSubmit") | {"cwd": str(repo)}).encode(),
                       check=False))
    assert "third" in moved["hookSpecificOutput"]["additionalContext"]


# --- install ----------------------------------------------------------------------------------


EXISTING = {
    "permissions": {"allow": ["Bash(npm test)"]},
    "env": {"FOO": "1"},
    "hooks": {
        "PostToolUse": [{"matcher": "Edit|Write",
                         "hooks": [{"type": "command", "command": "npx prettier --write"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "./check.sh", "timeout": 5}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "guard"}]}],
    },
}


def install(db: Path, env: dict, project: Path, *flags: str) -> subprocess.CompletedProcess:
    return run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "auto",
                       "--project", str(project), *flags], env, project)


def test_install_creates_the_settings_file(tmp_path, db, env):
    done = install(db, env, tmp_path, "--wait", "300")
    path = tmp_path / ".claude" / "settings.json"
    assert done.stdout.decode() == (f"hooks for SessionStart, UserPromptSubmit, PostToolUse,"
                                    f" Stop, SessionEnd, the idle wake on SessionStart, Stop and the rule"
                                    f" mcp__agentbus__* written to {path}\n")
    settings = json.loads(path.read_text())
    assert settings["permissions"] == {"allow": ["mcp__agentbus__*"]}
    hooks = settings["hooks"]
    assert set(hooks) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop",
                          "SessionEnd"}
    assert hooks["PostToolUse"][0]["matcher"] == "*"
    assert "matcher" not in hooks["Stop"][0]
    stop = hooks["Stop"][0]["hooks"][0]
    assert stop["type"] == "command" and stop["timeout"] >= 300
    words = shlex.split(stop["command"])
    assert words[1:] == ["--db", str(db), "hook", "claude", "--agent", "auto", "--wait", "300",
                         "--max-continues", "5"]
    assert os.path.isabs(words[0]) and os.path.basename(words[0]) == "bus"


def test_install_merges_without_loss_and_twice_gives_the_same_file(tmp_path, db, env):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps(EXISTING, indent=4))
    install(db, env, tmp_path)
    first = path.read_bytes()
    merged = json.loads(first)
    assert merged["permissions"] == {"allow": ["Bash(npm test)", "mcp__agentbus__*"]}
    assert merged["env"] == {"FOO": "1"}
    assert merged["hooks"]["PreToolUse"] == EXISTING["hooks"]["PreToolUse"]
    assert merged["hooks"]["PostToolUse"][0] == EXISTING["hooks"]["PostToolUse"][0]
    assert merged["hooks"]["Stop"][0] == EXISTING["hooks"]["Stop"][0]
    assert len(merged["hooks"]["PostToolUse"]) == 2
    assert len(merged["hooks"]["Stop"]) == 3  # the user's, ours answering, ours waking
    again = install(db, env, tmp_path)
    assert again.stdout.decode() == f"{path} already has these hooks; nothing changed\n"
    assert path.read_bytes() == first
    changed = install(db, env, tmp_path, "--wait", "60")  # new flags replace ours in place
    stops = json.loads(path.read_text())["hooks"]["Stop"]
    assert len(stops) == 3 and "--wait 60" in stops[1]["hooks"][0]["command"]
    assert changed.returncode == 0


def test_install_refuses_a_settings_file_that_is_not_json_and_changes_nothing(tmp_path, db, env):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text("{ not json")
    done = run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "w1",
                       "--project", str(tmp_path)], env, tmp_path, check=False)
    assert done.returncode == 2 and b"is not valid JSON" in done.stderr
    assert path.read_text() == "{ not json"
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]


def test_install_json_reports_what_it_did(tmp_path, db, env):
    done = install(db, env, tmp_path, "--json")
    assert json.loads(done.stdout) == {
        "settings": str(tmp_path / ".claude" / "settings.json"), "changed": True,
        "events": ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd"],
        "allow": ["mcp__agentbus__*"], "rewake": ["SessionStart", "Stop"]}


# --- inbox ------------------------------------------------------------------------------------


def test_inbox_text_json_and_ack(db, env):
    seqs = publish(db, ("note", "first"), ("note", {"n": 2}))
    text = run("bus", ["--db", str(db), "inbox", "--agent", "w1"], env, db.parent)
    lines = text.stdout.decode().splitlines()
    assert lines[0] == "agentbus: 2 messages for w1:" and lines[2] == "first"
    assert cursor(db) == 0  # no --ack: the cursor stays
    listed = json.loads(run("bus", ["--db", str(db), "inbox", "--agent", "w1", "--format",
                                    "json", "--ack"], env, db.parent).stdout)
    assert [m["seq"] for m in listed["messages"]] == seqs
    assert listed["messages"][1]["payload"] == {"n": 2}
    assert (listed["agent"], listed["more"], listed["acked_through"]) == ("w1", False, seqs[-1])
    assert cursor(db) == seqs[-1]
    empty = run("bus", ["--db", str(db), "inbox", "--agent", "w1"], env, db.parent)
    assert empty.stdout == b""


def test_inbox_wait_wakes_on_a_publish_from_another_process(tmp_path, db, env):
    proc = subprocess.Popen([installed("bus"), "--db", str(db),
                             "inbox", "--agent", "w1", "--wait", str(WAIT_S), "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: has_inotify_fd(proc.pid) or proc.poll() is not None,
                   "inbox to start waiting", 20)
        assert proc.poll() is None
        run("bus", ["--db", str(db), "publish", "--from", "p", "--to", "w1", "--type", "go"],
            env, tmp_path)
        stdout, stderr = proc.communicate(timeout=WAIT_S - 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert [m["type"] for m in json.loads(stdout)["messages"]] == ["go"]


def test_hook_acks_only_what_reached_stdout(db, env):
    """A hook whose answer cannot be written (Claude Code gone) acknowledges nothing."""
    publish(db, ("note", "unseen"))
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails (EPIPE)
    try:
        done = subprocess.run([installed("bus"), "--db", str(db), "hook", "claude", "--agent",
                               "w1"], input=json.dumps(event("SessionStart")).encode(),
                              stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode not in (0, 2)
    assert cursor(db) == 0
    again = answer(hook(db, env, event("SessionStart")))
    assert "unseen" in again["hookSpecificOutput"]["additionalContext"]


def test_install_refuses_an_agent_id_the_bus_would_refuse(tmp_path, db, env):
    done = run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "a b",
                       "--project", str(tmp_path)], env, tmp_path, check=False)
    assert done.returncode == 2
    assert b"Invalid value for '--agent': contains ' '" in done.stderr
    assert not (tmp_path / ".claude").exists()


# --- what the client is sure to show --------------------------------------------------------------


@pytest.mark.parametrize("cap_env, max_continues, blocks", [
    ({}, "10", 8),  # Claude Code's default cap: a 9th block would be acked and never seen
    ({"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "3"}, "5", 3),
    ({"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "20"}, "4", 4),
])
def test_hook_stop_never_blocks_beyond_the_cap_claude_code_honours(db, env, cap_env,
                                                                   max_continues, blocks):
    streak = []
    for active in [False] + [True] * 12:
        [seq] = publish(db, ("ping", len(streak)))
        done = hook(db, env | cap_env, event("Stop", stop_hook_active=active),
                    "--max-continues", max_continues)
        if not done.stdout:
            break
        assert answer(done)["decision"] == "block"
        streak.append(seq)
    assert len(streak) == blocks
    assert cursor(db) == streak[-1]  # the message it let wait is not acked: it comes next turn
    nxt = answer(hook(db, env, event("UserPromptSubmit")))
    assert f"#{seq} planner -> w1 ping" in nxt["hookSpecificOutput"]["additionalContext"]


def test_install_refuses_max_continues_above_the_cap_and_writes_nothing(tmp_path, db, env):
    done = run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "auto",
                       "--project", str(tmp_path), "--max-continues", "9"], env, tmp_path,
               check=False)
    assert done.returncode == 2
    assert (b"Invalid value for '--max-continues': is 9, but Claude Code honours at most 8 Stop"
            b" blocks in a row" in done.stderr)
    assert not (tmp_path / ".claude").exists()
    raised = install(db, env | {"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "12"}, tmp_path,
                     "--max-continues", "12")
    assert raised.returncode == 0, raised.stderr


# --- own messages ---------------------------------------------------------------------------------


def test_hook_never_shows_an_agent_its_own_messages_and_passes_them(tmp_path, db, env):
    with Bus.open(db) as bus:
        bus.publish("w1", "state_change", {"to": "WORKING"})
        theirs = bus.publish("w2", "state_change", {"to": "WORKING"}).seq
        bus.publish("w1", "task_done", {"task": "t1"})
        last = bus.publish("w2", "note", "to w1", to="w1").seq
        bus.publish("w1", "note", "to myself", to="w1")
        bus.publish("w1", "task_done", {"task": "t2"})
        trailing = bus.publish("w1", "progress", 0.5).seq
    out = answer(hook(db, env, event("SessionStart")))
    text = out["hookSpecificOutput"]["additionalContext"]
    assert text.splitlines()[0] == "agentbus: 2 messages for w1:"
    assert f"#{theirs} w2 -> * state_change" in text and f"#{last} w2 -> w1 note" in text
    assert "task_done" not in text and "progress" not in text and "to myself" not in text
    assert cursor(db) == trailing  # past its own broadcasts after the last one shown
    status = json.loads(run("bus", ["--db", str(db), "status", "--json"], env, tmp_path).stdout)
    [mine] = [c for c in status["consumers"] if c["agent"] == "w1"]
    assert mine["pending"] == 0
    with Bus.open(db) as bus:
        bus.publish("w1", "task_done", {"task": "t3"})
    quiet = hook(db, env, event("PostToolUse", tool_name="Bash"))
    assert (quiet.returncode, quiet.stdout) == (0, b"")
    polled = run("bus", ["--db", str(db), "poll", "--agent", "w1", "--json"], env, tmp_path)
    assert polled.stdout == b""
    own = run("bus", ["--db", str(db), "poll", "--agent", "w1", "--include-own", "--json"], env,
              tmp_path)
    assert [json.loads(line)["type"] for line in own.stdout.splitlines()] == ["task_done"]


# --- presence -------------------------------------------------------------------------------------


def alive(db: Path, env: dict, cwd: Path) -> dict:
    done = run("bus", ["--db", str(db), "alive", "--all", "--json"], env, cwd)
    return {row["agent"]: row for row in map(json.loads, done.stdout.splitlines())}


def test_hook_session_keeps_its_presence_and_an_ended_session_is_not_live(tmp_path, db, env):
    session = installed_session(tmp_path, db, env, tmp_path)
    session.session_start()
    assert alive(db, env, tmp_path)["w1"]["status"] == "idle"  # started: alive, no turn yet
    session.prompt("work")
    assert alive(db, env, tmp_path)["w1"]["status"] == "working"
    session.tool()
    assert alive(db, env, tmp_path)["w1"]["status"] == "working"
    assert session.stop()
    assert alive(db, env, tmp_path)["w1"]["status"] == "idle"
    session.end()
    ended = alive(db, env, tmp_path)["w1"]
    assert (ended["status"], ended["state"]) == ("stopped", "stopped")
    running = run("bus", ["--db", str(db), "alive", "--json"], env, tmp_path)
    assert running.stdout == b""  # not among the live agents
    status = json.loads(run("bus", ["--db", str(db), "status", "--json"], env, tmp_path).stdout)
    assert status["agents_by_state"]["alive"] == 0 and status["agents_by_state"]["stopped"] == 1


# --- a lead and its workers in one checkout ------------------------------------------------------


def test_hook_auto_outside_every_worktree_stands_down_or_is_the_checkouts_agent(tmp_path, env):
    repo = make_repo(tmp_path / "repo")
    db = tmp_path / "state" / "bus.db"
    spawned = run("worker", ["--db", str(db), "spawn", "--task", "t1", "--worker", "w7",
                             "--json"], env, repo)
    worktree = Path(json.loads(spawned.stdout)["worktree"])
    publish(db, ("plan", "review w7"), to="lead")
    lead_event = json.dumps(event("SessionStart") | {"cwd": str(repo)}).encode()
    command = ["--db", str(db), "hook", "claude", "--agent", "auto"]
    quiet = run("bus", command, env, repo, input=lead_event, check=False)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, b"", b"")
    assert "lead" not in alive(db, env, repo)  # no agent's presence was touched
    named = run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "lead",
                        "--local", "--project", str(repo)], env, repo)
    local = repo / ".claude" / "settings.local.json"
    assert named.stdout.decode() == f"BUS_AGENT=lead written to {local}\n"
    assert json.loads(local.read_text()) == {"env": {"BUS_AGENT": "lead"}}
    lead_env = env | json.loads(local.read_text())["env"]  # as Claude Code passes it on
    out = answer(run("bus", command, lead_env, repo, input=lead_event, check=False))
    assert "review w7" in out["hookSpecificOutput"]["additionalContext"]
    listed = run("bus", ["--db", str(db), "inbox", "--agent", "auto", "--json"], lead_env, repo)
    assert json.loads(listed.stdout)["agent"] == "lead"  # `bus mcp --agent auto` resolves so too
    publish(db, ("hint", "look at src/"), to="w7")
    worker_event = json.dumps(event("SessionStart") | {"cwd": str(worktree)}).encode()
    mine = answer(run("bus", command, lead_env, worktree, input=worker_event, check=False))
    assert " for w7:" in mine["hookSpecificOutput"]["additionalContext"]  # the worktree wins
    bad = run("bus", command, env | {"BUS_AGENT": "a b"}, repo, input=lead_event, check=False)
    assert bad.returncode == 1 and b"BUS_AGENT" in bad.stderr


def test_install_local_refuses_auto(tmp_path, db, env):
    done = run("bus", ["--db", str(db), "hook", "install", "claude", "--agent", "auto",
                       "--local", "--project", str(tmp_path)], env, tmp_path, check=False)
    assert done.returncode == 2 and b"not auto" in done.stderr
    assert not (tmp_path / ".claude").exists()


# --- the fast path --------------------------------------------------------------------------------


HEAVY = ("click", "pydantic", "mcp", "bus.api", "bus.channels", "bus.pump", "bus.cli.root",
         "bus.cli.agents", "bus.views", "blobs.store")


def imported_modules(importtime: str) -> set[str]:
    """The modules `python -X importtime` reported loading."""
    return {line.split("|")[-1].strip() for line in importtime.splitlines()
            if line.startswith("import time:") and not line.endswith("imported package")}


def test_hook_with_nothing_to_show_loads_no_heavy_module(db, env, tmp_path):
    """The console script answers a quiet hook itself: no click, no facade, no engines."""
    setup = (Path(__file__).parents[2] / "setup.cfg").read_text()
    assert "bus = bus.cli.entry:main" in setup
    command = [sys.executable, "-X", "importtime", "-m", "bus.cli", "--db", str(db), "hook",
               "claude", "--agent", "w1"]
    quiet = subprocess.run(command, input=json.dumps(event("PostToolUse")).encode(), env=env,
                           cwd=tmp_path, capture_output=True, timeout=60)
    assert (quiet.returncode, quiet.stdout) == (0, b"")
    loaded = imported_modules(quiet.stderr.decode())
    assert "bus.cli.entry" in loaded and "apsw" in loaded
    assert not {m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY
                or any(m.startswith(h + ".") for h in HEAVY)}
    assert alive(db, env, tmp_path)["w1"]["status"] == "working"  # it answered, and beat
    publish(db, ("note", "now something waits"))
    shown = subprocess.run(command, input=json.dumps(event("PostToolUse")).encode(), env=env,
                           cwd=tmp_path, capture_output=True, timeout=60)
    assert "click" in imported_modules(shown.stderr.decode())  # the command shows it
    out = json.loads(shown.stdout)
    assert "now something waits" in out["hookSpecificOutput"]["additionalContext"]


# Not pathlib: a checkout's editable install loads it to find the package (a wheel does not;
# scripts/bench_hooks.py measures the hook from one).
LIBRARY = ("dataclasses", "typing", "inspect", "bus.harness.claude_code", "bus.storage.db",
           "bus.log.messages",
           "bus.coordination.heartbeats")


def beat_time(db: Path, agent: str = "w1") -> int:
    conn = apsw.Connection(str(db))
    try:
        return conn.execute("SELECT ts_ms FROM heartbeats WHERE agent_id = ?", (agent,)).get
    finally:
        conn.close()


def age_beat(db: Path, by_ms: int, agent: str = "w1") -> None:
    conn = apsw.Connection(str(db))
    try:
        conn.execute("UPDATE heartbeats SET ts_ms = ts_ms - ? WHERE agent_id = ?", (by_ms, agent))
    finally:
        conn.close()


def test_hook_whose_presence_is_fresh_reads_with_apsw_alone_and_writes_nothing(db, env, tmp_path):
    """Within PRESENCE_FRESH_MS of a beat saying the same, a quiet hook loads no library module
    beyond its light ones and writes nothing; once the beat is older, or says otherwise, the
    hook beats again."""
    command = [sys.executable, "-X", "importtime", "-m", "bus.cli", "--db", str(db), "hook",
               "claude", "--agent", "w1"]

    def quiet(name: str) -> set[str]:
        done = subprocess.run(command, input=json.dumps(event(name)).encode(), env=env,
                              cwd=tmp_path, capture_output=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, b""), done.stderr
        return imported_modules(done.stderr.decode())

    assert "bus.harness.claude_code" in quiet("SessionStart")  # no beat yet: the library writes one
    started = beat_time(db)
    loaded = quiet("SessionStart")  # the same presence, just now: nothing to do
    assert not loaded & set(LIBRARY), loaded & set(LIBRARY)
    assert beat_time(db) == started
    assert "bus.harness.claude_code" in quiet("PostToolUse")  # started (idle) -> working: a beat
    assert alive(db, env, tmp_path)["w1"]["status"] == "working"
    working = beat_time(db)
    assert not quiet("PostToolUse") & set(LIBRARY)
    assert beat_time(db) == working
    age_beat(db, glance.PRESENCE_FRESH_MS)
    assert "bus.harness.claude_code" in quiet("PostToolUse")  # as old as the window: beat again
    assert beat_time(db) > working - glance.PRESENCE_FRESH_MS


def test_hook_fast_path_hands_a_file_of_another_schema_version_to_the_command(db, env):
    """A file the code must migrate first (or refuse) is never answered at a glance."""
    answer_quietly = hook(db, env, event("PostToolUse"))
    assert (answer_quietly.returncode, answer_quietly.stdout) == (0, b"")
    conn = apsw.Connection(str(db))
    conn.execute(f"PRAGMA user_version = {bus.migrations.newest_version() + 1}")
    conn.close()
    refused = hook(db, env, event("PostToolUse"))
    assert refused.returncode == 1
    assert b"upgrade agentbus" in refused.stderr


@pytest.mark.parametrize("name", ["Stop", "PostToolUse"])
def test_hook_gives_what_it_showed_a_receipt_naming_the_event_and_session(db, env, name):
    [direct] = publish(db, ("question", "which branch?"))
    with Bus.open(db) as bus:
        assert bus.receipt(direct).state == "sent"
    answer(hook(db, env, event(name, stop_hook_active=False)))
    with Bus.open(db) as bus:
        receipt = bus.receipt(direct)
    assert receipt.state == "acked"
    assert receipt.delivery.via == f"hook:{name}"
    assert receipt.delivery.session == event(name)["session_id"]
