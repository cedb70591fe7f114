"""When a pump step must look beyond its own work (bus/pump/pump.py decides with it)."""

from __future__ import annotations

import apsw

from bus.pump.routing import Routes

_DATA_VERSION_SQL = "PRAGMA data_version"


class Scan:
    """When a step must look beyond its own work: the inbox, dead units, what is left.

    Only another connection's commit (`PRAGMA data_version`: a client's
    envelope, another pump's claim), a lease running out, a new routing table
    or a full inbox batch can give a scan something new to find. So a step
    that commits while other units are in flight skips the scan when none of
    those happened, and a step with nothing to commit is no transaction at
    all when, on top of that, the last scan's claims were not cut short by
    the concurrency limits (the pump's own claim is no reason to look again).
    """

    def __init__(self, idle_wake_s: float) -> None:
        self.idle_wake_ms = int(idle_wake_s * 1000)  # the pump looks again at least this often
        self.version: int | None = None
        self.routes: Routes | None = None
        self.due_ms: int | None = None  # a lease may run out from then on
        self.more = True  # the inbox had more than one step routes
        self.pending = True  # what the last scan said is left
        self.settled = False  # the last scan left nothing it could claim

    def _same(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        version = conn.execute(_DATA_VERSION_SQL).get
        same = version == self.version
        self.version = version
        return same and not self.more and routes is self.routes and (
            self.due_ms is None or now < self.due_ms)

    def due(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        """Whether this step must scan; reads `data_version` (inside the transaction)."""
        return not self._same(conn, routes, now)

    def quiet(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        """Whether a step with nothing to commit would find nothing (read outside a
        transaction, so it sees the latest commit)."""
        return self.settled and self._same(conn, routes, now)

    def done(self, conn: apsw.Connection, routes: Routes, now: int, pending: bool,
             next_expiry: int | None, more: bool) -> None:
        self.version = conn.execute(_DATA_VERSION_SQL).get
        self.routes, self.pending, self.more = routes, pending, more
        self.due_ms = min(now + self.idle_wake_ms, next_expiry or now + 10 ** 9)

    def claimed(self, until: int, claimed: list, full: bool, scanned: bool) -> None:
        """After the claims: their leases, and whether the limits cut them short
        (`full`: a listener got all it asked for, or asked nothing for want of slots)."""
        if claimed:
            self.due_ms = until if self.due_ms is None else min(self.due_ms, until)
        # A claim that got fewer units than it asked for left none behind: only a
        # commit elsewhere, a lease running out or a new table can change that.
        # (A busy listener skipped by the quarter rule in _claim got none; its
        # running handlers bring the next step.)
        self.settled = scanned and not full
        if not scanned:
            self.pending = True
