"""Task claims on the `Bus` facade: leases, takeovers, dead tasks and reaping (seed 003).

A mixin of `Bus` (bus/api.py), kept apart so the facade stays readable: each
method is one BEGIN IMMEDIATE transaction on the calling thread's connection
around the SQL of bus/claims.py, plus the messages the bus announces itself
(`task_dead`, `task_reclaimed`, `task_released`) in the same transaction.
"""

from __future__ import annotations

from typing import Any

import apsw

from bus import claims
from bus import messages
from bus.claims import Claim
from bus.claims import ClaimResult
from bus.claims import DeadClaim
from bus.db import translate_errors
from bus.db import write_transaction
from bus.errors import ValidationFailed
from bus.heartbeats import Thresholds

LEASE_MS_MAX = 7 * 24 * 3600 * 1000
SYSTEM_AGENT = "bus"  # sender of the messages the bus publishes itself (task_released, ...)
TASK_ID_MAX = 256


class TaskClaims:
    """Leased task claims; `conn` is the calling thread's connection (given by `Bus`)."""

    conn: apsw.Connection

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
        (task, previous_holder, new_holder, attempt).
        """
        task_id, agent = _validate_task(task_id), messages.validate_agent_id(agent)
        _validate_lease(lease_ms)
        messages.validate_positive_int(max_attempts, "max_attempts")
        conn = self.conn
        with write_transaction(conn):
            at = clock_ms(now)
            previous = claims.get(conn, task_id)
            result = claims.try_claim(conn, task_id, agent, lease_ms, max_attempts, at)
            if result.just_died:
                self._announce(conn, "task_dead", result.dead.to_json_dict(), task_id, at)
            elif result.granted and previous is not None and previous.agent != agent:
                # Granted over another agent's row: its lease had run out (a takeover).
                self._announce(conn, "task_reclaimed", {
                    "task": task_id, "previous_holder": previous.agent, "new_holder": agent,
                    "attempt": result.claim.attempts}, task_id, at)
        return result

    def renew(self, task_id: str, agent: str, lease_ms: int | None = None, *,
              now: int | None = None) -> bool:
        """Set `agent`'s lease to run `lease_ms` (default: the claim's own) from now.

        False, changing nothing, when the lease has expired or another agent
        holds it. A `lease_ms` shorter than what is left shortens the lease.
        """
        task_id, agent = _validate_task(task_id), messages.validate_agent_id(agent)
        if lease_ms is not None:
            _validate_lease(lease_ms)
        conn = self.conn
        with write_transaction(conn):
            return claims.renew(conn, task_id, agent, lease_ms, clock_ms(now)) is not None

    def release(self, task_id: str, agent: str) -> bool:
        """Give the task back; False if `agent` does not hold it.

        A holder whose lease expired without anyone taking over still holds
        the row and may release it; the next claim then starts at attempt 1
        (attempts count expiries, and a release is a deliberate hand-back).
        """
        task_id, agent = _validate_task(task_id), messages.validate_agent_id(agent)
        conn = self.conn
        with write_transaction(conn):
            return claims.release(conn, task_id, agent)

    def claims(self) -> list[Claim]:
        """Every current claim, expired ones included (check `claim.expired(now)`)."""
        with translate_errors(self.conn):
            return claims.list_claims(self.conn)

    def dead_claims(self) -> list[DeadClaim]:
        """Tasks that ran out of attempts, oldest first."""
        with translate_errors(self.conn):
            return claims.list_dead(self.conn)

    def reap(self, now: int | None = None, thresholds: Thresholds | None = None) -> list[Claim]:
        """End the leases held by agents whose liveness is dead; return those claims.

        Each task becomes claimable at once (keeping its attempt count) and a
        `task_released` message is broadcast for it.
        """
        thresholds = thresholds or Thresholds()
        conn = self.conn
        with write_transaction(conn):
            at = clock_ms(now)
            cutoff = at - Thresholds.to_ms(thresholds.dead)  # liveness's own boundary
            silent = claims.held_by_silent_agents(conn, cutoff, at)
            for claim, last_beat in silent:
                claims.expire(conn, claim.task_id, at)
                self._announce(conn, "task_released", {
                    "task": claim.task_id, "agent": claim.agent, "reason": "agent dead",
                    "silent_s": round((at - last_beat) / 1000, 3)}, claim.task_id, at)
        return [claim for claim, _ in silent]

    def _announce(self, conn: apsw.Connection, type: str, payload: dict[str, Any],
                  correlation_id: str, at: int) -> None:
        """Broadcast a message from the bus itself, inside the caller's transaction."""
        row = messages.prepare_row(SYSTEM_AGENT, type, payload, correlation_id=correlation_id)
        messages.insert_row(conn, row, at)


def clock_ms(now: object) -> int:
    """The clock in epoch milliseconds, or the caller's `now` after a sanity check."""
    if now is None:
        return messages.now_ms()
    # Anything before 1973 in milliseconds is surely seconds passed by mistake.
    if isinstance(now, bool) or not isinstance(now, int) or now < 100_000_000_000:
        raise ValidationFailed("now", f"must be epoch milliseconds (an int like "
                                      f"{messages.now_ms()}), got {now!r}")
    return now


def _validate_task(task_id: object) -> str:
    return messages.validate_text(task_id, "task_id", TASK_ID_MAX)


def _validate_lease(lease_ms: object) -> None:
    messages.validate_positive_int(lease_ms, "lease_ms")
    if lease_ms > LEASE_MS_MAX:
        raise ValidationFailed("lease_ms", f"is {lease_ms}; the longest lease is {LEASE_MS_MAX} (7 days)")
