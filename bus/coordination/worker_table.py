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

from bus.log.agent_ids import TERMINAL_STATES  # defined light, for hooks

# The workers still at work, as SQL: the terminal states are spelled once, above.
AT_WORK_SQL = f"state NOT IN ({', '.join(repr(state) for state in sorted(TERMINAL_STATES))})"

COLUMNS = ("worker_id, task_id, state, repo, base, branch, worktree, head_commit,"
           " merge_commit, note, created_at_ms, updated_at_ms")
_GET_SQL = f"SELECT {COLUMNS} FROM workers WHERE worker_id = ?"
_LIST_SQL = f"SELECT {COLUMNS} FROM workers ORDER BY created_at_ms, worker_id"
# A worker's transitions are its own state_change messages: the lifecycle publishes
# each in the transaction that makes it, with the task as correlation id.
_TRANSITION = ("SELECT seq, ts_ms, payload ->> '$.from', payload ->> '$.to',"
               " payload ->> '$.command' FROM messages")
_STATE_CHANGES_SQL = (
    f"{_TRANSITION} WHERE from_agent = :worker AND type = 'state_change' AND json_valid(payload)"
    " AND seq > :floor ORDER BY seq"
)
# The task's id as correlation id lets idx_messages_correlation_seq serve it: no
# index leads with the type or the sender (each would cost every publish).
_TASK_STATE_CHANGES_SQL = (
    f"{_TRANSITION} WHERE correlation_id = :task AND type = 'state_change'"
    " AND from_agent = :worker AND json_valid(payload) ORDER BY seq DESC LIMIT :limit"
)


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


@dataclass(frozen=True)
class StateChange:
    """One transition of a worker, as its state_change message tells it."""

    seq: int
    ts_ms: int
    from_state: str | None
    to_state: str | None
    command: str | None


def state_changes(conn: apsw.Connection, worker: str, after_seq: int = 0) -> list[StateChange]:
    """The transitions of `worker` in the log above `after_seq` (a bound on the scan:
    no index leads with the sender), oldest first."""
    return [StateChange(*row) for row in conn.execute(
        _STATE_CHANGES_SQL, {"worker": worker, "floor": after_seq})]


def task_state_changes(conn: apsw.Connection, worker: str, task: str,
                       limit: int) -> list[StateChange]:
    """The newest `limit` transitions of `worker` on `task`, oldest first."""
    rows = conn.execute(_TASK_STATE_CHANGES_SQL,
                        {"task": task, "worker": worker, "limit": limit}).fetchall()
    return [StateChange(*row) for row in reversed(rows)]
