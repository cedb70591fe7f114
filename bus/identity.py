"""Who an agent is, from where it runs: what `--agent auto` resolves to.

An agent started by the `worker spawn` workflow runs in that worker's git
worktree, so the directory names the worker. The `workers` table
(bus/worker_table.py) is read here directly: the bus must not import the
`workers` package, which sits above it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping
from typing import NamedTuple

import apsw

from bus.errors import AgentNotResolved
from bus.messages import validate_agent_id
from bus.worker_table import TERMINAL_STATES

AUTO = "auto"  # the --agent value that asks for this resolution
AGENT_ENV = "BUS_AGENT"  # who `auto` is outside every worker's worktree, when set
_LISTED = 5  # workers an error names before it says "and N more"


class WorkerPlace(NamedTuple):
    worker: str
    state: str
    worktree: Path


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
        depth = max(len(p.worktree.parts) for p in matching)
        matching = [p for p in matching if len(p.worktree.parts) == depth]
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


def _real(path: str | os.PathLike[str]) -> Path:
    """Symlinks resolved on both sides: /tmp and /private/tmp, a linked checkout."""
    return Path(os.path.realpath(os.path.abspath(path)))


def _contains(worktree: Path, directory: Path) -> bool:
    return directory == worktree or worktree in directory.parents


def _none_message(directory: Path, places: list[WorkerPlace]) -> str:
    if not places:
        looked = "the bus has no workers"
    else:
        shown = ", ".join(f"{p.worker} at {p.worktree}" for p in places[:_LISTED])
        more = f" and {len(places) - _LISTED} more" if len(places) > _LISTED else ""
        looked = f"looked at {len(places)} worker worktree(s): {shown}{more}"
    return (f"agent: auto found no worker whose worktree contains {directory} ({looked});"
            " run the agent inside the worktree `worker spawn` printed, give its id, or name"
            f" this checkout's agent in ${AGENT_ENV}")


def _ambiguous_message(directory: Path, chosen: list[WorkerPlace]) -> str:
    shown = ", ".join(f"{p.worker} ({p.state}) at {p.worktree}" for p in chosen)
    return (f"agent: auto found {len(chosen)} workers whose worktree contains {directory}"
            f" ({shown}); give the id of the one to act as")
