"""Heartbeats and liveness: who is alive, judged by the age of their last beat.

Beats come from a dedicated thread (`Heartbeat`) with its own connection, so
an agent blocked for minutes in an LLM call or a subprocess still beats and
does not look dead. One row per agent, upserted: beats never grow the log.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any
from typing import Callable
from typing import TYPE_CHECKING

import apsw

from bus.storage.db import connect
from bus.storage.db import refuse_write
from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.log.glance import PRESENCE_STATUS
from bus.log.glance import STOPPED
from bus.log.messages import append
from bus.log.messages import now_ms
from bus.log.messages import prepare_row
from bus.log.messages import validate_agent_id
from bus.log.messages import validate_text

if TYPE_CHECKING:
    from bus.log.payloads import PayloadPolicy


STATUSES = ("idle", "working", "blocked", "stopped")
STATES = ("alive", "warn", "stale", "dead")  # in order of increasing silence
# Every state `liveness` reports: a state judged by silence, or `stopped`
# whatever the silence. A view that counts agents by state counts these.
LIVENESS_STATES = (*STATES, STOPPED)
_ORDER = (STOPPED, *STATES)  # how `liveness` sorts: stopped agents last
TASK_MAX = 256


class _Keep:
    """The type of KEEP: a beat's task or progress left as the agent's last beat had it."""

    def __repr__(self) -> str:
        return "KEEP"


# Pass as `task` or `progress` of a beat to keep the agent's current value
# (None clears it). A kept progress belongs to a task: a beat that changes the
# task and keeps the progress clears it.
KEEP: Any = _Keep()
_BEAT_SQL = (
    "INSERT INTO heartbeats (agent_id, ts_ms, status, current_task, progress)"
    " VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (agent_id) DO UPDATE SET ts_ms = excluded.ts_ms, status = excluded.status,"
    " current_task = excluded.current_task, progress = excluded.progress"
)
_LIST_SQL = "SELECT agent_id, ts_ms, status, current_task, progress FROM heartbeats"
_LAST_SQL = "SELECT status, current_task, progress, ts_ms FROM heartbeats WHERE agent_id = ?"
_FORGET_SQL = "DELETE FROM heartbeats WHERE agent_id = ? RETURNING agent_id"
# An agent that was dead (or is forgotten) lost its file reservations
# (bus/coordination/reservations.py):
# they must not come back to life with its next beat.
_END_RESERVATIONS_SQL = "DELETE FROM file_reservations WHERE agent_id = ?"
_HAS_BEATEN_SQL = "SELECT 1 FROM heartbeats WHERE agent_id = ?"


class AgentHoldsClaims(BusError):
    """`forget` refused: the agent still holds task claims."""

    error_code = "conflict"

    def __init__(self, agent: str, tasks: list[str]) -> None:
        super().__init__(f"agent {agent} holds claims on {', '.join(tasks)}; release them"
                         f" (bus release --task T --agent {agent}) or let another agent take"
                         " them over first")
        self.agent = agent
        self.tasks = tasks


@dataclass(frozen=True)
class Thresholds:
    """Seconds of silence after which an agent is warn, stale and dead."""

    warn: float = 30.0
    stale: float = 100.0
    dead: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.warn <= self.stale <= self.dead:
            raise ValidationFailed(
                "thresholds", f"need 0 < warn <= stale <= dead, got {self.warn}, "
                f"{self.stale}, {self.dead}")

    @classmethod
    def given(cls, warn: float | None = None, stale: float | None = None,
              dead: float | None = None) -> Thresholds:
        """Thresholds from the values given; a missing one defaults, lowered if
        needed to stay at or below the next one given (so `dead=60` alone works)."""
        defaults = cls()
        dead = defaults.dead if dead is None else dead
        stale = min(defaults.stale, dead) if stale is None else stale
        warn = min(defaults.warn, stale) if warn is None else warn
        return cls(warn, stale, dead)

    @staticmethod
    def to_ms(seconds: float) -> int:
        """Whole milliseconds, rounding float noise away (1.001 s is 1001 ms, not 1000)."""
        return math.ceil(round(seconds * 1000, 6))

    def state(self, age_s: float) -> str:
        return self.state_ms(round(age_s * 1000))

    def state_ms(self, age_ms: int) -> str:
        """The state after `age_ms` of silence; reap uses the same dead boundary."""
        if age_ms >= self.to_ms(self.dead):
            return "dead"
        if age_ms >= self.to_ms(self.stale):
            return "stale"
        if age_ms >= self.to_ms(self.warn):
            return "warn"
        return "alive"


@dataclass(frozen=True)
class Liveness:
    """One agent's last beat and what its age says about it."""

    agent: str
    state: str
    age_s: float
    status: str
    task: str | None
    progress: float | None
    ts_ms: int

    def to_json_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "state": self.state, "age_s": round(self.age_s, 3),
                "status": self.status, "task": self.task, "progress": self.progress,
                "ts_ms": self.ts_ms}


def validate_beat(agent: object, status: object, task: object,
                  progress: object) -> tuple[str, str, str | None, float | None]:
    """Check a beat's fields; raises ValidationFailed naming the field."""
    agent = validate_agent_id(agent)
    if status not in STATUSES:
        raise ValidationFailed("status", f"{status!r} is not one of: {', '.join(STATUSES)}")
    if task is not KEEP:
        task = validate_text(task, "task", TASK_MAX, optional=True)
    if progress is not None and progress is not KEEP:
        if isinstance(progress, bool) or not isinstance(progress, (int, float)) \
                or not math.isfinite(progress) or not 0 <= progress <= 1:
            raise ValidationFailed(
                "progress", f"is a fraction from 0 to 1, got {progress!r} (50% is 0.5)")
        progress = float(progress)
    return agent, status, task, progress


def beat(conn: apsw.Connection, agent: str, status: str, task: str | None,
         progress: float | None, now: int | None = None, *,
         payloads: PayloadPolicy | None = None) -> int:
    """Upsert the agent's row in its own short transaction; return the beat time.

    A beat that changes the agent's progress publishes `task_progress`, one
    that makes it blocked `task_blocked` (the lifecycle's vocabulary), in the same
    transaction; a beat that changes neither writes only its own row.
    """
    with write_transaction(conn):
        ts = now_ms() if now is None else now
        last = conn.execute(_LAST_SQL, (agent,)).fetchone()
        if last is not None and _was_dead(last, ts):
            conn.execute(_END_RESERVATIONS_SQL, (agent,))
        task, progress = _kept(last, task, progress)
        conn.execute(_BEAT_SQL, (agent, ts, status, task, progress))
        for type_, payload in _changes(last, status, task, progress):
            row = prepare_row(agent, type_, payload, correlation_id=task)
            append(conn, [row], payloads, ts)
    return ts


def _was_dead(last: tuple, now: int) -> bool:
    """Whether the agent's last beat had turned dead (by the default thresholds) by `now`."""
    status, _task, _progress, ts = last
    return status != STOPPED and now - ts >= Thresholds.to_ms(Thresholds().dead)


def _kept(last: tuple | None, task: Any, progress: Any) -> tuple[str | None, float | None]:
    """A beat's task and progress with KEEP replaced by the last beat's values."""
    _status, last_task, last_progress = last[:3] if last is not None else (None, None, None)
    if task is KEEP:
        task = last_task
    if progress is KEEP:
        progress = last_progress if task == last_task else None
    return task, progress


def _changes(last: tuple | None, status: str, task: str | None,
             progress: float | None) -> list[tuple[str, dict[str, Any]]]:
    """The announcements a beat owes: what changed since the agent's previous beat."""
    last_status, _task, last_progress = last[:3] if last is not None else (None, None, None)
    found = []
    if progress is not None and progress != last_progress:
        found.append(("task_progress", {"task": task, "progress": progress}))
    if status == "blocked" and last_status != "blocked":
        found.append(("task_blocked", {"task": task}))
    return found


def presence(conn: apsw.Connection, agent: str, moment: str, now: int | None = None, *,
             payloads: PayloadPolicy | None = None) -> int:
    """Beat for `agent` as its session's `moment` (a key of PRESENCE_STATUS) says;
    return the beat time. ValidationFailed for a moment not in PRESENCE_STATUS."""
    status = PRESENCE_STATUS.get(moment)
    if status is None:
        raise ValidationFailed("moment", f"{moment!r} is not one of:"
                               f" {', '.join(PRESENCE_STATUS)}")
    return beat(conn, agent, status, KEEP, KEEP, now, payloads=payloads)


def forget(conn: apsw.Connection, agent: str) -> bool:
    """Delete the agent's heartbeat row, and its file reservations, inside the caller's
    transaction; False if it had no heartbeat."""
    conn.execute(_END_RESERVATIONS_SQL, (agent,))
    return conn.execute(_FORGET_SQL, (agent,)).get is not None


def has_beaten(conn: apsw.Connection, agent: str) -> bool:
    """Whether `agent` ever sent a heartbeat (so it is a real agent, not a typo)."""
    return conn.execute(_HAS_BEATEN_SQL, (agent,)).get is not None


def liveness(conn: apsw.Connection, now: int, thresholds: Thresholds,
             stopped: bool = True) -> list[Liveness]:
    """Every agent that ever beat, most silent state first, then by age.

    An agent whose last beat says `stopped` finished cleanly: its state is
    `stopped` whatever its silence, and it comes last (left out unless `stopped`).
    """
    found = []
    for agent, ts, status, task, progress in conn.execute(_LIST_SQL):
        if status == STOPPED and not stopped:
            continue
        age_ms = max(0, now - ts)
        state = STOPPED if status == STOPPED else thresholds.state_ms(age_ms)
        found.append(Liveness(agent, state, age_ms / 1000, status, task, progress, ts))
    found.sort(key=lambda item: (-_ORDER.index(item.state), -item.age_s, item.agent))
    return found


class Heartbeat:
    """Beats for `agent` every `interval` seconds from a thread of its own.

        with Heartbeat(db_path, "worker-1", interval=10) as hb:
            hb.update(status="working", task="t1")
            call_the_llm()              # may block for minutes; the beats go on
            hb.update(progress=0.5)

    The thread opens its own connection. A failed beat (database busy) is
    logged and retried at the next interval; it never kills the thread.
    `on_beat`, if given, runs in the thread after each beat (to renew a lease, say).
    Leaving the block, normally or by Ctrl-C, stops the thread at once.
    """

    def __init__(self, db_path: str | os.PathLike[str], agent: str, interval: float = 10.0, *,
                 status: str = "idle", task: str | None = None,
                 progress: float | None = None,
                 on_beat: Callable[[], object] | None = None) -> None:
        if isinstance(interval, bool) or not (isinstance(interval, (int, float))
                                              and 0 < interval < math.inf):
            raise ValidationFailed("interval", f"must be a positive number of seconds, got {interval!r}")
        self.db_path = os.fspath(db_path)
        self.interval = float(interval)
        self._fields = validate_beat(agent, status, task, progress)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_beat = on_beat
        self._last_beat = False  # stop(last_status=...) asked for one beat more
        self.beats = 0

    def update(self, **changes: Any) -> None:
        """Change status, task and/or progress; the next beat (sent now) carries them."""
        unknown = set(changes) - {"status", "task", "progress"}
        if unknown:
            raise ValidationFailed(sorted(unknown)[0], "unknown field; use status, task or progress")
        with self._lock:
            agent, status, task, progress = self._fields
            current = {"status": status, "task": task, "progress": progress, **changes}
            self._fields = validate_beat(agent, current["status"], current["task"],
                                         current["progress"])
        self._wake.set()

    def start(self) -> Heartbeat:
        if self._thread is not None:
            raise BusError("this Heartbeat is already started")
        conn = connect(self.db_path, create=False)  # fail here, in the caller, not in the thread
        try:
            refuse_write(conn)  # a read-only bus takes no beats: say so now, not in a log
        except BaseException:
            conn.close()
            raise
        self._thread = threading.Thread(target=self._run, args=(conn,), daemon=True,
                                        name=f"heartbeat-{self._fields[0]}")
        self._thread.start()
        return self

    def stop(self, last_status: str | None = None) -> None:
        """Stop beating; with `last_status` (`stopped` for a clean end), the thread sends
        one last beat with it first, so views show how the agent ended rather than let
        its last `working` beat decay to dead. A status not in STATUSES raises
        ValidationFailed, and nothing stops."""
        if last_status is not None:
            self.update(status=last_status)  # validated here, in the caller
            self._last_beat = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, conn: apsw.Connection) -> None:
        try:
            while not self._stop.is_set():
                # Cleared before the beat: an update() from now on gets its own beat.
                self._wake.clear()
                self._beat_once(conn)
                self._wake.wait(self.interval)
            if self._last_beat:  # set before the stop flag that ended the loop
                self._beat_once(conn, last=True)
        finally:
            conn.close()

    def _beat_once(self, conn: apsw.Connection, last: bool = False) -> None:
        with self._lock:
            fields = self._fields
        try:
            beat(conn, *fields)
            self.beats += 1
            if self._on_beat is not None and not last:
                self._on_beat()
        except (BusError, apsw.Error) as exc:
            import logging  # only here: a hook's quiet answer beats without loading logging
            logging.getLogger("bus.heartbeat").warning(
                "heartbeat for %s failed, retrying in %.1f s: %s",
                fields[0], self.interval, exc)
