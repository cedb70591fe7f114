"""The floor of scripts/bench_pump.py: an inline unit's statements alone, no pump.

What any pump that keeps agentbus's rules must write for one request answered
inline, in straight-line apsw:

- the client's commit: its conversation thread, the request, its inbox row;
- the pump's commit: take the inbox row, read the request, write the reply,
  write the call's thread (closed: it answered) and close the conversation
  (the reply reached its client).

with no XML work at all: the envelopes are the pump's, canonical XML in a
JSON payload, formatted around a payload built up front. (A floor with the
XML checks was tried: a hardened parse and the two XSDs cost more than the
pump's whole pipeline, which reads plain payloads from their C14N bytes.)

`floor_replies` is the throughput case (N requests wait, `batch` answered per
transaction); `floor_server` and `floor_trip` the round trip case, woken the
way the raw baseline and the pump are (`bus.log.wake.ChangeWatcher`). The ratios
of these to the raw baselines say what the pump's targets ask of the design
itself: a target above the floor's ratio cannot be met by any pump doing
this work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import apsw
import orjson

from bus import Bus
from bus.log.messages import _INSERT_SQL as INSERT_MESSAGE_SQL
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from bus.log.wake import ChangeWatcher

ORGANISM = "bench"
CLIENT = "console"
LISTENER = "calculator"
# The envelopes as the pump stores them: canonical XML in a JSON payload.
_ENVELOPE = ('<env:message xmlns:env="urn:agentbus:envelope:1"><env:from>{sender}</env:from>'
             '{to}<env:thread>{thread}</env:thread>{payload}</env:message>')
_ADD = "<add><a>1.5</a><b>2.0</b></add>"
_SUM = "<sum><value>3.5</value></sum>"
_ROOT_SQL = ("INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms)"
             " VALUES (?, NULL, ?, 0, ?) RETURNING id")
_CONVERSATION_SQL = ("INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms)"
                     " VALUES (?, ?, ?, 1, ?)")
_INBOX_SQL = ("INSERT INTO pump_inbox (seq, organism, root_tag, to_listener, created_at_ms)"
              " VALUES (?, ?, 'add', NULL, ?)")
_TAKE_SQL = ("DELETE FROM pump_inbox WHERE organism = ?1 AND seq IN (SELECT seq FROM"
             " pump_inbox WHERE organism = ?1 ORDER BY seq LIMIT ?2) RETURNING seq")
_REQUEST_SQL = "SELECT id, correlation_id FROM messages WHERE seq = ?"
_CALL_THREAD_SQL = (
    "INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms, status, closed_at_ms)"
    " SELECT ?1, id, ?2, depth + 1, ?3, 'closed', ?3 FROM threads WHERE uuid = ?4"
)
_CLOSE_SQL = "UPDATE threads SET status = 'closed', closed_at_ms = ? WHERE uuid = ?"
_REPLY_SQL = "SELECT 1 FROM messages WHERE correlation_id = ? AND seq > ?"


def connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(5000)
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def open_floor(path: Path) -> tuple[apsw.Connection, int]:
    """A new bus file (the bus's schema and pragmas) with the organism's root thread:
    a connection to it and the root's row id."""
    Bus.open(path).close()
    conn = connect(path)
    return conn, conn.execute(_ROOT_SQL, (new_message_id(), ORGANISM, now_ms())).get


def send(conn: apsw.Connection, root_id: int) -> tuple[int, str]:
    """The client's commit; (the request's seq, its conversation)."""
    conn.execute("BEGIN IMMEDIATE")
    sent = _request(conn, root_id)
    conn.execute("COMMIT")
    return sent


def _request(conn: apsw.Connection, root_id: int) -> tuple[int, str]:
    """A request on a new conversation, with its inbox row; (its seq, the conversation)."""
    conversation, now = new_message_id(), now_ms()
    conn.execute(_CONVERSATION_SQL, (conversation, root_id, CLIENT, now))
    request = _ENVELOPE.format(sender=CLIENT, to="", thread=conversation, payload=_ADD)
    seq = conn.execute(INSERT_MESSAGE_SQL, (new_message_id(), now, CLIENT, f"@{ORGANISM}",
                                            "envelope", conversation, None,
                                            orjson.dumps({"xml": request}).decode(),
                                            None)).get
    conn.execute(_INBOX_SQL, (seq, ORGANISM, now))
    return seq, conversation


def answer(conn: apsw.Connection, batch: int) -> int:
    """The pump's commit: up to `batch` waiting requests answered; how many."""
    conn.execute("BEGIN IMMEDIATE")
    now = now_ms()
    seqs = [seq for (seq,) in conn.execute(_TAKE_SQL, (ORGANISM, batch))]
    for seq in seqs:
        request_id, conversation = conn.execute(_REQUEST_SQL, (seq,)).fetchone()
        reply = _ENVELOPE.format(sender=LISTENER, to=f"<env:to>{CLIENT}</env:to>",
                                 thread=conversation, payload=_SUM)
        conn.execute(INSERT_MESSAGE_SQL, (new_message_id(), now, LISTENER, f"@{ORGANISM}",
                                          "envelope", conversation, request_id,
                                          orjson.dumps({"xml": reply}).decode(), None)).get
        conn.execute(_CALL_THREAD_SQL, (new_message_id(), LISTENER, now, conversation))
        conn.execute(_CLOSE_SQL, (now, conversation))
    conn.execute("COMMIT")
    return len(seqs)


def floor_replies(path: Path, count: int, batch: int, clock: Callable[[], float]) -> float:
    """Requests answered per second, `batch` per transaction, `count` waiting at the start."""
    conn, root_id = open_floor(path)
    conn.execute("BEGIN IMMEDIATE")
    for _ in range(count):
        _request(conn, root_id)
    conn.execute("COMMIT")
    start = clock()
    answered = 0
    while answered < count:
        answered += answer(conn, batch)
    elapsed = clock() - start
    conn.close()
    return count / elapsed


def floor_server(path: Path, stopped: Callable[[], bool] = lambda: False) -> None:
    """Answer every request as it comes, one commit per wake."""
    conn = connect(path)
    watcher = ChangeWatcher(conn, path)
    while not stopped():
        watcher.wait(0.05)
        answer(conn, 64)
    watcher.close()
    conn.close()


def floor_trip(conn: apsw.Connection, watcher: ChangeWatcher, root_id: int) -> None:
    """One request sent and its reply seen."""
    seq, conversation = send(conn, root_id)
    while not conn.execute(_REPLY_SQL, (conversation, seq)).fetchall():
        watcher.wait(1.0)

