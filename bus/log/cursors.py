"""Per-consumer cursors: the last seq each agent acknowledged.

A cursor moves only on ack and only forward, so a consumer that dies between
poll and ack is handed the same messages again (at-least-once delivery).
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from bus.log.glance import position  # the agent's read position: defined light, for hooks
from bus.log.messages import now_ms

_EXISTS_SQL = "SELECT 1 FROM cursors WHERE agent_id = ?"
# One statement: refuse a seq that was never assigned (acking past the end
# would skip messages not yet published), and never move backwards. The
# updated time changes only when the cursor does; SET sees the old row.
_ACK_SQL = (
    "INSERT INTO cursors (agent_id, last_acked_seq, updated_at_ms)"
    " SELECT :agent, :seq, :now"
    " WHERE :seq <= (SELECT max(seq) FROM messages)"
    " ON CONFLICT (agent_id) DO UPDATE SET"
    " last_acked_seq = max(last_acked_seq, excluded.last_acked_seq),"
    " updated_at_ms = CASE WHEN excluded.last_acked_seq > last_acked_seq"
    " THEN excluded.updated_at_ms ELSE updated_at_ms END"
    " RETURNING last_acked_seq"
)
# The common ack, in one statement: the message right after :seq waits for the agent
# (not its own, addressed to it or to all), so the cursor goes to :seq and no further.
# Writes nothing when that message is missing or not for the agent.
_ACK_WHEN_NEXT_WAITS_SQL = (
    "INSERT INTO cursors (agent_id, last_acked_seq, updated_at_ms)"
    " SELECT :agent, :seq, :now FROM messages WHERE seq = :seq + 1"
    " AND from_agent <> :agent AND (to_agent = :agent OR to_agent IS NULL)"
    " ON CONFLICT (agent_id) DO UPDATE SET"
    " last_acked_seq = max(last_acked_seq, excluded.last_acked_seq),"
    " updated_at_ms = CASE WHEN excluded.last_acked_seq > last_acked_seq"
    " THEN excluded.updated_at_ms ELSE updated_at_ms END"
    " RETURNING last_acked_seq"
)
_LIST_SQL = "SELECT agent_id, last_acked_seq, updated_at_ms FROM cursors ORDER BY agent_id"
_SET_SQL = (
    "INSERT INTO cursors (agent_id, last_acked_seq, updated_at_ms) VALUES (:agent, :seq, :now)"
    " ON CONFLICT (agent_id) DO UPDATE SET last_acked_seq = excluded.last_acked_seq,"
    " updated_at_ms = excluded.updated_at_ms"
)
# A new consumer that should see only what comes next: its cursor starts at
# the last seq. An existing cursor is left where it is.
_START_AT_LATEST_SQL = (
    "INSERT INTO cursors (agent_id, last_acked_seq, updated_at_ms)"
    " VALUES (:agent, coalesce((SELECT max(seq) FROM messages), 0), :now)"
    " ON CONFLICT (agent_id) DO NOTHING"
)
_DELETE_SQL = "DELETE FROM cursors WHERE agent_id = ? RETURNING last_acked_seq"
_NAMES_SQL = "SELECT agent_id FROM cursors ORDER BY agent_id"


@dataclass(frozen=True)
class Cursor:
    """An agent's read position; `pending` counts messages for it above the cursor."""

    agent: str
    last_acked_seq: int
    updated_at_ms: int
    pending: int

    def to_json_dict(self) -> dict[str, object]:
        return {"agent": self.agent, "last_acked_seq": self.last_acked_seq,
                "updated_at_ms": self.updated_at_ms, "pending": self.pending}


def advance(conn: apsw.Connection, agent: str, seq: int) -> int | None:
    """Move the cursor to `seq` if that is forward; return the new position.

    Returns None, writing nothing, when `seq` is beyond the last assigned seq.
    """
    return conn.execute(_ACK_SQL, {"agent": agent, "seq": seq, "now": now_ms()}).get


def advance_when_next_waits(conn: apsw.Connection, agent: str, seq: int) -> int | None:
    """`advance` to `seq` when the next message waits for `agent`, so none of the agent's
    own messages follow `seq` to pass (see `messages.past_own`); return the new position.

    None, writing nothing, otherwise: the caller then takes the general path.
    """
    return conn.execute(_ACK_WHEN_NEXT_WAITS_SQL,
                        {"agent": agent, "seq": seq, "now": now_ms()}).get


def list_rows(conn: apsw.Connection) -> list[tuple[str, int, int]]:
    return conn.execute(_LIST_SQL).fetchall()


def known(conn: apsw.Connection) -> list[str]:
    """The agents that have a cursor."""
    return [agent for (agent,) in conn.execute(_NAMES_SQL)]


def exists(conn: apsw.Connection, agent: str) -> bool:
    return conn.execute(_EXISTS_SQL, (agent,)).get is not None


def set_position(conn: apsw.Connection, agent: str, seq: int) -> None:
    """Put the cursor at `seq`, forward or back: the caller checked that it may."""
    conn.execute(_SET_SQL, {"agent": agent, "seq": seq, "now": now_ms()})


def start_at_latest(conn: apsw.Connection, agent: str) -> None:
    """Give an agent without a cursor one at the last seq; leave an existing one."""
    conn.execute(_START_AT_LATEST_SQL, {"agent": agent, "now": now_ms()})


def delete(conn: apsw.Connection, agent: str) -> int | None:
    """Remove the agent's cursor; return where it was, None if it had none."""
    return conn.execute(_DELETE_SQL, (agent,)).get
