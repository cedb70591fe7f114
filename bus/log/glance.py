"""An agent at a glance: its cursor, the first message waiting for it, and its presence.

These are the reads a Claude Code hook makes at every tool call, and the
hook's fast path (bus/cli/entry.py) makes them before loading the rest of the
library: a hook with nothing to show costs about the interpreter's own start.
So this module imports nothing but apsw, and the log's modules (cursors,
messages, heartbeats) take these definitions from here.
"""

from __future__ import annotations

import time

import apsw

STOPPED = "stopped"  # the last beat of an agent that finished cleanly (worker done/fail/cancel)
# A harness session's moments (Claude Code's and Codex's hooks report them) as beats: a
# session that started or went idle is `idle`, one at work `working`, and one that ended
# `stopped`, so that no view shows it live. The beat keeps the agent's task and progress.
PRESENCE_STATUS = {"started": "idle", "working": "working", "idle": "idle", "ended": STOPPED}
# A session's presence beat newer than this, saying the same, needs no new beat: a
# busy session's hooks then write once per interval, not at every tool call. Far
# below the 30 s after which a silent agent shows as `warn` (bus/coordination/heartbeats.py).
PRESENCE_FRESH_MS = 10_000

# An agent's own messages are not waiting for it (it knows what it said): its broadcasts,
# and what it addressed to itself.
NOT_OWN = " AND from_agent <> :agent"
_POSITION_SQL = "SELECT last_acked_seq FROM cursors WHERE agent_id = ?"
# The first message waiting for an agent above its cursor: the heads of poll's two scans.
_FIRST_WAITING_SQL = (
    "SELECT min(seq) FROM (SELECT min(seq) AS seq FROM messages"
    f" WHERE to_agent = :agent AND seq > :after{NOT_OWN}"
    f" UNION ALL SELECT min(seq) FROM messages WHERE to_agent IS NULL AND seq > :after{NOT_OWN})"
)
_BEAT_SQL = "SELECT status, ts_ms FROM heartbeats WHERE agent_id = ?"


def open_reader(path: str) -> apsw.Connection:
    """A connection to an existing bus file for these reads alone: no pragmas, no checks, and
    never a new file (bus/storage/db.py opens every connection that writes or serves a command)."""
    return apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE)


def position(conn: apsw.Connection, agent: str) -> int:
    """The agent's last acknowledged seq, 0 before its first ack."""
    return conn.execute(_POSITION_SQL, (agent,)).get or 0


def first_waiting(conn: apsw.Connection, agent: str, after: int) -> int | None:
    """The seq of the first message for `agent` (to it or broadcast, by another agent) above
    `after`, or None."""
    return conn.execute(_FIRST_WAITING_SQL, {"agent": agent, "after": after}).get


def has_waiting(conn: apsw.Connection, agent: str) -> bool:
    """Whether a message waits for `agent` above its cursor (its own messages do not)."""
    return first_waiting(conn, agent, position(conn, agent)) is not None


def now_ms() -> int:
    """The log's clock: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def presence_is_fresh(conn: apsw.Connection, agent: str, moment: str) -> bool:
    """Whether the agent's last beat already says what `moment` would, and is recent enough
    (PRESENCE_FRESH_MS) that a new one would only move its time."""
    row = conn.execute(_BEAT_SQL, (agent,)).fetchone()
    if row is None:
        return False
    status, ts = row
    return status == PRESENCE_STATUS.get(moment) and 0 <= now_ms() - ts < PRESENCE_FRESH_MS
