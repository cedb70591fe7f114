"""Claude Code's hook protocol: the events `bus hook claude` answers, and its settings entries.

The contract, from Claude Code's hooks reference (code.claude.com/docs/en/hooks,
read for this module: "Hook input", "Exit code output", "JSON output" and the
per-event "Decision control" sections; also docs.anthropic.com/en/docs/claude-code/hooks):

- A command hook gets one JSON object on stdin. Every event carries
  `session_id`, `transcript_path`, `cwd` and `hook_event_name`; `Stop` adds
  `stop_hook_active`, true when Claude is already continuing because a Stop
  hook blocked (the reference tells hooks to check it, or Claude never stops).
- Exit code 0: stdout is parsed as JSON. Exit code 2 is a *blocking* error
  (stderr goes to Claude, and on Stop it prevents the stop). Any other code
  is a non-blocking error: stderr is shown to the user and Claude goes on. So
  a failure of ours exits 1, never 2.
- `SessionStart` and `UserPromptSubmit` add context with
  `{"hookSpecificOutput": {"hookEventName": <event>, "additionalContext": <text>}}`.
- `PostToolUse` and `Stop` take `{"decision": "block", "reason": <text>}`:
  after a tool, the reason is shown to Claude; at a stop, Claude does not stop
  and takes the reason as what to do next. No output (or no `decision`) lets
  the stop happen.
- Settings (`.claude/settings.json`): `{"hooks": {<event>: [{"matcher": ...,
  "hooks": [{"type": "command", "command": ..., "timeout": seconds}]}]}}`;
  `matcher` applies to the tool events only (`*` matches every tool) and is
  left out for the others.

Consecutive continues (`--max-continues`) are counted per session in a small
state file beside the bus database, `claude-hooks/<session>.json`: it exists
only while a streak of blocked stops lasts, and goes when the session is let
stop (or, for a session that ended mid-streak, a day later). A file rather than a table: the count is a harness's bookkeeping, not
part of the log, and needs no migration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping

import orjson

from blobs.files import write_atomically
from bus.errors import ValidationFailed

SESSION_START = "SessionStart"
USER_PROMPT_SUBMIT = "UserPromptSubmit"
POST_TOOL_USE = "PostToolUse"
STOP = "Stop"
CONTEXT_EVENTS = (SESSION_START, USER_PROMPT_SUBMIT)  # answered with additionalContext
EVENTS = (SESSION_START, USER_PROMPT_SUBMIT, POST_TOOL_USE, STOP)
TOOL_EVENTS = (POST_TOOL_USE,)  # the events whose entries take a matcher
REWAKE_EVENTS = (SESSION_START, STOP)  # the background waiter starts at each (claude_rewake)
STATE_DIR = "claude-hooks"
DEFAULT_TIMEOUT_S = 60  # the reference's default for a command hook
STALE_STREAK_S = 24 * 3600  # a streak file this old belongs to a session that is gone
_SAFE_SESSION = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True)
class HookEvent:
    """One event as read from stdin: its name, session, directory and Stop's flag."""

    name: str
    session_id: str | None
    cwd: str | None
    stop_hook_active: bool

    @property
    def known(self) -> bool:
        return self.name in EVENTS


def parse_event(raw: bytes) -> HookEvent:
    """The event in `raw` (stdin); ValidationFailed naming what is wrong with it."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        shown = raw[:60].decode(errors="replace")
        raise ValidationFailed("stdin", f"is not JSON ({exc}; it began {shown!r}); Claude Code"
                               " sends one JSON object per hook call") from exc
    if not isinstance(data, dict):
        raise ValidationFailed("stdin", f"is JSON {type(data).__name__}, not the object"
                               " Claude Code sends")
    name = data.get("hook_event_name")
    if not isinstance(name, str) or not name:
        raise ValidationFailed("stdin", "has no hook_event_name string; is this command"
                               " registered as a Claude Code hook?")
    session = data.get("session_id")
    cwd = data.get("cwd")
    return HookEvent(name, session if isinstance(session, str) and session else None,
                     cwd if isinstance(cwd, str) and cwd else None,
                     data.get("stop_hook_active") is True)


def context_output(event: str, text: str) -> dict[str, Any]:
    """SessionStart / UserPromptSubmit: `text` added to what Claude sees."""
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}


def block_output(reason: str) -> dict[str, Any]:
    """PostToolUse: `reason` shown to Claude; Stop: Claude goes on with `reason` as its input."""
    return {"decision": "block", "reason": reason}


class ContinueCounter:
    """How many stops in a row were blocked in one session, in a file beside the bus."""

    def __init__(self, db_path: str | os.PathLike[str], session_id: str | None) -> None:
        self.path = (Path(db_path).absolute().parent / STATE_DIR / _file_name(session_id)
                     if session_id else None)

    def count(self) -> int:
        if self.path is None:
            return 0
        try:
            value = orjson.loads(self.path.read_bytes()).get("continues", 0)
        except (FileNotFoundError, orjson.JSONDecodeError, AttributeError):
            return 0  # no streak, or a file cut short: counting afresh is the safe side
        return value if isinstance(value, int) and value >= 0 else 0

    def record(self, continues: int) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, orjson.dumps({"continues": continues}))
        self._prune()

    def _prune(self) -> None:
        """Forget the streaks of sessions that ended mid-streak (killed, closed) long ago."""
        assert self.path is not None
        cutoff = time.time() - STALE_STREAK_S
        for other in self.path.parent.glob("*.json"):
            try:
                if other != self.path and other.stat().st_mtime < cutoff:
                    other.unlink()
            except FileNotFoundError:
                continue  # another hook pruned it first

    def reset(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _file_name(session_id: str) -> str:
    """The session id itself when it is file-name safe (Claude Code's are UUIDs), else its hash."""
    if _SAFE_SESSION.fullmatch(session_id):
        return f"{session_id}.json"
    return hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".json"


# --- settings ----------------------------------------------------------------------------------


def hook_commands(base: list[str], agent: str, wait: float, max_continues: int
                  ) -> dict[str, str]:
    """The command line each event runs: `base` (the bus program and its --db) + `hook claude`."""
    common = [*base, "hook", "claude", "--agent", agent]
    stop = [*common, "--wait", _number(wait), "--max-continues", str(max_continues)]
    return {event: shlex.join(stop if event == STOP else common) for event in EVENTS}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def stop_timeout(wait: float) -> int:
    """Seconds Claude Code gives the Stop hook: its wait and room to start and answer."""
    return max(DEFAULT_TIMEOUT_S, int(wait) + 30)


def is_ours(command: object) -> bool:
    """A hook command that runs `bus ... hook claude` (any agent, any flags)."""
    return bus_hook_words(command) is not None


def is_rewake(command: object) -> bool:
    """One of ours that waits in the background to wake the session (`--rewake`)."""
    words = bus_hook_words(command)
    return words is not None and "--rewake" in words


def bus_hook_words(command: object, harness: str = "claude") -> list[str] | None:
    """The words of a `bus ... hook HARNESS ...` command line; None for anything else."""
    if not isinstance(command, str):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if (words and os.path.basename(words[0]) == "bus"
            and any(words[i:i + 2] == ["hook", harness] for i in range(len(words)))):
        return words
    return None


def merge_settings(settings: Mapping[str, Any], commands: Mapping[str, str],
                   timeouts: Mapping[str, int]) -> dict[str, Any]:
    """`settings` with one entry of ours per event: replaced where one was, appended where not.

    Everything else (other keys, other events, other hooks of the same event,
    their order) is kept as it was. ValidationFailed when `hooks` or an
    event's list has a shape Claude Code would not read.
    """
    merged = dict(settings)
    hooks = merged.get("hooks", {})
    if not isinstance(hooks, dict):
        raise ValidationFailed("hooks", "in the settings file is not an object; fix it by hand"
                               " (Claude Code reads {\"hooks\": {\"Stop\": [...]}})")
    hooks = dict(hooks)
    for event, command in commands.items():
        ours = {"type": "command", "command": command, "timeout": timeouts[event]}
        hooks[event] = merge_entries(event, hooks.get(event, []), ours, _is_answering)
    merged["hooks"] = hooks
    return merged


def merge_rewake(settings: Mapping[str, Any], command: str | None,
                 hook_fields: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with our background waiter (`command`, with `hook_fields` such as `async`)
    on each of REWAKE_EVENTS, replaced where one was; with `command` None, without it.

    Kept as merge_settings keeps things; the answering entries are left alone.
    """
    merged = dict(settings)
    hooks = dict(merged.get("hooks", {}))  # merge_settings checked its shape
    ours = None if command is None else {"type": "command", "command": command, **hook_fields}
    for event in REWAKE_EVENTS:
        entries = merge_entries(event, hooks.get(event, []), ours, _is_rewake_hook)
        if entries or event in hooks:
            hooks[event] = entries
    merged["hooks"] = hooks
    return merged


def _is_answering(hook: object) -> bool:
    return isinstance(hook, dict) and is_ours(hook.get("command")) and not is_rewake(
        hook.get("command"))


def _is_rewake_hook(hook: object) -> bool:
    return isinstance(hook, dict) and is_rewake(hook.get("command"))


def merge_entries(event: str, entries: object, ours: dict[str, Any] | None,
                 same: Callable[[object], bool]) -> list[Any]:
    """`entries` with `ours` in place of the first hook `same` matches (the others go), or
    appended in an entry of its own; with `ours` None, only without those."""
    if not isinstance(entries, list):
        raise ValidationFailed(f"hooks.{event}", "in the settings file is not a list; fix it"
                               " by hand")
    result: list[Any] = []
    placed = False
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("hooks"), list):
            kept = [h for h in entry["hooks"] if not same(h)]
            if len(kept) < len(entry["hooks"]) and not placed and ours is not None:
                kept.insert(next(i for i, h in enumerate(entry["hooks"]) if same(h)), ours)
                placed = True
            if kept:
                result.append({**entry, "hooks": kept})
            continue
        result.append(entry)
    if not placed and ours is not None:
        group: dict[str, Any] = {"matcher": "*"} if event in TOOL_EVENTS else {}
        result.append({**group, "hooks": [ours]})
    return result


def read_settings(path: Path) -> dict[str, Any]:
    """The settings object in `path`, {} when there is no file yet.

    The settings file is read and written with the stdlib `json`, not orjson:
    it is the user's file, and every value in it must come back as it was
    (an integer beyond 64 bits included), in the order it was.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed("project", f"{path} is not valid JSON ({exc}); fix or move it,"
                               " nothing was written") from exc
    if not isinstance(data, dict):
        raise ValidationFailed("project", f"{path} holds JSON {type(data).__name__}, not an"
                               " object; fix or move it, nothing was written")
    return data


def settings_bytes(settings: Mapping[str, Any]) -> bytes:
    return (json.dumps(settings, indent=2, ensure_ascii=False) + "\n").encode()


def write_settings(path: Path, settings: Mapping[str, Any]) -> bool:
    """Write `settings` to `path` atomically, keeping the file's mode; False when unchanged."""
    try:
        before = read_settings(path) if path.stat().st_size else None
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        before, mode = None, 0o666 & ~_umask()
    if before == settings:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, settings_bytes(settings))
    os.chmod(path, mode)
    return True


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
