"""The task graph on the `Bus` facade: add tasks, list what is ready, claim the next, finish.

A mixin of `Bus` (bus/api.py) like bus/leases.py: each method is one
BEGIN IMMEDIATE transaction around the SQL of bus/tasks.py. Leases are the
claims of bus/leases.py under the same task ids, so `claim_next` takes its
task through the very code `claim` runs (attempts, takeovers, dead tasks,
reaping and heartbeats all apply), and a task a live lease holds is not
ready. `complete_task` and `cancel_task` publish `task_done` and
`task_cancelled` (correlation id: the task) in their transaction, so the
export and the history see every end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Iterable

import apsw

from bus import claims
from bus import messages
from bus import tasks
from bus.claims import Claim
from bus.db import translate_errors
from bus.db import write_transaction
from bus.errors import NotTaskHolder
from bus.errors import TaskCycle
from bus.errors import TaskStateConflict
from bus.errors import UnknownTask
from bus.errors import ValidationFailed
from bus.claims import SYSTEM_AGENT
from bus.claims import validate_lease
from bus.claims import validate_task as validate_task_id
from bus.messages import clock_ms
from bus.tasks import Task
from bus.tasks import TaskCounts

TITLE_MAX = 1000
EVENTS_SHOWN = 50  # the newest messages about a task that `task_detail` returns


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


class TaskGraph:
    """Tasks with dependencies and a ready list; `conn` is the calling thread's connection."""

    conn: apsw.Connection

    def add_task(self, task_id: str, title: str | None = None, *, after: Iterable[str] = (),
                 priority: int = tasks.PRIORITY_DEFAULT, now: int | None = None) -> Task:
        """Add an open task that waits on the tasks in `after` (each must exist).

        `priority` runs from 0 (the most urgent, listed first) to 4. Raises
        ValidationFailed (field `task`) when the id is taken, UnknownTask
        (field `after`) for a dependency that does not exist.
        """
        task_id = validate_task_id(task_id)
        title = messages.validate_text(title, "title", TITLE_MAX, optional=True)
        _validate_priority(priority)
        after = _validated_ids(after)
        conn = self.conn
        with write_transaction(conn):
            if tasks.get(conn, task_id) is not None:
                raise ValidationFailed("task", f"{task_id} exists already; `bus task depend"
                                               f" {task_id} --after ...` adds dependencies to it")
            needed = _existing(conn, after)
            task = tasks.insert(conn, task_id, title, priority, clock_ms(now))
            for dependency in needed:
                tasks.add_dependency(conn, task, dependency)
            return tasks.get(conn, task_id)

    def add_dependencies(self, task_id: str, after: Iterable[str]) -> list[str]:
        """Make an open task wait on more tasks; the ids newly added (known ones are skipped).

        Raises TaskCycle (field `after`, with the cycle's path) when one would
        close a cycle; then nothing is added.
        """
        task_id = validate_task_id(task_id)
        after = _validated_ids(after)
        conn = self.conn
        with write_transaction(conn):
            task = _open_task(conn, task_id, "task depend",
                              "only an open task can wait on others")
            added = []
            for dependency in _existing(conn, after):
                cycle = tasks.cycle_through(conn, task, dependency)
                if cycle is not None:
                    raise TaskCycle(cycle)
                if tasks.add_dependency(conn, task, dependency):
                    added.append(dependency.task_id)
            return added

    def ready_tasks(self, limit: int | None = None, *, now: int | None = None) -> list[Task]:
        """Open tasks whose dependencies are all done and that no live lease holds,
        most urgent first (priority 0), then oldest."""
        if limit is not None:
            messages.validate_positive_int(limit, "limit")
        with translate_errors(self.conn), self.conn:  # one read snapshot
            return tasks.ready(self.conn, clock_ms(now), -1 if limit is None else limit)

    def list_tasks(self, state: str | None = None) -> list[Task]:
        """Every task (or those in `state`: open, done, cancelled), oldest first."""
        if state is not None and state not in tasks.STATES:
            raise ValidationFailed("state", f"must be one of {', '.join(tasks.STATES)},"
                                            f" got {state!r}")
        with translate_errors(self.conn):
            return tasks.list_tasks(self.conn, state)

    def find_task(self, task_id: str) -> Task | None:
        """The task, or None when the graph has no such id."""
        with translate_errors(self.conn):
            return tasks.get(self.conn, validate_task_id(task_id))

    def task_detail(self, task_id: str, *, now: int | None = None) -> TaskDetail:
        """The task with its dependencies, dependents, lease and newest events."""
        task_id = validate_task_id(task_id)
        conn = self.conn
        with translate_errors(conn), conn:
            at = clock_ms(now)
            task = _required(conn, task_id)
            return TaskDetail(task, tasks.dependencies(conn, task), tasks.dependents(conn, task),
                              claims.get(conn, task_id), tasks.is_ready(conn, task, at),
                              tasks.events(conn, task_id, EVENTS_SHOWN), at)

    def task_counts(self, *, now: int | None = None) -> TaskCounts:
        with translate_errors(self.conn), self.conn:
            return tasks.counts(self.conn, clock_ms(now))

    def claim_next(self, agent: str, lease_ms: int = 60_000, *, max_attempts: int = 5,
                   now: int | None = None) -> ClaimedTask | None:
        """Claim the first ready task for `agent`, or None when nothing is ready.

        One write transaction reads the ready list and claims through the
        same code as `try_claim`, so two agents never get the same task. A
        ready task whose expired lease has no attempts left is declared dead
        on the way (`task_dead`, as a claim would) and the next one is tried.
        """
        agent = messages.validate_agent_id(agent)
        validate_lease(lease_ms)
        messages.validate_positive_int(max_attempts, "max_attempts")
        conn = self.conn
        with write_transaction(conn):
            at = clock_ms(now)
            refused: set[str] = set()
            while True:
                # Nearly always the first is taken: read one, more only past refusals.
                candidates = [t for t in tasks.ready(conn, at, 1 + len(refused))
                              if t.task_id not in refused]
                if not candidates:
                    return None
                for task in candidates:
                    # The claim code of `bus claim`, as a savepoint in this transaction:
                    # the ready list cannot change under it.
                    result = claims.try_claim(conn, task.task_id, agent, lease_ms,
                                              max_attempts=max_attempts, now=at)
                    if result.granted:
                        return ClaimedTask(task, result.claim)
                    refused.add(task.task_id)

    def complete_task(self, task_id: str, agent: str, *, fence: int | None = None,
                      require_claim: bool = True, now: int | None = None) -> Task:
        """Mark a task done by `agent`, which must hold its claim (with `fence`, that exact
        one); its lease ends and its dependents wait on one task less.

        Publishes `task_done` in the same transaction. `require_claim=False`
        is for a task finished otherwise (a worker's merged branch). Raises
        StaleFence (field `fence`, naming the current one) when another agent
        took the task over since `fence` was handed out, UnknownTask,
        TaskStateConflict (not open, or waiting on others), NotTaskHolder.
        """
        task_id, agent = validate_task_id(task_id), messages.validate_agent_id(agent)
        if fence is not None:
            messages.validate_positive_int(fence, "fence")
        conn = self.conn
        with write_transaction(conn):
            at = clock_ms(now)
            task = _open_task(conn, task_id, "task done", "nothing is left to do")
            if task.waiting_on:
                waits = [t.task_id for t in tasks.dependencies(conn, task) if t.state != tasks.DONE]
                raise TaskStateConflict(task_id, f"waiting on {', '.join(waits)}", "task done",
                                        "finish those first (or `bus task cancel` this one)")
            if fence is not None:  # first: a paused holder's stale fence says so
                claims.check_fence(conn, task_id, fence)
            claim = claims.get(conn, task_id)
            if require_claim and (claim is None or claim.agent != agent):
                raise NotTaskHolder(task_id, agent, claim.agent if claim else None)
            if claim is not None:
                claims.release(conn, task_id, claim.agent)
            done, unblocked = tasks.finish(conn, task, tasks.DONE, agent, at)
            self._task_event(conn, agent, "task_done", {
                "task": task_id, "agent": agent, "title": task.title,
                "fence": claim.fence if claim else None, "unblocked": unblocked}, at)
            return done

    def cancel_task(self, task_id: str, agent: str | None = None, reason: str | None = None, *,
                    now: int | None = None) -> Task:
        """Cancel an open task (its lease ends, if any); publishes `task_cancelled`.

        Its dependents stay blocked: a cancelled task is not done.
        """
        task_id = validate_task_id(task_id)
        agent = messages.validate_agent_id(agent) if agent is not None else SYSTEM_AGENT
        reason = messages.validate_text(reason, "reason", TITLE_MAX, optional=True)
        conn = self.conn
        with write_transaction(conn):
            at = clock_ms(now)
            task = _open_task(conn, task_id, "task cancel", "it cannot be cancelled")
            claim = claims.get(conn, task_id)
            if claim is not None:
                claims.release(conn, task_id, claim.agent)
            cancelled, _ = tasks.finish(conn, task, tasks.CANCELLED, agent, at)
            held = claim.agent if claim is not None and not claim.expired(at) else None
            self._task_event(conn, agent, "task_cancelled", {
                "task": task_id, "agent": agent, "reason": reason, "holder": held,
                "blocked": [t.task_id for t in tasks.dependents(conn, task)
                            if t.state == tasks.OPEN]}, at)
            return cancelled

    def _task_event(self, conn: apsw.Connection, agent: str, type: str,
                    payload: dict[str, Any], at: int) -> None:
        row = messages.prepare_row(agent, type, payload, correlation_id=payload["task"])
        messages.insert_row(conn, row, at)


def _validate_priority(priority: object) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not tasks.PRIORITY_HIGHEST <= priority <= tasks.PRIORITY_LOWEST:
        raise ValidationFailed("priority", f"must be an integer from {tasks.PRIORITY_HIGHEST}"
                                           f" (most urgent) to {tasks.PRIORITY_LOWEST},"
                                           f" got {priority!r}")


def _validated_ids(after: Iterable[str]) -> list[str]:
    if isinstance(after, str):  # one id given where a list was meant
        after = [after]
    seen = dict.fromkeys(messages.validate_text(d, "after", 256) for d in after)
    return list(seen)


def _existing(conn: apsw.Connection, task_ids: list[str]) -> list[Task]:
    found = []
    for task_id in task_ids:
        task = tasks.get(conn, task_id)
        if task is None:
            raise UnknownTask(task_id, "after")
        found.append(task)
    return found


def _required(conn: apsw.Connection, task_id: str) -> Task:
    task = tasks.get(conn, task_id)
    if task is None:
        raise UnknownTask(task_id)
    return task


def _open_task(conn: apsw.Connection, task_id: str, command: str, fix: str) -> Task:
    task = _required(conn, task_id)
    if task.state != tasks.OPEN:
        raise TaskStateConflict(task_id, task.state, command, fix)
    return task


def _neighbour(task: Task) -> dict[str, object]:
    return {"task": task.task_id, "title": task.title, "state": task.state}
