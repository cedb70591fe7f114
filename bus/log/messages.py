"""The message log: validation, encoding, and the SQL of publish and poll.

`Bus` (bus/api.py) calls these functions with its connection; they hold the
rules that decide what a valid message is and how it maps to a row. `append` is
the one way any part writes a message: the inserts behind it are private.
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from typing import Any
from typing import ContextManager
from typing import Iterable
from typing import Mapping
from typing import TYPE_CHECKING
from typing import NamedTuple
from typing import Protocol
from typing import Sequence

import apsw

from blobs.errors import BlobCorrupt
from blobs.errors import BlobMissing
from blobs.errors import BlobRefInvalid
from bus.storage.errors import ValidationFailed
from bus.log.glance import NOT_OWN
from bus.log.glance import first_waiting
from bus.log.glance import now_ms
from bus.log.agent_ids import validate_agent_id

if TYPE_CHECKING:
    from blobs.store import BlobStore

TYPE_MAX = 128
REFERENCE_MAX = 256  # correlation_id, in_reply_to
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
PUBLISH_KEYS = ("from_agent", "type", "payload", "to", "id", "correlation_id", "in_reply_to")
_PUBLISH_KEY_SET = frozenset(PUBLISH_KEYS)

# The columns row_to_message reads, in its order.
COLUMNS = (
    "seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload, payload_ref"
)
_INSERT_HEAD = (
    "INSERT INTO messages (id, ts_ms, from_agent, to_agent, type, correlation_id,"
    " in_reply_to, payload, payload_ref) VALUES "
)
_ROW_VALUES = "(?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_SQL = f"{_INSERT_HEAD}{_ROW_VALUES} ON CONFLICT (id) DO NOTHING RETURNING seq"
_SEQ_BY_ID_SQL = "SELECT seq FROM messages WHERE id = ?"
# Two index range scans merged by seq: the cost follows `limit`, not the
# backlog. A plain `to_agent IS NULL OR to_agent = ?` would sort every waiting row.
# An agent's own messages are not waiting for it (it knows what it said): both scans
# pass over what it sent, its broadcasts and what it addressed to itself, unless asked
# (`_WITH_OWN`, for a reader of the whole log as the agent).
_POLL_TEMPLATE = (
    f"SELECT {COLUMNS} FROM messages WHERE to_agent = :agent AND seq > :after{{own}}"
    f" UNION ALL SELECT {COLUMNS} FROM messages WHERE to_agent IS NULL AND seq > :after"
    "{own} ORDER BY seq LIMIT :limit"
)
_POLL_SQL = _POLL_TEMPLATE.format(own=NOT_OWN)
_POLL_WITH_OWN_SQL = _POLL_TEMPLATE.format(own="")
_PENDING_COUNT_SQL = (
    f"SELECT (SELECT count(*) FROM messages WHERE to_agent = :agent AND seq > :after{NOT_OWN})"
    f" + (SELECT count(*) FROM messages WHERE to_agent IS NULL AND seq > :after{NOT_OWN})"
)
_LIST_SQL = f"SELECT {COLUMNS} FROM messages WHERE seq > ? ORDER BY seq LIMIT ?"
_TAIL_SQL = f"SELECT {COLUMNS} FROM messages ORDER BY seq DESC LIMIT ?"
# Only the rows published since the question are read (the seq range is the primary key).
_REPLY_SQL = (f"SELECT {COLUMNS} FROM messages WHERE seq > :after AND in_reply_to = :id"
              " AND (to_agent = :agent OR to_agent IS NULL) ORDER BY seq LIMIT 1")
# The agent's own messages (broadcasts, and to itself) in a row above `after`, up to the next message waiting for it.
_LAST_OWN_BEFORE_SQL = (
    "SELECT max(seq) FROM messages WHERE from_agent = :agent"
    " AND (to_agent IS NULL OR to_agent = :agent) AND seq > :after AND seq < :before"
)
# past_own's common case in one row read: the message right after the acked one is for the
# agent (to it or to all) and not its own, so no own message lies before what waits next.
_NEXT_WAITS_SQL = (
    "SELECT 1 FROM messages WHERE seq = :next AND from_agent <> :agent"
    " AND (to_agent = :agent OR to_agent IS NULL)"
)
# What an answer needs of the message it answers: no payload read.
_ADDRESS_SQL = "SELECT id, from_agent, to_agent, correlation_id FROM messages WHERE seq = ?"
_LAST_SEQ_SQL = "SELECT max(seq) FROM messages"  # the newest row is never deleted
_COUNT_SQL = "SELECT count(*) FROM messages"
_SEQ_END = 2**63 - 1  # above every seq SQLite can assign
_UUID_EXAMPLE = "00000000-0000-0000-0000-000000000000"
_REFERENCED_BLOBS_SQL = "SELECT DISTINCT payload_ref FROM messages WHERE payload_ref IS NOT NULL"


@dataclass(frozen=True)
class Message:
    """One message as a consumer sees it; `payload` is decoded JSON.

    `payload_error` is None, or says why the payload could not be read
    ("decode_failed", "blob_missing", "blob_corrupt"); it never raises.
    Read with a preview size, a payload in the blob store is not loaded:
    `payload` is None, `payload_preview` holds its first bytes as text and
    `payload_size` its size in bytes.
    """

    seq: int
    id: str
    ts_ms: int
    from_agent: str
    to_agent: str | None
    type: str
    correlation_id: str | None
    in_reply_to: str | None
    payload: Any
    payload_error: str | None = None
    payload_ref: str | None = None
    payload_preview: str | None = None
    payload_size: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The stable JSON form shared by `--json` output and the export."""
        out = {
            "seq": self.seq,
            "id": self.id,
            "ts_ms": self.ts_ms,
            "ts": iso_utc(self.ts_ms),
            "from": self.from_agent,
            "to": self.to_agent,
            "type": self.type,
            "correlation_id": self.correlation_id,
            "in_reply_to": self.in_reply_to,
            "payload": self.payload,
        }
        if self.payload_ref is not None:
            out["payload_ref"] = self.payload_ref
        if self.payload_error is not None:
            out["payload_error"] = self.payload_error
        return out


class PublishResult(NamedTuple):
    """What publish did: the message's `seq` and `id`, whether it was already
    there (`duplicate`), and what the commit survives (`durable`: "commit"
    for a process crash, "fsync" for power loss too)."""

    seq: int
    id: str
    duplicate: bool
    durable: str

    def to_json_dict(self) -> dict[str, Any]:
        return self._asdict()


class Row(NamedTuple):
    """A validated message ready to insert (its time is taken when it is written)."""

    id: str
    from_agent: str
    to_agent: str | None
    type: str
    correlation_id: str | None
    in_reply_to: str | None
    payload: str | None
    payload_ref: str | None = None

    def bindings(self, ts_ms: int) -> tuple[Any, ...]:
        return (self.id, ts_ms, *self[1:8])


# --- validation -----------------------------------------------------------


def validate_text(value: object, field: str, limit: int, optional: bool = False) -> str | None:
    """A non-empty string of at most `limit` characters (or None if optional)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValidationFailed(field, f"must be a string, got {type(value).__name__}", value=value)
    if not value:
        raise ValidationFailed(field, "must not be empty", value=value)
    if len(value) > limit:
        raise ValidationFailed(field, f"is {len(value)} characters long; the limit is {limit}")
    return value


def validate_message_id(value: object, field: str = "id") -> str:
    """A caller-chosen id must be a UUID string; it is stored in lower case."""
    if isinstance(value, str) and _UUID.fullmatch(value):
        return value.lower()
    raise ValidationFailed(
        field, f"{value!r} is not a UUID string like '{_UUID_EXAMPLE}'", value=value
    )


def validate_positive_int(value: object, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValidationFailed(field, f"must be an integer >= 1, got {value!r}", value=value)


def encode_payload(payload: Any, field: str = "payload") -> str | None:
    """JSON text for a payload; None stays None. Refuses what JSON cannot hold."""
    if payload is None:
        return None
    # Imported here, not at the top: a hook's quiet answer (bus/cli/entry.py) reads no
    # payload, and orjson's import costs more than the rest of that answer.
    import orjson
    try:
        text = orjson.dumps(payload)
    except TypeError as exc:
        raise ValidationFailed(field, f"is not JSON-serialisable: {exc}") from None
    # orjson writes NaN and infinities as null: refuse rather than change the data.
    if b"null" in text and _has_non_finite(payload):
        raise ValidationFailed(field, "contains NaN or infinity, which JSON cannot represent")
    return text.decode()


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, Mapping):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


def prepare_row(
    from_agent: object,
    type: object,
    payload: Any = None,
    *,
    to: object = None,
    id: object = None,
    correlation_id: object = None,
    in_reply_to: object = None,
) -> Row:
    """Validate one publish's arguments and build its row; raises ValidationFailed."""
    return Row(
        id=new_message_id() if id is None else validate_message_id(id),
        from_agent=validate_agent_id(from_agent, "from_agent"),
        to_agent=None if to is None else validate_agent_id(to, "to"),
        type=validate_text(type, "type", TYPE_MAX),
        correlation_id=validate_text(correlation_id, "correlation_id", REFERENCE_MAX, True),
        in_reply_to=validate_text(in_reply_to, "in_reply_to", REFERENCE_MAX, True),
        payload=encode_payload(payload),
    )


def prepare_batch(messages: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Validate every message of a batch before any is written.

    Errors name the item and key, e.g. field "messages[3].type".
    """
    rows = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValidationFailed(f"messages[{index}]", "must be a dict of publish arguments")
        try:
            rows.append(_prepare_item(message))
        except ValidationFailed as exc:
            raise ValidationFailed(f"messages[{index}].{exc.field}", exc.reason) from None
    return rows


def _prepare_item(message: Mapping[str, Any]) -> Row:
    if not _PUBLISH_KEY_SET.issuperset(message):
        unknown = sorted(map(str, set(message) - _PUBLISH_KEY_SET))[0]
        raise ValidationFailed(unknown, f"unknown key; accepted keys: {', '.join(PUBLISH_KEYS)}")
    for required in ("from_agent", "type"):
        if required not in message:
            raise ValidationFailed(required, "is required")
    return prepare_row(**message)


# --- SQL --------------------------------------------------------------------


class Placement(Protocol):
    """Where a row's payload goes: the bus's PayloadPolicy (bus/log/payloads.py, which
    imports this module: hence a protocol here)."""

    def all_inline(self, rows: Sequence[Row]) -> bool: ...

    def place(self, row: Row) -> Row: ...

    def staging(self) -> ContextManager[None]: ...


def append(conn: apsw.Connection, rows: Sequence[Row], payloads: Placement | None,
           now: int | None = None) -> list[tuple[int, bool]]:
    """Write `rows` to the log; return each one's (seq, duplicate). The log's one write
    path: a publish, a channel's send, the pump's envelopes and the coordination's
    announcements all come here, so every message gets the same treatment.

    Inside the caller's write transaction (up to ROWS_PER_INSERT rows may also be one
    statement of their own). `payloads`, the bus's PayloadPolicy, refuses a payload
    over the size limit and moves one over the blob threshold to the blob store,
    exactly as for a publish (a row placed already passes unchanged); None only where
    no bus is at hand (a hook's own connection), whose payloads stay inline. A row
    whose id is in the log already is not written: its original seq comes back with
    duplicate True.

    `now`: the time written on every row; None lets SQLite take it once the write
    lock is held, so times follow seq order across processes.
    """
    if payloads is None or payloads.all_inline(rows):
        return _insert(conn, rows, now)
    with payloads.staging():  # a refused or failed write leaves no blob behind
        return _insert(conn, [payloads.place(row) for row in rows], now)


def _insert(conn: apsw.Connection, rows: Sequence[Row], now: int | None) -> list[tuple[int, bool]]:
    if now is None:
        return _insert_rows(conn, rows)
    return [_insert_row(conn, row, now) for row in rows]


def _insert_row(conn: apsw.Connection, row: Row, ts_ms: int) -> tuple[int, bool]:
    """Insert inside the caller's write transaction; return (seq, duplicate).

    The caller takes `ts_ms` after acquiring the write lock, so times follow
    seq order across processes (as far as the clock allows).

    A row whose id exists already is not written (and takes no seq): the
    original seq comes back.
    """
    seq = conn.execute(_INSERT_SQL, row.bindings(ts_ms)).get
    if seq is not None:
        return seq, False
    return conn.execute(_SEQ_BY_ID_SQL, (row.id,)).get, True


# Rows per multi-row INSERT: 8 bound values each, far below SQLite's limit
# of 32,766 variables, and few distinct statement texts for apsw's cache.
ROWS_PER_INSERT = 64
# The time a row is written, taken by SQLite once per statement after it has
# the write lock: times follow seq order across processes.
_NOW_MS_SQL = "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)"
_ROW_VALUES_NOW = f"(?, {_NOW_MS_SQL}, ?, ?, ?, ?, ?, ?, ?)"


def _insert_rows(conn: apsw.Connection, rows: Sequence[Row]) -> list[tuple[int, bool]]:
    """Insert rows with one statement per 64; return each one's (seq, duplicate).

    The results are what `_insert_row` would give for each row in turn: an id
    already in the file, or earlier in `rows`, is a duplicate of that row.
    Outside a transaction, up to 64 rows are one statement and so one
    transaction of their own: no BEGIN or COMMIT, so a group commit's leader
    gives the GIL up once, not three times, to threads it must then wait for.
    A batch of over 64 rows is all or nothing only in the caller's transaction.
    """
    results: list[tuple[int, bool]] = []
    for first in range(0, len(rows), ROWS_PER_INSERT):
        results.extend(_insert_chunk(conn, rows[first:first + ROWS_PER_INSERT]))
    return results


def _insert_chunk(conn: apsw.Connection, rows: Sequence[Row]) -> list[tuple[int, bool]]:
    # A Row's fields are its bindings, in column order (the time comes from SQL).
    conn.execute(_multi_insert_sql(len(rows)), [value for row in rows for value in row])
    written = conn.changes()
    # New rows take consecutive seqs in VALUES order (max(seq) + 1 each, under
    # the write lock); a row skipped as a duplicate takes none.
    first_new = conn.last_insert_rowid() - written + 1
    if written == len(rows):
        return [(first_new + index, False) for index in range(len(rows))]
    return _resolve_duplicates(conn, rows, first_new if written else None)


def _resolve_duplicates(conn: apsw.Connection, rows: Sequence[Row],
                        first_new: int | None) -> list[tuple[int, bool]]:
    """Each row's seq, and whether its id was there before (in the file or earlier in `rows`)."""
    ids = [row.id for row in rows]
    seq_by_id = dict(conn.execute(_seqs_by_ids_sql(len(ids)), ids))
    results, seen = [], set()
    for row in rows:
        seq = seq_by_id.get(row.id)
        if seq is None:
            # Outside a transaction, compaction may have removed the row this one
            # duplicated since the INSERT committed: then it is new after all.
            seq, duplicate = _insert_row(conn, row, now_ms())
            seq_by_id[row.id] = seq
        else:
            duplicate = first_new is None or seq < first_new or row.id in seen
        results.append((seq, duplicate))
        seen.add(row.id)
    return results


@functools.lru_cache(maxsize=None)
def _multi_insert_sql(count: int) -> str:
    return f"{_INSERT_HEAD}{', '.join([_ROW_VALUES_NOW] * count)} ON CONFLICT (id) DO NOTHING"


@functools.lru_cache(maxsize=None)
def _seqs_by_ids_sql(count: int) -> str:
    return f"SELECT id, seq FROM messages WHERE id IN ({', '.join('?' * count)})"


def select_for_agent(conn: apsw.Connection, agent: str, after: int, limit: int,
                     blobs: BlobStore | None = None, preview: int = 0,
                     include_own: bool = False) -> list[Message]:
    """The messages for `agent` (to it or broadcast, by another agent) above `after`, in seq
    order; with `include_own`, its own too (its broadcasts, and what it sent itself)."""
    sql = _POLL_WITH_OWN_SQL if include_own else _POLL_SQL
    rows = conn.execute(sql, {"agent": agent, "after": after, "limit": limit})
    return [row_to_message(row, blobs, preview) for row in rows]


def pending_count(conn: apsw.Connection, agent: str, after: int) -> int:
    """How many messages wait for `agent` above `after` (its own messages are not waiting)."""
    return conn.execute(_PENDING_COUNT_SQL, {"agent": agent, "after": after}).get


def select_after(conn: apsw.Connection, after: int, limit: int,
                 blobs: BlobStore | None = None, preview: int = 0) -> list[Message]:
    """Every message with seq above `after`, whoever it is for, in seq order."""
    rows = conn.execute(_LIST_SQL, (after, limit))
    return [row_to_message(row, blobs, preview) for row in rows]


def select_reply(conn: apsw.Connection, agent: str, message_id: str, after: int,
                 blobs: BlobStore | None = None) -> Message | None:
    """The first message for `agent` (or broadcast) in reply to `message_id`, above `after`."""
    row = conn.execute(_REPLY_SQL, {"agent": agent, "id": message_id, "after": after}).fetchone()
    return None if row is None else row_to_message(row, blobs)


def past_own(conn: apsw.Connection, agent: str, seq: int) -> int:
    """Where a cursor goes once `agent` handled `seq`: `seq`, or past the agent's own
    messages that follow it before the next message waiting for it.

    Poll passes over an agent's own messages, so nothing else would move its
    cursor past those after the last message it was shown; left there, they
    would hold back retention and stand as lag.
    """
    if conn.execute(_NEXT_WAITS_SQL, {"next": seq + 1, "agent": agent}).get:
        return seq  # a queue read in order: the very next message waits for the agent
    before = first_waiting(conn, agent, seq)
    own = conn.execute(_LAST_OWN_BEFORE_SQL, {"agent": agent, "after": seq,
                                              "before": before or _SEQ_END}).get
    return seq if own is None else own


class Address(NamedTuple):
    """Who sent a message and to whom, and what an answer to it refers to."""

    id: str
    from_agent: str
    to_agent: str | None
    correlation_id: str | None


def select_address(conn: apsw.Connection, seq: int) -> Address | None:
    """The message `seq`'s id, sender, recipient and correlation id; None if there is none."""
    row = conn.execute(_ADDRESS_SQL, (seq,)).fetchone()
    return None if row is None else Address(*row)


def select_last(conn: apsw.Connection, count: int, blobs: BlobStore | None = None,
                preview: int = 0) -> list[Message]:
    """The newest `count` messages, oldest first."""
    rows = reversed(conn.execute(_TAIL_SQL, (count,)).fetchall())
    return [row_to_message(row, blobs, preview) for row in rows]


def last_seq(conn: apsw.Connection) -> int:
    """The highest seq ever assigned (0 for an empty log); seqs are never reused,
    since compaction keeps the newest message."""
    return conn.execute(_LAST_SEQ_SQL).get or 0


def message_count(conn: apsw.Connection) -> int:
    return conn.execute(_COUNT_SQL).get


def row_to_message(row: tuple[Any, ...], blobs: BlobStore | None = None,
                   preview: int = 0) -> Message:
    """A row as a Message; a payload that cannot be read is reported, never raised.

    With `preview` > 0 a blob is not loaded, only its first `preview` bytes.
    """
    seq, id_, ts_ms, from_agent, to_agent, type_, correlation_id, in_reply_to, text, ref = row
    head = size = None
    if ref is not None and preview:
        payload, (head, size, error) = None, _blob_head(ref, blobs, preview)
    else:
        payload, error = load_payload(text, ref, blobs)
    return Message(seq, id_, ts_ms, from_agent, to_agent, type_, correlation_id,
                   in_reply_to, payload, error, ref, head, size)


def _blob_head(ref: str, blobs: BlobStore | None,
               size: int) -> tuple[str | None, int | None, str | None]:
    """(first bytes as text, whole size, error) of a blob; never raises."""
    # The blobs classes: the bus's store raises its subclasses of them, a plain store these.
    if blobs is None:
        return None, None, "blob_missing"
    try:
        data, total = blobs.head(ref, size)
        return data.decode(errors="replace"), total, None
    except BlobMissing:
        return None, None, "blob_missing"
    except BlobRefInvalid:
        return None, None, "blob_corrupt"


def load_payload(text: str | None, ref: str | None,
                 blobs: BlobStore | None) -> tuple[Any, str | None]:
    """(payload, error) of a row's payload column or blob reference; never raises."""
    if ref is not None:
        return _load_blob_payload(ref, blobs)
    if text is not None:
        return _decode(text)
    return None, None


def _load_blob_payload(ref: str, blobs: BlobStore | None) -> tuple[Any, str | None]:
    if blobs is None:
        return None, "blob_missing"
    try:
        return _decode(blobs.get(ref))
    except BlobMissing:
        return None, "blob_missing"
    except (BlobCorrupt, BlobRefInvalid):
        return None, "blob_corrupt"


def _decode(text: str | bytes) -> tuple[Any, str | None]:
    import orjson  # as in encode_payload
    try:
        return orjson.loads(text), None
    except orjson.JSONDecodeError:
        return None, "decode_failed"


def referenced_blobs(conn: apsw.Connection) -> set[str]:
    """Every blob reference a retained message holds."""
    return {ref for (ref,) in conn.execute(_REFERENCED_BLOBS_SQL)}


def new_message_id() -> str:
    """A time-ordered (version 7, RFC 9562) UUID string.

    48 bits of Unix milliseconds, then 74 random bits: ids made later sort
    later (to the millisecond), so the unique index on `messages.id` grows
    at its right edge instead of taking a random page per insert. Formatted
    by hand, like the version 4 ids before it, for speed.
    """
    h = f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"
    return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-{_UUID_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


# RFC 9562 variant bits: the first hex digit of the fourth group is 8, 9, a or b.
_UUID_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def clock_ms(now: object) -> int:
    """The clock in epoch milliseconds, or the caller's `now` after a sanity check."""
    if now is None:
        return now_ms()
    # Anything before 1973 in milliseconds is surely seconds passed by mistake.
    if isinstance(now, bool) or not isinstance(now, int) or now < 100_000_000_000:
        raise ValidationFailed("now", f"must be epoch milliseconds (an int like "
                                      f"{now_ms()}), got {now!r}")
    return now


def iso_utc(ts_ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with millisecond precision."""
    moment = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"
