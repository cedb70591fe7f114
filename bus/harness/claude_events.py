"""Claude Code's hook events: their names, what each says of a session, and one event read.

Apart from bus/harness/claude_code.py (the answers and the settings) so that the
hook's fast path (bus/cli/entry.py) reads an event with the interpreter, json
and nothing heavier: it runs at every tool call.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple

from bus.log import agent_ids as identity
from bus.storage.errors import AgentNotResolved
from bus.storage.errors import ValidationFailed

TYPE_CHECKING = False  # typing's own flag costs the hook's fast path the typing module
if TYPE_CHECKING:
    from typing import Mapping

    import apsw

SESSION_START = "SessionStart"
USER_PROMPT_SUBMIT = "UserPromptSubmit"
POST_TOOL_USE = "PostToolUse"
STOP = "Stop"
SESSION_END = "SessionEnd"
CONTEXT_EVENTS = (SESSION_START, USER_PROMPT_SUBMIT, POST_TOOL_USE)  # additionalContext
EVENTS = (SESSION_START, USER_PROMPT_SUBMIT, POST_TOOL_USE, STOP, SESSION_END)
TOOL_EVENTS = (POST_TOOL_USE,)  # the events whose entries take a matcher
REWAKE_EVENTS = (SESSION_START, STOP)  # the background waiter starts at each (claude_rewake)
# What each event says of the session (bus/coordination/heartbeats.py's presence); Stop is idle only
# when the session is let stop.
PRESENCE = {SESSION_START: "started", USER_PROMPT_SUBMIT: "working", POST_TOOL_USE: "working",
            STOP: "idle", SESSION_END: "ended"}
DEFAULT_MAX_CONTINUES = 5  # `bus hook claude --max-continues`
LIMIT_MAX = 1000  # `bus hook claude --limit`: the most messages one answer may show


class HookEvent(namedtuple("HookEvent", "name session_id cwd stop_hook_active transcript_path",
                           defaults=(None,))):
    """One event as read from stdin: its name (str), session (str or None), directory
    (str or None), Stop's flag (bool) and the session's transcript file (str or None)."""

    __slots__ = ()

    @property
    def known(self) -> bool:
        return self.name in EVENTS


def parse_event(raw: bytes) -> HookEvent:
    """The event in `raw` (stdin); ValidationFailed naming what is wrong with it."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes not UTF-8
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
    transcript = data.get("transcript_path")
    return HookEvent(name, session if isinstance(session, str) and session else None,
                     cwd if isinstance(cwd, str) and cwd else None,
                     data.get("stop_hook_active") is True,
                     transcript if isinstance(transcript, str) and transcript else None)


def hook_agent(conn: apsw.Connection, agent: str, event: HookEvent,
               environ: Mapping[str, str] = os.environ) -> str | None:
    """Who answers `event`: `agent`, or for `auto` the worker of the session's directory, else
    $BUS_AGENT (bus/log/agent_ids.py); None when `auto` finds neither.

    None means the session belongs to no agent (a lead's session in the main
    checkout, sharing the project's `auto` entries): the hook stands down
    quietly rather than fail at every event. The session's project directory
    decides (Claude Code sets it for hooks), not where Claude has cd'ed to since.
    """
    directory = environ.get("CLAUDE_PROJECT_DIR") or event.cwd or os.getcwd()
    try:
        return identity.resolve_agent(conn, agent, directory, environ)
    except AgentNotResolved as exc:
        if exc.candidates:
            raise  # two workers claim the directory: a mistake to show, not a session to skip
        return None
