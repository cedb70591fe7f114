"""The series behind `bus serve`'s charts: plain SQL over the file, read-only.

Each function returns JSON-ready lists that the page hands to Plotly as
they are. The server keeps the history (`History`): a page opened now shows
the last hour, and each read looks only at what was committed since the last.
"""

from __future__ import annotations

from typing import Any

import apsw

from bus.coordination.worker_table import TERMINAL_STATES
from bus.views.status import Status

HISTORY_WINDOW_MS = 3600 * 1000  # throughput, lag and takeovers: the last hour
BUCKET_MS = 10_000  # one point per ten seconds: 360 to the hour
HISTORY_SCAN_MAX = 500_000  # messages the first read of the hour looks at, at most
SWIMLANE_WINDOW_MS = 24 * 3600 * 1000
SWIMLANE_SCAN_MAX = 200_000  # messages the first read of the swimlanes looks at, at most
# Segments sent to a page, the newest: each page gets the whole series at each
# change, and a busy day's thousands of lanes would be megabytes a second.
SWIMLANE_SEGMENTS_MAX = 1500
THREADS_MAX = 500
# Every query below reads a seq range (the primary key): the first read of a
# server looks back a bounded window, then each read only the messages
# committed since the last, so the charts cost the same on a file of a million.
_RATE_SQL = (
    "SELECT type, ts_ms / :bucket, count(*) FROM messages"
    " WHERE seq > :after AND ts_ms >= :since GROUP BY 1, 2"
)
# The worker lifecycle publishes every transition as `state_change` from the
# worker, payload {"from", "to", "command"}.
_STATE_CHANGES_SQL = (
    "SELECT seq, from_agent, ts_ms, payload ->> '$.to' FROM messages"
    " WHERE seq > :after AND type = 'state_change' AND ts_ms >= :since AND json_valid(payload)"
    " ORDER BY seq"
)
# A takeover is announced by the bus (bus/coordination/claims.py try_claim) as task_reclaimed.
_TAKEOVERS_SQL = (
    "SELECT ts_ms, payload ->> '$.new_holder', correlation_id FROM messages"
    " WHERE seq > :after AND type = 'task_reclaimed' AND ts_ms >= :since AND json_valid(payload)"
    " ORDER BY seq"
)
_LAST_SEQ_SQL = "SELECT max(seq) FROM messages"
_THREADS_SQL = (
    "SELECT t.uuid, p.uuid, t.name, t.status FROM threads t"
    " LEFT JOIN threads p ON p.id = t.parent_id ORDER BY t.id DESC LIMIT :limit"
)


class History:
    """What the charts show over time, kept by the server so a page opened now shows
    the last hour: messages per bucket by type and takeovers (from the log), each
    consumer's lag and each agent's liveness (sampled at each read: the file keeps
    only the last cursor and beat), and each worker's state changes (from its
    state_change messages).

    `update(conn, status)` reads only the messages committed since the last
    call; a log whose last seq went down (the file was replaced) starts over.
    """

    def __init__(self) -> None:
        self.last_seq: int | None = None
        self.rate: dict[tuple[str, int], int] = {}
        self.lag: dict[str, dict[int, int]] = {}
        self.changes: dict[str, list[tuple[int, str]]] = {}
        self.takeovers: list[tuple[int, str, str]] = []
        # agent -> ((since_ms, liveness state), ...), each change the server saw. A
        # tuple replaced whole at each change, so a page's thread reads it without a lock.
        self.liveness: dict[str, tuple[tuple[int, str], ...]] = {}

    def update(self, conn: apsw.Connection, status: Status) -> None:
        now, last = status.now_ms, conn.execute(_LAST_SEQ_SQL).get or 0
        if self.last_seq is None or last < self.last_seq:
            self.__init__()  # type: ignore[misc]
            after_rate, after_lanes = last - HISTORY_SCAN_MAX, last - SWIMLANE_SCAN_MAX
        else:
            after_rate = after_lanes = self.last_seq
        since = now - HISTORY_WINDOW_MS
        params = {"after": after_rate, "since": since, "bucket": BUCKET_MS}
        for type_, bucket, count in conn.execute(_RATE_SQL, params):
            self.rate[type_, bucket] = self.rate.get((type_, bucket), 0) + count
        lanes = {"after": after_lanes, "since": now - SWIMLANE_WINDOW_MS}
        for _seq, worker, ts_ms, state in conn.execute(_STATE_CHANGES_SQL, lanes):
            self.changes.setdefault(worker, []).append((ts_ms, state))
        self.takeovers.extend(conn.execute(_TAKEOVERS_SQL, {"after": after_rate, "since": since}))
        for consumer in status.consumers:
            self.lag.setdefault(consumer.agent, {})[now // BUCKET_MS] = consumer.lag
        for agent in status.agents:
            seen = self.liveness.get(agent.agent, ())
            if not seen or seen[-1][1] != agent.state:
                self.liveness[agent.agent] = (*seen, (now, agent.state))
        self.last_seq = last
        self._forget_before(now)

    def _forget_before(self, now: int) -> None:
        oldest = (now - HISTORY_WINDOW_MS) // BUCKET_MS
        self.rate = {key: n for key, n in self.rate.items() if key[1] >= oldest}
        for points in self.lag.values():
            for bucket in [b for b in points if b < oldest]:
                del points[bucket]
        self.takeovers = [t for t in self.takeovers if t[0] >= now - HISTORY_WINDOW_MS]
        for agent, seen in list(self.liveness.items()):
            # the last change before the window says what the agent was at its start
            kept = [i for i, (ts, _state) in enumerate(seen) if ts >= now - HISTORY_WINDOW_MS]
            first = max(0, (kept[0] if kept else len(seen)) - 1)
            if first:
                self.liveness[agent] = seen[first:]
        cutoff = now - SWIMLANE_WINDOW_MS
        for worker in list(self.changes):
            kept = self.changes[worker]
            # keep the last change before the window: the state the window starts in
            first = max((i for i, (ts, _s) in enumerate(kept) if ts < cutoff), default=0)
            self.changes[worker] = kept[first:]


def chart_data(conn: apsw.Connection, status: Status,
               history: History | None = None) -> dict[str, Any]:
    """Every chart's series as of `status` (read in the caller's read transaction).

    Without `history` (one-off callers) a fresh one reads the last hour now.
    """
    if history is None:
        history = History()
    history.update(conn, status)
    return {"rate": message_rate(history), "lag": consumer_lag(history, status),
            "swimlane": worker_swimlane(history, status.now_ms),
            "claims": claims_by_agent(status, history), "threads": call_trees(conn),
            "window_ms": [status.now_ms - HISTORY_WINDOW_MS, status.now_ms]}


def message_rate(history: History) -> dict[str, dict[str, list[int]]]:
    """type -> {"t": bucket start in epoch ms, "n": messages in that bucket}, the last hour."""
    series: dict[str, dict[str, list[int]]] = {}
    for (type_, bucket), count in sorted(history.rate.items()):
        one = series.setdefault(type_, {"t": [], "n": []})
        one["t"].append(bucket * BUCKET_MS)
        one["n"].append(count)
    return series


def consumer_lag(history: History, status: Status) -> dict[str, dict[str, list[int]]]:
    """consumer -> {"t": epoch ms, "lag": messages behind}, one point per bucket it was
    sampled in; only the consumers there are now."""
    series = {}
    for consumer in status.consumers:
        points = history.lag.get(consumer.agent, {})
        buckets = sorted(points)
        series[consumer.agent] = {"t": [b * BUCKET_MS for b in buckets],
                                  "lag": [points[b] for b in buckets]}
    return series


def worker_swimlane(history: History, now_ms: int) -> list[dict[str, Any]]:
    """One segment per worker state: {worker, state, start_ms, end_ms, terminal}.

    A state lasts until the next change; the last one until now, except a
    terminal state (COMPLETED, CANCELLED, FAILED), which ends where it starts:
    the worker is gone, its lane stops. At most the newest SWIMLANE_SEGMENTS_MAX.
    """
    segments: list[dict[str, Any]] = []
    for worker in sorted(history.changes):
        changes = history.changes[worker]
        for (start, state), following in zip(changes, [*changes[1:], None]):
            terminal = state in TERMINAL_STATES
            end = following[0] if following else (start if terminal else now_ms)
            segments.append({"worker": worker, "state": state, "start_ms": start,
                             "end_ms": end, "terminal": terminal})
    if len(segments) > SWIMLANE_SEGMENTS_MAX:
        newest = sorted(s["start_ms"] for s in segments)[-SWIMLANE_SEGMENTS_MAX]
        segments = [s for s in segments if s["start_ms"] >= newest]
    return segments


def claims_by_agent(status: Status, history: History) -> dict[str, dict[str, int]]:
    """holder -> {"held": claims now, "taken_over": takeovers it made in the last hour,
    counted from the bus's task_reclaimed messages}."""
    found: dict[str, dict[str, int]] = {}
    for claim in status.claims.claims:
        found.setdefault(claim.agent, {"held": 0, "taken_over": 0})["held"] += 1
    for _ts, new_holder, _task in history.takeovers:
        found.setdefault(new_holder, {"held": 0, "taken_over": 0})["taken_over"] += 1
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
