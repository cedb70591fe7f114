"""Dead letters: deliveries that ran out of retries, kept for people.

A dead letter keeps the whole message (it is still in `messages`) plus
retry_count, last_error and dead_lettered_at. Replay puts the delivery back
to pending with its retries reset, after the send pipeline's checks on the
channel and recipient; discard and purge remove dead letters from the queue
(the delivery row stays, with status dead_letter, as history).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Callable

import apsw

from bus.channels import sending
from bus.channels import store
from bus.channels.queries import FROM_SQL
from bus.channels.queries import MESSAGE_COLUMNS
from bus.channels.queries import ChannelMessage
from bus.channels.queries import row_to_message
from bus.channels.store import SENDING_STATES
from bus.channels.store import add_open_deliveries
from bus.storage.errors import ValidationFailed
from bus.log.messages import iso_utc

_COLUMNS = "dl.id, dl.recipient, dl.retry_count, dl.last_error, dl.dead_lettered_at_ms, "
_SELECT_SQL = (
    "SELECT " + _COLUMNS + MESSAGE_COLUMNS + FROM_SQL + " JOIN dead_letters dl ON dl.seq = cm.seq"
)
_LIST_SQL = _SELECT_SQL + " ORDER BY dl.id LIMIT ?"
_ONE_SQL = _SELECT_SQL + " WHERE dl.id = ?"
_REPLAY_CHECK_SQL = (
    "SELECT dl.seq, dl.recipient, dl.channel_id, c.name, c.state,"
    " EXISTS (SELECT 1 FROM participants p WHERE p.channel_id = dl.channel_id"
    " AND p.agent = dl.recipient) FROM dead_letters dl JOIN channels c ON c.id = dl.channel_id"
    " WHERE dl.id = ?"
)
# A replay re-enters the send pipeline: the ack timer starts again from now.
_REVIVE_SQL = (
    "UPDATE deliveries SET status = 'pending', retry_count = 0, deadline_ms = ?,"
    " visible_at_ms = ? WHERE seq = ? AND recipient = ?"
)
_REOPEN_MESSAGE_SQL = "UPDATE channel_messages SET status = 'delivered' WHERE seq = ?"
_DELETE_SQL = "DELETE FROM dead_letters WHERE id = ?"
_PURGE_SQL = "DELETE FROM dead_letters WHERE dead_lettered_at_ms < ?"
_COUNT_SQL = "SELECT count(*) FROM dead_letters"


@dataclass(frozen=True)
class DeadLetter:
    """A message that one recipient never acknowledged, and why."""

    id: int
    recipient: str
    retry_count: int
    last_error: str
    dead_lettered_at_ms: int
    message: ChannelMessage

    def to_json_dict(self) -> dict[str, Any]:
        return {"id": self.id, "recipient": self.recipient, "retry_count": self.retry_count,
                "last_error": self.last_error, "dead_lettered_at_ms": self.dead_lettered_at_ms,
                "dead_lettered_at": iso_utc(self.dead_lettered_at_ms),
                "message": self.message.to_json_dict()}


def _from_row(row: tuple[Any, ...], load_content: Callable[[Any, Any], Any]) -> DeadLetter:
    return DeadLetter(*row[:5], row_to_message(row[5:], load_content))


def list_dead_letters(conn: apsw.Connection, load_content: Callable[[Any, Any], Any],
                      limit: int = 1000) -> list[DeadLetter]:
    return [_from_row(row, load_content) for row in conn.execute(_LIST_SQL, (limit,))]


def get_dead_letter(conn: apsw.Connection, dead_id: int,
                    load_content: Callable[[Any, Any], Any]) -> DeadLetter:
    row = conn.execute(_ONE_SQL, (dead_id,)).fetchone()
    if row is None:
        raise _unknown(dead_id)
    return _from_row(row, load_content)


def replay(conn: apsw.Connection, dead_id: int, now_ms: int) -> tuple[int, str]:
    """Deliver the dead letter again from now; return (seq, recipient)."""
    found = conn.execute(_REPLAY_CHECK_SQL, (dead_id,)).fetchone()
    if found is None:
        raise _unknown(dead_id)
    seq, recipient, channel_id, name, state, still_member = found
    if state not in SENDING_STATES:
        raise ValidationFailed("channel", f"channel {name!r} is {state}; replay needs it active")
    if not still_member:
        raise ValidationFailed("recipient", f"{recipient} has left channel {name!r}; it cannot"
                                            " receive the replay (discard the dead letter)")
    deadline = sending.send_deadline(store.get_channel(conn, name), now_ms)
    conn.execute(_REVIVE_SQL, (deadline, now_ms, seq, recipient))
    conn.execute(_REOPEN_MESSAGE_SQL, (seq,))
    add_open_deliveries(conn, channel_id, 1)
    conn.execute(_DELETE_SQL, (dead_id,))
    return seq, recipient


def discard(conn: apsw.Connection, dead_id: int) -> None:
    conn.execute(_DELETE_SQL, (dead_id,))
    if not conn.changes():
        raise _unknown(dead_id)


def purge(conn: apsw.Connection, before_ms: int) -> int:
    """Remove the dead letters older than `before_ms`; return how many."""
    conn.execute(_PURGE_SQL, (before_ms,))
    return conn.changes()


def dead_letter_count(conn: apsw.Connection) -> int:
    return conn.execute(_COUNT_SQL).get


def _unknown(dead_id: int) -> ValidationFailed:
    return ValidationFailed("id", f"no dead letter with id {dead_id}; list them with"
                                  " `bus dlq list`")
