"""Handing deliveries out, acknowledging them, and the timers.

Every timer is a stored deadline, evaluated by `tick(conn, now_ms)`, which
receive runs first and `bus channel tick` runs on demand, so nothing is
lost across restarts and tests step an injected clock:

- on an at_least_once or exactly_once channel the ack timer starts at
  send: a delivery is created with `deadline_ms` = send
  time + ack_timeout, whether or not its recipient ever calls receive.
  Handing it out restarts the timer (the receiver gets a whole ack_timeout
  to answer). Past the deadline, unacknowledged, it goes back to pending,
  visible again `retry_backoff_ms * 2^(retry - 1)` after the deadline, with
  a new deadline ack_timeout after that; after max_retries retries it
  becomes a dead letter, announced on the `_system` channel (see
  `bus.channels.system`). A channel with max_pending starts the timer at
  receive instead, and a paused channel holds its waiting deliveries' timers;
- `received` and `in_progress` acks push the deadline on by ack_timeout
  (the receiver is alive and working), `completed` and `failed` end it;
- a query's timeout marks it expired when no response came;
- exactly_once dedup entries expire.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import Callable

import apsw
import orjson

from bus.log import messages
from bus.channels import system
from bus.channels.queries import FROM_SQL
from bus.channels.queries import MESSAGE_COLUMNS
from bus.channels.queries import ChannelMessage
from bus.channels.queries import MessageFilter
from bus.channels.queries import QueryResult
from bus.channels.queries import filter_sql
from bus.channels.queries import order_sql
from bus.channels.queries import row_to_message
from bus.channels.store import DELIVERING_STATES
from bus.channels.store import Channel
from bus.channels.store import add_open_deliveries
from bus.storage.errors import ValidationFailed

ACK_STATUSES = ("received", "in_progress", "completed", "failed")
FINAL_STATUSES = frozenset({"completed", "failed"})
# A delivery that is still someone's to finish: waiting, handed out, or acknowledged as working.
OPEN_STATUSES = frozenset({"pending", "delivered", "received", "in_progress"})
NOTE_MAX = 65536
TICK_BATCH = 1000

_DELIVERING = orjson.dumps(sorted(DELIVERING_STATES)).decode()
_RECEIVE_FROM_SQL = FROM_SQL + " JOIN deliveries d ON d.seq = cm.seq"
# Only the deliveries index: how many are waiting, when the filter is empty.
_RECEIVE_COUNT_SQL = (
    "SELECT count(*) FROM deliveries d WHERE d.recipient = :agent AND d.status = 'pending'"
    " AND d.visible_at_ms <= :now AND d.channel_id IN (SELECT value FROM json_each(:channels))"
)
_RECEIVE_WHERE = [
    "d.recipient = :agent", "d.status = 'pending'", "d.visible_at_ms <= :now",
    "d.channel_id IN (SELECT value FROM json_each(:channels))",
]
# The delivery's fields of a ChannelMessage, then what handing it out needs.
_RECEIVE_EXTRA_COLUMNS = (
    ", d.recipient, d.status, d.attempts + 1, d.retry_count,"
    " d.channel_id, c.delivery_mode, c.ack_timeout_ms"
)
_HAND_OUT_COLUMNS = 3
# The agent's channels that hand out deliveries now, with what receive needs of each.
_OPEN_CHANNELS_SQL = (
    "SELECT c.id, c.priority_ordering, c.max_pending, CASE WHEN c.max_pending IS NULL THEN 0"
    " ELSE (SELECT count(*) FROM deliveries i WHERE i.channel_id = c.id"
    " AND i.deadline_ms IS NOT NULL) END FROM participants p JOIN channels c ON c.id = p.channel_id"
    " WHERE p.agent = ? AND c.state IN (SELECT value FROM json_each(?))"
)
_HAND_OUT_SQL = (
    "UPDATE deliveries SET status = 'delivered', attempts = attempts + 1, delivered_at_ms = :now,"
    " deadline_ms = CASE WHEN :timeout IS NULL THEN NULL ELSE :now + :timeout END"
    " WHERE seq = :seq AND recipient = :agent"
)
_MARK_DELIVERED_SQL = (
    "UPDATE channel_messages SET status = 'delivered' WHERE seq = ? AND status = 'sent'"
)
_REFRESH_DEDUP_SQL = (
    "UPDATE dedup SET expires_at_ms = ? WHERE correlation_id = ? AND recipient = ? AND seq = ?"
)
_DELIVERY_SQL = (
    "SELECT d.status, d.attempts, d.deadline_ms, d.channel_id, c.delivery_mode, c.ack_timeout_ms,"
    " m.correlation_id FROM deliveries d JOIN channels c ON c.id = d.channel_id"
    " JOIN messages m ON m.seq = d.seq WHERE d.seq = ? AND d.recipient = ?"
)
_ACK_SQL = (
    "UPDATE deliveries SET status = :status, note = coalesce(:note, note), acked_at_ms = :now,"
    " deadline_ms = :deadline WHERE seq = :seq AND recipient = :agent"
)
_OUTCOMES_SQL = (
    "SELECT coalesce(sum(status = 'pending' OR deadline_ms IS NOT NULL), 0),"
    " coalesce(sum(status = 'failed'), 0), coalesce(sum(status = 'dead_letter'), 0)"
    " FROM deliveries WHERE seq = ?"
)
_SET_MESSAGE_STATUS_SQL = "UPDATE channel_messages SET status = ? WHERE seq = ?"
_EXPIRED_SQL = (
    "SELECT d.seq, d.recipient, d.channel_id, d.retry_count, d.deadline_ms, c.max_retries,"
    " c.retry_backoff_ms, c.ack_timeout_ms,"
    # ChannelConfig.timer_at_send (at_most_once has no deadlines), and not while paused
    " c.max_pending IS NULL AND c.state != 'paused'"
    " FROM deliveries d JOIN channels c ON c.id = d.channel_id"
    " WHERE d.deadline_ms <= ? ORDER BY d.deadline_ms LIMIT ?"
)
_RETRY_SQL = (
    "UPDATE deliveries SET status = 'pending', retry_count = ?, deadline_ms = ?,"
    " visible_at_ms = ?, last_error = ? WHERE seq = ? AND recipient = ?"
)
# Pausing a channel stops the timers of what waits on it; resuming starts them again,
# from the resume (or from a retry's visibility, if later).
_HOLD_TIMERS_SQL = (
    "UPDATE deliveries SET deadline_ms = NULL WHERE channel_id = ? AND deadline_ms IS NOT NULL"
    " AND status = 'pending'"
)
_RESTART_TIMERS_SQL = (
    "UPDATE deliveries SET deadline_ms = max(visible_at_ms, :now) + :timeout"
    " WHERE seq IN (SELECT seq FROM channel_messages WHERE channel_id = :channel)"
    " AND channel_id = :channel AND status = 'pending' AND deadline_ms IS NULL"
)
_BURY_SQL = (
    "UPDATE deliveries SET status = 'dead_letter', deadline_ms = NULL, last_error = ?,"
    " retry_count = ? WHERE seq = ? AND recipient = ?"
)
_INSERT_DEAD_LETTER_SQL = (
    "INSERT INTO dead_letters (seq, recipient, channel_id, retry_count, last_error,"
    " dead_lettered_at_ms) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (seq, recipient) DO UPDATE SET"
    " retry_count = excluded.retry_count, last_error = excluded.last_error,"
    " dead_lettered_at_ms = excluded.dead_lettered_at_ms RETURNING id"
)
_EXPIRE_QUERIES_SQL = (
    "UPDATE channel_messages SET status = 'expired', expires_at_ms = NULL"
    " WHERE expires_at_ms <= ?"
)
_PURGE_DEDUP_SQL = "DELETE FROM dedup WHERE expires_at_ms <= ?"
_OPEN_ON_CHANNEL_SQL = (
    "SELECT d.seq, d.recipient, d.retry_count FROM channel_messages cm"
    " JOIN deliveries d ON d.seq = cm.seq WHERE cm.channel_id = ?"
    " AND (d.status = 'pending' OR d.deadline_ms IS NOT NULL) ORDER BY d.seq, d.recipient"
)
_CHANNEL_NAME_SQL = "SELECT name FROM channels WHERE id = ?"
CLOSED_ERROR = "channel closed"


@dataclass
class TickReport:
    """What one tick did."""

    redelivered: int = 0
    dead_lettered: int = 0
    expired_queries: int = 0

    def to_json_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# --- receive ------------------------------------------------------------------


def receive(conn: apsw.Connection, agent: str, flt: MessageFilter, now_ms: int,
            load_content: Callable[[Any, Any], Any],
            count: Callable[[str, dict[str, Any]], int],
            candidates: list[int] | None = None) -> QueryResult:
    """Hand out `agent`'s deliverable messages matching `flt`, inside the caller's transaction.

    Deliverable: pending, visible by now, on a channel the agent belongs to
    that is active or draining and below its max_pending. In the common case
    (oldest first, no priority ordering) rows come in the pending index's
    order and one row past the page says whether there are more, so a
    receive reads `limit + 1` rows whatever the backlog. `total_count` is
    left to `count(sql, params)`, run after the commit only if asked for.
    A filter with a content pattern comes with its `candidates` (see
    `content_candidates`): the pattern itself is not run here, under the lock.
    """
    budgets, channel_ids, prioritised = _open_channels(conn, agent)
    locked = flt if candidates is None else replace(flt, content_pattern=None, offset=0)
    sql, params = _receive_sql(locked, agent, now_ms, channel_ids, prioritised,
                               MESSAGE_COLUMNS + _RECEIVE_EXTRA_COLUMNS, candidates)
    rows = list(conn.execute(sql, params))
    has_more = len(rows) > flt.limit or len(candidates or ()) > flt.limit
    handed: list[ChannelMessage] = []
    for row in rows[:flt.limit]:
        message = row_to_message(row[:-_HAND_OUT_COLUMNS], load_content)
        channel_id, mode, ack_timeout_ms = row[-_HAND_OUT_COLUMNS:]
        if channel_id in budgets:
            if budgets[channel_id] <= 0:
                has_more = True  # max_pending reached during this call: the rest waits
                continue
            budgets[channel_id] -= 1
        _hand_out(conn, message, agent, channel_id, mode, ack_timeout_ms, now_ms)
        handed.append(_replace_status(message, "delivered"))
    # Counted after the commit: what is still waiting, plus what this call handed out.
    count_sql, count_params = _count_sql(flt, agent, now_ms, channel_ids)
    return QueryResult(handed, lambda: count(count_sql, count_params) + len(handed), has_more)


def content_candidates(conn: apsw.Connection, agent: str, flt: MessageFilter,
                       now_ms: int) -> list[int]:
    """The seqs `receive` would hand out for a filter with a content pattern, read only.

    Run before receive's write transaction, so a slow regular expression
    (a user's, like `(a+)+$`) holds up only its own caller, never another
    writer. Content never changes, so the match still holds under the lock,
    where receive re-checks everything else.
    """
    _budgets, channel_ids, prioritised = _open_channels(conn, agent)
    sql, params = _receive_sql(flt, agent, now_ms, channel_ids, prioritised, "cm.seq")
    return [seq for (seq,) in conn.execute(sql, params)]


def _receive_sql(flt: MessageFilter, agent: str, now_ms: int, channel_ids: list[int],
                 prioritised: bool, columns: str,
                 candidates: list[int] | None = None) -> tuple[str, dict[str, Any]]:
    """The SELECT of the deliverable messages matching `flt`, one page (plus one row)."""
    clauses, params = filter_sql(flt)
    if candidates is not None:
        clauses.append("cm.seq IN (SELECT value FROM json_each(:f_candidates))")
        params["f_candidates"] = orjson.dumps(candidates).decode()
    params.update(agent=agent, now=now_ms, channels=orjson.dumps(channel_ids).decode(),
                  limit=flt.limit + 1, offset=flt.offset)
    where = " WHERE " + " AND ".join(_RECEIVE_WHERE + clauses)
    in_index_order = flt.sort_by == "created_at" and flt.sort_order in (None, "asc")
    order = " ORDER BY d.seq" if in_index_order and not prioritised else \
        order_sql(flt, "asc", priority_first=prioritised)
    return ("SELECT " + columns + _RECEIVE_FROM_SQL + where + order
            + " LIMIT :limit OFFSET :offset"), params


def _count_sql(flt: MessageFilter, agent: str, now_ms: int,
               channel_ids: list[int]) -> tuple[str, dict[str, Any]]:
    """How many deliverable messages match `flt` (the whole filter, content pattern included)."""
    clauses, params = filter_sql(flt)
    params.update(agent=agent, now=now_ms, channels=orjson.dumps(channel_ids).decode())
    if not clauses:
        return _RECEIVE_COUNT_SQL, params
    return "SELECT count(*)" + _RECEIVE_FROM_SQL + " WHERE " + " AND ".join(
        _RECEIVE_WHERE + clauses), params


def _replace_status(message: ChannelMessage, delivery_status: str) -> ChannelMessage:
    status = "delivered" if message.status == "sent" else message.status
    return replace(message, delivery_status=delivery_status, status=status)


def _open_channels(conn: apsw.Connection, agent: str) -> tuple[dict[int, int], list[int], bool]:
    """(max_pending budgets left, ids of channels that deliver now, any priority ordering)."""
    budgets: dict[int, int] = {}
    channel_ids: list[int] = []
    prioritised = False
    rows = conn.execute(_OPEN_CHANNELS_SQL, (agent, _DELIVERING))
    for channel_id, ordering, max_pending, in_flight in rows:
        if max_pending is not None:
            budgets[channel_id] = max_pending - in_flight
            if budgets[channel_id] <= 0:
                continue  # paused by backpressure until acks bring it below max_pending
        channel_ids.append(channel_id)
        prioritised = prioritised or bool(ordering)
    return budgets, channel_ids, prioritised


def _hand_out(conn: apsw.Connection, message: ChannelMessage, agent: str, channel_id: int,
              mode: str, ack_timeout_ms: int, now_ms: int) -> None:
    seq = message.seq
    timeout = None if mode == "at_most_once" else ack_timeout_ms
    conn.execute(_HAND_OUT_SQL, {"now": now_ms, "timeout": timeout, "seq": seq, "agent": agent})
    if message.status == "sent":
        conn.execute(_MARK_DELIVERED_SQL, (seq,))
    if mode == "at_most_once":  # handed out is done: nothing is ever retried
        add_open_deliveries(conn, channel_id, -1)
    elif mode == "exactly_once":
        conn.execute(_REFRESH_DEDUP_SQL, (now_ms + 2 * ack_timeout_ms, message.correlation_id,
                                          agent, seq))


# --- acknowledge ---------------------------------------------------------------


def acknowledge(conn: apsw.Connection, seq: int, agent: str, status: str, note: str | None,
                now_ms: int) -> str:
    """Record `agent`'s ack of message `seq`; return the delivery's status afterwards."""
    if status not in ACK_STATUSES:
        raise ValidationFailed("status", f"{status!r} is not one of {', '.join(ACK_STATUSES)}")
    if note is not None:
        messages.validate_text(note, "note", NOTE_MAX)
    found = conn.execute(_DELIVERY_SQL, (seq, agent)).fetchone()
    if found is None:
        raise ValidationFailed("message", f"message {seq} has no delivery to {agent}; ack only"
                                          " messages you received")
    # What the delivery is comes first: a duplicate is never received, and saying so is clearer.
    _check_ack_transition(seq, agent, found[0], status)
    if found[1] == 0:
        raise ValidationFailed("message", f"message {seq} has not been received by {agent} yet;"
                                          " receive it before acknowledging it")
    return _record_ack(conn, seq, agent, status, note, now_ms, found)


def complete_answered(conn: apsw.Connection, seq: int, agent: str, answer_id: str,
                      now_ms: int) -> None:
    """`agent` answered message `seq` (a response or an acknowledgment message): its
    delivery of `seq`, if still open, is completed, so it is not handed out again."""
    found = conn.execute(_DELIVERY_SQL, (seq, agent)).fetchone()
    if found is not None and found[0] in OPEN_STATUSES:
        _record_ack(conn, seq, agent, "completed", f"answered by message {answer_id}", now_ms,
                    found)


def _record_ack(conn: apsw.Connection, seq: int, agent: str, status: str, note: str | None,
                now_ms: int, found: tuple[Any, ...]) -> str:
    current, _attempts, deadline, channel_id, mode, ack_timeout_ms, correlation_id = found
    if current == status and current in FINAL_STATUSES:
        return current  # a repeated final ack is a no-op
    was_open = current == "pending" or deadline is not None
    final = status in FINAL_STATUSES
    new_deadline = None if final or mode == "at_most_once" else now_ms + ack_timeout_ms
    conn.execute(_ACK_SQL, {"status": status, "note": note, "now": now_ms,
                            "deadline": new_deadline, "seq": seq, "agent": agent})
    if final and was_open:
        add_open_deliveries(conn, channel_id, -1)
    if final:
        _settle_message(conn, seq)
    if mode == "exactly_once" and correlation_id is not None:
        conn.execute(_REFRESH_DEDUP_SQL, (now_ms + 2 * ack_timeout_ms, correlation_id, agent, seq))
    return status


def _check_ack_transition(seq: int, agent: str, current: str, status: str) -> None:
    if current == "dead_letter":
        raise ValidationFailed("message", f"message {seq} to {agent} is a dead letter; replay it"
                                          " (bus dlq replay) to deliver it again")
    if current == "cancelled":
        raise ValidationFailed("message", f"message {seq} to {agent} was cancelled when {agent}"
                                          " left the channel; join again for new messages")
    if current == "duplicate":
        raise ValidationFailed("message", f"message {seq} was not delivered to {agent}: it"
                                          " repeats a correlation id already delivered (exactly_once)")
    if current in FINAL_STATUSES and current != status:
        raise ValidationFailed("status", f"message {seq} to {agent} is already {current};"
                                         " a final status cannot change")


def _settle_message(conn: apsw.Connection, seq: int) -> None:
    """Once no delivery of `seq` is open: dead_letter, failed or acknowledged, worst first."""
    still_open, failed, dead = conn.execute(_OUTCOMES_SQL, (seq,)).fetchone()
    if not still_open:
        status = "dead_letter" if dead else "failed" if failed else "acknowledged"
        conn.execute(_SET_MESSAGE_STATUS_SQL, (status, seq))


# --- timers --------------------------------------------------------------------


def tick(conn: apsw.Connection, now_ms: int) -> TickReport:
    """Evaluate every stored deadline up to `now_ms`, inside the caller's transaction."""
    report = TickReport()
    while True:
        expired = conn.execute(_EXPIRED_SQL, (now_ms, TICK_BATCH)).fetchall()
        for row in expired:
            _time_out(conn, row, now_ms, report)
        if len(expired) < TICK_BATCH:
            break
    conn.execute(_EXPIRE_QUERIES_SQL, (now_ms,))
    report.expired_queries = conn.changes()
    conn.execute(_PURGE_DEDUP_SQL, (now_ms,))
    return report


def _time_out(conn: apsw.Connection, row: tuple[Any, ...], now_ms: int,
              report: TickReport) -> None:
    """Retry one delivery whose ack deadline passed, or bury it after max_retries.

    Each retry restarts the timer from its visibility (when the timer starts
    at send), so a recipient that never receives runs through the schedule
    too. A late tick replays the schedule the stored deadline set: every
    retry whose own deadline has passed as well, then the one still running.
    """
    seq, recipient, channel_id, retries, deadline, max_retries, backoff, timeout, from_send = row
    error = f"not acknowledged within {timeout / 1000:g} s"
    while retries < max_retries:
        visible = deadline + backoff * 2 ** retries  # retry n waits backoff * 2^(n-1)
        retries += 1
        report.redelivered += 1
        deadline = visible + timeout if from_send else None
        if deadline is None or deadline > now_ms:
            conn.execute(_RETRY_SQL, (retries, deadline, visible, error, seq, recipient))
            return
    bury(conn, seq, recipient, channel_id, retries, error, now_ms)
    report.dead_lettered += 1


def hold_timers(conn: apsw.Connection, channel_id: int) -> None:
    """A paused channel hands nothing out, so what waits on it does not time out."""
    conn.execute(_HOLD_TIMERS_SQL, (channel_id,))


def restart_timers(conn: apsw.Connection, channel: Channel, now_ms: int) -> None:
    """A channel delivers again: its waiting deliveries' ack timers run from now."""
    if channel.config.timer_at_send:
        conn.execute(_RESTART_TIMERS_SQL, {"now": now_ms, "timeout": channel.config.ack_timeout_ms,
                                           "channel": channel.id})


def settle_closed(conn: apsw.Connection, channel_id: int, now_ms: int) -> int:
    """Dead-letter every unfinished delivery of a channel being closed; return how many.

    A closed channel delivers nothing, so without this its waiting messages
    would count against the store's max_active for ever.
    """
    waiting = conn.execute(_OPEN_ON_CHANNEL_SQL, (channel_id,)).fetchall()
    for seq, recipient, retries in waiting:
        bury(conn, seq, recipient, channel_id, retries, CLOSED_ERROR, now_ms)
    return len(waiting)


def bury(conn: apsw.Connection, seq: int, recipient: str, channel_id: int, retries: int,
         error: str, now_ms: int) -> int:
    """Make the delivery a dead letter and announce it; return the dead letter's id."""
    conn.execute(_BURY_SQL, (error, retries, seq, recipient))
    dead_id = conn.execute(_INSERT_DEAD_LETTER_SQL, (seq, recipient, channel_id, retries, error,
                                                     now_ms)).get
    add_open_deliveries(conn, channel_id, -1)
    _settle_message(conn, seq)
    system.announce(conn, system.DEADLETTER_TOPIC, {
        "dead_letter": dead_id, "seq": seq, "channel": conn.execute(_CHANNEL_NAME_SQL,
                                                                    (channel_id,)).get,
        "recipient": recipient, "retry_count": retries, "last_error": error}, now_ms)
    return dead_id
