"""The task graph: tasks, their dependencies, and the ready list (issue 32).

A task is `open`, `done` or `cancelled`, with a priority from 0 (the most
urgent, as in beads) to 4 and the tasks it depends on. It is *ready* when it
is open, every task it depends on is done, no live lease in task_claims
holds it, and it is not a dead claim. A cancelled dependency is not done:
its dependents stay blocked until someone cancels them too or they are done
some other way; nothing is unblocked by work that did not happen.

Each task keeps `waiting_on`, the count of its dependencies not yet done,
so the ready list is one scan of a partial index (migration 0014) in its
own order, checking only the leases of what it returns. Every function here
runs inside the caller's transaction (bus/task_graph.py holds them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
import apsw

TASKS_SCHEMA_VERSION = 14  # migrations/0014_task_graph.sql: a file before it has no tasks
PRIORITY_HIGHEST = 0
PRIORITY_LOWEST = 4
PRIORITY_DEFAULT = 2
OPEN = "open"
DONE = "done"
CANCELLED = "cancelled"
STATES = (OPEN, DONE, CANCELLED)

_COLUMNS = ("seq, task_id, title, priority, state, waiting_on, created_at_ms,"
            " finished_at_ms, finished_by")
_T_COLUMNS = ", ".join(f"t.{c}" for c in _COLUMNS.split(", "))
_INSERT_SQL = (
    "INSERT INTO tasks (task_id, title, priority, state, waiting_on, created_at_ms)"
    " VALUES (?, ?, ?, 'open', 0, ?) RETURNING seq"
)
_GET_SQL = f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?"
_GET_BY_SEQ_SQL = f"SELECT {_COLUMNS} FROM tasks WHERE seq = ?"
_ADD_EDGE_SQL = ("INSERT INTO task_dependencies (task_seq, depends_on_seq) VALUES (?, ?)"
                 " ON CONFLICT DO NOTHING RETURNING task_seq")
_WAIT_MORE_SQL = "UPDATE tasks SET waiting_on = waiting_on + 1 WHERE seq = ?"
# The literals 'open' and 0 repeat the partial index's WHERE: with bound
# values instead the planner could not prove the index covers the query
# (https://sqlite.org/partialindex.html#queries_using_partial_indexes).
_READY_WHERE = (
    "t.state = 'open' AND t.waiting_on = 0"
    " AND NOT EXISTS (SELECT 1 FROM task_claims c WHERE c.task_id = t.task_id"
    " AND c.lease_until_ms > :now)"
    " AND NOT EXISTS (SELECT 1 FROM dead_claims d WHERE d.task_id = t.task_id)"
)
# INDEXED BY: without statistics the planner may prefer idx_tasks_state and
# then sort every ready task for a LIMIT 1; the ready index
# is already in the order asked for, so claim_next reads one entry.
_READY_SQL = (f"SELECT {_T_COLUMNS} FROM tasks t INDEXED BY idx_tasks_ready WHERE {_READY_WHERE}"
              " ORDER BY t.priority, t.seq LIMIT :limit")
_IS_READY_SQL = f"SELECT count(*) FROM tasks t WHERE t.seq = :seq AND {_READY_WHERE}"
_READY_COUNT_SQL = f"SELECT count(*) FROM tasks t INDEXED BY idx_tasks_ready WHERE {_READY_WHERE}"
# Open tasks waiting on something: all open ones less those in the ready index.
_BLOCKED_COUNT_SQL = (
    "SELECT (SELECT count(*) FROM tasks WHERE state = 'open')"
    " - (SELECT count(*) FROM tasks INDEXED BY idx_tasks_ready WHERE state = 'open'"
    " AND waiting_on = 0)"
)
# Open tasks with a live lease: few (one per working agent), found from the claims
# side (CROSS JOIN keeps that order: https://sqlite.org/optoverview.html#crossjoin).
_HELD_COUNT_SQL = (
    "SELECT count(*) FROM task_claims c CROSS JOIN tasks t ON t.task_id = c.task_id"
    " WHERE c.lease_until_ms > :now AND t.state = 'open'"
)
_STATE_COUNTS_SQL = "SELECT state, count(*) FROM tasks GROUP BY state"
_LIST_SQL = f"SELECT {_COLUMNS} FROM tasks ORDER BY seq"
_LIST_STATE_SQL = f"SELECT {_COLUMNS} FROM tasks WHERE state = ? ORDER BY seq"
_DEPENDENCIES_SQL = (
    f"SELECT {_T_COLUMNS} FROM task_dependencies e JOIN tasks t ON t.seq = e.depends_on_seq"
    " WHERE e.task_seq = ? ORDER BY t.seq"
)
_DEPENDENTS_SQL = (
    f"SELECT {_T_COLUMNS} FROM task_dependencies e JOIN tasks t ON t.seq = e.task_seq"
    " WHERE e.depends_on_seq = ? ORDER BY t.seq"
)
# Everything `start` depends on, directly or not, each with the task that led
# to it: a new edge task -> start closes a cycle exactly when task is among them.
_REACHABLE_SQL = (
    "WITH RECURSIVE reach(seq, via) AS ("
    " SELECT :start, NULL"
    " UNION SELECT e.depends_on_seq, e.task_seq FROM task_dependencies e"
    " JOIN reach r ON e.task_seq = r.seq)"
    " SELECT seq, via FROM reach"
)
_FINISH_SQL = (
    "UPDATE tasks SET state = ?, finished_at_ms = ?, finished_by = ?"
    " WHERE seq = ? AND state = 'open'"
)
_UNBLOCK_DEPENDENTS_SQL = (
    "UPDATE tasks SET waiting_on = waiting_on - 1"
    " WHERE seq IN (SELECT task_seq FROM task_dependencies WHERE depends_on_seq = ?)"
    " RETURNING task_id, state, waiting_on"
)
_EVENTS_SQL = (
    "SELECT seq, ts_ms, from_agent, type FROM messages WHERE correlation_id = ?"
    " ORDER BY seq DESC LIMIT ?"
)


class Task(NamedTuple):
    """One task of the graph. `waiting_on` counts its dependencies not yet done.

    A NamedTuple, not a dataclass: `bus task ready` builds one per ready task,
    and a tuple's constructor is several times cheaper than a frozen
    dataclass's (scripts/bench_tasks.py compares the list with a plain SELECT).
    """

    seq: int
    task_id: str
    title: str | None
    priority: int
    state: str
    waiting_on: int
    created_at_ms: int
    finished_at_ms: int | None
    finished_by: str | None

    @property
    def blocked(self) -> bool:
        return self.state == OPEN and self.waiting_on > 0

    def to_json_dict(self) -> dict[str, object]:
        return {"task": self.task_id, "title": self.title, "priority": self.priority,
                "state": self.state, "waiting_on": self.waiting_on,
                "created_at_ms": self.created_at_ms, "finished_at_ms": self.finished_at_ms,
                "finished_by": self.finished_by}


@dataclass(frozen=True)
class TaskCounts:
    """Open tasks by what stops them: nothing (ready), a dependency (blocked), a lease (held)."""

    ready: int
    blocked: int
    held: int
    done: int
    cancelled: int

    def to_json_dict(self) -> dict[str, int]:
        return {"ready": self.ready, "blocked": self.blocked, "held": self.held,
                "done": self.done, "cancelled": self.cancelled}


def get(conn: apsw.Connection, task_id: str) -> Task | None:
    row = conn.execute(_GET_SQL, (task_id,)).fetchone()
    return Task(*row) if row else None


def insert(conn: apsw.Connection, task_id: str, title: str | None, priority: int,
           at: int) -> Task:
    """A new open task with no dependencies (the caller checked `task_id` is free)."""
    seq = conn.execute(_INSERT_SQL, (task_id, title, priority, at)).get
    return Task(seq, task_id, title, priority, OPEN, 0, at, None, None)


def cycle_through(conn: apsw.Connection, task: Task, dependency: Task) -> list[str] | None:
    """The cycle `task` depending on `dependency` would close, as task ids from `task`
    back to `task` (["a", "b", "a"]), or None when the edge keeps the graph acyclic."""
    if task.seq == dependency.seq:
        return [task.task_id, task.task_id]
    came_from: dict[int, int | None] = {}
    for seq, via in conn.execute(_REACHABLE_SQL, {"start": dependency.seq}):
        came_from.setdefault(seq, via)
    if task.seq not in came_from:
        return None
    path = [task.seq]  # walk back from task to dependency along the first way found
    while path[-1] != dependency.seq:
        path.append(came_from[path[-1]])
    path.reverse()  # dependency ... task: each depends on the next
    ids = [_task_id_of(conn, seq) for seq in path]
    return [task.task_id, *ids]


def add_dependency(conn: apsw.Connection, task: Task, dependency: Task) -> bool:
    """Record that `task` depends on `dependency` (the caller checked for cycles);
    False when it did already. A dependency not yet done makes `task` wait on it."""
    added = conn.execute(_ADD_EDGE_SQL, (task.seq, dependency.seq)).get is not None
    if added and dependency.state != DONE:
        conn.execute(_WAIT_MORE_SQL, (task.seq,))
    return added


def ready(conn: apsw.Connection, now: int, limit: int = -1) -> list[Task]:
    """Ready tasks, most urgent first, then oldest; `limit` -1 for all."""
    return [Task(*row) for row in conn.execute(_READY_SQL, {"now": now, "limit": limit})]


def is_ready(conn: apsw.Connection, task: Task, now: int) -> bool:
    return bool(conn.execute(_IS_READY_SQL, {"seq": task.seq, "now": now}).get)


def counts(conn: apsw.Connection, now: int, schema_version: int | None = None) -> TaskCounts:
    """How many tasks are ready, blocked, held; done and cancelled.

    `schema_version`: a read-only view's file, which may predate the task graph.
    """
    if schema_version is not None and schema_version < TASKS_SCHEMA_VERSION:
        return TaskCounts(0, 0, 0, 0, 0)
    by_state = dict(conn.execute(_STATE_COUNTS_SQL).fetchall())
    return TaskCounts(ready=conn.execute(_READY_COUNT_SQL, {"now": now}).get,
                      blocked=conn.execute(_BLOCKED_COUNT_SQL).get,
                      held=conn.execute(_HELD_COUNT_SQL, {"now": now}).get,
                      done=by_state.get(DONE, 0), cancelled=by_state.get(CANCELLED, 0))


def list_tasks(conn: apsw.Connection, state: str | None = None) -> list[Task]:
    rows = conn.execute(_LIST_STATE_SQL, (state,)) if state else conn.execute(_LIST_SQL)
    return [Task(*row) for row in rows]


def dependencies(conn: apsw.Connection, task: Task) -> list[Task]:
    return [Task(*row) for row in conn.execute(_DEPENDENCIES_SQL, (task.seq,))]


def dependents(conn: apsw.Connection, task: Task) -> list[Task]:
    return [Task(*row) for row in conn.execute(_DEPENDENTS_SQL, (task.seq,))]


def finish(conn: apsw.Connection, task: Task, state: str, agent: str | None,
           at: int) -> tuple[Task, list[str]]:
    """Mark an open task done or cancelled; a done one makes each of its dependents wait
    on one task less. The task as it is now, and the open dependents it left waiting
    on nothing (ready, unless a lease holds them)."""
    conn.execute(_FINISH_SQL, (state, at, agent, task.seq))
    unblocked = []
    if state == DONE:
        unblocked = [task_id for task_id, left_state, waiting_on
                     in conn.execute(_UNBLOCK_DEPENDENTS_SQL, (task.seq,))
                     if left_state == OPEN and waiting_on == 0]
    return task._replace(state=state, finished_at_ms=at, finished_by=agent), sorted(unblocked)


def events(conn: apsw.Connection, task_id: str, limit: int) -> list[tuple[int, int, str, str]]:
    """The newest messages about the task (its correlation id): (seq, ts_ms, from, type)."""
    rows = conn.execute(_EVENTS_SQL, (task_id, limit)).fetchall()
    return list(reversed(rows))


def _task_id_of(conn: apsw.Connection, seq: int) -> str:
    return conn.execute(_GET_BY_SEQ_SQL, (seq,)).fetchone()[1]
