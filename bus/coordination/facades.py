"""The doors to coordination on an open Bus: `bus.claims`, and the parts beside it.

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

from typing import Protocol

import apsw

from bus.coordination import claims
from bus.coordination.claims import Claim
from bus.coordination.claims import ClaimResult
from bus.coordination.claims import DeadClaim
from bus.coordination.heartbeats import Thresholds


class Connected(Protocol):
    """What a facade uses of the bus it serves: `Bus` hands itself over.

    A protocol rather than an import of `bus.api`, which imports this module:
    coordination sits below the facade and knows only the log's parts.
    """

    @property
    def conn(self) -> apsw.Connection: ...


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
        return claims.try_claim(self._bus.conn, task_id, agent, lease_ms,
                                max_attempts=max_attempts, now=now)

    def renew(self, task_id: str, agent: str, lease_ms: int | None = None, *,
              fence: int | None = None, now: int | None = None) -> bool:
        """Set `agent`'s lease to run `lease_ms` (default: the claim's own) from now.

        False, changing nothing, when the lease has expired or another agent
        holds it. A `lease_ms` shorter than what is left shortens the lease.
        With `fence`, raises StaleFence (changing nothing) unless it is the
        task's current fence.
        """
        return claims.renew(self._bus.conn, task_id, agent, lease_ms, fence=fence, now=now)

    def release(self, task_id: str, agent: str, *, fence: int | None = None) -> bool:
        """Give the task back; False if `agent` does not hold it.

        A holder whose lease expired without anyone taking over still holds
        the row and may release it; the next claim then starts at attempt 1
        (attempts count expiries, and a release is a deliberate hand-back)
        with the next fence. With `fence`, raises StaleFence (changing
        nothing) unless it is the task's current fence.
        """
        return claims.release(self._bus.conn, task_id, agent, fence=fence)

    def list(self) -> list[Claim]:
        """Every current claim, expired ones included (check `claim.expired(now)`)."""
        return claims.list_claims(self._bus.conn)

    def dead(self) -> list[DeadClaim]:
        """Tasks that ran out of attempts, oldest first."""
        return claims.list_dead(self._bus.conn)

    def reap(self, now: int | None = None, thresholds: Thresholds | None = None) -> list[Claim]:
        """End the leases held by agents whose liveness is dead; return those claims.

        Each task becomes claimable at once (keeping its attempt count; its
        next holder gets a new fence) and a `task_released` message is
        broadcast for it.
        """
        return claims.reap(self._bus.conn, now, thresholds)
