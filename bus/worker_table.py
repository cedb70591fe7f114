"""The workers table (migrations/0003_workers.sql): a worker's row, one shape for every reader.

The lifecycle (the `workers` package, above bus) writes the table; `--agent auto`,
the console and the history job read it. All of them take the row and the states
a worker never leaves from here, so the bus never imports the lifecycle and no
reader spells the row out again.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass

import apsw

from bus.identity import TERMINAL_STATES  # defined light, for hooks

# The workers still at work, as SQL: the terminal states are spelled once, above.
AT_WORK_SQL = f"state NOT IN ({', '.join(repr(state) for state in sorted(TERMINAL_STATES))})"

COLUMNS = ("worker_id, task_id, state, repo, base, branch, worktree, head_commit,"
           " merge_commit, note, created_at_ms, updated_at_ms")
_GET_SQL = f"SELECT {COLUMNS} FROM workers WHERE worker_id = ?"
_LIST_SQL = f"SELECT {COLUMNS} FROM workers ORDER BY created_at_ms, worker_id"


@dataclass(frozen=True)
class Worker:
    worker: str
    task: str
    state: str
    repo: str
    base: str
    branch: str
    worktree: str
    head_commit: str | None
    merge_commit: str | None
    note: str | None
    created_at_ms: int
    updated_at_ms: int

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self)


def get_worker(conn: apsw.Connection, worker: str) -> Worker | None:
    row = conn.execute(_GET_SQL, (worker,)).fetchone()
    return None if row is None else Worker(*row)


def list_workers(conn: apsw.Connection) -> list[Worker]:
    """Every worker, oldest first."""
    return [Worker(*row) for row in conn.execute(_LIST_SQL)]
