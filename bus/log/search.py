"""Full-text search over message payloads, optional per bus.

    bus.enable_search()                      # builds the index from the log, once
    for hit in bus.search("deploy frontend", type="note", since_ms=...):
        print(hit.rank, hit.message.seq, hit.message.payload)

The index is an FTS5 table, `message_search`, kept in step with `messages`
by two triggers: a publish adds its payload's words in the same transaction,
and a delete (compaction) removes them. It is contentless (`content=''`,
https://sqlite.org/fts5.html#contentless_tables): the text stays in
`messages` once, and `contentless_delete=1` lets the delete trigger remove a
row by seq. The triggers name only `seq` and `payload`, so the index is
independent of the indexes on `messages`.

It is off until enabled because it is not free: every publish also writes the
FTS5 segment of its transaction, which costs one message per transaction
well over the 20 % a default-on index was allowed (`scripts/bench.py` prints
the ratio). A text payload is indexed as its text; any other JSON payload as
its JSON (keys included, and an envelope's XML tags). Payloads in the blob
store (over 4096 bytes) are not indexed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import apsw

from bus.log import messages
from bus.storage.db import translate_busy
from bus.storage.db import write_transaction
from bus.storage.errors import SearchDisabled
from bus.storage.errors import ValidationFailed
from bus.log.messages import Message

if TYPE_CHECKING:
    from blobs.store import BlobStore

LIMIT_MAX = 10_000
QUERY_MAX = 1000
# What is indexed of a payload: a JSON string's text, anything else as JSON.
_TEXT_OF = "CASE WHEN json_type({0}) = 'text' THEN {0} ->> '$' ELSE {0} END"
_ENABLE_SQL = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5(text, content='',"
    " contentless_delete=1, tokenize='unicode61 remove_diacritics 2');"
    " CREATE TRIGGER IF NOT EXISTS message_search_insert AFTER INSERT ON messages"
    " WHEN new.payload IS NOT NULL BEGIN INSERT INTO message_search (rowid, text)"
    f" VALUES (new.seq, {_TEXT_OF.format('new.payload')}); END;"
    " CREATE TRIGGER IF NOT EXISTS message_search_delete AFTER DELETE ON messages"
    " BEGIN DELETE FROM message_search WHERE rowid = old.seq; END;"
)
_BACKFILL_SQL = (
    f"INSERT INTO message_search (rowid, text) SELECT seq, {_TEXT_OF.format('payload')}"
    " FROM messages WHERE payload IS NOT NULL"
)
_DISABLE_SQL = (
    "DROP TRIGGER IF EXISTS message_search_insert; DROP TRIGGER IF EXISTS message_search_delete;"
    " DROP TABLE IF EXISTS message_search;"
)
_ENABLED_SQL = "SELECT count(*) FROM sqlite_master WHERE name = 'message_search'"
_INDEXED_SQL = "SELECT count(*) FROM message_search"
_SEARCH_SQL = (
    "SELECT m.seq, m.id, m.ts_ms, m.from_agent, m.to_agent, m.type, m.correlation_id,"
    " m.in_reply_to, m.payload, m.payload_ref, s.rank FROM message_search s"
    " JOIN messages m ON m.seq = s.rowid WHERE message_search MATCH :query"
    " AND (:type IS NULL OR m.type = :type) AND (:sender IS NULL OR m.from_agent = :sender)"
    " AND (:to IS NULL OR m.to_agent = :to) AND (:since IS NULL OR m.ts_ms >= :since)"
    " ORDER BY s.rank, m.seq LIMIT :limit"
)


@dataclass(frozen=True)
class SearchHit:
    """A message that matched, and its FTS5 rank (bm25: lower is a better match)."""

    message: Message
    rank: float

    def to_json_dict(self) -> dict[str, Any]:
        return {**self.message.to_json_dict(), "rank": self.rank}


def is_enabled(conn: apsw.Connection) -> bool:
    with translate_busy():
        return conn.execute(_ENABLED_SQL).get > 0


def enable(conn: apsw.Connection) -> int:
    """Create the index and its triggers and index the log so far; how many rows it
    holds. Enabling an enabled bus changes nothing."""
    with write_transaction(conn):
        if not conn.execute(_ENABLED_SQL).get:
            conn.execute(_ENABLE_SQL)
            conn.execute(_BACKFILL_SQL)
        return conn.execute(_INDEXED_SQL).get


def disable(conn: apsw.Connection) -> None:
    """Drop the index and its triggers: publishes stop paying for it."""
    with write_transaction(conn):
        conn.execute(_DISABLE_SQL)


def search(conn: apsw.Connection, query: str, blobs: BlobStore | None, *,
           type: str | None = None, sender: str | None = None, to: str | None = None,
           since_ms: int | None = None, limit: int = 50) -> list[SearchHit]:
    """Messages whose payload matches the FTS5 `query`, best match first.

    `query` is FTS5 syntax: words (all must occur), "a phrase", OR, NOT,
    prefix*. Raises SearchDisabled, or ValidationFailed naming the field.
    """
    _validate(query, since_ms, limit)
    params = {"query": query, "type": type, "sender": sender, "to": to, "since": since_ms,
              "limit": limit}
    if not is_enabled(conn):
        raise SearchDisabled()
    try:
        with translate_busy():
            rows = conn.execute(_SEARCH_SQL, params).fetchall()
    except apsw.SQLError as exc:  # the query's syntax (fts5: syntax error near ...)
        raise ValidationFailed("query", f"{exc.args[0] if exc.args else exc}; use words,"
                                        ' "a phrase", OR, NOT or prefix* (FTS5 syntax)') from None
    return [SearchHit(messages.row_to_message(row[:-1], blobs), row[-1]) for row in rows]


def _validate(query: object, since_ms: object, limit: object) -> None:
    if not isinstance(query, str) or not query.strip() or len(query) > QUERY_MAX:
        raise ValidationFailed("query", f"must be 1-{QUERY_MAX} characters of FTS5 query,"
                                        " like: deploy frontend")
    if since_ms is not None and (isinstance(since_ms, bool) or not isinstance(since_ms, int)):
        raise ValidationFailed("since_ms", f"must be epoch milliseconds, got {since_ms!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise ValidationFailed("limit", f"must be 1-{LIMIT_MAX}, got {limit!r}")
