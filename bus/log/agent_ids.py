"""Who an agent is, from where it runs: what `--agent auto` resolves to.

An agent started by the `worker spawn` workflow runs in that worker's git
worktree, so the directory names the worker. The `workers` table
(bus/coordination/worker_table.py) is read here directly: the bus must not import the
`workers` package, which sits above it.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple

import apsw

from bus.storage.errors import AgentNotResolved
from bus.storage.errors import ValidationFailed

TYPE_CHECKING = False  # typing's own flag costs the hook's fast path the typing module
if TYPE_CHECKING:
    from typing import Mapping

AUTO = "auto"  # the --agent value that asks for this resolution
AGENT_ENV = "BUS_AGENT"  # who `auto` is outside every worker's worktree, when set
_LISTED = 5  # workers an error names before it says "and N more"
# The states a worker never leaves (the workers table, bus/coordination/worker_table.py, re-exports
# them; workers/machine.py builds its TERMINAL from them, and a test holds them equal).
TERMINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED"})
AGENT_ID_MAX = 128
_AGENT_ID = re.compile(r"[A-Za-z0-9._:-]+")
_VALID_AGENT_IDS: set[str] = set()
_VALID_AGENT_IDS_MAX = 4096

# A worker's id, state and worktree (its real path, symlinks resolved).
WorkerPlace = namedtuple("WorkerPlace", "worker state worktree")


def validate_agent_id(value: object, field: str = "agent") -> str:
    """An agent id: 1-128 characters of letters, digits and . _ : -"""
    # The same few agents publish again and again: a set lookup instead of
    # the regex for ids already seen (only valid ones are kept, a few thousand).
    if type(value) is str and value in _VALID_AGENT_IDS:
        return value
    if isinstance(value, str) and 0 < len(value) <= AGENT_ID_MAX and _AGENT_ID.fullmatch(value):
        if len(_VALID_AGENT_IDS) >= _VALID_AGENT_IDS_MAX:
            _VALID_AGENT_IDS.clear()
        _VALID_AGENT_IDS.add(value)
        return value
    raise ValidationFailed(field, _agent_id_problem(value), value=value)


def _agent_id_problem(value: object) -> str:
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > AGENT_ID_MAX:
        return f"is {len(value)} characters long; the limit is {AGENT_ID_MAX}"
    bad = next(ch for ch in value if not _AGENT_ID.fullmatch(ch))
    return f"contains {bad!r}; allowed are letters, digits and . _ : -"


def agent_for_directory(conn: apsw.Connection, path: str | os.PathLike[str],
                        fallback: str | None = None) -> str:
    """The worker whose worktree contains `path` (the directory itself or one below it);
    outside every worker's worktree, `fallback` when given.

    A worker still at work (not COMPLETED, CANCELLED or FAILED) wins over a
    finished one whose worktree was kept. Where worktrees nest, the innermost
    one decides. The fallback is a checkout's own agent (a lead in the main
    checkout, named by $BUS_AGENT): a worktree still wins over it, since a
    worker's session may inherit the lead's environment. Raises
    AgentNotResolved, naming the directory and what was looked at, when no
    worker matches and there is no fallback, or several match equally.
    """
    directory = _real(path)
    places = _worker_places(conn)
    matching = [p for p in places if _contains(p.worktree, directory)]
    if matching:
        depth = max(len(p.worktree) for p in matching)  # the innermost: the longest path
        matching = [p for p in matching if len(p.worktree) == depth]
    working = [p for p in matching if p.state not in TERMINAL_STATES]
    chosen = working or matching
    if len(chosen) == 1:
        return chosen[0].worker
    if not chosen and fallback:
        return fallback
    if not chosen:
        raise AgentNotResolved(_none_message(directory, places), str(directory), [])
    raise AgentNotResolved(_ambiguous_message(directory, chosen), str(directory),
                           [p.worker for p in chosen])


def resolve_agent(conn: apsw.Connection, agent: str, directory: str | os.PathLike[str],
                  environ: Mapping[str, str] = os.environ) -> str:
    """`agent` itself, or for `auto` the worker whose worktree holds `directory`, else the
    agent named in $BUS_AGENT (ValidationFailed naming it when it is no valid id)."""
    if agent != AUTO:
        return agent
    fallback = environ.get(AGENT_ENV) or None
    if fallback is not None:
        validate_agent_id(fallback, AGENT_ENV)
    return agent_for_directory(conn, directory, fallback)


def _worker_places(conn: apsw.Connection) -> list[WorkerPlace]:
    rows = conn.execute("SELECT worker_id, state, worktree FROM workers"
                        " ORDER BY updated_at_ms DESC, worker_id").fetchall()
    return [WorkerPlace(worker, state, _real(worktree)) for worker, state, worktree in rows]


def _real(path: str | os.PathLike[str]) -> str:
    """Symlinks resolved on both sides: /tmp and /private/tmp, a linked checkout."""
    return os.path.realpath(os.path.abspath(path))


def _contains(worktree: str, directory: str) -> bool:
    return directory == worktree or directory.startswith(worktree.rstrip(os.sep) + os.sep)


def _none_message(directory: str, places: list[WorkerPlace]) -> str:
    if not places:
        looked = "the bus has no workers"
    else:
        shown = ", ".join(f"{p.worker} at {p.worktree}" for p in places[:_LISTED])
        more = f" and {len(places) - _LISTED} more" if len(places) > _LISTED else ""
        looked = f"looked at {len(places)} worker worktree(s): {shown}{more}"
    return (f"agent: auto found no worker whose worktree contains {directory} ({looked});"
            " run the agent inside the worktree `worker spawn` printed, give its id, or name"
            f" this checkout's agent in ${AGENT_ENV}")


def _ambiguous_message(directory: str, chosen: list[WorkerPlace]) -> str:
    shown = ", ".join(f"{p.worker} ({p.state}) at {p.worktree}" for p in chosen)
    return (f"agent: auto found {len(chosen)} workers whose worktree contains {directory}"
            f" ({shown}); give the id of the one to act as")
