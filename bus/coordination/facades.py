"""The doors to coordination on an open Bus: `bus.claims`, `bus.tasks`,
`bus.reservations`, `bus.heartbeats` and `bus.tokens`.

    with Bus.open("bus.db") as bus:
        result = bus.claims.try_claim("t1", "worker-1", lease_ms=60_000)
        if result.granted:
            ...
            bus.claims.release("t1", "worker-1", fence=result.fence)

Each facade is a thin class over the room's operations, which take a
connection: it hands them the calling thread's connection to the bus file, so
one facade serves every thread of a Bus, as `bus.channels` does. The `Bus`
itself keeps the log; whatever coordinates agents is reached through here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterable
from typing import Protocol
from typing import Sequence
from typing import TYPE_CHECKING

import apsw

from bus.coordination import claims
from bus.coordination import heartbeats
from bus.coordination import reservations
from bus.coordination import tasks
from bus.coordination import tokens
from bus.coordination.claims import Claim
from bus.coordination.claims import ClaimResult
from bus.coordination.claims import DeadClaim
from bus.coordination.heartbeats import AgentHoldsClaims
from bus.coordination.heartbeats import Liveness
from bus.coordination.heartbeats import Thresholds
from bus.coordination.reservations import DEFAULT_TTL_MS
from bus.coordination.reservations import EXCLUSIVE
from bus.coordination.reservations import Held
from bus.coordination.reservations import Reservation
from bus.coordination.tasks import PRIORITY_DEFAULT
from bus.coordination.tasks import ClaimedTask
from bus.coordination.tasks import Task
from bus.coordination.tasks import TaskCounts
from bus.coordination.tasks import TaskDetail
from bus.coordination.tokens import NewToken
from bus.coordination.tokens import Token
from bus.log.messages import clock_ms
from bus.log.messages import validate_agent_id

if TYPE_CHECKING:
    from bus.log.payloads import PayloadPolicy


class Connected(Protocol):
    """What a facade uses of the bus it serves: `Bus` hands itself over.

    A protocol rather than an import of `bus.api`, which imports this module:
    coordination sits below the facade and knows only the log's parts. A facade
    reaches the connection only through the bus's doors, a read transaction or a
    write transaction; each module function it calls runs inside that one.
    """

    def read(self) -> AbstractContextManager[apsw.Connection]: ...

    def write(self) -> AbstractContextManager[apsw.Connection]: ...

    @property
    def payloads(self) -> PayloadPolicy: ...


class Claims:
    """Leased claims on tasks: one holder at a time, renewed or lost, dead after too many
    takes (bus/coordination/claims.py). Reached as `bus.claims`."""

    def __init__(self, bus: Connected) -> None:
        self._bus = bus

    def claim(self, task_id: str, agent: str, lease_ms: int = 60_000, *,
              max_attempts: int = 5, now: int | None = None) -> bool:
        """Take the lease on `task_id` for `lease_ms`; True if `agent` now holds it.

        See `try_claim` for who holds it when this returns False.
        """
        return self.try_claim(task_id, agent, lease_ms, max_attempts=max_attempts, now=now).granted

    def try_claim(self, task_id: str, agent: str, lease_ms: int = 60_000, *,
                  max_attempts: int = 5, now: int | None = None) -> ClaimResult:
        """Claim a task and say what happened.

        Granted when the task is free, its lease has expired (one more
        attempt), or `agent` holds it already (the lease is extended). A task
        taken `max_attempts` times whose lease expired again is declared dead
        (`result.dead`), a `task_dead` message is published, and it can no
        longer be claimed. Otherwise `result.claim` is the current holder's.
        Taking over another agent's expired lease publishes `task_reclaimed`
        (task, previous_holder, new_holder, attempt, fence).

        `result.fence` is the lease's fence: one more than the task's last
        each time the lease goes to a new holder (an extension keeps it).
        Pass it to `renew`, `release` and `bus.publish(task=..., fence=...)`.
        """
        with self._bus.write() as conn:
            return claims.try_claim(conn, task_id, agent, lease_ms,
                                    max_attempts=max_attempts, now=now, payloads=self._bus.payloads)

    def renew(self, task_id: str, agent: str, lease_ms: int | None = None, *,
              fence: int | None = None, now: int | None = None) -> bool:
        """Set `agent`'s lease to run `lease_ms` (default: the claim's own) from now.

        False, changing nothing, when the lease has expired or another agent
        holds it. A `lease_ms` shorter than what is left shortens the lease.
        With `fence`, raises StaleFence (changing nothing) unless it is the
        task's current fence.
        """
        with self._bus.write() as conn:
            return claims.renew(conn, task_id, agent, lease_ms, fence=fence, now=now)

    def release(self, task_id: str, agent: str, *, fence: int | None = None) -> bool:
        """Give the task back; False if `agent` does not hold it.

        A holder whose lease expired without anyone taking over still holds
        the row and may release it; the next claim then starts at attempt 1
        (attempts count expiries, and a release is a deliberate hand-back)
        with the next fence. With `fence`, raises StaleFence (changing
        nothing) unless it is the task's current fence.
        """
        with self._bus.write() as conn:
            return claims.release(conn, task_id, agent, fence=fence)

    def list(self) -> list[Claim]:
        """Every current claim, expired ones included (check `claim.expired(now)`)."""
        with self._bus.read() as conn:
            return claims.list_claims(conn)

    def dead(self) -> list[DeadClaim]:
        """Tasks that ran out of attempts, oldest first."""
        with self._bus.read() as conn:
            return claims.list_dead(conn)

    def reap(self, now: int | None = None, thresholds: Thresholds | None = None) -> list[Claim]:
        """End the leases held by agents whose liveness is dead; return those claims.

        Each task becomes claimable at once (keeping its attempt count; its
        next holder gets a new fence) and a `task_released` message is
        broadcast for it.
        """
        with self._bus.write() as conn:
            return claims.reap(conn, now, thresholds, self._bus.payloads)


class Tasks:
    """The task graph: tasks, their dependencies and the ready list
    (bus/coordination/tasks.py). Reached as `bus.tasks`.

    A task's lease is a claim under the task's id (`bus.claims`), so
    `claim_next` takes a task through the very code `bus.claims.try_claim`
    runs, and a task a live lease holds is not ready.
    """

    def __init__(self, bus: Connected) -> None:
        self._bus = bus

    def add(self, task_id: str, title: str | None = None, *, after: Iterable[str] = (),
            priority: int = PRIORITY_DEFAULT, now: int | None = None) -> Task:
        """Add an open task that waits on the tasks in `after` (each must exist).

        `priority` runs from 0 (the most urgent, listed first) to 4. Raises
        ValidationFailed (field `task`) when the id is taken, UnknownTask
        (field `after`) for a dependency that does not exist.
        """
        with self._bus.write() as conn:
            return tasks.add_task(conn, task_id, title, after=after, priority=priority,
                                  now=now)

    def add_dependencies(self, task_id: str, after: Iterable[str]) -> list[str]:
        """Make an open task wait on more tasks; the ids newly added (known ones are skipped).

        Raises TaskCycle (field `after`, with the cycle's path) when one would
        close a cycle; then nothing is added.
        """
        with self._bus.write() as conn:
            return tasks.add_dependencies(conn, task_id, after)

    def ready(self, limit: int | None = None, *, now: int | None = None) -> list[Task]:
        """Open tasks whose dependencies are all done and that no live lease holds,
        most urgent first (priority 0), then oldest."""
        with self._bus.read() as conn:
            return tasks.ready_tasks(conn, limit, now=now)

    def find(self, task_id: str) -> Task | None:
        """The task, or None when the graph has no such id."""
        with self._bus.read() as conn:
            return tasks.find_task(conn, task_id)

    def detail(self, task_id: str, *, now: int | None = None) -> TaskDetail:
        """The task with its dependencies, dependents, lease and newest events."""
        with self._bus.read() as conn:
            return tasks.task_detail(conn, task_id, now=now)

    def counts(self, *, now: int | None = None) -> TaskCounts:
        """How many tasks are ready, blocked (on a dependency), held (by a lease), done and
        cancelled."""
        with self._bus.read() as conn:
            return tasks.task_counts(conn, now=now)

    def claim_next(self, agent: str, lease_ms: int = 60_000, *, max_attempts: int = 5,
                   now: int | None = None) -> ClaimedTask | None:
        """Claim the first ready task for `agent`, or None when nothing is ready.

        One write transaction reads the ready list and claims through the
        same code as `bus.claims.try_claim`, so two agents never get the same
        task. A ready task whose expired lease has no attempts left is
        declared dead on the way (`task_dead`, as a claim would) and the next
        one is tried.
        """
        with self._bus.write() as conn:
            return tasks.claim_next(conn, agent, lease_ms, max_attempts=max_attempts,
                                    now=now, payloads=self._bus.payloads)

    def complete(self, task_id: str, agent: str, *, fence: int | None = None,
                 require_claim: bool = True, now: int | None = None) -> Task:
        """Mark a task done by `agent`, which must hold its claim (with `fence`, that exact
        one); its lease ends and its dependents wait on one task less.

        Publishes `task_done` in the same transaction. `require_claim=False`
        is for a task finished otherwise (a worker's merged branch). Raises
        StaleFence (field `fence`, naming the current one) when another agent
        took the task over since `fence` was handed out, UnknownTask,
        TaskStateConflict (not open, or waiting on others), NotTaskHolder.
        """
        with self._bus.write() as conn:
            return tasks.complete_task(conn, task_id, agent, fence=fence,
                                       require_claim=require_claim, now=now,
                                       payloads=self._bus.payloads)

    def cancel(self, task_id: str, agent: str | None = None, reason: str | None = None, *,
               now: int | None = None) -> Task:
        """Cancel an open task (its lease ends, if any); publishes `task_cancelled`.

        Its dependents stay blocked: a cancelled task is not done.
        """
        with self._bus.write() as conn:
            return tasks.cancel_task(conn, task_id, agent, reason, now=now,
                                     payloads=self._bus.payloads)

    def list(self, state: str | None = None) -> list[Task]:
        """Every task (or those in `state`: open, done, cancelled), oldest first."""
        with self._bus.read() as conn:
            return tasks.list_tasks(conn, state)


class Reservations:
    """Reservations of paths by glob, exclusive or shared, for a time
    (bus/coordination/reservations.py). Reached as `bus.reservations`."""

    def __init__(self, bus: Connected) -> None:
        self._bus = bus

    def reserve(self, agent: str, patterns: Sequence[str], *, mode: str = EXCLUSIVE,
                ttl_ms: int = DEFAULT_TTL_MS, reason: str | None = None, now: int | None = None,
                thresholds: Thresholds | None = None) -> list[Reservation]:
        """Reserve every pattern for `agent` for `ttl_ms`, or none of them.

        Raises ReservationConflict (listing each conflict: pattern, holder, mode,
        expiry and a path both match) when a pattern conflicts with another
        agent's live reservation. Reserving a pattern the agent holds already
        renews it with the new mode, TTL and reason.
        """
        with self._bus.write() as conn:
            return reservations.reserve(conn, agent, patterns, mode=mode, ttl_ms=ttl_ms,
                                        reason=reason, now=now, thresholds=thresholds)

    def unreserve(self, agent: str, patterns: Sequence[str] | None = None, *,
                  now: int | None = None,
                  thresholds: Thresholds | None = None) -> list[Reservation]:
        """Remove `agent`'s reservations of `patterns` (all of them when None); return those
        removed. A pattern the agent does not hold raises NotReserved, and nothing
        is removed."""
        with self._bus.write() as conn:
            return reservations.unreserve(conn, agent, patterns, now=now,
                                          thresholds=thresholds)

    def check_paths(self, agent: str | None, paths: Sequence[str], *, now: int | None = None,
                    thresholds: Thresholds | None = None) -> list[Held]:
        """The paths (relative to the repository root) that live agents other than
        `agent` hold exclusively, each with its holder; empty when `agent` may change
        them all. `agent=None` (someone the bus does not know): every holder counts."""
        with self._bus.read() as conn:
            return reservations.check_paths(conn, agent, paths, now=now,
                                            thresholds=thresholds)

    def list(self, agent: str | None = None, path: str | None = None, *,
             now: int | None = None, thresholds: Thresholds | None = None) -> list[Reservation]:
        """The live reservations, by pattern: of `agent` only, and/or those whose
        pattern matches `path` (relative to the repository root)."""
        with self._bus.read() as conn:
            return reservations.list_reservations(conn, agent, path, now=now,
                                                  thresholds=thresholds)


class Heartbeats:
    """Agents' beats and the liveness read from them (bus/coordination/heartbeats.py).
    Reached as `bus.heartbeats`; `Heartbeat` beats from a thread of its own."""

    def __init__(self, bus: Connected) -> None:
        self._bus = bus

    def beat(self, agent: str, status: str = "idle", task: str | None = None,
             progress: float | None = None) -> int:
        """Record that `agent` is alive; return the beat's time (epoch ms).

        `status` is idle, working or blocked; `progress` a fraction from 0 to 1.
        The beat replaces the agent's task and progress: None clears them, and
        `bus.coordination.heartbeats.KEEP` keeps what the last beat said (a kept progress is
        cleared when the task changes), as `bus heartbeat` does without --task:

            bus.heartbeats.beat("worker-1", "working", task=KEEP, progress=KEEP)

        For beats that go on while the agent blocks, use `Heartbeat`.
        """
        fields = heartbeats.validate_beat(agent, status, task, progress)
        with self._bus.write() as conn:
            return heartbeats.beat(conn, *fields, payloads=self._bus.payloads)

    def liveness(self, now: int | None = None, thresholds: Thresholds | None = None, *,
                 stopped: bool = True) -> list[Liveness]:
        """Every agent that ever beat, with its silence and state (alive/warn/stale/dead).

        `now` (epoch milliseconds) defaults to the clock; `thresholds` to
        30 s warn, 100 s stale, 300 s dead. Most silent first. Agents whose
        last beat was `stopped` (they finished cleanly) have the state
        `stopped` and come last; `stopped=False` leaves them out.
        """
        with self._bus.read() as conn:
            return heartbeats.liveness(conn, clock_ms(now), thresholds or Thresholds(), stopped)

    def forget(self, agent: str) -> bool:
        """Delete `agent`'s heartbeat row; False if it had none.

        Raises AgentHoldsClaims, changing nothing, while the agent holds a
        claim (expired or not): release it first, or let another agent take it.
        """
        agent = validate_agent_id(agent)
        with self._bus.write() as conn:
            held = [c.task_id for c in claims.held_by(conn, agent)]
            if held:
                raise AgentHoldsClaims(agent, held)
            return heartbeats.forget(conn, agent)


class Tokens:
    """The bearer tokens of `bus serve` (bus/coordination/tokens.py): each acts as one
    agent, may be read-only, may expire and may be revoked. Reached as `bus.tokens`;
    a server checks what it is presented with `TokenChecker`."""

    def __init__(self, bus: Connected) -> None:
        self._bus = bus

    def create(self, agent: str, *, expires_ms: int | None = None, read_only: bool = False,
               now: int | None = None) -> NewToken:
        """A new token for `agent`, valid for `expires_ms` from now (None: until revoked).

        The secret is in `new.token` this once: the file keeps only its hash.
        """
        with self._bus.write() as conn:
            return tokens.create_token(conn, agent, expires_ms=expires_ms,
                                       read_only=read_only, now=now)

    def revoke(self, token_id: str, now: int | None = None) -> Token:
        """Revoke a token for good; revoking one already revoked is a no-op.

        Raises ValidationFailed("id") for an id no token has.
        """
        with self._bus.write() as conn:
            return tokens.revoke_token(conn, token_id, now)

    def any_usable(self, now: int | None = None) -> bool:
        """Whether some token is neither revoked nor expired."""
        with self._bus.read() as conn:
            return tokens.any_usable_token(conn, now)

    def list(self) -> list[Token]:
        """Every token, revoked and expired ones too, oldest first (never a secret)."""
        with self._bus.read() as conn:
            return tokens.list_tokens(conn)
