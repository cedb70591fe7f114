"""The status of a bus file: one snapshot that every view renders.

`read_status(path)` opens the file read-only and reads every section in one
read transaction, so the numbers agree with each other (a message counted in
the log is counted in its consumer's lag too). It is plain SQL over the
tables: no view imports the engine, the pump or the worker lifecycle to
ask them, and looking never writes.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import apsw

from bus.storage import integrity
from bus.log import messages
from bus.channels.queries import ChannelSummary
from bus.channels.queries import channel_summaries
from bus.coordination.claims import Claim
from bus.coordination.claims import list_claims
from bus.storage.db import connect
from bus.storage.db import translate_busy
from bus.storage.errors import SchemaOutdated
from bus.coordination.heartbeats import LIVENESS_STATES
from bus.coordination.heartbeats import Liveness
from bus.coordination.heartbeats import Thresholds
from bus.coordination.heartbeats import liveness
from bus.mirror.subjects import CURSOR_PREFIX as MIRROR_CURSOR_PREFIX
from bus.log.receipts import Outstanding
from bus.log.receipts import outstanding
from bus.coordination.reservations import Reservation
from bus.replica.position import ReplicaPosition
from bus.replica.position import replica_position
from bus.coordination.reservations import has_reservations_table
from bus.coordination.reservations import live_reservations
from bus.storage.schema import schema_status
from bus.coordination.tasks import TaskCounts
from bus.coordination.tasks import counts as task_counts

EXPIRING_SOON_MS = 10_000  # a lease with less than this left is about to be taken over
RECEIPTS_SHOWN = 5  # the oldest direct messages not acknowledged, listed under receipts
EXPORTER = "(export)"  # the exporter's name among the consumers: no agent id has parentheses
_OLDEST_SQL = "SELECT seq, ts_ms FROM messages ORDER BY seq LIMIT 1"
_CURSORS_SQL = "SELECT agent_id, last_acked_seq, updated_at_ms FROM cursors ORDER BY agent_id"
_EXPORT_SQL = "SELECT last_seq, path FROM export_state WHERE id = 1"
_DEAD_CLAIMS_SQL = "SELECT count(*) FROM dead_claims"
_WORKERS_SQL = "SELECT state, count(*) FROM workers GROUP BY state ORDER BY state"
_WORKER_LIST_SQL = ("SELECT worker_id, task_id, state, branch, updated_at_ms FROM workers"
                    " ORDER BY worker_id")
_ORGANISMS_SQL = "SELECT name FROM pump_organisms ORDER BY name"
# A pending unit whose lease runs is being handled; one without is queued.
_PUMP_UNITS_SQL = (
    "SELECT (SELECT count(*) FROM pump_work WHERE status = 'pending' AND lease_until_ms <= :now),"
    " (SELECT count(*) FROM pump_work WHERE status = 'pending' AND lease_until_ms > :now),"
    " (SELECT count(*) FROM pump_work WHERE status = 'dead')"
)


@dataclass(frozen=True)
class FileInfo:
    path: str
    size_bytes: int
    wal_bytes: int
    schema_version: int
    durability: str  # per connection, not stored in the file: what this view was given
    schema_latest: int  # what `bus migrate` (or any writer's open) brings the file to


@dataclass(frozen=True)
class LogInfo:
    messages: int
    last_seq: int
    oldest_seq: int | None
    oldest_ts_ms: int | None


@dataclass(frozen=True)
class ConsumerPosition:
    """A cursor (or the exporter's position): how far it is and what waits for it.

    `pending` counts the messages it will be handed (to it or broadcast by another, above
    the cursor); `lag` is how many seqs it is behind the log's last one.
    """

    agent: str
    kind: str  # "agent", "mirror" (`bus mirror nats`) or "exporter"
    cursor: int
    pending: int
    lag: int
    last_ack_ms: int | None
    last_ack_age_s: float | None

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClaimsInfo:
    held: int
    expiring_soon: int
    expired: int
    taken_over: int  # claims on their second attempt or later
    dead: int
    claims: list[Claim]


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of the lifecycle (`worker status` has the rest: worktree, commits)."""

    worker: str
    task: str
    state: str
    branch: str
    updated_ms: int


@dataclass(frozen=True)
class PumpInfo:
    organisms: list[str]
    queued: int
    in_flight: int
    dead: int


@dataclass(frozen=True)
class ExportInfo:
    last_seq: int
    lag: int
    path: str | None


@dataclass(frozen=True)
class Status:
    """Everything `bus status` shows, as of `now_ms`."""

    now_ms: int
    file: FileInfo
    log: LogInfo
    consumers: list[ConsumerPosition]
    agents: list[Liveness]
    claims: ClaimsInfo
    workers: dict[str, int]  # how many in each state
    worker_list: list[WorkerInfo]
    reservations: list[Reservation]  # the live file reservations, by pattern
    channels: list[ChannelSummary]
    pump: PumpInfo
    export: ExportInfo
    tasks: TaskCounts  # the task graph: open tasks ready, blocked, held; done, cancelled
    receipts: Outstanding  # direct messages not delivered, or delivered and not acked
    replica: ReplicaPosition | None = None  # Litestream's replica, once `bus replicate` ran
    agents_by_state: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        # Every state liveness reports, `stopped` included (each worker done, fail
        # or cancel leaves one), so the counts always add up to the agents listed.
        counts = {state: 0 for state in LIVENESS_STATES}
        for agent in self.agents:
            counts[agent.state] += 1
        object.__setattr__(self, "agents_by_state", counts)

    def consumer(self, agent: str) -> ConsumerPosition | None:
        return next((c for c in self.consumers if c.agent == agent), None)

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_status(path: str | os.PathLike[str], durability: str = "normal", *,
                now: int | None = None, thresholds: Thresholds | None = None) -> Status:
    """The status of the bus at `path`, read through a read-only connection.

    Raises BusNotFound when there is no file, SchemaOutdated when it needs
    `bus migrate` first (a file behind only by migrations that readers do not
    see is read as it is), NotABusDatabase for a foreign file.
    """
    # A one-off status checks the file as a writer's open does: counts read
    # from indexes alone would report a damaged file as healthy.
    conn = connect(path, readonly=True, check=True)
    try:
        return status_of(conn, os.fspath(path), durability, now=now, thresholds=thresholds,
                         remote_replica=True)
    finally:
        conn.close()


def status_of(conn: apsw.Connection, path: str, durability: str = "normal", *,
              now: int | None = None, thresholds: Thresholds | None = None,
              remote_replica: bool = False) -> Status:
    """The status through an open connection (a live view keeps one), in one read snapshot.

    A replica other than file:// is asked where it is only with `remote_replica`
    (a one-off status may wait for the network; a live view refreshing does not).
    """
    at = messages.now_ms() if now is None else now
    with translate_busy(conn), conn:  # an error names the file
        schema = schema_status(conn, path)
        if not schema.readable:  # a pending migration changes what these queries read
            raise SchemaOutdated(schema.current, schema.latest, path)
        log = _log(conn)
        export = _export(conn, log.last_seq)
        return Status(
            now_ms=at, file=_file(path, schema.current, schema.latest, durability), log=log,
            consumers=_consumers(conn, log.last_seq, export, at),
            agents=liveness(conn, at, thresholds or Thresholds()),
            claims=_claims(conn, at, schema.current), workers=dict(conn.execute(_WORKERS_SQL).fetchall()),
            worker_list=[WorkerInfo(*row) for row in conn.execute(_WORKER_LIST_SQL)],
            reservations=(live_reservations(conn, at, thresholds)
                          if has_reservations_table(conn) else []),
            channels=channel_summaries(conn),
            pump=_pump(conn, at), export=export, tasks=task_counts(conn, at, schema.current),
            receipts=outstanding(conn, RECEIPTS_SHOWN),
            replica=replica_position(path, remote=remote_replica, now_ms=at))


def _file(path: str, schema_version: int, schema_latest: int, durability: str) -> FileInfo:
    return FileInfo(path, _size(Path(path)), _size(Path(f"{path}-wal")), schema_version,
                    durability, schema_latest)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0  # no WAL between the last connection's close and the next open


def _log(conn: apsw.Connection) -> LogInfo:
    oldest = conn.execute(_OLDEST_SQL).fetchone() or (None, None)
    return LogInfo(messages.message_count(conn), messages.last_seq(conn), *oldest)


def _export(conn: apsw.Connection, last_seq: int) -> ExportInfo:
    exported, path = conn.execute(_EXPORT_SQL).fetchone()
    return ExportInfo(exported, last_seq - exported, path)


def _consumers(conn: apsw.Connection, last_seq: int, export: ExportInfo,
               at: int) -> list[ConsumerPosition]:
    """Every cursor, then the exporter: retention waits for it once it has exported."""
    found = [_cursor_position(conn, agent, seq, last_seq, updated, at)
             for agent, seq, updated in conn.execute(_CURSORS_SQL)]
    if export.last_seq > 0 or export.path:
        found.append(ConsumerPosition(EXPORTER, "exporter", export.last_seq, export.lag,
                                      export.lag, None, None))
    return found


def _cursor_position(conn: apsw.Connection, agent: str, seq: int, last_seq: int,
                     updated: int, at: int) -> ConsumerPosition:
    """An agent's cursor, or the mirror's: it publishes every message, so all it lags is
    pending for it."""
    if agent.startswith(MIRROR_CURSOR_PREFIX):
        kind, pending = "mirror", last_seq - seq
    else:
        kind, pending = "agent", messages.pending_count(conn, agent, seq)
    return ConsumerPosition(agent, kind, seq, pending, last_seq - seq, updated, _age_s(at, updated))


def _age_s(at: int, then: int) -> float:
    return round(max(0, at - then) / 1000, 3)


def _claims(conn: apsw.Connection, at: int, schema_version: int) -> ClaimsInfo:
    current = list_claims(conn, schema_version)
    expired = [c for c in current if c.expired(at)]
    soon = [c for c in current if not c.expired(at) and c.lease_until_ms - at < EXPIRING_SOON_MS]
    return ClaimsInfo(held=len(current) - len(expired), expiring_soon=len(soon),
                      expired=len(expired), taken_over=sum(c.attempts > 1 for c in current),
                      dead=conn.execute(_DEAD_CLAIMS_SQL).get, claims=current)


def _pump(conn: apsw.Connection, at: int) -> PumpInfo:
    organisms = [name for (name,) in conn.execute(_ORGANISMS_SQL)]
    queued, in_flight, dead = conn.execute(_PUMP_UNITS_SQL, {"now": at}).fetchone()
    return PumpInfo(organisms, queued, in_flight, dead)
