"""Who an agent is, from where it runs: what `--agent auto` resolves to.

An agent started by the `worker spawn` workflow runs in that worker's git
worktree, so the directory names the worker. The `workers` table
(bus/worker_table.py) is read here directly: the bus must not import the
`workers` package, which sits above it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import apsw

from bus.errors import AgentNotResolved
from bus.worker_table import TERMINAL_STATES

AUTO = "auto"  # the --agent value that asks for this resolution
_LISTED = 5  # workers an error names before it says "and N more"


class WorkerPlace(NamedTuple):
    worker: str
    state: str
    worktree: Path


def agent_for_directory(conn: apsw.Connection, path: str | os.PathLike[str]) -> str:
    """The worker whose worktree contains `path` (the directory itself or one below it).

    A worker still at work (not COMPLETED, CANCELLED or FAILED) wins over a
    finished one whose worktree was kept. Where worktrees nest, the innermost
    one decides. Raises AgentNotResolved, naming the directory and what was
    looked at, when no worker matches or several do equally.
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
    if not chosen:
        raise AgentNotResolved(_none_message(directory, places), str(directory), [])
    raise AgentNotResolved(_ambiguous_message(directory, chosen), str(directory),
                           [p.worker for p in chosen])


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
            " run the agent inside the worktree `worker spawn` printed, or give its id")


def _ambiguous_message(directory: Path, chosen: list[WorkerPlace]) -> str:
    shown = ", ".join(f"{p.worker} ({p.state}) at {p.worktree}" for p in chosen)
    return (f"agent: auto found {len(chosen)} workers whose worktree contains {directory}"
            f" ({shown}); give the id of the one to act as")
