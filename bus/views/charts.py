"""The series behind `bus serve`'s charts: plain SQL over the file, read-only.

Each function returns JSON-ready lists that the page hands to Plotly as
they are. Every query is bounded (a window of time or a row limit) so a
long-lived bus does not make the page slower with age.
"""

from __future__ import annotations

from typing import Any

import apsw

from bus.views.status import Status

RATE_WINDOW_S = 300  # the messages-per-second chart covers the last five minutes
RATE_MESSAGES_MAX = 20_000  # ... and at most this many of the newest messages
SWIMLANE_WINDOW_MS = 24 * 3600 * 1000
THREADS_MAX = 500
# seq orders time (a message's ts_ms is its commit time), so a seq range on the
# primary key bounds the scan and the time filter trims it.
_RATE_SQL = (
    "SELECT type, ts_ms / 1000 AS second, count(*) FROM messages"
    " WHERE seq > :after AND ts_ms >= :since GROUP BY type, second ORDER BY type, second"
)
# The worker lifecycle publishes every transition as `state_change` from the
# worker, payload {"from", "to", "command"}; idx_messages_type_from_ts serves it.
_STATE_CHANGES_SQL = (
    "SELECT from_agent, ts_ms, json_extract(payload, '$.to') FROM messages"
    " WHERE type = 'state_change' AND ts_ms >= :since AND json_valid(payload)"
    " ORDER BY from_agent, ts_ms"
)
_THREADS_SQL = (
    "SELECT t.uuid, p.uuid, t.name, t.status FROM threads t"
    " LEFT JOIN threads p ON p.id = t.parent_id ORDER BY t.id DESC LIMIT :limit"
)


def chart_data(conn: apsw.Connection, status: Status) -> dict[str, Any]:
    """Every chart's series as of `status` (read in the caller's read transaction)."""
    return {"rate": message_rate(conn, status), "lag": consumer_lag(status),
            "swimlane": worker_swimlane(conn, status.now_ms), "claims": claims_by_agent(status),
            "threads": call_trees(conn)}


def message_rate(conn: apsw.Connection, status: Status) -> dict[str, dict[str, list[int]]]:
    """type -> {"t": epoch seconds, "n": messages in that second}, over the last window."""
    params = {"after": status.log.last_seq - RATE_MESSAGES_MAX,
              "since": status.now_ms - RATE_WINDOW_S * 1000}
    series: dict[str, dict[str, list[int]]] = {}
    for type_, second, count in conn.execute(_RATE_SQL, params):
        one = series.setdefault(type_, {"t": [], "n": []})
        one["t"].append(second)
        one["n"].append(count)
    return series


def consumer_lag(status: Status) -> dict[str, int]:
    """consumer -> lag now; the page keeps the history of these points."""
    return {c.agent: c.lag for c in status.consumers}


def worker_swimlane(conn: apsw.Connection, now_ms: int) -> list[dict[str, Any]]:
    """One segment per worker state: {worker, state, start_ms, end_ms}, the last one open."""
    segments: list[dict[str, Any]] = []
    for worker, ts_ms, state in conn.execute(_STATE_CHANGES_SQL,
                                             {"since": now_ms - SWIMLANE_WINDOW_MS}):
        previous = segments[-1] if segments else None
        if previous is not None and previous["worker"] == worker:
            previous["end_ms"] = ts_ms
        segments.append({"worker": worker, "state": state, "start_ms": ts_ms, "end_ms": now_ms})
    return segments


def claims_by_agent(status: Status) -> dict[str, dict[str, int]]:
    """holder -> {"held": claims, "taken_over": those on a second attempt or later}."""
    found: dict[str, dict[str, int]] = {}
    for claim in status.claims.claims:
        counts = found.setdefault(claim.agent, {"held": 0, "taken_over": 0})
        counts["held"] += 1
        counts["taken_over"] += claim.attempts > 1
    return found


def call_trees(conn: apsw.Connection) -> dict[str, list[str]]:
    """The newest threads as a forest for a sunburst: ids, parents ("" for a root), labels."""
    rows = conn.execute(_THREADS_SQL, {"limit": THREADS_MAX}).fetchall()
    shown = {uuid for uuid, _parent, _name, _status in rows}
    ids, parents, labels = [], [], []
    for uuid, parent, name, thread_status in reversed(rows):
        ids.append(uuid)
        parents.append(parent if parent in shown else "")
        labels.append(name if thread_status == "open" else f"{name} (closed)")
    return {"ids": ids, "parents": parents, "labels": labels}
