"""Leased task claims: one holder at a time, renewed or lost, dead after too many takes.

A claim is a lease: the holder must renew it before `lease_until_ms` or any
agent may take the task over. Every take after an expiry counts an attempt;
a task whose lease has expired `max_attempts` times is moved to
`dead_claims` instead of going round forever. Every function here runs
inside the caller's write transaction, with `now` taken under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

_CLAIM_COLUMNS = (
    "task_id, claimed_by, claimed_at_ms, lease_until_ms, lease_ms, attempts, max_attempts"
)
# One statement decides the race: a new task is inserted; an expired claim
# with attempts left is taken over (one more attempt); the holder claiming
# again extends its own lease. Anything else matches nothing and returns no row.
_CLAIM_SQL = (
    f"INSERT INTO task_claims ({_CLAIM_COLUMNS})"
    " VALUES (:task, :agent, :now, :now + :lease, :lease, 1, :max_attempts)"
    " ON CONFLICT (task_id) DO UPDATE SET"
    " claimed_by = excluded.claimed_by,"
    " claimed_at_ms = CASE WHEN lease_until_ms <= :now THEN :now ELSE claimed_at_ms END,"
    " lease_until_ms = excluded.lease_until_ms,"
    " lease_ms = excluded.lease_ms,"
    " attempts = CASE WHEN lease_until_ms <= :now THEN attempts + 1 ELSE attempts END"
    " WHERE (lease_until_ms <= :now AND attempts < max_attempts)"
    " OR (claimed_by = excluded.claimed_by AND lease_until_ms > :now)"
    f" RETURNING {_CLAIM_COLUMNS}"
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

    def expired(self, now_ms: int) -> bool:
        return self.lease_until_ms <= now_ms

    def to_json_dict(self) -> dict[str, object]:
        return {"task": self.task_id, "agent": self.agent, "claimed_at_ms": self.claimed_at_ms,
                "lease_until_ms": self.lease_until_ms, "lease_ms": self.lease_ms,
                "attempts": self.attempts, "max_attempts": self.max_attempts}


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


def try_claim(conn: apsw.Connection, task: str, agent: str, lease_ms: int,
              max_attempts: int, now: int) -> ClaimResult:
    dead = get_dead(conn, task)
    if dead is not None:
        return ClaimResult(False, dead=dead)
    row = conn.execute(_CLAIM_SQL, {"task": task, "agent": agent, "now": now, "lease": lease_ms,
                                    "max_attempts": max_attempts}).fetchall()
    if row:
        return ClaimResult(True, claim=Claim(*row[0]))
    current = get(conn, task)
    if current.expired(now) and current.attempts >= current.max_attempts:
        reason = f"lease expired {current.attempts} times (max_attempts {current.max_attempts})"
        return ClaimResult(False, dead=bury(conn, current, reason, now), just_died=True)
    return ClaimResult(False, claim=current)


def renew(conn: apsw.Connection, task: str, agent: str, lease_ms: int | None,
          now: int) -> int | None:
    """Extend the holder's unexpired lease; the new lease end, or None (nothing changed)."""
    return conn.execute(_RENEW_SQL, {"task": task, "agent": agent, "lease": lease_ms,
                                     "now": now}).get


def release(conn: apsw.Connection, task: str, agent: str) -> bool:
    return conn.execute(_RELEASE_SQL, (task, agent)).get is not None


def get(conn: apsw.Connection, task: str) -> Claim | None:
    row = conn.execute(_GET_SQL, (task,)).fetchone()
    return Claim(*row) if row else None


def list_claims(conn: apsw.Connection) -> list[Claim]:
    return [Claim(*row) for row in conn.execute(_LIST_SQL)]


def held_by(conn: apsw.Connection, agent: str) -> list[Claim]:
    """The claims naming `agent` as holder, expired ones included."""
    return [Claim(*row) for row in conn.execute(_HELD_BY_SQL, (agent,))]


def get_dead(conn: apsw.Connection, task: str) -> DeadClaim | None:
    row = conn.execute(_GET_DEAD_SQL, (task,)).fetchone()
    return DeadClaim(*row) if row else None


def list_dead(conn: apsw.Connection) -> list[DeadClaim]:
    return [DeadClaim(*row) for row in conn.execute(_LIST_DEAD_SQL)]


def bury(conn: apsw.Connection, claim: Claim, reason: str, now: int) -> DeadClaim:
    """Move a claim to dead_claims: the task can no longer be claimed."""
    conn.execute(_DELETE_SQL, (claim.task_id,))
    row = conn.execute(_BURY_SQL, (claim.task_id, claim.agent, claim.attempts, reason, now))
    return DeadClaim(*row.fetchall()[0])


def held_by_silent_agents(conn: apsw.Connection, cutoff_ms: int,
                          now: int) -> list[tuple[Claim, int]]:
    """Unexpired claims whose holder's last heartbeat is at or before `cutoff_ms`."""
    rows = conn.execute(_HELD_BY_SILENT_SQL, {"cutoff": cutoff_ms, "now": now})
    return [(Claim(*row[:-1]), row[-1]) for row in rows]


def expire(conn: apsw.Connection, task: str, now: int) -> None:
    """End a lease now: the task becomes claimable and keeps its attempt count."""
    conn.execute(_EXPIRE_SQL, (now, task))
