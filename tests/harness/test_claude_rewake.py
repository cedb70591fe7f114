"""`bus hook claude --rewake`, Claude Code's background waiter, as real processes.

Each waiter is the installed `bus` in a subprocess, given the event on stdin
and the variables Claude Code sets for hooks (CLAUDE_PID, the session's
process). A waiter is waiting once it has made its inotify watcher
(tests/support/hook_harness.py); every wait below is a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bus import Bus
from bus.harness import claude_code
from bus.harness import claude_rewake
from tests.support.hook_harness import ClaudeSession
from tests.support.hook_harness import child_env
from tests.support.hook_harness import has_inotify_fd
from tests.support.hook_harness import installed
from tests.support.hook_harness import run
from tests.support.waiting import wait_until

WAIT_S = 60  # the waiter's --wait: far above anything a test waits for
READY_S = 30  # a waiter starting on a busy machine


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "bus.db"
    path.parent.mkdir()
    Bus.open(path).close()
    return path


def session(tmp_path: Path, db: Path, wait: float = WAIT_S, **env: str) -> ClaudeSession:
    """A session whose SessionStart and Stop run the waiter for w1; its process is this one."""
    command = claude_rewake.rewake_command([installed("bus"), "--db", str(db)], "w1", wait)
    variables = child_env(tmp_path) | {"CLAUDE_PID": str(os.getpid())} | env
    return ClaudeSession({event: command for event in claude_code.REWAKE_EVENTS}, tmp_path,
                         variables)


def start_waiting(claude: ClaudeSession, event: str = "Stop") -> subprocess.Popen:
    proc = claude.start(event)
    wait_until(lambda: has_inotify_fd(proc.pid) or proc.poll() is not None, "the waiter waits",
               READY_S)
    assert proc.poll() is None, proc.communicate()
    return proc


def publish(db: Path, payload: object, to: str = "w1") -> int:
    with Bus.open(db) as bus:
        return bus.publish("planner", "note", payload, to=to).seq


def cursor(db: Path) -> list[int]:
    """The seqs still waiting for w1."""
    with Bus.open(db) as bus:
        return [m.seq for m in bus.poll("w1")]


def test_rewake_waits_then_exits_2_with_the_message_on_stderr_and_acks_it(tmp_path, db):
    claude = session(tmp_path, db)
    proc = start_waiting(claude)
    seq = publish(db, "wake up")
    reply = claude.finish(proc)
    assert reply.code == claude_rewake.WAKE_EXIT
    assert f"#{seq} planner -> w1 note" in reply.stderr and "wake up" in reply.stderr
    assert cursor(db) == []
    with Bus.open(db) as bus:
        receipt = bus.receipt(seq)
    assert receipt.state == "acked"
    assert (receipt.delivery.via, receipt.delivery.session) == ("hook:rewake", claude.session_id)


def test_rewake_delivers_what_already_waits_at_once(tmp_path, db):
    seq = publish(db, {"n": 1})
    reply = session(tmp_path, db).hook("SessionStart", source="startup")
    assert reply.code == 2 and f"#{seq} " in reply.stderr and cursor(db) == []


def test_rewake_killed_while_waiting_acks_nothing_and_the_next_waiter_delivers(tmp_path, db):
    claude = session(tmp_path, db)
    proc = start_waiting(claude)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    seq = publish(db, "after the kill")
    assert cursor(db) == [seq]  # nothing acked
    reply = claude.hook("Stop")  # its session lock went with it: the next one is not refused
    assert reply.code == 2 and "after the kill" in reply.stderr and cursor(db) == []


def test_rewake_second_waiter_of_a_session_leaves_it_to_the_first(tmp_path, db):
    claude = session(tmp_path, db)
    first = start_waiting(claude, "SessionStart")
    second = claude.hook("Stop")  # a turn the user started ended: the first still waits
    assert (second.code, second.stderr) == (0, "")
    publish(db, "once")
    reply = claude.finish(first)
    assert reply.code == 2 and reply.stderr.count("once") == 1


def test_rewake_two_sessions_of_one_agent_show_a_message_once(tmp_path, db):
    waiters = [session(tmp_path, db) for _ in range(2)]
    procs = [start_waiting(claude) for claude in waiters]
    publish(db, "just one of you")
    wait_until(lambda: any(p.poll() is not None for p in procs), "a waiter delivers", READY_S)
    replies = []
    for claude, proc in zip(waiters, procs):
        if proc.poll() is None:
            proc.terminate()  # the other still waits: Claude Code ends it with its session
        replies.append(claude.finish(proc))
    shown = [r for r in replies if "just one of you" in r.stderr]
    assert len(shown) == 1 and shown[0].code == 2 and cursor(db) == []


def test_rewake_ends_without_acking_when_its_session_ends(tmp_path, db):
    claude_process = subprocess.Popen(["sleep", "600"])  # stands in for Claude Code's process
    claude = session(tmp_path, db, CLAUDE_PID=str(claude_process.pid))
    proc = start_waiting(claude)
    claude_process.kill()
    claude_process.wait()
    reply = claude.finish(proc, timeout=READY_S)
    assert (reply.code, reply.stderr) == (0, "")
    seq = publish(db, "for the next session")
    assert cursor(db) == [seq]


def test_rewake_stands_down_in_a_session_nobody_attends(tmp_path, db):
    publish(db, "not now")
    reply = session(tmp_path, db, CLAUDE_CODE_SESSION_ATTENDED="0").hook("Stop")
    assert (reply.code, reply.stderr) == (0, "") and len(cursor(db)) == 1


def test_rewake_wait_ends_quietly_when_nothing_comes(tmp_path, db):
    reply = session(tmp_path, db, wait=0.2).hook("Stop")
    assert (reply.code, reply.stderr) == (0, "")


def test_rewake_and_an_answering_hook_never_show_one_message_twice(tmp_path, db):
    """The waiter and PostToolUse race for each message: the delivery lock gives it to one."""
    claude = session(tmp_path, db)
    answering = ClaudeSession({"PostToolUse": f"{installed('bus')} --db {db} hook claude"
                               " --agent w1"}, tmp_path, claude.env, claude.session_id)
    for round_ in range(3):
        text = f"round {round_}"
        proc = start_waiting(claude)
        publish(db, text)
        tool = answering.tool()
        if tool.output is None:  # the waiter had it first
            reply = claude.finish(proc)
            assert reply.code == 2 and text in reply.stderr
        else:
            assert text in json.dumps(tool.output)
            proc.terminate()  # it waits on: nothing is left for it
            assert text not in claude.finish(proc).stderr
        assert cursor(db) == []


class FakeInbox:
    """A session's inbox socket: reads one client's lines to its end, then closes; with
    `transcript`, records the message queued there as Claude Code does (2.1.332), else
    drops it as Claude Code drops a line with a bad token: closing all the same."""

    def __init__(self, path: Path, transcript: Path | None = None) -> None:
        self.path = path
        self.transcript = transcript
        self.lines: list[dict] = []
        self.closing = False
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            if self.closing:  # close()'s own connection: no client came
                return
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            self.lines = [json.loads(line) for line in data.splitlines()]
            if self.transcript is not None:
                record = {"type": "queue-operation", "operation": "enqueue",
                          "content": self.lines[-1]["message"]["content"]}
                with self.transcript.open("a") as out:
                    out.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """End the thread, then close the socket. Closed under a thread still blocked in
        accept(), the descriptor's number would be reused by the next socket this process
        opens (a scripted model's, a later test's inbox) and the stale accept() would take
        that socket's connections: a later test then waited for a request that never came."""
        if self.thread.is_alive():
            self.closing = True
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.connect(str(self.path))
            self.thread.join(timeout=30)
        self.server.close()


def test_rewake_posts_to_the_sessions_inbox_socket_and_exits_0(tmp_path, db):
    inbox = FakeInbox(tmp_path / "inbox.sock", transcript=tmp_path / "t.jsonl")
    (tmp_path / "t.jsonl").write_text("")  # the session's transcript: it was spoken to
    try:
        claude = session(tmp_path, db, CLAUDE_CODE_MESSAGING_SOCKET=str(inbox.path),
                         CLAUDE_CODE_MESSAGING_TOKEN="t0k3n")
        proc = start_waiting(claude)
        seq = publish(db, "by the socket")
        reply = claude.finish(proc)
        inbox.thread.join(READY_S)
    finally:
        inbox.close()
    assert (reply.code, reply.stderr) == (0, "")
    auth, message = inbox.lines
    assert auth == {"type": "auth", "token": "t0k3n"}
    assert message["type"] == "user" and message["message"]["role"] == "user"
    assert f"#{seq} planner -> w1 note" in message["message"]["content"]
    assert cursor(db) == []
    with Bus.open(db) as bus:
        assert bus.receipt(seq).delivery.via == "claude:inbox"


def test_rewake_falls_back_to_stderr_when_the_session_does_not_record_the_post(tmp_path, db):
    """The socket closes whether the session queued the message or dropped it: only its
    transcript's enqueue record counts, and without one the hook's way delivers."""
    inbox = FakeInbox(tmp_path / "inbox.sock", transcript=None)
    (tmp_path / "t.jsonl").write_text("")
    try:
        claude = session(tmp_path, db, CLAUDE_CODE_MESSAGING_SOCKET=str(inbox.path),
                         CLAUDE_CODE_MESSAGING_TOKEN="stale")
        seq = publish(db, "dropped by the socket")
        reply = claude.hook("Stop")
        inbox.thread.join(READY_S)
    finally:
        inbox.close()
    assert inbox.lines[0] == {"type": "auth", "token": "stale"}  # it was posted, and dropped
    assert reply.code == 2 and f"#{seq} " in reply.stderr
    assert cursor(db) == []
    with Bus.open(db) as bus:
        assert bus.receipt(seq).delivery.via == "hook:rewake"


@pytest.mark.parametrize("named", [False, True])
def test_rewake_without_a_transcript_to_confirm_by_never_posts(tmp_path, db, named):
    """No transcript_path, or none written yet (a session nobody has spoken to)."""
    inbox = FakeInbox(tmp_path / "inbox.sock", transcript=tmp_path / "t.jsonl")
    try:
        claude = session(tmp_path, db, CLAUDE_CODE_MESSAGING_SOCKET=str(inbox.path),
                         CLAUDE_CODE_MESSAGING_TOKEN="t0k3n")
        seq = publish(db, "no transcript")
        extra = {} if named else {"transcript_path": None}
        reply = claude.hook("Stop", **extra)
    finally:
        inbox.close()
    assert reply.code == 2 and f"#{seq} " in reply.stderr and inbox.lines == []


def test_rewake_falls_back_to_stderr_when_the_inbox_socket_is_gone(tmp_path, db):
    claude = session(tmp_path, db, CLAUDE_CODE_MESSAGING_SOCKET=str(tmp_path / "gone.sock"),
                     CLAUDE_CODE_MESSAGING_TOKEN="t0k3n")
    seq = publish(db, "the hook's way")
    reply = claude.hook("Stop")
    assert reply.code == 2 and f"#{seq} " in reply.stderr and cursor(db) == []


def test_install_writes_the_waiter_beside_the_hooks_and_no_rewake_takes_it_out(tmp_path, db):
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": "./check.sh"}]}]}}))
    install = ["--db", str(db), "hook", "install", "claude", "--agent", "w1", "--project",
               str(tmp_path)]
    run("bus", install, child_env(tmp_path), tmp_path)
    hooks = json.loads(settings.read_text())["hooks"]
    waiters = {event: [h for e in entries for h in e["hooks"] if "--rewake" in h["command"]]
               for event, entries in hooks.items()}
    assert {event for event, found in waiters.items() if found} == {"SessionStart", "Stop"}
    [stop_waiter] = waiters["Stop"]
    assert stop_waiter["async"] is True and stop_waiter["asyncRewake"] is True
    assert stop_waiter["timeout"] > claude_rewake.REWAKE_WAIT_S
    run("bus", [*install, "--no-rewake"], child_env(tmp_path), tmp_path)
    after = json.loads(settings.read_text())["hooks"]
    commands = [h["command"] for entries in after.values() for e in entries for h in e["hooks"]]
    assert not any("--rewake" in c for c in commands)
    assert "./check.sh" in commands
    assert sum("hook claude" in c for c in commands) == len(claude_code.EVENTS)  # answering


def test_rewake_prunes_the_locks_of_sessions_gone_for_a_day_but_not_a_held_one(tmp_path, db):
    old = time.time() - claude_rewake.STALE_WAITER_S - 60
    gone = claude_rewake.state_path(db, "waiter", "gone-session")
    held_path = claude_rewake.state_path(db, "waiter", "still-waiting")
    held = claude_rewake.claim_session(db, "still-waiting")
    gone.touch()
    for path in (gone, held_path):
        os.utime(path, (old, old))
    mine = claude_rewake.claim_session(db, "new-session")
    try:
        assert not gone.exists() and held_path.exists()
    finally:
        os.close(mine)
        os.close(held)
