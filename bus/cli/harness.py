"""`bus` commands for agent harnesses: who the agent is (`--agent auto`)."""

from __future__ import annotations

import os

from bus.api import Bus
from bus.identity import AUTO
from bus.identity import agent_for_directory

AGENT_HELP = ("The agent to act as; `auto`: the worker whose worktree contains the working"
              " directory (as `worker spawn` set it up).")


def resolve_agent(bus: Bus, agent: str, directory: str | None = None) -> str:
    """`agent` itself, or for `auto` the worker whose worktree holds `directory` (default: cwd)."""
    if agent != AUTO:
        return agent
    return agent_for_directory(bus.conn, directory if directory is not None else os.getcwd())


COMMANDS: list = []
