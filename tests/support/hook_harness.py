"""The installed `bus` in a subprocess, and a scripted Claude Code that runs its hooks.

`ClaudeSession` follows Claude Code's documented hook behaviour (bus/harness/claude_code.py
cites the reference): it sends each event's JSON on the hook's stdin with the
session's id and directory, reads the JSON on stdout after exit code 0, and at a
`Stop` either stops (no decision) or goes on with the reason as its next input,
sending the next `Stop` with `stop_hook_active: true`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pytest

from tests.support.procs_workers import GIT_REPO_VARIABLES
from tests.support.procs_workers import hermetic_git_env
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent
RUN_TIMEOUT = 60.0


def installed(program: str) -> str:
    """The console script of this checkout's install (the venv running the tests)."""
    path = BIN / program
    if not path.exists():
        pytest.skip(f"{program} is not installed beside {sys.executable} (make .venv/.installed)")
    return str(path)


def child_env(tmp_path: Path) -> dict[str, str]:
    """Child processes: no BUS_DB from the caller's shell (nor the project directory of a
    Claude Code session running the tests), git kept inside tmp_path."""
    full = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for name in (*GIT_REPO_VARIABLES, "BUS_DB", "BUS_DURABILITY", "CLAUDE_PROJECT_DIR"):
        full.pop(name, None)
    full.update(hermetic_git_env(tmp_path))
    return full


def run(program: str, args: list[str], env: dict[str, str], cwd: Path, *,
        input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([installed(program), *args], env=env, cwd=cwd, capture_output=True,
                          timeout=RUN_TIMEOUT, input=input if input is not None else b"")
    if check:
        assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def has_inotify_fd(pid: int) -> bool:
    """Whether the process has an inotify instance: `bus.wait_for_change` made its watcher."""
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                return True
        except OSError:
            continue
    return False


@dataclass
class HookReply:
    """One hook run as Claude Code sees it: exit code, the parsed stdout (or None), stderr."""

    code: int
    output: dict | None
    stderr: str


@dataclass
class ClaudeSession:
    """A scripted session in `cwd` whose hooks are the commands in `commands` (event -> shell)."""

    commands: dict[str, str]
    cwd: Path
    env: dict[str, str]
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    inputs: list[str] = field(default_factory=list)  # what reached the model, in order
    stop_hook_active: bool = False

    def event(self, name: str, **extra) -> dict:
        return {"session_id": self.session_id, "transcript_path": str(self.cwd / "t.jsonl"),
                "cwd": str(self.cwd), "hook_event_name": name, **extra}

    def start(self, name: str, **extra) -> subprocess.Popen:
        """Start the hook of event `name`, its stdin the event's JSON and then end of file."""
        read_end, write_end = os.pipe()
        with os.fdopen(write_end, "wb") as stdin:  # an event is far below a pipe's buffer
            stdin.write(json.dumps(self.event(name, **extra)).encode())
        try:
            return subprocess.Popen(shlex.split(self.commands[name]), cwd=self.cwd, env=self.env,
                                    stdin=read_end, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        finally:
            os.close(read_end)

    def finish(self, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT) -> HookReply:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        output = json.loads(stdout) if proc.returncode == 0 and stdout.strip() else None
        return HookReply(proc.returncode, output, stderr.decode())

    def hook(self, name: str, **extra) -> HookReply:
        return self.finish(self.start(name, **extra))

    def session_start(self) -> HookReply:
        reply = self.hook("SessionStart", source="startup")
        self._take_context(reply)
        return reply

    def prompt(self, text: str) -> HookReply:
        reply = self.hook("UserPromptSubmit", prompt=text)
        self.inputs.append(text)
        self._take_context(reply)
        self.stop_hook_active = False
        return reply

    def tool(self, name: str = "Bash") -> HookReply:
        reply = self.hook("PostToolUse", tool_name=name, tool_input={}, tool_response={})
        self._take_context(reply)
        return reply

    def end(self) -> HookReply:
        reply = self.hook("SessionEnd", reason="prompt_input_exit")
        assert (reply.code, reply.output) == (0, None), reply.stderr  # its output is ignored
        return reply

    def start_stop(self) -> subprocess.Popen:
        return self.start("Stop", stop_hook_active=self.stop_hook_active)

    def finish_stop(self, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT) -> bool:
        """True when the session stops; else the reason became its input and it works on."""
        reply = self.finish(proc, timeout)
        assert reply.code == 0, reply.stderr
        if reply.output and reply.output.get("decision") == "block":
            self.inputs.append(reply.output["reason"])
            self.stop_hook_active = True
            return False
        self.stop_hook_active = False
        return True

    def stop(self) -> bool:
        return self.finish_stop(self.start_stop())

    def _take_context(self, reply: HookReply) -> None:
        """Context reaches the model; a `decision` here would be shown as a hook error."""
        assert reply.code == 0, reply.stderr
        if reply.output:
            assert set(reply.output) == {"hookSpecificOutput"}, reply.output
            self.inputs.append(reply.output["hookSpecificOutput"]["additionalContext"])
