"""File reservations: an agent holds files of the repository, by glob, for a while.

    bus.reservations.reserve("agent-a", ["src/auth/**"], ttl_ms=2 * 3600_000, reason="login rework")
    bus.reservations.check_paths("agent-b", ["src/auth/login.py"])  # [Held(path, reservation)]

Two reservations conflict when some path matches both patterns (bus/coordination/globs.py
decides it exactly) and either is exclusive; an agent's own reservations never
conflict with each other. A reservation ends when

- its TTL runs out;
- its holder's heartbeat turns dead (silent for `Thresholds.dead`, 300 s by
  default; an agent that never beat is judged by its TTL alone, one whose last
  beat says `stopped` is not dead);
- its holder's worker (the worker whose id is the holder's agent id) reaches
  COMPLETED, CANCELLED or FAILED.

Whether a reservation is live is decided when it is read, from the heartbeats
and workers tables in the same snapshot, so no process has to sweep for
correctness. Every write deletes the ended ones it sees, and an agent's first
beat after it was dead ends its reservations first (heartbeats.beat), so one
that ended stays ended. All times are epoch milliseconds; every call takes
`now` so tests step the clock instead of sleeping.

Like bus/coordination/claims.py, the operations (reserve, list_reservations, unreserve,
check_paths) take a connection and run in one transaction on it; the
`Reservations` facade (bus/coordination/facades.py, `bus.reservations` on a
Bus) hands them its thread's connection (`bus.reservations.list` is
`list_reservations`). The functions above them read or sweep inside the
caller's transaction (the status views read the table so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Sequence

import apsw

from bus.log import messages
from bus.storage.db import translate_errors
from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.coordination.globs import Glob
from bus.coordination.globs import GlobIndex
from bus.coordination.globs import normalize_path
from bus.coordination.globs import parse_glob
from bus.coordination.heartbeats import STOPPED
from bus.coordination.heartbeats import Thresholds
from bus.log.messages import iso_utc
from bus.coordination.worker_table import AT_WORK_SQL
from bus.coordination.worker_table import TERMINAL_STATES

EXCLUSIVE = "exclusive"
SHARED = "shared"
MODES = (EXCLUSIVE, SHARED)
DEFAULT_TTL_MS = 3600 * 1000
TTL_MAX_MS = 7 * 24 * 3600 * 1000
REASON_MAX = 500
PATTERNS_MAX = 1000  # in one call

_COLUMNS = "r.id, r.agent_id, r.pattern, r.mode, r.reason, r.created_at_ms, r.expires_at_ms"
# Each reservation with what decides whether it is live: its holder's last beat and worker.
_ALL_SQL = (
    f"SELECT {_COLUMNS}, h.ts_ms, h.status, w.state FROM file_reservations r"
    " LEFT JOIN heartbeats h ON h.agent_id = r.agent_id"
    " LEFT JOIN workers w ON w.worker_id = r.agent_id"
    " ORDER BY r.pattern, r.agent_id"
)
_HOLDER_SQL = (
    "SELECT h.ts_ms, h.status, w.state FROM (SELECT ? AS agent_id) a"
    " LEFT JOIN heartbeats h ON h.agent_id = a.agent_id"
    " LEFT JOIN workers w ON w.worker_id = a.agent_id"
)
_DELETE_SQL = "DELETE FROM file_reservations WHERE id = ?"
_UPSERT_SQL = (
    "INSERT INTO file_reservations (agent_id, pattern, mode, reason, created_at_ms, expires_at_ms)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (agent_id, pattern) DO UPDATE SET mode = excluded.mode,"
    " reason = excluded.reason, expires_at_ms = excluded.expires_at_ms"
    f" RETURNING {_COLUMNS.replace('r.', '')}"
)
_TABLE_SQL = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'file_reservations'"
_WORKTREES_SQL = (
    "SELECT worker_id, worktree FROM workers"
    f" WHERE {AT_WORK_SQL} ORDER BY worker_id"
)


@dataclass(frozen=True)
class Reservation:
    """One agent's hold on the paths a pattern matches."""

    id: int
    agent: str
    pattern: str
    mode: str
    reason: str | None
    created_at_ms: int
    expires_at_ms: int

    @property
    def exclusive(self) -> bool:
        return self.mode == EXCLUSIVE

    @property
    def glob(self) -> Glob:
        return parse_glob(self.pattern)

    def to_json_dict(self) -> dict[str, Any]:
        return {"id": self.id, "agent": self.agent, "pattern": self.pattern, "mode": self.mode,
                "reason": self.reason, "created_at_ms": self.created_at_ms,
                "expires_at_ms": self.expires_at_ms, "expires": iso_utc(self.expires_at_ms)}

    def holder_line(self) -> str:
        """`agent-b holds src/auth/** (exclusive) until 2026-...Z: login rework`"""
        why = f": {self.reason}" if self.reason else ""
        return (f"{self.agent} holds {self.pattern} ({self.mode}) until"
                f" {iso_utc(self.expires_at_ms)}{why}")


@dataclass(frozen=True)
class Conflict:
    """A pattern asked for, a live reservation of another agent it conflicts with, and a
    path both match."""

    pattern: str
    held: Reservation
    example_path: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "holder": self.held.agent, "held_pattern":
                self.held.pattern, "mode": self.held.mode, "expires_at_ms":
                self.held.expires_at_ms, "expires": iso_utc(self.held.expires_at_ms),
                "reason": self.held.reason, "example_path": self.example_path}


@dataclass(frozen=True)
class Held:
    """A path another live agent holds exclusively."""

    path: str
    held: Reservation

    def to_json_dict(self) -> dict[str, Any]:
        return {"path": self.path, "holder": self.held.agent, "pattern": self.held.pattern,
                "mode": self.held.mode, "expires_at_ms": self.held.expires_at_ms,
                "expires": iso_utc(self.held.expires_at_ms), "reason": self.held.reason}


class ReservationConflict(BusError):
    """`reserve` refused: some pattern conflicts with another agent's live reservation.
    Nothing was reserved."""

    error_code = "reserved"

    def __init__(self, agent: str, conflicts: list[Conflict]) -> None:
        lines = [f"  {c.pattern} conflicts with: {c.held.holder_line()} (both match"
                 f" {c.example_path})" for c in conflicts]
        holders = sorted({c.held.agent for c in conflicts})
        super().__init__(
            f"{agent} reserved nothing; {len(conflicts)} conflict(s) with other agents'"
            " reservations:\n" + "\n".join(lines) + "\nWait until they end (bus reservations),"
            f" ask {' or '.join(holders)} to release them (bus unreserve --agent"
            f" {holders[0]}), or reserve --shared where the holder's is shared")
        self.field = "conflicts"  # not a bad argument: exit 1, not a usage error
        self.agent = agent
        self.conflicts = conflicts


class NotReserved(BusError):
    """`unreserve` of a pattern the agent does not hold; nothing was removed."""

    error_code = "not_found"

    def __init__(self, agent: str, missing: list[str], held: list[str]) -> None:
        super().__init__(f"{agent} holds no reservation of {', '.join(missing)}; it holds:"
                         f" {', '.join(held) or 'none'} (bus reservations --agent {agent});"
                         " nothing was released")
        self.field = "pattern"
        self.agent = agent
        self.missing = missing


class PathsReserved(BusError):
    """Paths another live agent holds exclusively: the git hook, `worker done`,
    `worker merge` and `bus reserve --check` refuse with this same message."""

    error_code = "reserved"

    def __init__(self, held: list[Held]) -> None:
        lines = [f"  {h.path}: {h.held.holder_line()}" for h in held]
        holders = sorted({h.held.agent for h in held})
        super().__init__(
            f"the change touches {len(held)} path(s) another agent holds exclusively:\n"
            + "\n".join(lines) + "\nWait until the reservation ends (bus reservations), ask"
            f" {' or '.join(holders)} to release it (bus unreserve --agent {holders[0]}),"
            " or leave these paths out")
        self.field = "paths"
        self.held = held


def ended_by(row: Sequence[Any], now: int, dead_ms: int) -> str | None:
    """Why the reservation of an _ALL_SQL row has ended ("ttl", "dead", "worker"), or None."""
    expires_at, beat_ms, status, worker_state = row[6], row[7], row[8], row[9]
    if expires_at <= now:
        return "ttl"
    return holder_ended(beat_ms, status, worker_state, now, dead_ms)


def holder_ended(beat_ms: int | None, status: str | None, worker_state: str | None, now: int,
                 dead_ms: int) -> str | None:
    """Why every reservation of a holder has ended ("dead", "worker"), or None: judged from
    its last beat and its worker's state."""
    if beat_ms is not None and status != STOPPED and now - beat_ms >= dead_ms:
        return "dead"
    if worker_state in TERMINAL_STATES:
        return "worker"
    return None


def live_reservations(conn: apsw.Connection, now: int,
                      thresholds: Thresholds | None = None) -> list[Reservation]:
    """Every live reservation, by pattern then agent (inside the caller's read or write)."""
    dead_ms = Thresholds.to_ms((thresholds or Thresholds()).dead)
    return [Reservation(*row[:7]) for row in conn.execute(_ALL_SQL)
            if ended_by(row, now, dead_ms) is None]


def has_reservations_table(conn: apsw.Connection) -> bool:
    """Whether the file has migration 13 yet: a read-only view reads an older file as one
    where nobody reserved anything (the migration is marked `readers: unchanged`)."""
    return conn.execute(_TABLE_SQL).get is not None


def sweep(conn: apsw.Connection, now: int,
          thresholds: Thresholds | None = None) -> list[Reservation]:
    """Delete the reservations that have ended, inside the caller's write transaction;
    return the live ones (one read of the table serves both)."""
    dead_ms = Thresholds.to_ms((thresholds or Thresholds()).dead)
    live = []
    for row in conn.execute(_ALL_SQL).fetchall():
        if ended_by(row, now, dead_ms):
            conn.execute(_DELETE_SQL, (row[0],))
        else:
            live.append(Reservation(*row[:7]))
    return live


def held_paths(reservations: Iterable[Reservation], agent: str | None,
               paths: Iterable[str]) -> list[Held]:
    """Which of `paths` (normalized) live reservations of agents other than `agent` hold
    exclusively; each path with every such holder."""
    index = GlobIndex()
    for r in reservations:
        if r.exclusive and r.agent != agent:
            index.add(r.pattern, r)
    if not index.size:
        return []
    return [Held(path, r) for path in paths for _pattern, r in index.matching(path)]


def worker_of_worktree(conn: apsw.Connection, directory: str | os.PathLike[str]) -> str | None:
    """The unfinished worker whose worktree is `directory` (the same directory, symlinks
    resolved), or None."""
    target = Path(directory).resolve()
    for worker, worktree in conn.execute(_WORKTREES_SQL):
        if Path(worktree).resolve() == target:
            return worker
    return None


def validate_patterns(patterns: object, field: str = "patterns") -> list[Glob]:
    """Each pattern parsed, duplicates dropped; ValidationFailed names the bad one."""
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)) or not patterns:
        raise ValidationFailed(field, f"give one pattern or more in a list (['src/auth/**']),"
                                      f" got {patterns!r}")
    if len(patterns) > PATTERNS_MAX:
        raise ValidationFailed(field, f"{len(patterns)} patterns; at most {PATTERNS_MAX} a call")
    return list({g.text: g for g in (parse_glob(p, field) for p in patterns)}.values())


def validate_paths(paths: object, field: str = "paths") -> list[str]:
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        raise ValidationFailed(field, f"give the paths in a list (['src/a.py']), got {paths!r}")
    return list(dict.fromkeys(normalize_path(p, field) for p in paths))


def _validate_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValidationFailed("mode", f"{mode!r} is not one of: {', '.join(MODES)}")
    return mode  # type: ignore[return-value]


def _validate_ttl(ttl_ms: object) -> int:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 0 < ttl_ms <= TTL_MAX_MS:
        raise ValidationFailed("ttl", f"must be from 1 ms to 7 days, got {ttl_ms!r} ms")
    return ttl_ms


# --- operations: one transaction each on the connection given -------------------


def reserve(conn: apsw.Connection, agent: str, patterns: Sequence[str], *,
            mode: str = EXCLUSIVE, ttl_ms: int = DEFAULT_TTL_MS, reason: str | None = None,
            now: int | None = None, thresholds: Thresholds | None = None) -> list[Reservation]:
    """See `Reservations.reserve`."""
    agent = messages.validate_agent_id(agent)
    globs = validate_patterns(patterns)
    mode, ttl_ms = _validate_mode(mode), _validate_ttl(ttl_ms)
    reason = messages.validate_text(reason, "reason", REASON_MAX, optional=True)
    with write_transaction(conn):
        at = messages.now_ms() if now is None else now
        live = sweep(conn, at, thresholds)
        _refuse_ended_holder(conn, agent, at, thresholds)
        conflicts = _conflicts(live, agent, globs, mode)
        if conflicts:
            raise ReservationConflict(agent, conflicts)
        return [Reservation(*conn.execute(_UPSERT_SQL, (
            agent, g.text, mode, reason, at, at + ttl_ms)).fetchone()) for g in globs]


def list_reservations(conn: apsw.Connection, agent: str | None = None,
                      path: str | None = None, *, now: int | None = None,
                      thresholds: Thresholds | None = None) -> list[Reservation]:
    """See `Reservations.list`."""
    if agent is not None:
        agent = messages.validate_agent_id(agent)
    wanted = normalize_path(path) if path is not None else None
    at = messages.now_ms() if now is None else now
    with translate_errors(conn), conn:
        found = live_reservations(conn, at, thresholds)
    return [r for r in found if (agent is None or r.agent == agent)
            and (wanted is None or r.glob.matches(wanted))]


def unreserve(conn: apsw.Connection, agent: str, patterns: Sequence[str] | None = None, *,
              now: int | None = None,
              thresholds: Thresholds | None = None) -> list[Reservation]:
    """See `Reservations.unreserve`."""
    agent = messages.validate_agent_id(agent)
    with write_transaction(conn):
        at = messages.now_ms() if now is None else now
        held = {r.pattern: r for r in sweep(conn, at, thresholds) if r.agent == agent}
        wanted = (list(held) if patterns is None
                  else [g.text for g in validate_patterns(patterns)])
        missing = [p for p in wanted if p not in held]
        if missing:
            raise NotReserved(agent, missing, list(held))
        for pattern in wanted:
            conn.execute(_DELETE_SQL, (held[pattern].id,))
    return [held[p] for p in wanted]


def check_paths(conn: apsw.Connection, agent: str | None, paths: Sequence[str], *,
                now: int | None = None, thresholds: Thresholds | None = None) -> list[Held]:
    """See `Reservations.check_paths`."""
    if agent is not None:
        agent = messages.validate_agent_id(agent)
    wanted = validate_paths(paths)
    at = messages.now_ms() if now is None else now
    with translate_errors(conn), conn:
        found = live_reservations(conn, at, thresholds)
    return held_paths(found, agent, wanted)


def _refuse_ended_holder(conn: apsw.Connection, agent: str, now: int,
                         thresholds: Thresholds | None) -> None:
    """ValidationFailed (agent) when a reservation of `agent` would end at once: its
    heartbeat is dead or its worker finished."""
    dead_ms = Thresholds.to_ms((thresholds or Thresholds()).dead)
    beat_ms, status, worker_state = conn.execute(_HOLDER_SQL, (agent,)).fetchone()
    why = holder_ended(beat_ms, status, worker_state, now, dead_ms)
    if why == "dead":
        raise ValidationFailed("agent", f"{agent} has not beaten for {(now - beat_ms) // 1000} s"
                                        f" (dead), so its reservations would end at once; beat"
                                        f" first (bus heartbeat --agent {agent})")
    if why == "worker":
        raise ValidationFailed("agent", f"worker {agent} is {worker_state}, so its reservations"
                                        " would end at once; reserve as a worker that is not"
                                        " finished")


def _conflicts(live: list[Reservation], agent: str, globs: list[Glob],
               mode: str) -> list[Conflict]:
    index = GlobIndex()
    for r in live:
        if r.agent != agent and (mode == EXCLUSIVE or r.exclusive):
            index.add(r.pattern, r)
    return [Conflict(g.text, r, witness)
            for g in globs for _pattern, r, witness in index.overlapping(g)]  # type: ignore[misc]
