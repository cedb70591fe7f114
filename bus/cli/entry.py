"""The `bus` console script: a Claude Code hook with nothing to show is answered before click.

Claude Code runs `bus hook claude` at every tool call, prompt and stop, so its
common answer (nothing waits: keep the session's presence, say nothing) must
cost little more than the interpreter's own start. Loading click and the
commands costs several times that. So for the command lines `bus hook install
claude` writes, and only those, this script reads the event, opens the file
and asks the log through the same functions the command uses
(bus/claude_code.py: `hook_agent`, `quiet_answer`); when messages wait, or
anything is not as expected, it hands the event to the full command, which
answers (or reports) as always.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from bus import claude_code
from bus.db import connect
from bus.errors import BusError
from bus.migration_files import supported_version

_HOOK_WORDS = ["hook", "claude"]
_OPTIONS = {"--agent", "--wait", "--max-continues", "--limit"}
_VERSION_SQL = "PRAGMA user_version"


@dataclass(frozen=True)
class HookCall:
    """The parts of `bus --db DB hook claude --agent A [--wait S] [--max-continues N]`."""

    db: str
    agent: str
    wait: float
    max_continues: int


def main() -> int | None:
    """Answer a quiet hook here, or run the `bus` command."""
    call = hook_call(sys.argv[1:])
    if call is not None and answered_quietly(call):
        return 0
    from bus.cli.root import main as command  # click and every command, only when needed
    return command()


def hook_call(args: Sequence[str]) -> HookCall | None:
    """The hook command line in `args`, or None for anything else (the full command parses it)."""
    if len(args) < 6 or len(args) % 2 or args[0] != "--db" or args[2:4] != _HOOK_WORDS:
        return None
    options = dict(zip(args[4::2], args[5::2]))
    if "--agent" not in options or not set(options) <= _OPTIONS:
        return None
    try:
        wait = float(options.get("--wait", 0))
        max_continues = int(options.get("--max-continues", claude_code.DEFAULT_MAX_CONTINUES))
        limit = int(options.get("--limit", 1))  # shows nothing here; only checked
    except ValueError:
        return None
    if not (0 <= wait < float("inf")) or max_continues < 0 \
            or not 1 <= limit <= claude_code.LIMIT_MAX:  # as the command's options refuse
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
        event = claude_code.parse_event(raw)
    except BusError:
        return False  # the command reports it
    if not event.known:
        return True
    try:
        conn = connect(call.db, os.environ.get("BUS_DURABILITY", "normal"), create=False)
    except BusError:
        return False
    try:
        if conn.execute(_VERSION_SQL).get != supported_version():
            return False  # the command migrates the file first, or says why it cannot
        who = claude_code.hook_agent(conn, call.agent, event)
        return who is None or claude_code.quiet_answer(conn, call.db, who, event, call.wait,
                                                       call.max_continues)
    except BusError:
        return False
    finally:
        conn.close()
