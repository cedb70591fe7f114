"""Per-consumer cursors: the last seq each agent acknowledged.

A cursor moves only on ack and only forward, so a consumer that dies between
poll and ack is handed the same messages again (at-least-once delivery).
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from bus.messages import now_ms

_POSITION_SQL = "SELECT last_acked_seq FROM cursors WHERE agent_id = ?"
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
_LIST_SQL = "SELECT agent_id, last_acked_seq, updated_at_ms FROM cursors ORDER BY agent_id"


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


def position(conn: apsw.Connection, agent: str) -> int:
    """The agent's last acknowledged seq, 0 before its first ack."""
    return conn.execute(_POSITION_SQL, (agent,)).get or 0


def advance(conn: apsw.Connection, agent: str, seq: int) -> int | None:
    """Move the cursor to `seq` if that is forward; return the new position.

    Returns None, writing nothing, when `seq` is beyond the last assigned seq.
    """
    return conn.execute(_ACK_SQL, {"agent": agent, "seq": seq, "now": now_ms()}).get


def list_rows(conn: apsw.Connection) -> list[tuple[str, int, int]]:
    return conn.execute(_LIST_SQL).fetchall()
