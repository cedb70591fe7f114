"""The read functions behind `bus serve`'s pages and the MCP resources: one place per answer.

Every function takes an open connection (read-only for the views) and reads
in the caller's transaction; each returns plain dataclasses with a
`to_json_dict`. The pages render them, the MCP resources return their JSON,
and neither computes an answer of its own. The log's pages are bus/log/browse.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import apsw

from bus.log import messages
from bus.log import receipts
from bus.log.browse import SCAN_WINDOW
from bus.channels.queries import Delivery
from bus.channels.queries import deliveries_of
from bus.coordination.claims import Claim
from bus.coordination.claims import list_claims
from bus.coordination.heartbeats import Liveness
from bus.coordination.heartbeats import Thresholds
from bus.coordination.heartbeats import liveness
from bus.log.messages import COLUMNS
from bus.log.messages import Message
from bus.log.messages import row_to_message
from bus.log.receipts import Receipt
from bus.coordination.reservations import Reservation
from bus.coordination.reservations import has_reservations_table
from bus.coordination.reservations import live_reservations
from bus.coordination.worker_table import StateChange
from bus.coordination.worker_table import Worker
from bus.coordination.worker_table import get_worker
from bus.coordination.worker_table import state_changes

REPLY_WINDOW = 10_000  # replies are looked for among this many messages after their question
THREAD_MAX = 50  # of a conversation on a message's page; the browser pages through the rest
RECENT_MAX = 20
PREVIEW_BYTES = 4096  # of a payload kept in the blob store
# What the bus announces when a lease changes hands or ends (bus/coordination/claims.py _announce).
CLAIM_EVENT_TYPES = ("task_reclaimed", "task_released", "task_dead")

_BY_SEQ_SQL = f"SELECT {COLUMNS} FROM messages WHERE seq = ?"
_BY_ID_SQL = f"SELECT {COLUMNS} FROM messages WHERE id = ?"
_REPLIES_SQL = (f"SELECT {COLUMNS} FROM messages WHERE seq > :seq AND seq <= :seq + :window"
                " AND in_reply_to = :id ORDER BY seq LIMIT :limit")
_THREAD_SQL = (f"SELECT {COLUMNS} FROM messages WHERE correlation_id = ? ORDER BY seq"
               f" LIMIT {THREAD_MAX}")
_CHANNEL_OF_SQL = ("SELECT c.name, m.topic, m.priority, m.status FROM channel_messages m"
                   " JOIN channels c ON c.id = m.channel_id WHERE m.seq = ?")
_FROM_RECENT_SQL = (f"SELECT {COLUMNS} FROM messages WHERE from_agent = :agent"
                    " AND seq > :floor ORDER BY seq DESC LIMIT :limit")
_TO_RECENT_SQL = f"SELECT {COLUMNS} FROM messages WHERE to_agent = ? ORDER BY seq DESC LIMIT ?"
_CHANNELS_OF_AGENT_SQL = ("SELECT c.name, p.role FROM participants p JOIN channels c"
                          " ON c.id = p.channel_id WHERE p.agent = ? ORDER BY c.name")
_ANY_ABOUT_SQL = "SELECT 1 FROM messages WHERE correlation_id = ? LIMIT 1"
_CLAIM_EVENTS_SQL = (f"SELECT {COLUMNS} FROM messages WHERE correlation_id = :task"
                     " AND type IN ('task_reclaimed', 'task_released', 'task_dead')"
                     " ORDER BY seq DESC LIMIT :limit")


# --- one message ---------------------------------------------------------------------


@dataclass(frozen=True)
class MessageDetail:
    """A message with what concerns it: the message it answers, its answers (among the
    next REPLY_WINDOW messages), its conversation (same correlation id), its channel
    side and deliveries, and for a direct message its receipt (delivered? acked?)."""

    message: Message
    answers: Message | None
    replies: list[Message]
    thread: list[Message]
    channel: dict[str, Any] | None
    deliveries: list[Delivery]
    receipt: Receipt | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {"message": self.message.to_json_dict(),
                "receipt": self.receipt.state_json() if self.receipt else None,
                "answers": self.answers.to_json_dict() if self.answers else None,
                "replies": [m.to_json_dict() for m in self.replies],
                "thread": [m.to_json_dict() for m in self.thread],
                "channel": self.channel,
                "deliveries": [{"channel": self.channel["name"], **d.to_json_dict()}
                               for d in self.deliveries]}


def get_message(conn: apsw.Connection, key: int | str, blobs: Any = None) -> Message | None:
    """The message with seq `key` (an int) or id `key` (a str); None if there is none."""
    sql = _BY_SEQ_SQL if isinstance(key, int) else _BY_ID_SQL
    row = conn.execute(sql, (key,)).fetchone()
    return row_to_message(row, blobs, preview=PREVIEW_BYTES) if row else None


def message_detail(conn: apsw.Connection, seq: int, blobs: Any = None) -> MessageDetail | None:
    message = get_message(conn, seq, blobs)
    if message is None:
        return None
    answers = get_message(conn, message.in_reply_to) if message.in_reply_to else None
    replies = _messages(conn, _REPLIES_SQL, {"seq": seq, "window": REPLY_WINDOW,
                                             "id": message.id, "limit": THREAD_MAX})
    thread = (_messages(conn, _THREAD_SQL, (message.correlation_id,))
              if message.correlation_id else [])
    channel = conn.execute(_CHANNEL_OF_SQL, (seq,)).fetchone()
    return MessageDetail(
        message, answers, replies, thread,
        dict(zip(("name", "topic", "priority", "status"), channel)) if channel else None,
        deliveries_of(conn, seq),
        receipts.receipt_for(conn, seq))


def _messages(conn: apsw.Connection, sql: str, params: Any) -> list[Message]:
    return [row_to_message(row, preview=200) for row in conn.execute(sql, params)]


# --- agents --------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentDetail:
    """An agent: its last beat, what it holds, its channels, its newest messages
    (sent: among the newest SCAN_WINDOW of the log; to it: any)."""

    agent: str
    liveness: Liveness | None
    claims: list[Claim]
    cursor: int | None
    channels: list[tuple[str, str]]
    sent: list[Message]
    received: list[Message]
    is_worker: bool = False  # a worker of the lifecycle has a page of its own too
    reservations: list[Reservation] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "is_worker": self.is_worker,
                "reservations": [dataclasses.asdict(r) for r in self.reservations],
                "liveness": self.liveness.to_json_dict() if self.liveness else None,
                "claims": [c.to_json_dict() for c in self.claims], "cursor": self.cursor,
                "channels": [{"channel": n, "role": r} for n, r in self.channels],
                "sent": [m.to_json_dict() for m in self.sent],
                "received": [m.to_json_dict() for m in self.received]}


def agent_detail(conn: apsw.Connection, agent: str, now: int,
                 thresholds: Thresholds | None = None) -> AgentDetail:
    """What the bus knows of `agent` (an agent nobody heard of has empty sections)."""
    beats = [b for b in liveness(conn, now, thresholds or Thresholds()) if b.agent == agent]
    cursor = conn.execute("SELECT last_acked_seq FROM cursors WHERE agent_id = ?",
                          (agent,)).fetchone()
    floor = max(0, messages.last_seq(conn) - SCAN_WINDOW)
    return AgentDetail(
        agent, beats[0] if beats else None,
        [c for c in list_claims(conn) if c.agent == agent], cursor[0] if cursor else None,
        conn.execute(_CHANNELS_OF_AGENT_SQL, (agent,)).fetchall(),
        _messages(conn, _FROM_RECENT_SQL, {"agent": agent, "floor": floor, "limit": RECENT_MAX}),
        _messages(conn, _TO_RECENT_SQL, (agent, RECENT_MAX)),
        get_worker(conn, agent) is not None,
        [r for r in list_reservations(conn, now) if r.agent == agent])


# --- workers -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerDetail:
    worker: Worker
    history: list[StateChange]
    sent: list[Message]
    commits: list[str] | None = None  # None: the repository could not be read
    commits_note: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        return {"worker": self.worker.to_json_dict(),
                "history": [dataclasses.asdict(h) for h in self.history],
                "sent": [m.to_json_dict() for m in self.sent],
                "commits": self.commits, "commits_note": self.commits_note}


def worker_detail(conn: apsw.Connection, worker: str) -> WorkerDetail | None:
    """A worker's row, its state history (from its state_change messages among the
    newest SCAN_WINDOW) and its newest messages; None if there is no such worker."""
    found = get_worker(conn, worker)
    if found is None:
        return None
    floor = max(0, messages.last_seq(conn) - SCAN_WINDOW)
    history = state_changes(conn, worker, floor)
    sent = _messages(conn, _FROM_RECENT_SQL, {"agent": worker, "floor": floor,
                                              "limit": RECENT_MAX})
    return WorkerDetail(found, history, sent)


# --- claims -------------------------------------------------------------------------------


def has_messages_about(conn: apsw.Connection, task: str) -> bool:
    """Whether any message carries `task` as its correlation id (its index answers)."""
    return conn.execute(_ANY_ABOUT_SQL, (task,)).fetchone() is not None


def claim_events(conn: apsw.Connection, task: str, limit: int = RECENT_MAX) -> list[Message]:
    """The bus's announcements about a task's lease (takeovers, releases, death), newest first."""
    return _messages(conn, _CLAIM_EVENTS_SQL, {"task": task, "limit": limit})


# --- reservations (migration 13; an older file has none) ---------------------------------


def list_reservations(conn: apsw.Connection, now: int) -> list[Reservation]:
    """The live file reservations (none in a file older than migration 13)."""
    return live_reservations(conn, now) if has_reservations_table(conn) else []
