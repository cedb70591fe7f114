"""Delivery receipts of direct messages: sent, delivered to the recipient's session, acked.

    receipts.record_delivered(conn, "bob", [12, 13], via="hook:Stop", session="s1")
    receipts.receipt_for(conn, 12)      # Receipt(state="delivered", delivery=..., ...)
    receipts.outstanding(conn)          # what `bus status` shows: not delivered, not acked

A message was delivered when its recipient's session was shown it: a hook's
output, an MCP poll/exchange/reply result, `bus inbox`, `bus poll`. Those are
the only places that know a model or a person saw it, so each calls
`record_delivered` (through `Bus.record_delivered`) with what it showed.
Only direct messages get receipts (to_agent set): a broadcast has no one
recipient to answer for it. Acknowledged is not stored: the recipient's
cursor at or past the message's seq is the one record of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from typing import Iterable

import apsw
import orjson

from bus.storage.db import write_transaction
from bus.storage.errors import ValidationFailed
from bus.log.messages import iso_utc
from bus.log.messages import now_ms

DELIVERED = "delivered"  # shown to the recipient's session, not acknowledged yet
ACKED = "acked"          # the recipient's cursor is at or past it
SENT = "sent"            # neither: the recipient's session never saw it
VIA_MAX = 64
SESSION_MAX = 200
_VIA = re.compile(r"[a-z][A-Za-z0-9_.:-]*")
_TABLE_SQL = "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'receipts'"
# Only the rows of `seqs` addressed to `agent` get a receipt, whatever the caller passes:
# one statement, each seq a primary-key lookup. A delivery again (at least once: what
# is not acknowledged is shown again) counts and says where it went last.
_RECORD_SQL = (
    "INSERT INTO receipts (seq, agent, first_ms, last_ms, via, session)"
    " SELECT m.seq, m.to_agent, :now, :now, :via, :session FROM messages m"
    " WHERE m.seq IN (SELECT value FROM json_each(:seqs)) AND m.to_agent = :agent"
    " ON CONFLICT (seq) DO UPDATE SET last_ms = excluded.last_ms,"
    " deliveries = deliveries + 1, via = excluded.via, session = excluded.session"
)
_COLUMNS = (
    "m.seq, m.id, m.from_agent, m.to_agent, m.type, m.ts_ms,"
    " coalesce((SELECT last_acked_seq FROM cursors WHERE agent_id = m.to_agent), 0) >= m.seq,"
    " r.first_ms, r.last_ms, r.deliveries, r.via, r.session"
)
# Channel messages ('#name') have deliveries of their own (bus/channels/), not receipts.
_DIRECT = "substr({to}, 1, 1) != '#'"
_WAITING = (
    # The direct messages not acknowledged, per recipient: each recipient found by one
    # seek of idx_messages_to_seq (no scan of the log), then its messages above its
    # cursor by a range of the same index.
    "WITH RECURSIVE recipients (agent) AS ("
    " SELECT min(to_agent) FROM messages WHERE to_agent IS NOT NULL"
    " UNION ALL SELECT (SELECT min(to_agent) FROM messages WHERE to_agent > agent)"
    " FROM recipients WHERE agent IS NOT NULL)"
    " SELECT {columns} FROM recipients"
    " JOIN messages m ON m.to_agent = recipients.agent AND m.seq >"
    " coalesce((SELECT last_acked_seq FROM cursors WHERE agent_id = recipients.agent), 0)"
    " LEFT JOIN {receipts} r ON r.seq = m.seq"
    " WHERE recipients.agent IS NOT NULL AND " + _DIRECT.format(to="recipients.agent")
)
# A file without migration 16 (a read-only view of an older file): nothing was recorded.
_NONE_RECORDED = ("(SELECT 0 AS seq, 0 AS first_ms, 0 AS last_ms, 0 AS deliveries,"
                  " '' AS via, '' AS session WHERE 0)")


def _statements(receipts: str) -> dict[str, str]:
    return {
        "one": (f"SELECT {_COLUMNS} FROM messages m LEFT JOIN {receipts} r ON r.seq = m.seq"
                " WHERE m.seq = ? AND " + _DIRECT.format(to="m.to_agent")),
        "oldest": _WAITING.format(columns=_COLUMNS, receipts=receipts)
        + " ORDER BY m.seq LIMIT ?",
        "counts": _WAITING.format(columns="count(*) - count(r.seq), count(r.seq)",
                                  receipts=receipts),
    }


_SQL = {True: _statements("receipts"), False: _statements(_NONE_RECORDED)}


@dataclass(frozen=True)
class SessionDelivery:
    """When and how a direct message was shown to its recipient's session: first, latest,
    how often. (A channel's `Delivery` is another thing: one recipient's copy of a channel
    message, with its acks and retries.)"""

    first_ms: int
    last_ms: int
    deliveries: int
    via: str  # what showed it last: hook:Stop, mcp:poll, inbox, poll ...
    session: str | None  # the recipient's session then, where its client names one


@dataclass(frozen=True)
class Receipt:
    """A direct message and what became of it: `state` is sent, delivered or acked."""

    seq: int
    id: str
    from_agent: str
    to_agent: str
    type: str
    ts_ms: int
    state: str
    delivery: SessionDelivery | None

    def to_json_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "id": self.id, "from": self.from_agent, "to": self.to_agent,
                "type": self.type, "ts": iso_utc(self.ts_ms), **self.state_json()}

    def state_json(self) -> dict[str, Any]:
        """The receipt without the message: state, delivered, acked, and the delivery."""
        found: dict[str, Any] = {"state": self.state, "delivered": self.delivery is not None,
                                 "acked": self.state == ACKED}
        if self.delivery is not None:
            d = self.delivery
            found.update(first_delivered=iso_utc(d.first_ms), last_delivered=iso_utc(d.last_ms),
                         deliveries=d.deliveries, via=d.via)
            if d.session is not None:
                found["session"] = d.session
        return found


@dataclass(frozen=True)
class Outstanding:
    """Direct messages not acknowledged yet: how many were never delivered, how many were
    delivered and wait for their ack, and the oldest of them (oldest first)."""

    not_delivered: int
    delivered_not_acked: int
    oldest: list[Receipt]

    def to_json_dict(self) -> dict[str, Any]:
        return {"not_delivered": self.not_delivered,
                "delivered_not_acked": self.delivered_not_acked,
                "oldest": [r.to_json_dict() for r in self.oldest]}


def record_delivered(conn: apsw.Connection, agent: str, seqs: Iterable[int], via: str,
                     session: str | None = None, now: int | None = None) -> None:
    """Record that `agent`'s session was shown the messages `seqs` (`via`: what showed
    them, e.g. hook:Stop, mcp:poll, inbox). Only those addressed to `agent` get a
    receipt; the others are skipped. Inside the caller's transaction when one is open
    (a savepoint then), else in one of its own. Raises ValidationFailed for a bad `via`
    or `session`, BusReadOnly on a file opened read-only."""
    wanted = sorted({int(seq) for seq in seqs})
    if not wanted:
        return
    _validate(via, session)
    values = {"agent": agent, "seqs": orjson.dumps(wanted).decode(), "via": via,
              "session": session, "now": now_ms() if now is None else now}
    with write_transaction(conn):
        conn.execute(_RECORD_SQL, values)


def receipt_for(conn: apsw.Connection, seq: int) -> Receipt | None:
    """The receipt of message `seq`; None when there is no such message or it is not a
    direct one (a broadcast has no receipt)."""
    row = conn.execute(_SQL[has_receipts_table(conn)]["one"], (seq,)).fetchone()
    return None if row is None else _receipt(row)


def outstanding(conn: apsw.Connection, limit: int = 5) -> Outstanding:
    """The direct messages not acknowledged yet: counts, and the `limit` oldest."""
    sql = _SQL[has_receipts_table(conn)]
    not_delivered, delivered = conn.execute(sql["counts"]).fetchone()
    oldest = [_receipt(row) for row in conn.execute(sql["oldest"], (limit,))]
    return Outstanding(not_delivered, delivered, oldest)


def has_receipts_table(conn: apsw.Connection) -> bool:
    """Whether the file has migration 16 yet: a read-only view reads an older file as one
    where no delivery was recorded (the migration is marked `readers: unchanged`)."""
    return conn.execute(_TABLE_SQL).get is not None


def _receipt(row: tuple) -> Receipt:
    seq, id_, from_agent, to_agent, type_, ts_ms, acked, *delivered = row
    delivery = SessionDelivery(*delivered) if delivered[0] is not None else None
    state = ACKED if acked else DELIVERED if delivery is not None else SENT
    return Receipt(seq, id_, from_agent, to_agent, type_, ts_ms, state, delivery)


def _validate(via: str, session: str | None) -> None:
    if not isinstance(via, str) or len(via) > VIA_MAX or not _VIA.fullmatch(via):
        raise ValidationFailed("via", f"must be a short name like hook:Stop or mcp:poll"
                                      f" (a lowercase letter first, at most {VIA_MAX}"
                                      f" characters), got {via!r}")
    if session is not None and (not isinstance(session, str) or len(session) > SESSION_MAX):
        raise ValidationFailed("session", f"must be the client's session id, at most"
                                          f" {SESSION_MAX} characters, or None")
