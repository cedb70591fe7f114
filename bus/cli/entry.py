"""The `bus` console script: a Claude Code hook with nothing to show is answered before click.

Claude Code runs `bus hook claude` at every tool call, prompt and stop, so its
common answer (nothing waits: say nothing) must cost little more than the
interpreter's own start. Loading click and the commands costs several times
that, and so does the log's library (dataclasses, typing, pathlib). So for the
command lines `bus hook install claude` writes, and only those, this script
answers in two steps before the command:

1. With apsw and json alone (bus/log/glance.py, bus/harness/claude_events.py,
   bus/log/agent_ids.py), on a connection that only reads: nothing waits for the
   agent and its last presence beat already says what the event would, and is
   recent (glance.PRESENCE_FRESH_MS). Nothing is to be written or shown.
2. Through the functions the command uses (bus/harness/claude_code.py `quiet_answer`,
   on the bus's own connection): nothing waits, but a beat or a Stop's
   bookkeeping is due.

When messages wait, or anything is not as expected, it hands the event to the
full command, which answers (or reports) as always.
"""

from __future__ import annotations

import io
import os
import sys
from collections import namedtuple

import apsw

import bus.migrations
from bus.harness import claude_events
from bus.log import glance
from bus.storage.errors import BusError

_HOOK_WORDS = ["hook", "claude"]
_OPTIONS = {"--agent", "--wait", "--max-continues", "--limit"}
_VERSION_SQL = "PRAGMA user_version"
# The events a glance may answer: not a Stop (its streak is counted) nor SessionEnd (it ends
# the session's presence, which is always a write).
_GLANCED = frozenset(claude_events.EVENTS) - {claude_events.STOP, claude_events.SESSION_END}

# The parts of `bus --db DB hook claude --agent A [--wait S] [--max-continues N] [--limit L]`.
HookCall = namedtuple("HookCall", "db agent wait max_continues")


def main() -> int | None:
    """Answer a quiet hook here, or run the `bus` command."""
    call = hook_call(sys.argv[1:])
    if call is not None and answered_quietly(call):
        return 0
    from bus.cli.root import main as command  # click and every command, only when needed
    return command()


def hook_call(args: list[str]) -> HookCall | None:
    """The hook command line in `args`, or None for anything else (the full command parses it)."""
    if len(args) < 6 or len(args) % 2 or args[0] != "--db" or args[2:4] != _HOOK_WORDS:
        return None
    options = dict(zip(args[4::2], args[5::2]))
    if "--agent" not in options or not set(options) <= _OPTIONS:
        return None
    try:
        wait = float(options.get("--wait", 0))
        max_continues = int(options.get("--max-continues", claude_events.DEFAULT_MAX_CONTINUES))
        limit = int(options.get("--limit", 1))  # shows nothing here; only checked
    except ValueError:
        return None
    if not (0 <= wait < float("inf")) or max_continues < 0 \
            or not 1 <= limit <= claude_events.LIMIT_MAX:  # as the command's options refuse
        return None
    return HookCall(args[1], options["--agent"], wait, max_continues)


def answered_quietly(call: HookCall) -> bool:
    """Answer the event on stdin when nothing is to be shown; False hands it to the command.

    The event read here is put back as the command's stdin. Nothing is
    written before the last step, so a hand-over never answers twice.
    """
    raw = sys.stdin.buffer.read()
    sys.stdin = io.TextIOWrapper(io.BytesIO(raw))
    try:
        event = claude_events.parse_event(raw)
    except BusError:
        return False  # the command reports it
    if not event.known:
        return True
    glanced = at_a_glance(call, event)
    if glanced is not None:
        return glanced
    return answered_by_the_library(call, event)


def at_a_glance(call: HookCall, event: claude_events.HookEvent) -> bool | None:
    """Step 1: True when nothing is to be shown or written, False when messages wait (the
    command shows them), None when step 2 is to decide (a beat or a Stop is due)."""
    try:
        conn = glance.open_reader(call.db)
    except apsw.Error:
        return False  # the command names what is wrong with the file
    try:
        if conn.execute(_VERSION_SQL).get != bus.migrations.newest_version():
            return False  # the command migrates the file first, or says why it cannot
        agent = claude_events.hook_agent(conn, call.agent, event)
        if agent is None:
            return True  # a session of no agent: the hook stands down
        if event.name not in _GLANCED:
            return None
        if glance.has_waiting(conn, agent):
            return False
        moment = claude_events.PRESENCE[event.name]
        return True if glance.presence_is_fresh(conn, agent, moment) else None
    except (apsw.Error, BusError):
        return False  # a file that is not the bus it should be, or an agent not resolved
    finally:
        conn.close()


def answered_by_the_library(call: HookCall, event: claude_events.HookEvent) -> bool:
    """Step 2: the command's own quiet answer (a beat, a Stop's streak), on its connection."""
    from bus.harness import claude_code
    from bus.storage.db import connect
    try:
        conn = connect(call.db, os.environ.get("BUS_DURABILITY", "normal"), create=False)
    except BusError:
        return False
    try:
        who = claude_events.hook_agent(conn, call.agent, event)
        return who is None or claude_code.quiet_answer(conn, call.db, who, event, call.wait,
                                                       call.max_continues)
    except BusError:
        return False
    finally:
        conn.close()
