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
- `SessionStart`, `UserPromptSubmit` and `PostToolUse` add context with
  `{"hookSpecificOutput": {"hookEventName": <event>, "additionalContext": <text>}}`.
  (PostToolUse also takes `decision: "block"`, but Claude Code shows that as a
  "hook blocking error" naming the command: messages are not failures.)
- `Stop` takes `{"decision": "block", "reason": <text>}`: Claude does not stop
  and takes the reason as what to do next. No output (or no `decision`) lets
  the stop happen. Claude Code honours at most CLAUDE_CODE_STOP_HOOK_BLOCK_CAP
  (default 8) blocks in a row, then ends the turn whatever a hook says: a block
  beyond the cap would be acked and never seen, so the hook never gives one.
- `SessionEnd` (its output is ignored) says the session is over.
- Hooks and MCP servers inherit the settings files' `env`, so a checkout's own
  `.claude/settings.local.json` can name its agent (`BUS_AGENT`) for the
  `--agent auto` entries the project shares.
- An MCP tool runs in `claude -p` only with a `permissions.allow` rule for it
  (`mcp__<server>__*`); the install writes one for the bus's server.
- Settings (`.claude/settings.json`): `{"hooks": {<event>: [{"matcher": ...,
  "hooks": [{"type": "command", "command": ..., "timeout": seconds}]}]}}`;
  `matcher` applies to the tool events only (`*` matches every tool) and is
  left out for the others.

Consecutive continues (`--max-continues`, at most the cap) are counted per session in a small
state file beside the bus database, `claude-hooks/<session>.json`: it exists
only while a streak of blocked stops lasts, and goes when the session is let
stop (or, for a session that ended mid-streak, a day later). A file rather than a table: the count is a harness's bookkeeping, not
part of the log, and needs no migration.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

import apsw

from bus.log import glance
from bus.coordination import heartbeats
from bus.harness.claude_events import CONTEXT_EVENTS
from bus.harness.claude_events import DEFAULT_MAX_CONTINUES
from bus.harness.claude_events import EVENTS
from bus.harness.claude_events import HookEvent
from bus.harness.claude_events import LIMIT_MAX
from bus.harness.claude_events import POST_TOOL_USE
from bus.harness.claude_events import PRESENCE
from bus.harness.claude_events import REWAKE_EVENTS
from bus.harness.claude_events import SESSION_END
from bus.harness.claude_events import SESSION_START
from bus.harness.claude_events import STOP
from bus.harness.claude_events import TOOL_EVENTS
from bus.harness.claude_events import USER_PROMPT_SUBMIT
from bus.harness.claude_events import hook_agent
from bus.harness.claude_events import parse_event
from bus.storage.errors import ValidationFailed

if TYPE_CHECKING:
    from bus.harness.inbox import Inbox
    from bus.harness.inbox import Log

STOP_CAP_ENV = "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"
STOP_CAP_DEFAULT = 8  # Claude Code's, when the variable is unset
MCP_SERVER = "agentbus"  # the name the README registers `bus mcp` under
STATE_DIR = "claude-hooks"
DEFAULT_TIMEOUT_S = 60  # the reference's default for a command hook
STALE_STREAK_S = 24 * 3600  # a streak file this old belongs to a session that is gone
_SAFE_SESSION = re.compile(r"[A-Za-z0-9_-]{1,128}")
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def context_output(event: str, text: str) -> dict[str, Any]:
    """SessionStart / UserPromptSubmit / PostToolUse: `text` added to what Claude sees."""
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}


def block_output(reason: str) -> dict[str, Any]:
    """Stop: Claude goes on with `reason` as its input."""
    return {"decision": "block", "reason": reason}


def stop_block_cap(environ: Mapping[str, str] = os.environ) -> int:
    """The most Stop blocks in a row Claude Code honours: its variable, else its default.

    A value that is not a whole number >= 0 counts as unset, as the default is
    what Claude Code then goes by.
    """
    raw = environ.get(STOP_CAP_ENV, "").strip()
    return int(raw) if raw.isdigit() else STOP_CAP_DEFAULT


def continues_allowed(max_continues: int, environ: Mapping[str, str] = os.environ) -> int:
    """Stops in a row a hook may turn into work: its --max-continues, never above the cap."""
    return min(max_continues, stop_block_cap(environ))


def check_max_continues(max_continues: int, environ: Mapping[str, str] = os.environ) -> None:
    """ValidationFailed when Claude Code would end the turn before `max_continues` blocks."""
    cap = stop_block_cap(environ)
    if max_continues > cap:
        raise ValidationFailed("max-continues", f"is {max_continues}, but Claude Code honours at"
                               f" most {cap} Stop blocks in a row ({STOP_CAP_ENV}, default"
                               f" {STOP_CAP_DEFAULT}) and a message given in a block past that"
                               f" is never seen; use {cap} or less, or raise {STOP_CAP_ENV}"
                               " for the sessions too")


class ContinueCounter:
    """How many stops in a row were blocked in one session, in a file beside the bus."""

    def __init__(self, db_path: str | os.PathLike[str], session_id: str | None) -> None:
        self.path = (Path(db_path).absolute().parent / STATE_DIR / _file_name(session_id)
                     if session_id else None)

    def count(self) -> int:
        if self.path is None:
            return 0
        try:
            value = json.loads(self.path.read_bytes()).get("continues", 0)
        except (FileNotFoundError, ValueError, AttributeError):
            return 0  # no streak, or a file cut short: counting afresh is the safe side
        return value if isinstance(value, int) and value >= 0 else 0

    def record(self, continues: int) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.path, json.dumps({"continues": continues}).encode())
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
    import hashlib  # here, not above: a hook with nothing to show never needs it (entry.py)
    return hashlib.sha256(session_id.encode()).hexdigest()[:32] + ".json"


# --- answering an event -------------------------------------------------------------------------
# What `bus hook claude` does without the CLI, so that the console script answers the common
# case (nothing to show) before loading click (bus/cli/entry.py), and the command does the same.


def stop_streak(db_path: str | os.PathLike[str], event: HookEvent) -> tuple[ContinueCounter, int]:
    """The session's counter and the blocked stops in a row before this one."""
    counter = ContinueCounter(db_path, event.session_id)
    return counter, counter.count() if event.stop_hook_active else 0


def quiet_answer(conn: apsw.Connection, db_path: str | os.PathLike[str], agent: str,
                 event: HookEvent, wait: float, max_continues: int,
                 environ: Mapping[str, str] = os.environ) -> bool:
    """Answer `event` for `agent` when it shows nothing: keep the session's presence and, at
    a Stop, end the streak. True when answered so; False when messages wait (or a Stop is
    to wait `wait` s for one) and the caller is to show them."""
    if event.name == STOP:
        counter, streak = stop_streak(db_path, event)
        if streak < continues_allowed(max_continues, environ) and (
                wait > 0 or glance.has_waiting(conn, agent)):
            return False
        let_stop(conn, agent, counter)
        return True
    if event.name != SESSION_END and glance.has_waiting(conn, agent):
        return False
    heartbeats.presence(conn, agent, PRESENCE[event.name])
    return True


def let_stop(conn: apsw.Connection, agent: str, counter: ContinueCounter) -> None:
    """The session stops: its streak ends and it is idle."""
    counter.reset()
    heartbeats.presence(conn, agent, PRESENCE[STOP])


def answer(log: Log, db_path: str | os.PathLike[str], agent: str,
           event: HookEvent, wait: float, max_continues: int, limit: int,
           emit: Callable[[dict[str, Any]], None],
           environ: Mapping[str, str] = os.environ) -> Inbox | None:
    """Answer `event` for `agent`: `emit` the hook's JSON output when messages are to be
    shown, then ack them with their receipts; return what was shown (None: nothing).

    `emit` writes the output where Claude Code reads it (stdout) and returns once
    it is written: what it was given is acked only then. The stop policy: a Stop
    turns into more work (a block) while messages wait, or come within `wait`,
    at most `max_continues` stops in a row and never beyond the cap Claude Code
    honours (`continues_allowed`), as a block it ignores would be acked unseen.
    The agent's delivery lock (claude_rewake) is held from the read to the ack,
    so its background waiter never shows the same messages. Each beat and each look is
    a short write transaction of its own (`log.write()`), never held across a wait.
    """
    with log.write() as conn:
        quiet = quiet_answer(conn, db_path, agent, event, wait, max_continues, environ)
    if quiet:
        return None
    # Imported here, not above: the fast path's quiet answer (bus/cli/entry.py) loads this
    # module, and the waiter's socket and locks cost it a few ms it never needs.
    from bus.harness.claude_rewake import delivering
    from bus.harness.inbox import acknowledge
    from bus.harness.inbox import pending
    with delivering(db_path, agent):
        if event.name == STOP:
            shown, output = _stop_answer(log, db_path, agent, event, wait, limit)
        else:
            with log.write() as conn:
                heartbeats.presence(conn, agent, PRESENCE[event.name])
            shown = pending(log, agent, limit)
            output = context_output(event.name, shown.text) if shown.shown else None
        if output is None:
            return None
        emit(output)
        acknowledge(log, shown, f"hook:{event.name}", event.session_id)
        return shown


def _stop_answer(log: Log, db_path: str | os.PathLike[str], agent: str,
                 event: HookEvent, wait: float, limit: int
                 ) -> tuple[Inbox, dict[str, Any] | None]:
    """A Stop that may go on (quiet_answer said so): a block with what waits, or None to
    let it stop."""
    from bus.harness.inbox import pending  # as in `answer`
    counter, streak = stop_streak(db_path, event)
    shown = pending(log, agent, limit, wait)
    with log.write() as conn:
        if not shown.shown:
            let_stop(conn, agent, counter)
            return shown, None
        counter.record(streak + 1)
        heartbeats.presence(conn, agent, "working")  # the session goes on with them
    return shown, block_output(shown.text)


# --- settings ----------------------------------------------------------------------------------


def hook_commands(base: list[str], agent: str, wait: float, max_continues: int
                  ) -> dict[str, str]:
    """The command line each event runs: `base` (the bus program and its --db) + `hook claude`."""
    common = [*base, "hook", "claude", "--agent", agent]
    waits = ["--wait", _number(wait)] if wait else []  # none: a headless run ends at once
    stop = [*common, *waits, "--max-continues", str(max_continues)]
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
                   timeouts: Mapping[str, int], allow: Sequence[str] = ()) -> dict[str, Any]:
    """`settings` with one entry of ours per event: replaced where one was, appended where not;
    and each rule of `allow` in `permissions.allow`, appended where missing.

    Everything else (other keys, other events, other hooks of the same event,
    other rules, their order) is kept as it was. ValidationFailed when `hooks`,
    an event's list or `permissions.allow` has a shape Claude Code would not read.
    """
    merged = dict(settings)
    hooks = dict(_member(merged, "hooks", dict, "{\"hooks\": {\"Stop\": [...]}}"))
    for event, command in commands.items():
        ours = {"type": "command", "command": command, "timeout": timeouts[event]}
        hooks[event] = merge_entries(event, hooks.get(event, []), ours, _is_answering)
    merged["hooks"] = hooks
    if allow:
        permissions = dict(_member(merged, "permissions", dict,
                                   "{\"permissions\": {\"allow\": [...]}}"))
        rules = list(_member(permissions, "allow", list, "{\"allow\": [\"rule\", ...]}",
                             "permissions.allow"))
        rules += [rule for rule in allow if rule not in rules]
        permissions["allow"] = rules
        merged["permissions"] = permissions
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


def merge_env(settings: Mapping[str, Any], name: str, value: str) -> dict[str, Any]:
    """`settings` with `env[name]` set to `value`, everything else kept."""
    merged = dict(settings)
    env = dict(_member(merged, "env", dict, "{\"env\": {\"NAME\": \"value\"}}"))
    env[name] = value
    merged["env"] = env
    return merged


def mcp_allow_rules(server: str) -> list[str]:
    """The permission rule that lets a session call every tool of MCP server `server`.

    ValidationFailed for a name Claude Code would not register (letters, digits, _ and -).
    """
    if not _SERVER_NAME.fullmatch(server):
        raise ValidationFailed("mcp-server", f"{server!r} is not an MCP server name Claude Code"
                               " accepts: letters, digits, _ and - (as in .mcp.json)")
    return [f"mcp__{server}__*"]


def _member(settings: Mapping[str, Any], key: str, kind: type, shape: str,
            field: str | None = None) -> Any:
    value = settings.get(key, kind())
    if not isinstance(value, kind):
        raise ValidationFailed(field or key, f"in the settings file is not a JSON"
                               f" {'object' if kind is dict else 'list'}; fix it by hand"
                               f" (Claude Code reads {shape})")
    return value


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
    _write_atomically(path, settings_bytes(settings))
    os.chmod(path, mode)
    return True


def _write_atomically(path: Path, data: bytes) -> None:
    # Imported here, not above: blobs.files loads tempfile (and with it shutil, random and
    # hashlib), which a hook with nothing to show never needs (bus/cli/entry.py).
    from blobs.files import write_atomically
    write_atomically(path, data)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
