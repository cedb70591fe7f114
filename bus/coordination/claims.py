"""Leased task claims: one holder at a time, renewed or lost, dead after too many takes.

A claim is a lease: the holder must renew it before `lease_until_ms` or any
agent may take the task over. Every take after an expiry counts an attempt;
a task whose lease has expired `max_attempts` times is moved to
`dead_claims` instead of going round forever.

Every granted lease carries a fence: an integer that grows each time the
task's lease goes to a new holder (a takeover, a claim after a release or an
expiry, by the same agent too) and is never reused for that task;
`task_fences` keeps the highest one handed out, so it survives the claim row.
A renewal or an extension by the holder keeps its fence. An action that
passes a fence (renew, release, a publish about the task, `worker done`) is
refused with StaleFence, changing nothing, unless it is the task's current
fence: a holder that was paused past its lease cannot act on the task once
another took it.

The operations take a connection and run inside the caller's write transaction
on it, together with the messages the bus announces itself (`task_dead`,
`task_reclaimed`, `task_released`): the `Claims` facade (bus/coordination/
facades.py, `bus.claims` on a Bus) runs each in `bus.write()`, and the task
graph claims inside its own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import TYPE_CHECKING
from typing import NamedTuple

import apsw

from bus.log import messages
from bus.storage.db import translate_errors
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import Thresholds
from bus.log.messages import clock_ms

if TYPE_CHECKING:
    from bus.log.payloads import PayloadPolicy

LEASE_MS_MAX = 7 * 24 * 3600 * 1000
SYSTEM_AGENT = "bus"  # sender of the messages the bus publishes itself (task_released, ...)
TASK_ID_MAX = 256

_CLAIM_COLUMNS = (
    "task_id, claimed_by, claimed_at_ms, lease_until_ms, lease_ms, attempts, max_attempts, fence"
)
# One statement decides the race: a new task is inserted; an expired claim
# with attempts left is taken over (one more attempt, a new fence); the holder
# claiming again extends its own lease (same fence). Anything else matches
# nothing and returns no row. SET expressions read the row as it was.
_CLAIM_SQL = (
    f"INSERT INTO task_claims ({_CLAIM_COLUMNS})"
    " VALUES (:task, :agent, :now, :now + :lease, :lease, 1, :max_attempts, :fence)"
    " ON CONFLICT (task_id) DO UPDATE SET"
    " claimed_by = excluded.claimed_by,"
    " claimed_at_ms = CASE WHEN lease_until_ms <= :now THEN :now ELSE claimed_at_ms END,"
    " lease_until_ms = excluded.lease_until_ms,"
    " lease_ms = excluded.lease_ms,"
    " attempts = CASE WHEN lease_until_ms <= :now THEN attempts + 1 ELSE attempts END,"
    " fence = CASE WHEN lease_until_ms <= :now THEN :fence ELSE fence END"
    " WHERE (lease_until_ms <= :now AND attempts < max_attempts)"
    " OR (claimed_by = excluded.claimed_by AND lease_until_ms > :now)"
    f" RETURNING {_CLAIM_COLUMNS}"
)
_LAST_FENCE_SQL = "SELECT fence FROM task_fences WHERE task_id = ?"
# What a claim must know before it writes, in one statement (it runs on every claim):
# the holder now, the last fence handed out, and whether the task is dead.
_BEFORE_CLAIM_SQL = (
    "SELECT c.claimed_by, f.fence, d.task_id IS NOT NULL"
    " FROM (SELECT ? AS task_id) AS t"
    " LEFT JOIN task_claims AS c USING (task_id)"
    " LEFT JOIN task_fences AS f USING (task_id)"
    " LEFT JOIN dead_claims AS d USING (task_id)"
)
_RECORD_FENCE_SQL = (
    "INSERT INTO task_fences (task_id, fence) VALUES (?, ?)"
    " ON CONFLICT (task_id) DO UPDATE SET fence = excluded.fence"
)
_RENEW_SQL = (
    "UPDATE task_claims SET lease_ms = coalesce(:lease, lease_ms),"
    " lease_until_ms = :now + coalesce(:lease, lease_ms)"
    " WHERE task_id = :task AND claimed_by = :agent AND lease_until_ms > :now"
    " RETURNING lease_until_ms"
)
_RELEASE_SQL = "DELETE FROM task_claims WHERE task_id = ? AND claimed_by = ? RETURNING task_id"
_GET_SQL = f"SELECT {_CLAIM_COLUMNS} FROM task_claims WHERE task_id = ?"
_LIST_SQL = f"SELECT {_CLAIM_COLUMNS} FROM task_claims ORDER BY task_id"
# A file from before fences (read-only views do not migrate it): every claim
# there was granted once, so its fence is 1, as migration 12 makes it.
FENCES_SCHEMA_VERSION = 12  # migrations/0012_fences.sql
_LIST_BEFORE_FENCES_SQL = (
    f"SELECT {_CLAIM_COLUMNS.removesuffix(', fence')}, 1 FROM task_claims ORDER BY task_id"
)
_HELD_BY_SQL = f"SELECT {_CLAIM_COLUMNS} FROM task_claims WHERE claimed_by = ? ORDER BY task_id"
_DEAD_COLUMNS = "task_id, last_holder, attempts, reason, died_at_ms"
_GET_DEAD_SQL = f"SELECT {_DEAD_COLUMNS} FROM dead_claims WHERE task_id = ?"
_LIST_DEAD_SQL = f"SELECT {_DEAD_COLUMNS} FROM dead_claims ORDER BY died_at_ms, task_id"
_BURY_SQL = (
    f"INSERT INTO dead_claims ({_DEAD_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
    f" RETURNING {_DEAD_COLUMNS}"
)
_DELETE_SQL = "DELETE FROM task_claims WHERE task_id = ?"
# Claims still leased to agents whose last heartbeat is older than the cutoff.
_HELD_BY_SILENT_SQL = (
    f"SELECT {', '.join('c.' + c for c in _CLAIM_COLUMNS.split(', '))}, h.ts_ms"
    " FROM task_claims c JOIN heartbeats h ON h.agent_id = c.claimed_by"
    " WHERE h.ts_ms <= :cutoff AND c.lease_until_ms > :now ORDER BY c.task_id"
)
_EXPIRE_SQL = "UPDATE task_claims SET lease_until_ms = ? WHERE task_id = ?"


@dataclass(frozen=True)
class Claim:
    """A task's current lease."""

    task_id: str
    agent: str
    claimed_at_ms: int
    lease_until_ms: int
    lease_ms: int
    attempts: int
    max_attempts: int
    fence: int

    def expired(self, now_ms: int) -> bool:
        return self.lease_until_ms <= now_ms

    def to_json_dict(self) -> dict[str, object]:
        return {"task": self.task_id, "agent": self.agent, "fence": self.fence,
                "claimed_at_ms": self.claimed_at_ms, "lease_until_ms": self.lease_until_ms,
                "lease_ms": self.lease_ms, "attempts": self.attempts,
                "max_attempts": self.max_attempts}


@dataclass(frozen=True)
class DeadClaim:
    """A task that ran out of attempts, with who held it last and why it died."""

    task_id: str
    last_holder: str
    attempts: int
    reason: str
    died_at_ms: int

    def to_json_dict(self) -> dict[str, object]:
        return {"task": self.task_id, "last_holder": self.last_holder, "attempts": self.attempts,
                "reason": self.reason, "died_at_ms": self.died_at_ms}


@dataclass(frozen=True)
class ClaimResult:
    """The outcome of a claim: `granted`, the current `claim` (whoever holds
    it), or `dead` when the task ran out of attempts (`just_died` when this
    very call declared it dead)."""

    granted: bool
    claim: Claim | None = None
    dead: DeadClaim | None = None
    just_died: bool = False

    @property
    def fence(self) -> int | None:
        """The granted lease's fence (pass it to renew, release, publish); None if refused."""
        return self.claim.fence if self.granted else None


class BeforeClaim(NamedTuple):
    """A task's state as a claim finds it (`_BEFORE_CLAIM_SQL`)."""

    holder: str | None  # the claim row's agent, expired or not; None without a row
    last_fence: int | None  # the highest fence handed out; None if never claimed
    dead: int  # 1 when the task ran out of attempts


class StaleFence(BusError):
    """An action passed a fence that is not its task's current one; nothing changed.

    `current` is the task's fence now (None when the task was never claimed)
    and `holder` the claim that has it, if any.
    """

    error_code = "stale_fence"

    refused_by_state = True  # the CLI: exit 1 naming --fence, not a usage error

    def __init__(self, task: str, given: int, current: int | None, holder: Claim | None) -> None:
        self.field = "fence"
        self.task, self.given, self.current, self.holder = task, given, current, holder
        self.reason = _stale_reason(task, given, current, holder)
        super().__init__(f"fence: {self.reason}")


def _stale_reason(task: str, given: int, current: int | None, holder: Claim | None) -> str:
    if current is None:
        return f"{given} was never issued: task {task} has never been claimed"
    if holder is None or holder.fence != current:
        who = "nobody holds it now"
    else:
        who = f"held by {holder.agent} until {messages.iso_utc(holder.lease_until_ms)}"
    verb = "is stale" if given < current else "was never issued"
    return (f"{given} {verb}: the current fence of task {task} is {current} ({who});"
            f" claim {task} again for a current fence")


# --- operations: inside the caller's write transaction --------------------------------
# `bus.claims` runs each in `bus.write()`, one transaction; `tasks` runs them inside its
# own. Not a savepoint of their own: a claim and its release are the hot path, and none
# of them writes before it can fail.


def _inside_a_write(conn: apsw.Connection) -> None:
    """Refuse to run outside a transaction, where each statement would commit alone."""
    if not conn.in_transaction:
        raise BusError("a claim operation runs inside a write transaction: `with"
                       " bus.write() as conn:` (or call `bus.claims`)")


def try_claim(conn: apsw.Connection, task_id: str, agent: str, lease_ms: int = 60_000, *,
              max_attempts: int = 5, now: int | None = None,
              payloads: PayloadPolicy | None = None) -> ClaimResult:
    """Claim a task and say what happened (see `Claims.try_claim`). `payloads`, the
    bus's PayloadPolicy, places the payloads of what it announces as a publish's."""
    task_id, agent = validate_task(task_id), messages.validate_agent_id(agent)
    validate_lease(lease_ms)
    messages.validate_positive_int(max_attempts, "max_attempts")
    _inside_a_write(conn)
    at = clock_ms(now)
    before = BeforeClaim(*conn.execute(_BEFORE_CLAIM_SQL, (task_id,)).fetchone())
    result = _take(conn, task_id, agent, lease_ms, max_attempts, at, before)
    if result.just_died:
        _announce(conn, payloads, "task_dead", result.dead.to_json_dict(), task_id, at)
    elif result.granted and before.holder is not None and before.holder != agent:
        # Granted over another agent's row: its lease had run out (a takeover).
        _announce(conn, payloads, "task_reclaimed", {
            "task": task_id, "previous_holder": before.holder, "new_holder": agent,
            "attempt": result.claim.attempts, "fence": result.claim.fence}, task_id, at)
    return result


def renew(conn: apsw.Connection, task_id: str, agent: str, lease_ms: int | None = None, *,
          fence: int | None = None, now: int | None = None) -> bool:
    """Set `agent`'s lease to run `lease_ms` (default: the claim's own) from now
    (see `Claims.renew`)."""
    task_id, agent = validate_task(task_id), messages.validate_agent_id(agent)
    if lease_ms is not None:
        validate_lease(lease_ms)
    _inside_a_write(conn)
    at = clock_ms(now)
    if fence is not None:
        check_fence(conn, task_id, fence)
    return conn.execute(_RENEW_SQL, {"task": task_id, "agent": agent, "lease": lease_ms,
                                     "now": at}).get is not None


def release(conn: apsw.Connection, task_id: str, agent: str, *, fence: int | None = None) -> bool:
    """Give the task back; False if `agent` does not hold it (see `Claims.release`)."""
    task_id, agent = validate_task(task_id), messages.validate_agent_id(agent)
    _inside_a_write(conn)
    if fence is not None:
        check_fence(conn, task_id, fence)
    return conn.execute(_RELEASE_SQL, (task_id, agent)).get is not None


def reap(conn: apsw.Connection, now: int | None = None, thresholds: Thresholds | None = None,
         payloads: PayloadPolicy | None = None) -> list[Claim]:
    """End the leases held by agents whose liveness is dead (see `Claims.reap`)."""
    thresholds = thresholds or Thresholds()
    _inside_a_write(conn)
    at = clock_ms(now)
    cutoff = at - Thresholds.to_ms(thresholds.dead)  # liveness's own boundary
    silent = _held_by_silent_agents(conn, cutoff, at)
    for claim, last_beat in silent:
        conn.execute(_EXPIRE_SQL, (at, claim.task_id))
        _announce(conn, payloads, "task_released", {
            "task": claim.task_id, "agent": claim.agent, "reason": "agent dead",
            "fence": claim.fence, "silent_s": round((at - last_beat) / 1000, 3)},
            claim.task_id, at)
    return [claim for claim, _ in silent]


def check_fence(conn: apsw.Connection, task_id: str, fence: object) -> None:
    """Raise StaleFence unless `fence` is `task_id`'s current fence.

    For the caller's write transaction, so the check and what it guards commit
    together: a publish that reports on a task checks here before it inserts.
    A fence stays current until the task's lease goes to a new holder, also
    after its holder released it or let it expire.
    """
    fence = messages.validate_positive_int(fence, "fence")
    current = conn.execute(_LAST_FENCE_SQL, (task_id,)).get
    if fence != current:
        raise StaleFence(task_id, fence, current, get(conn, task_id))


# --- queries -----------------------------------------------------------------------


def get(conn: apsw.Connection, task: str) -> Claim | None:
    row = conn.execute(_GET_SQL, (task,)).fetchone()
    return Claim(*row) if row else None


def list_claims(conn: apsw.Connection, schema_version: int | None = None) -> list[Claim]:
    """Every current claim, expired ones included (check `claim.expired(now)`).

    `schema_version`: a read-only view's file, which may predate fences.
    """
    before_fences = schema_version is not None and schema_version < FENCES_SCHEMA_VERSION
    with translate_errors(conn):
        return [Claim(*row) for row in conn.execute(
            _LIST_BEFORE_FENCES_SQL if before_fences else _LIST_SQL)]


def held_by(conn: apsw.Connection, agent: str) -> list[Claim]:
    """The claims naming `agent` as holder, expired ones included."""
    return [Claim(*row) for row in conn.execute(_HELD_BY_SQL, (agent,))]


def get_dead(conn: apsw.Connection, task: str) -> DeadClaim | None:
    row = conn.execute(_GET_DEAD_SQL, (task,)).fetchone()
    return DeadClaim(*row) if row else None


def list_dead(conn: apsw.Connection) -> list[DeadClaim]:
    """Tasks that ran out of attempts, oldest first."""
    with translate_errors(conn):
        return [DeadClaim(*row) for row in conn.execute(_LIST_DEAD_SQL)]


@dataclass(frozen=True)
class ClaimsTable:
    """The claims now (expired ones included) and the dead ones, as one reader shows them."""

    held: list[Claim]
    dead: list[DeadClaim]


def claims_table(conn: apsw.Connection) -> ClaimsTable:
    """Every claim and every dead claim, in the caller's transaction."""
    return ClaimsTable(list_claims(conn), list_dead(conn))


def validate_task(task_id: object) -> str:
    return messages.validate_text(task_id, "task_id", TASK_ID_MAX)


def validate_lease(lease_ms: object) -> None:
    messages.validate_positive_int(lease_ms, "lease_ms")
    if lease_ms > LEASE_MS_MAX:
        raise ValidationFailed("lease_ms", f"is {lease_ms}; the longest lease is {LEASE_MS_MAX} (7 days)")


# --- the statements behind the operations, inside their transaction ----------------


def _take(conn: apsw.Connection, task: str, agent: str, lease_ms: int,
          max_attempts: int, now: int, before: BeforeClaim) -> ClaimResult:
    if before.dead:
        return ClaimResult(False, dead=get_dead(conn, task))
    next_fence = (before.last_fence or 0) + 1
    row = conn.execute(_CLAIM_SQL, {"task": task, "agent": agent, "now": now, "lease": lease_ms,
                                    "max_attempts": max_attempts, "fence": next_fence}).fetchall()
    if row:
        claim = Claim(*row[0])
        if claim.fence == next_fence:  # a new lease, not the holder extending its own
            conn.execute(_RECORD_FENCE_SQL, (task, next_fence))
        return ClaimResult(True, claim=claim)
    current = get(conn, task)
    if current.expired(now) and current.attempts >= current.max_attempts:
        reason = f"lease expired {current.attempts} times (max_attempts {current.max_attempts})"
        return ClaimResult(False, dead=_bury(conn, current, reason, now), just_died=True)
    return ClaimResult(False, claim=current)


def _bury(conn: apsw.Connection, claim: Claim, reason: str, now: int) -> DeadClaim:
    """Move a claim to dead_claims: the task can no longer be claimed."""
    conn.execute(_DELETE_SQL, (claim.task_id,))
    row = conn.execute(_BURY_SQL, (claim.task_id, claim.agent, claim.attempts, reason, now))
    return DeadClaim(*row.fetchall()[0])


def _held_by_silent_agents(conn: apsw.Connection, cutoff_ms: int,
                           now: int) -> list[tuple[Claim, int]]:
    """Unexpired claims whose holder's last heartbeat is at or before `cutoff_ms`."""
    rows = conn.execute(_HELD_BY_SILENT_SQL, {"cutoff": cutoff_ms, "now": now})
    return [(Claim(*row[:-1]), row[-1]) for row in rows]


def _announce(conn: apsw.Connection, payloads: PayloadPolicy | None, type: str,
              payload: dict[str, Any], correlation_id: str, at: int) -> None:
    """Broadcast a message from the bus itself, inside the caller's transaction."""
    row = messages.prepare_row(SYSTEM_AGENT, type, payload, correlation_id=correlation_id)
    messages.append(conn, [row], payloads, at)
