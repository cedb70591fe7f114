"""The log as a person browses it: newest first, a page at a time, filtered.

    filt = LogFilter.from_params({"type": "note", "since": "1h"})
    page = browse.list_messages(conn, filt, now_ms())   # a LogPage
    older = browse.list_messages(conn, replace(filt, before=page.next_before), now_ms())

The console's message browser and the MCP resources read the log through
this one query. (A channel's messages have their own filter, the
`MessageFilter` of bus/channels/queries.py, over what channels add to a
message: topic, priority, delivery status.)

Paging is by seq, newest first (keyset: `seq < :before`), so a page costs the
same at the first message as at the millionth. Filters the indexes on
`messages` serve (recipient: idx_messages_to_seq; task: idx_messages_correlation_seq;
text: the FTS5 index) walk their index; the others (type, sender) walk the
log backwards from `before` and stop after SCAN_WINDOW messages, so a rare
type never reads the whole log in one page: the page says where it stopped
and the next one goes on from there. Indexes on type or sender would cost
every publish (DESIGN.md, "Every index on messages is paid on each publish").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import apsw

from bus.log import messages
from bus.log import search
from bus.storage.errors import ValidationFailed
from bus.log.messages import COLUMNS
from bus.log.messages import Message
from bus.log.messages import row_to_message

PAGE_SIZE = 50
PAGE_SIZE_MAX = 500
SCAN_WINDOW = 200_000  # messages a page without an indexed filter reads at most

# A filter's condition; only those given are joined (identifiers are these
# constants, every value is bound).
_CONDITIONS = {
    "type": "type = :type",
    "sender": "from_agent = :sender",
    "to": "to_agent = :to",
    "task": "correlation_id = :task",
    "since": "ts_ms >= :since",
    "text": "seq IN (SELECT rowid FROM message_search WHERE message_search MATCH :text)",
}
_INDEXED = frozenset({"to", "task", "text"})
_SEQ_RANGE = "seq < :before AND seq >= :floor"
_SINCE_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_SINCE_RE = re.compile(r"^\s*(\d{1,6})\s*([smhdw])\s*$")
_FIRST_AT_OR_AFTER_SQL = "SELECT seq, ts_ms FROM messages WHERE seq >= ? ORDER BY seq LIMIT 1"
_MIN_SEQ_SQL = "SELECT min(seq) FROM messages"


@dataclass(frozen=True)
class LogFilter:
    """What `/messages` shows; every field is a URL parameter of the same name.

    `since` is relative ("15m", "1h", "2d"); `before` is the keyset: messages
    with a lower seq (None: from the newest).
    """

    type: str | None = None
    sender: str | None = None
    to: str | None = None
    task: str | None = None
    since: str | None = None
    text: str | None = None
    before: int | None = None
    limit: int = PAGE_SIZE

    @classmethod
    def from_params(cls, params: dict[str, str]) -> LogFilter:
        """From URL parameters; empty ones are absent. ValidationFailed names a bad one."""
        given = {k: v.strip() for k, v in params.items() if v.strip()}
        before = given.get("before")
        limit = given.get("limit", str(PAGE_SIZE))
        if before is not None and not before.isdigit():
            raise ValidationFailed("before", f"must be a seq (a whole number), got {before!r}")
        if not limit.isdigit() or not 1 <= int(limit) <= PAGE_SIZE_MAX:
            raise ValidationFailed("limit", f"must be 1-{PAGE_SIZE_MAX}, got {limit!r}")
        found = cls(**{k: given.get(k) for k in ("type", "sender", "to", "task", "since", "text")},
                    before=int(before) if before is not None else None, limit=int(limit))
        if found.since is not None:
            since_ms(found.since)  # refuse a bad one now, with its name
        return found

    def params(self, **changes: Any) -> dict[str, str]:
        """The URL parameters of this filter (with `changes`), the empty ones left out."""
        # not dataclasses.asdict, which deep-copies: a page asks twice, and it was
        # a tenth of the page's time
        values = {**vars(self), **changes}
        if values["limit"] == PAGE_SIZE:
            values["limit"] = None
        return {k: str(v) for k, v in values.items() if v is not None}

    def conditions(self) -> list[str]:
        return [name for name in _CONDITIONS if getattr(self, name) is not None]


@dataclass(frozen=True)
class LogPage:
    """One page of the browser: the messages, and where the next (older) page starts.

    `scanned_to` is the lowest seq this page looked at when it stopped at the
    scan window without filling the page (None when it did not stop early);
    `next_before` is None at the oldest message.
    """

    messages: list[Message]
    next_before: int | None
    scanned_to: int | None
    search_enabled: bool

    def to_json_dict(self) -> dict[str, Any]:
        return {"messages": [m.to_json_dict() for m in self.messages],
                "next_before": self.next_before, "scanned_to": self.scanned_to,
                "search_enabled": self.search_enabled}


def since_ms(text: str) -> int:
    """"15m", "1h", "2d" as milliseconds; ValidationFailed naming `since` otherwise."""
    match = _SINCE_RE.match(text)
    if match is None:
        raise ValidationFailed("since", f"must be a number and a unit (s, m, h, d, w), like 15m"
                                        f" or 1h, got {text!r}")
    return int(match.group(1)) * _SINCE_UNITS[match.group(2)]


def message_page_sql(filt: LogFilter) -> str:
    """The browser's SQL for `filt` (also run alone by scripts/bench_views.py)."""
    where = [_CONDITIONS[name] for name in filt.conditions()]
    return (f"SELECT {COLUMNS} FROM messages WHERE {' AND '.join(where + [_SEQ_RANGE])}"
            " ORDER BY seq DESC LIMIT :limit")


def message_page_params(conn: apsw.Connection, filt: LogFilter, now: int) -> dict[str, Any]:
    """The values message_page_sql binds: the filter's, and the seq range to walk
    (`floor`: where this page stops, see page_range)."""
    return _page_params_and_start(conn, filt, now)[0]


def _page_params_and_start(conn: apsw.Connection, filt: LogFilter,
                           now: int) -> tuple[dict[str, Any], int]:
    """message_page_params, and where the filter's range starts (see page_range)."""
    params: dict[str, Any] = {name: getattr(filt, name) for name in filt.conditions()}
    if filt.since is not None:
        params["since"] = now - since_ms(filt.since)
    before, floor, start = page_range(conn, filt, params.get("since"))
    params.update(before=before, floor=floor, limit=filt.limit)
    return params, start


def page_range(conn: apsw.Connection, filt: LogFilter,
               since: int | None) -> tuple[int, int, int]:
    """(before, floor, start) of a page: it shows seqs below `before` and at or above
    `floor`; the filter's range begins at `start` (the first message of `since`, or
    the oldest). `floor` is `start` when an index serves the filter, else at most
    SCAN_WINDOW below `before`."""
    before = filt.before if filt.before is not None else messages.last_seq(conn) + 1
    # seq orders time: the first message of the range is found by bisection, not a scan
    start = first_seq_at(conn, since) if since is not None else _min_seq(conn)
    indexed = bool(_INDEXED & set(filt.conditions()))
    return before, start if indexed else max(start, before - SCAN_WINDOW), start


def list_messages(conn: apsw.Connection, filt: LogFilter, now: int,
                  blobs: Any = None) -> LogPage:
    """A page of messages matching `filt`, newest first (see the module's note on paging).

    Raises SearchDisabled for `text` on a bus without the search index, and
    ValidationFailed naming `text` for a query FTS5 cannot parse.
    """
    enabled = search.is_enabled(conn)
    if filt.text is not None and not enabled:
        raise search.SearchDisabled()
    params, start = _page_params_and_start(conn, filt, now)
    try:
        rows = conn.execute(message_page_sql(filt), params).fetchall()
    except apsw.SQLError as exc:  # only the FTS5 query can be malformed here
        raise ValidationFailed("text", f"{exc}; use words, \"a phrase\", OR, NOT or prefix*"
                                       " (FTS5 syntax)") from None
    found = [row_to_message(row, blobs, preview=200) for row in rows]
    if len(found) == filt.limit:
        return LogPage(found, found[-1].seq, None, enabled)
    floor = params["floor"]
    if floor > start:  # stopped at the window: the next page goes on from there
        return LogPage(found, floor, floor, enabled)
    return LogPage(found, None, None, enabled)


def first_seq_at(conn: apsw.Connection, ts_ms: int) -> int:
    """The lowest seq whose message is at or after `ts_ms`, by bisecting the log on seq
    (commit times grow with seq): some twenty primary-key lookups, not a scan."""
    low, high = _min_seq(conn), messages.last_seq(conn) + 1
    while low < high:
        middle = (low + high) // 2
        row = conn.execute(_FIRST_AT_OR_AFTER_SQL, (middle,)).fetchone()
        if row is None or row[1] >= ts_ms:
            high = middle
        else:
            low = row[0] + 1
    return low


def _min_seq(conn: apsw.Connection) -> int:
    return conn.execute(_MIN_SEQ_SQL).get or 0
