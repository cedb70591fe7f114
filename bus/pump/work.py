"""Work units of the pump: the SQL of routing, claiming, renewing and finishing.

A unit is one (input envelope, listener) pair in `pump_work`
(migrations/0007_pump.sql). The functions that write run inside the
caller's write transaction (one of the pump's BEGIN IMMEDIATE), with `now`
taken under its lock, so what they read first nobody changes before they
write. Claims are leases as in bus/coordination/claims.py: per listener, the oldest
units never leased are looked up, then get this pump as owner, a new lease
and one more attempt. A unit whose lease ran out is a suspect (its pump
died with it in flight) and is claimed on its own (`find_suspect`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Iterable
from typing import NamedTuple
from typing import Sequence

import apsw
import orjson

from bus.log.messages import Message
from bus.log.messages import row_to_message

if TYPE_CHECKING:
    from blobs.store import BlobStore

_UNITS_NEWEST_SQL = (
    "SELECT id, organism, input_seq, listener, kind, thread, status, attempts, max_attempts,"
    " lease_owner, lease_until_ms, created_at_ms, finished_at_ms, outcome FROM pump_work"
    " ORDER BY id DESC LIMIT ?"
)
_UNIT_COLUMNS = "id, input_seq, listener, kind, thread, attempts, max_attempts"
_INSERT_UNIT_SQL = (
    "INSERT INTO pump_work (organism, input_seq, listener, kind, thread, max_attempts,"
    " created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (input_seq, listener) DO NOTHING RETURNING id"
)
# insert_unit for a JSON array of [input seq, listener, thread, max attempts].
# (WHERE true: an upsert's SELECT needs a WHERE, or SQLite reads ON as a join's.)
_INSERT_UNITS_SQL = (
    "INSERT INTO pump_work (organism, input_seq, listener, kind, thread, max_attempts,"
    " created_at_ms) SELECT :organism, value ->> 0, value ->> 1, 'call', value ->> 2,"
    " value ->> 3, :now FROM json_each(:units) WHERE true"
    " ON CONFLICT (input_seq, listener) DO NOTHING"
)
# The oldest claimable units of one listener, read in id order from
# idx_pump_work_pending, which stops after `limit` of them. (The `+` keeps the
# planner off idx_pump_work_lease: that range holds every listener's whole
# unclaimed backlog, which it then had to read and sort on every claim.)
# Found first, then leased by id: most claims find nothing, and the lookup
# alone costs a quarter of the UPDATE around it.
_CLAIMABLE_SQL = (
    "SELECT id FROM pump_work WHERE organism = :organism"
    " AND listener = :listener AND status = 'pending' AND +lease_until_ms = 0"
    " ORDER BY id LIMIT :limit"
)
# A unit claimed before whose lease ran out: its pump died (or lost the lease)
# while it was in flight, maybe because of it. The oldest such unit of the
# given listeners; a range on idx_pump_work_lease (expired leases only).
_SUSPECT_SQL = (
    "SELECT id FROM pump_work WHERE organism = :organism AND status = 'pending'"
    " AND lease_until_ms BETWEEN 1 AND :now AND attempts < max_attempts"
    " AND listener IN (SELECT value FROM json_each(:listeners))"
    " ORDER BY lease_until_ms, id LIMIT 1"
)
_CLAIM_SQL = (
    "UPDATE pump_work SET lease_owner = :owner, lease_until_ms = :now + :lease,"
    " attempts = attempts + 1 WHERE id IN (SELECT value FROM json_each(:ids))"
    " AND status = 'pending' AND lease_until_ms <= :now"
    f" RETURNING {_UNIT_COLUMNS}"
)
_RENEW_SQL = (
    "UPDATE pump_work SET lease_until_ms = :now + :lease"
    " WHERE lease_owner = :owner AND status = 'pending'"
    " AND id IN (SELECT value FROM json_each(:ids))"
)
# The claim check and the ack in one statement: the unit is ours if nobody
# claimed it since (same owner, same attempt) and it is still pending.
_FINISH_HELD_SQL = (
    "UPDATE pump_work SET status = 'done', outcome = :outcome, finished_at_ms = :now"
    " WHERE id = :id AND lease_owner = :owner AND attempts = :attempts"
    " AND status = 'pending' RETURNING id"
)
# finish_held for a JSON array of [id, attempts]: the ids still held, now done.
_FINISH_ALL_HELD_SQL = (
    "UPDATE pump_work SET status = 'done', outcome = :outcome, finished_at_ms = :now"
    " FROM (SELECT value ->> 0 AS id, value ->> 1 AS attempts FROM json_each(:units)) AS held"
    " WHERE pump_work.id = held.id AND lease_owner = :owner"
    " AND pump_work.attempts = held.attempts AND status = 'pending' RETURNING pump_work.id"
)
# Units that ran out of attempts: their lease expired max_attempts times. A
# range on idx_pump_work_lease: expired leases only, never the unclaimed backlog.
_BURY_EXHAUSTED_SQL = (
    "UPDATE pump_work SET status = 'dead', outcome = 'dead', finished_at_ms = :now"
    " WHERE organism = :organism AND status = 'pending' AND lease_until_ms BETWEEN 1 AND :now"
    f" AND attempts >= max_attempts RETURNING {_UNIT_COLUMNS}"
)
# Units of listeners the running pump no longer has (an OOB remove-listener);
# this one reads every pending unit, so the pump runs it when its table changes.
_BURY_ORPHANS_SQL = (
    "UPDATE pump_work SET status = 'dead', outcome = 'listener-removed', finished_at_ms = :now"
    " WHERE organism = :organism AND status = 'pending' AND lease_until_ms <= :now"
    " AND listener NOT IN (SELECT value FROM json_each(:listeners))"
    f" RETURNING {_UNIT_COLUMNS}"
)
# Index lookups only: whether anything is left, and when the next lease runs out.
_PENDING_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pump_inbox WHERE organism = :organism)"
    " OR EXISTS (SELECT 1 FROM pump_work WHERE organism = :organism AND status = 'pending'),"
    " (SELECT min(lease_until_ms) FROM pump_work WHERE organism = :organism"
    " AND status = 'pending' AND lease_until_ms > :now)"
)
# For the change watcher: is there anything a step would take, and when does
# the next lease run out? Index lookups only.
_HAS_WORK_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pump_inbox WHERE organism = :organism)"
    " OR EXISTS (SELECT 1 FROM pump_work WHERE organism = :organism AND status = 'pending'"
    " AND lease_until_ms <= :now),"
    " (SELECT min(lease_until_ms) FROM pump_work WHERE organism = :organism"
    " AND status = 'pending' AND lease_until_ms > :now)"
)
_INSERT_INBOX_SQL = (
    "INSERT INTO pump_inbox (seq, organism, root_tag, to_listener, created_at_ms)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (organism, seq) DO NOTHING"
)
# The oldest rows, deleted and returned in one statement (RETURNING gives no
# order: take_inbox sorts them).
_TAKE_INBOX_SQL = (
    "DELETE FROM pump_inbox WHERE organism = ?1 AND seq IN (SELECT seq FROM pump_inbox"
    " WHERE organism = ?1 ORDER BY seq LIMIT ?2) RETURNING seq, root_tag, to_listener"
)
# How much waits (client envelopes not routed yet, units not finished), counted no
# further than `limit` in each table: index ranges of at most `limit` entries.
_WAITING_COUNT_SQL = (
    "SELECT (SELECT count(*) FROM (SELECT 1 FROM pump_inbox WHERE organism = :organism"
    " LIMIT :limit)) + (SELECT count(*) FROM (SELECT 1 FROM pump_work"
    " WHERE organism = :organism AND status = 'pending' LIMIT :limit))"
)
_INBOX_WAITING_SQL = "SELECT EXISTS (SELECT 1 FROM pump_inbox WHERE organism = ?)"
_LAST_INBOX_SQL = "SELECT max(seq) FROM pump_inbox WHERE organism = ?"
_BOOT_SQL = (
    "INSERT INTO pump_organisms (name, booted_at_ms, boot_id) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO NOTHING RETURNING name"
)
_MESSAGES_SQL = (
    "SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload,"
    " payload_ref FROM messages WHERE seq IN (SELECT value FROM json_each(?))"
)
_MESSAGE_BY_ID_SQL = (
    "SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload,"
    " payload_ref FROM messages WHERE id = ?"
)
_UNITS_SQL = f"SELECT {_UNIT_COLUMNS} FROM pump_work WHERE input_seq = ? ORDER BY id"
# For people (`bus pump dead`), not the hot path: the pending indexes do not cover it.
_DEAD_SQL = (
    "SELECT w.id, w.input_seq, m.id, m.from_agent, w.listener, w.attempts, w.outcome,"
    " w.finished_at_ms FROM pump_work w LEFT JOIN messages m ON m.seq = w.input_seq"
    " WHERE w.organism = ? AND w.status = 'dead' ORDER BY w.id LIMIT ?"
)


class Unit(NamedTuple):
    """A claimed (or buried) work unit."""

    id: int
    input_seq: int
    listener: str
    kind: str  # "call": a new call to the listener; "answer": a reply on its own thread
    thread: str
    attempts: int
    max_attempts: int


class DeadUnit(NamedTuple):
    """A unit the pump gave up on; its sender got a <huh>. `input_id` and `sender`
    are None when compaction has deleted the input envelope since."""

    id: int
    input_seq: int
    input_id: str | None
    sender: str | None
    listener: str
    attempts: int
    outcome: str  # "dead": its lease ran out max_attempts times; "listener-removed"
    finished_at_ms: int

    def to_json_dict(self) -> dict:
        return self._asdict()


class Inbound(NamedTuple):
    """A client envelope waiting to be routed."""

    seq: int
    root_tag: str
    to: str | None


def insert_unit(conn: apsw.Connection, organism: str, input_seq: int, listener: str,
                kind: str, thread: str, max_attempts: int, now: int) -> bool:
    """Route an input to `listener`; False if that unit exists already (a retried route)."""
    return conn.execute(_INSERT_UNIT_SQL, (organism, input_seq, listener, kind, thread,
                                           max_attempts, now)).get is not None


def insert_calls(conn: apsw.Connection, organism: str,
                 units: Sequence[tuple[int, str, str, int]], now: int) -> None:
    """`insert_unit` of kind "call" for each (input seq, listener, thread, max attempts),
    in one statement."""
    conn.execute(_INSERT_UNITS_SQL, {"organism": organism, "units": orjson.dumps(units),
                                     "now": now})


def claim(conn: apsw.Connection, organism: str, listener: str, owner: str, lease_ms: int,
          limit: int, now: int) -> list[Unit]:
    """Lease up to `limit` of `listener`'s never claimed units to `owner`, oldest first.

    Runs inside the caller's write transaction, so nobody claims in between.
    Units claimed before are retried through `find_suspect` instead.
    """
    ids = [row[0] for row in conn.execute(_CLAIMABLE_SQL, {
        "organism": organism, "listener": listener, "limit": limit})]
    return lease(conn, ids, owner, lease_ms, now)


def find_suspect(conn: apsw.Connection, organism: str, listeners: Iterable[str],
                 now: int) -> int | None:
    """The oldest unit of `listeners` whose lease ran out with attempts left, or None.

    Its pump died (or lost its lease) with it in flight: it may be the cause,
    so the pump retries it alone (see Pump._claim).
    """
    return conn.execute(_SUSPECT_SQL, {"organism": organism, "now": now,
                                       "listeners": orjson.dumps(list(listeners))}).get


def lease(conn: apsw.Connection, ids: list[int], owner: str, lease_ms: int,
          now: int) -> list[Unit]:
    """Lease the units `ids` (those still pending and unleased) to `owner`; one more attempt."""
    if not ids:
        return []
    rows = conn.execute(_CLAIM_SQL, {"owner": owner, "now": now, "lease": lease_ms,
                                     "ids": orjson.dumps(ids)}).fetchall()
    return sorted(Unit(*row) for row in rows)


def renew(conn: apsw.Connection, owner: str, ids: Iterable[int], lease_ms: int,
          now: int) -> int:
    """Extend `owner`'s leases on `ids`; how many it still held."""
    conn.execute(_RENEW_SQL, {"now": now, "lease": lease_ms, "owner": owner,
                              "ids": orjson.dumps(list(ids))})
    return conn.changes()


def finish_held(conn: apsw.Connection, unit: Unit, owner: str, outcome: str,
                now: int) -> bool:
    """Mark `unit` done with `outcome` if `owner` still holds the claim it made.

    False (and nothing changed) when another pump took the unit over since.
    """
    return conn.execute(_FINISH_HELD_SQL, {"outcome": outcome, "now": now, "id": unit.id,
                                           "owner": owner, "attempts": unit.attempts}
                        ).get is not None


def finish_all_held(conn: apsw.Connection, units: Sequence[Unit], owner: str, outcome: str,
                    now: int) -> set[int]:
    """`finish_held` for many units in one statement: the ids of those marked done."""
    held = orjson.dumps([(unit.id, unit.attempts) for unit in units])
    rows = conn.execute(_FINISH_ALL_HELD_SQL, {"outcome": outcome, "now": now, "units": held,
                                               "owner": owner})
    return {unit_id for (unit_id,) in rows}


def bury_exhausted(conn: apsw.Connection, organism: str, now: int) -> list[Unit]:
    """Mark dead the units whose lease expired `max_attempts` times; return them."""
    rows = conn.execute(_BURY_EXHAUSTED_SQL, {"organism": organism, "now": now}).fetchall()
    return sorted(Unit(*row) for row in rows)


def bury_orphans(conn: apsw.Connection, organism: str, listeners: Iterable[str],
                 now: int) -> list[Unit]:
    """Mark dead the unleased units of listeners not in `listeners`; return them."""
    rows = conn.execute(_BURY_ORPHANS_SQL, {"organism": organism, "now": now,
                                            "listeners": orjson.dumps(list(listeners))})
    return sorted(Unit(*row) for row in rows.fetchall())


def pending(conn: apsw.Connection, organism: str, now: int) -> tuple[bool, int | None]:
    """(whether units or inbox rows are left, when the next running lease ends)."""
    left, next_expiry = conn.execute(_PENDING_SQL, {"organism": organism, "now": now}).fetchone()
    return bool(left), next_expiry


def has_work(conn: apsw.Connection, organism: str, now: int) -> tuple[bool, int | None]:
    """(whether envelopes wait to be routed or units to be claimed or buried, when the
    next running lease ends); read outside any transaction."""
    ready, next_expiry = conn.execute(_HAS_WORK_SQL, {"organism": organism, "now": now}).get
    return bool(ready), next_expiry


def insert_inbox(conn: apsw.Connection, seq: int, organism: str, root_tag: str,
                 to: str | None, now: int) -> None:
    conn.execute(_INSERT_INBOX_SQL, (seq, organism, root_tag, to, now))


def take_inbox(conn: apsw.Connection, organism: str, limit: int) -> list[Inbound]:
    """Remove and return up to `limit` waiting client envelopes, oldest first.

    Runs inside the caller's write transaction, so nobody takes them in between.
    """
    return sorted(Inbound(*row) for row in conn.execute(_TAKE_INBOX_SQL, (organism, limit)))


def inbox_waiting(conn: apsw.Connection, organism: str) -> bool:
    """Whether client envelopes wait to be routed (an index lookup)."""
    return bool(conn.execute(_INBOX_WAITING_SQL, (organism,)).get)


def waiting_count(conn: apsw.Connection, organism: str, limit: int) -> int:
    """Inbox rows plus pending units of `organism`, each counted up to `limit`."""
    return conn.execute(_WAITING_COUNT_SQL, {"organism": organism, "limit": limit}).get


def last_inbox_seq(conn: apsw.Connection, organism: str) -> int:
    """The seq of the newest envelope waiting to be routed; 0 if none waits."""
    return conn.execute(_LAST_INBOX_SQL, (organism,)).get or 0


def mark_booted(conn: apsw.Connection, organism: str, boot_id: str, now: int) -> bool:
    """Record the organism's first start; False if it booted before (a restart)."""
    return conn.execute(_BOOT_SQL, (organism, now, boot_id)).get is not None


def messages_by_seq(conn: apsw.Connection, seqs: Iterable[int],
                    blobs: BlobStore | None) -> dict[int, Message]:
    seqs = list(seqs)
    if not seqs:
        return {}
    rows = conn.execute(_MESSAGES_SQL, (orjson.dumps(seqs),))
    return {row[0]: row_to_message(row, blobs) for row in rows}


def message_by_id(conn: apsw.Connection, message_id: str,
                  blobs: BlobStore | None) -> Message | None:
    row = conn.execute(_MESSAGE_BY_ID_SQL, (message_id,)).fetchone()
    return None if row is None else row_to_message(row, blobs)


def units_for_input(conn: apsw.Connection, input_seq: int) -> list[Unit]:
    """Every unit an input was routed to (for inspection and tests)."""
    return [Unit(*row) for row in conn.execute(_UNITS_SQL, (input_seq,))]


def dead_units(conn: apsw.Connection, organism: str, limit: int = 1000) -> list[DeadUnit]:
    """The organism's dead units, oldest first."""
    return [DeadUnit(*row) for row in conn.execute(_DEAD_SQL, (organism, limit))]


class PumpUnit(NamedTuple):
    """A work unit as the console lists it: where it stands, its lease and its outcome."""

    id: int
    organism: str
    input_seq: int
    listener: str
    kind: str
    thread: str
    status: str
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_until_ms: int
    created_ms: int
    finished_ms: int | None
    outcome: str | None


def newest_units(conn: apsw.Connection, limit: int = 1000) -> list[PumpUnit]:
    """The newest pump work units, newest first."""
    return [PumpUnit(*row) for row in conn.execute(_UNITS_NEWEST_SQL, (limit,))]
