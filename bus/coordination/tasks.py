"""The task graph: tasks, their dependencies, and the ready list.

A task is `open`, `done` or `cancelled`, with a priority from 0 (the most
urgent, as in beads) to 4 and the tasks it depends on. It is *ready* when it
is open, every task it depends on is done, no live lease in task_claims
holds it, and it is not a dead claim. A cancelled dependency is not done:
its dependents stay blocked until someone cancels them too or they are done
some other way; nothing is unblocked by work that did not happen.

Each task keeps `waiting_on`, the count of its dependencies not yet done,
so the ready list is one scan of a partial index (migration 0014) in its
own order, checking only the leases of what it returns.

Like bus/coordination/claims.py, the operations (add_task ... cancel_task) take a
connection and run in one transaction on it; the `Tasks` facade
(bus/coordination/facades.py, `bus.tasks` on a Bus) hands them its thread's
connection. The functions below them run inside the caller's transaction.
Leases are the claims of bus/coordination/claims.py under the same task ids,
so `claim_next` takes its task through the very code `claim` runs (attempts,
takeovers, dead tasks, reaping and heartbeats all apply), and a task a live
lease holds is not ready. `complete_task` and
`cancel_task` publish `task_done` and `task_cancelled` (correlation id: the
task) in their transaction, so the export and the history see every end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import NamedTuple
from typing import TYPE_CHECKING

import apsw

from bus.coordination import claims
from bus.log import messages
from bus.coordination.claims import SYSTEM_AGENT
from bus.coordination.claims import Claim
from bus.coordination.claims import validate_lease
from bus.coordination.claims import validate_task as validate_task_id
from bus.storage.db import translate_errors
from bus.storage.db import write_transaction
from bus.storage.errors import NotTaskHolder
from bus.storage.errors import TaskCycle
from bus.storage.errors import TaskStateConflict
from bus.storage.errors import UnknownTask
from bus.storage.errors import ValidationFailed
from bus.log.messages import clock_ms

if TYPE_CHECKING:
    from bus.log.payloads import PayloadPolicy

TASKS_SCHEMA_VERSION = 14  # migrations/0014_task_graph.sql: a file before it has no tasks
PRIORITY_HIGHEST = 0
PRIORITY_LOWEST = 4
PRIORITY_DEFAULT = 2
OPEN = "open"
DONE = "done"
CANCELLED = "cancelled"
STATES = (OPEN, DONE, CANCELLED)
TITLE_MAX = 1000
EVENTS_SHOWN = 50  # the newest messages about a task that `task_detail` returns

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
_TASKS_TABLE_SQL = "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'tasks'"
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


@dataclass(frozen=True)
class ClaimedTask:
    """What `claim_next` took: the task and the lease it now holds."""

    task: Task
    claim: Claim

    @property
    def fence(self) -> int:
        return self.claim.fence

    def to_json_dict(self) -> dict[str, object]:
        return {**self.task.to_json_dict(), "agent": self.claim.agent, "fence": self.fence,
                "lease_until_ms": self.claim.lease_until_ms, "attempts": self.claim.attempts,
                "max_attempts": self.claim.max_attempts}


@dataclass(frozen=True)
class TaskDetail:
    """One task with its neighbours, its lease and the newest messages about it."""

    task: Task
    dependencies: list[Task]
    dependents: list[Task]
    claim: Claim | None
    ready: bool
    events: list[tuple[int, int, str, str]]  # (seq, ts_ms, from, type), oldest first
    now_ms: int

    @property
    def holder(self) -> str | None:
        """The agent whose lease is live now, if any."""
        live = self.claim is not None and not self.claim.expired(self.now_ms)
        return self.claim.agent if live else None

    def to_json_dict(self) -> dict[str, object]:
        claim = self.claim
        return {**self.task.to_json_dict(), "ready": self.ready,
                "dependencies": [_neighbour(t) for t in self.dependencies],
                "dependents": [_neighbour(t) for t in self.dependents],
                "holder": self.holder, "fence": claim.fence if claim else None,
                "lease_until_ms": claim.lease_until_ms if claim else None,
                "events": [{"seq": seq, "ts_ms": ts, "from": sender, "type": type_}
                           for seq, ts, sender, type_ in self.events]}


@dataclass(frozen=True)
class TaskRow:
    """A task of the graph with what stops it now: `status` is ready, blocked, held,
    done or cancelled; `holder` and `fence` are its live lease's."""

    task: Task
    status: str
    holder: str | None
    fence: int | None

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def priority(self) -> int:
        return self.task.priority

    @property
    def created_ms(self) -> int:
        return self.task.created_at_ms


# --- operations: one transaction each on the connection given -------------------


def add_task(conn: apsw.Connection, task_id: str, title: str | None = None, *,
             after: Iterable[str] = (), priority: int = PRIORITY_DEFAULT,
             now: int | None = None) -> Task:
    """See `Tasks.add`."""
    task_id = validate_task_id(task_id)
    title = messages.validate_text(title, "title", TITLE_MAX, optional=True)
    _validate_priority(priority)
    after = _validated_ids(after)
    with write_transaction(conn):
        if get(conn, task_id) is not None:
            raise ValidationFailed("task", f"{task_id} exists already; `bus task depend"
                                           f" {task_id} --after ...` adds dependencies to it")
        needed = _existing(conn, after)
        task = insert(conn, task_id, title, priority, clock_ms(now))
        for dependency in needed:
            add_dependency(conn, task, dependency)
        return get(conn, task_id)


def add_dependencies(conn: apsw.Connection, task_id: str, after: Iterable[str]) -> list[str]:
    """See `Tasks.add_dependencies`."""
    task_id = validate_task_id(task_id)
    after = _validated_ids(after)
    with write_transaction(conn):
        task = _open_task(conn, task_id, "task depend",
                          "only an open task can wait on others")
        added = []
        for dependency in _existing(conn, after):
            cycle = cycle_through(conn, task, dependency)
            if cycle is not None:
                raise TaskCycle(cycle)
            if add_dependency(conn, task, dependency):
                added.append(dependency.task_id)
        return added


def ready_tasks(conn: apsw.Connection, limit: int | None = None, *,
                now: int | None = None) -> list[Task]:
    """See `Tasks.ready`."""
    if limit is not None:
        messages.validate_positive_int(limit, "limit")
    with translate_errors(conn), conn:  # one read snapshot
        return ready(conn, clock_ms(now), -1 if limit is None else limit)


def list_tasks(conn: apsw.Connection, state: str | None = None) -> list[Task]:
    """See `Tasks.list`."""
    if state is not None and state not in STATES:
        raise ValidationFailed("state", f"must be one of {', '.join(STATES)},"
                                        f" got {state!r}")
    with translate_errors(conn):
        rows = conn.execute(_LIST_STATE_SQL, (state,)) if state else conn.execute(_LIST_SQL)
        return [Task(*row) for row in rows]


def find_task(conn: apsw.Connection, task_id: str) -> Task | None:
    """See `Tasks.find`."""
    with translate_errors(conn):
        return get(conn, validate_task_id(task_id))


def task_detail(conn: apsw.Connection, task_id: str, *, now: int | None = None) -> TaskDetail:
    """See `Tasks.detail`."""
    task_id = validate_task_id(task_id)
    with translate_errors(conn), conn:
        return task_detail_of(conn, _required(conn, task_id), clock_ms(now))


def task_detail_of(conn: apsw.Connection, task: Task, at: int) -> TaskDetail:
    """`task` with its neighbours, lease and events as of `at`, in the caller's transaction
    (a read-only view's connection too: `bus top` shows this)."""
    return TaskDetail(task, dependencies(conn, task), dependents(conn, task),
                      claims.get(conn, task.task_id), is_ready(conn, task, at),
                      events(conn, task.task_id, EVENTS_SHOWN), at)


def task_counts(conn: apsw.Connection, *, now: int | None = None) -> TaskCounts:
    with translate_errors(conn), conn:
        return counts(conn, clock_ms(now))


def claim_next(conn: apsw.Connection, agent: str, lease_ms: int = 60_000, *, max_attempts: int = 5,
               now: int | None = None, payloads: PayloadPolicy | None = None) -> ClaimedTask | None:
    """See `Tasks.claim_next`: the ready list and the claim share one transaction."""
    agent = messages.validate_agent_id(agent)
    validate_lease(lease_ms)
    messages.validate_positive_int(max_attempts, "max_attempts")
    with write_transaction(conn):
        at = clock_ms(now)
        refused: set[str] = set()
        while True:
            # Nearly always the first is taken: read one, more only past refusals.
            candidates = [t for t in ready(conn, at, 1 + len(refused))
                          if t.task_id not in refused]
            if not candidates:
                return None
            for task in candidates:
                # The claim code of `bus claim`, as a savepoint in this transaction:
                # the ready list cannot change under it.
                result = claims.try_claim(conn, task.task_id, agent, lease_ms,
                                          max_attempts=max_attempts, now=at,
                                          payloads=payloads)
                if result.granted:
                    return ClaimedTask(task, result.claim)
                refused.add(task.task_id)


def complete_task(conn: apsw.Connection, task_id: str, agent: str, *, fence: int | None = None,
                  require_claim: bool = True, now: int | None = None,
                  payloads: PayloadPolicy | None = None) -> Task:
    """See `Tasks.complete`."""
    task_id, agent = validate_task_id(task_id), messages.validate_agent_id(agent)
    if fence is not None:
        messages.validate_positive_int(fence, "fence")
    with write_transaction(conn):
        at = clock_ms(now)
        task = _open_task(conn, task_id, "task done", "nothing is left to do")
        if task.waiting_on:
            waits = [t.task_id for t in dependencies(conn, task) if t.state != DONE]
            raise TaskStateConflict(task_id, f"waiting on {', '.join(waits)}", "task done",
                                    "finish those first (or `bus task cancel` this one)")
        if fence is not None:  # first: a paused holder's stale fence says so
            claims.check_fence(conn, task_id, fence)
        claim = claims.get(conn, task_id)
        if require_claim and (claim is None or claim.agent != agent):
            raise NotTaskHolder(task_id, agent, claim.agent if claim else None)
        if claim is not None:
            claims.release(conn, task_id, claim.agent)
        done, unblocked = finish(conn, task, DONE, agent, at)
        _task_event(conn, payloads, agent, "task_done", {
            "task": task_id, "agent": agent, "title": task.title,
            "fence": claim.fence if claim else None, "unblocked": unblocked}, at)
        return done


def cancel_task(conn: apsw.Connection, task_id: str, agent: str | None = None,
                reason: str | None = None, *, now: int | None = None,
                payloads: PayloadPolicy | None = None) -> Task:
    """See `Tasks.cancel`."""
    task_id = validate_task_id(task_id)
    agent = messages.validate_agent_id(agent) if agent is not None else SYSTEM_AGENT
    reason = messages.validate_text(reason, "reason", TITLE_MAX, optional=True)
    with write_transaction(conn):
        at = clock_ms(now)
        task = _open_task(conn, task_id, "task cancel", "it cannot be cancelled")
        claim = claims.get(conn, task_id)
        if claim is not None:
            claims.release(conn, task_id, claim.agent)
        cancelled, _ = finish(conn, task, CANCELLED, agent, at)
        held = claim.agent if claim is not None and not claim.expired(at) else None
        _task_event(conn, payloads, agent, "task_cancelled", {
            "task": task_id, "agent": agent, "reason": reason, "holder": held,
            "blocked": [t.task_id for t in dependents(conn, task)
                        if t.state == OPEN]}, at)
        return cancelled


def _task_event(conn: apsw.Connection, payloads: PayloadPolicy | None, agent: str, type: str,
                payload: dict[str, Any], at: int) -> None:
    row = messages.prepare_row(agent, type, payload, correlation_id=payload["task"])
    messages.append(conn, [row], payloads, at)


# --- inside the caller's transaction ---------------------------------------------


def has_task_graph(conn: apsw.Connection) -> bool:
    """Whether the file has the task graph yet (a read-only view may read an older file)."""
    return conn.execute(_TASKS_TABLE_SQL).get is not None


def list_task_rows(conn: apsw.Connection, now: int) -> list[TaskRow]:
    """Every task of the graph, oldest first, with its status now (none in an older file)."""
    if not has_task_graph(conn):
        return []
    held = {c.task_id: c for c in claims.list_claims(conn) if not c.expired(now)}
    found = []
    for task in (Task(*row) for row in conn.execute(_LIST_SQL)):
        claim = held.get(task.task_id)
        if task.state != OPEN:
            status = task.state
        elif claim is not None:
            status = "held"
        else:
            status = "blocked" if task.waiting_on else "ready"
        found.append(TaskRow(task, status, claim.agent if claim else None,
                             claim.fence if claim else None))
    return found


def find_task_detail(conn: apsw.Connection, task_id: str, now: int) -> TaskDetail | None:
    """The task's dependencies, dependents, lease and newest events, as `bus task show`
    reads them; None if the graph has no such task (or the file no graph)."""
    task = get(conn, task_id) if has_task_graph(conn) else None
    return None if task is None else task_detail_of(conn, task, now)


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


def _validate_priority(priority: object) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not PRIORITY_HIGHEST <= priority <= PRIORITY_LOWEST:
        raise ValidationFailed("priority", f"must be an integer from {PRIORITY_HIGHEST}"
                                           f" (most urgent) to {PRIORITY_LOWEST},"
                                           f" got {priority!r}")


def _validated_ids(after: Iterable[str]) -> list[str]:
    if isinstance(after, str):  # one id given where a list was meant
        after = [after]
    seen = dict.fromkeys(messages.validate_text(d, "after", 256) for d in after)
    return list(seen)


def _existing(conn: apsw.Connection, task_ids: list[str]) -> list[Task]:
    found = []
    for task_id in task_ids:
        task = get(conn, task_id)
        if task is None:
            raise UnknownTask(task_id, "after")
        found.append(task)
    return found


def _required(conn: apsw.Connection, task_id: str) -> Task:
    task = get(conn, task_id)
    if task is None:
        raise UnknownTask(task_id)
    return task


def _open_task(conn: apsw.Connection, task_id: str, command: str, fix: str) -> Task:
    task = _required(conn, task_id)
    if task.state != OPEN:
        raise TaskStateConflict(task_id, task.state, command, fix)
    return task


def _neighbour(task: Task) -> dict[str, object]:
    return {"task": task.task_id, "title": task.title, "state": task.state}
