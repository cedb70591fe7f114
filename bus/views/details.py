"""What `bus top` reads beyond the status: the task table, and one row opened.

A worker's state history is its own `state_change` messages (the lifecycle
publishes one in the transaction of each transition; the views read the log,
they do not import the lifecycle). An agent's last messages are those it sent
or was sent among the newest RECENT_WINDOW of the log, so opening an agent
costs the same on a bus of a million messages. Tasks come from the task
graph's own functions (bus/coordination/tasks.py). Every read goes through the caller's
read-only connection, in its transaction.

Plain strings, as bus/views/render.py: the terminal view puts them on a screen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Sequence

import apsw
import orjson

from bus.log import messages
from bus.coordination import tasks
from bus.log.messages import Message
from bus.log.messages import iso_utc
from bus.log.messages import row_to_message
from bus.coordination.tasks import task_detail_of
from bus.coordination.worker_table import StateChange
from bus.coordination.worker_table import task_state_changes
from bus.views import render
from bus.views.status import Status

if TYPE_CHECKING:
    from blobs.store import BlobStore

TASK_COLUMNS = ["task", "state", "priority", "waiting on", "holder", "title"]
RECENT_WINDOW = 10_000  # messages an agent's last messages are looked for among
RECENT_MAX = 12  # last messages shown of an agent or a task
HISTORY_MAX = 200  # state changes shown of a worker (the newest)
BODY_MAX = 80  # characters of a payload shown on one line
PREVIEW_BYTES = 256  # of a payload kept in the blob store: never loaded whole

_CONTROLS = {code: " " for code in [*range(32), 127]}
_COLUMNS = (
    "seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload, payload_ref"
)
# Sent: the seq range bounds the scan (no index leads with the sender); received:
# idx_messages_to_seq walks from the newest.
_AGENT_MESSAGES_SQL = (
    f"SELECT * FROM (SELECT {_COLUMNS} FROM messages WHERE from_agent = :agent AND seq > :floor"
    " ORDER BY seq DESC LIMIT :limit)"
    f" UNION SELECT * FROM (SELECT {_COLUMNS} FROM messages WHERE to_agent = :agent"
    " ORDER BY seq DESC LIMIT :limit)"
    " ORDER BY seq DESC LIMIT :limit"
)
# A task's messages carry its id as correlation id (idx_messages_correlation_seq).
_TASK_MESSAGES_SQL = (
    f"SELECT {_COLUMNS} FROM messages WHERE correlation_id = ? ORDER BY seq DESC LIMIT ?"
)


def worker_history(conn: apsw.Connection, worker: str, task: str) -> list[StateChange]:
    """The transitions of `worker` on `task`, oldest first (the newest HISTORY_MAX)."""
    return task_state_changes(conn, worker, task, HISTORY_MAX)


def agent_messages(conn: apsw.Connection, agent: str,
                   blobs: BlobStore | None = None) -> list[Message]:
    """The newest messages `agent` sent or was sent, newest first (a payload in `blobs`
    by its first PREVIEW_BYTES)."""
    floor = max(0, messages.last_seq(conn) - RECENT_WINDOW)
    rows = conn.execute(_AGENT_MESSAGES_SQL, {"agent": agent, "floor": floor,
                                              "limit": RECENT_MAX})
    return [row_to_message(row, blobs, PREVIEW_BYTES) for row in rows]


def task_messages(conn: apsw.Connection, task: str,
                  blobs: BlobStore | None = None) -> list[Message]:
    """The newest messages about `task` (its id as correlation id), newest first."""
    rows = conn.execute(_TASK_MESSAGES_SQL, (task, RECENT_MAX))
    return [row_to_message(row, blobs, PREVIEW_BYTES) for row in rows]


def task_rows(conn: apsw.Connection, status: Status) -> list[tuple[str, ...]]:
    """Every task of the graph, in the order it was added, with what holds an open one
    back: `ready`, `held` (a live lease), `blocked` (dependencies not done), or `open`
    (none of these: a task whose claims ran out). A file older than the graph has none."""
    if status.file.schema_version < tasks.TASKS_SCHEMA_VERSION:
        return []
    ready = {t.task_id for t in tasks.ready(conn, status.now_ms)}
    holders = _live_holders(status)
    return [(t.task_id, _task_state(t, ready, holders), str(t.priority), str(t.waiting_on),
             holders.get(t.task_id, "-"), t.title or "-") for t in tasks.list_tasks(conn)]


def _live_holders(status: Status) -> dict[str, str]:
    return {c.task_id: f"{c.agent} (fence {c.fence})" for c in status.claims.claims
            if not c.expired(status.now_ms)}


def _task_state(task: tasks.Task, ready: set[str], holders: dict[str, str]) -> str:
    if task.state != tasks.OPEN:
        return task.state
    if task.task_id in ready:
        return "ready"
    if task.task_id in holders:
        return "held"
    return "blocked" if task.blocked else "open"


def task_lines(conn: apsw.Connection, status: Status, task_id: str) -> list[str]:
    """A task as `bus task show` has it (bus/coordination/tasks.py's `task_detail_of`): its state
    and holder, what it depends on, what waits on it, the newest messages about it."""
    task = (tasks.get(conn, task_id)
            if status.file.schema_version >= tasks.TASKS_SCHEMA_VERSION else None)
    if task is None:
        return [f"task {task_id}: not in the task graph"]
    detail = task_detail_of(conn, task, status.now_ms)
    ready = {t.task_id for t in tasks.ready(conn, status.now_ms)}
    holders = _live_holders(status)
    lines = [f"task {task_id}" + (f": {task.title}" if task.title else ""),
             f"  state     {_task_state(task, ready, holders)}",
             f"  priority  {task.priority}", f"  holder    {holders.get(task_id, '-')}",
             f"  added     {iso_utc(task.created_at_ms)}"]
    if task.finished_at_ms is not None:
        lines.append(f"  {task.state:9} {iso_utc(task.finished_at_ms)}"
                     f" by {task.finished_by or '-'}")
    for title, found in (("depends on", detail.dependencies), ("needed by", detail.dependents)):
        lines += ["", f"{title} ({len(found)}):"]
        lines += [f"  {t.task_id}  {_task_state(t, ready, holders)}" for t in found] or ["  none"]
    lines += ["", f"events ({len(detail.events)}, oldest first):"]
    return lines + ([f"  {iso_utc(ts)[11:23]}  #{seq:<6} {sender}  {type_}"
                     for seq, ts, sender, type_ in detail.events] or ["  none"])


# --- lines --------------------------------------------------------------------------


def message_line(m: Message) -> str:
    """One line: seq, time (UTC), sender → recipient (* for everyone), type, short body."""
    return (f"{m.seq:>6}  {iso_utc(m.ts_ms)[11:23]}  {m.from_agent} → {m.to_agent or '*'}"
            f"  {m.type}  {short_body(m)}").rstrip()


def short_body(m: Message) -> str:
    """The payload on one line, cut to BODY_MAX characters; a blob by its size."""
    if m.payload_ref is not None:
        size = "" if m.payload_size is None else f" {render.human_bytes(m.payload_size)}"
        return f"[blob{size}] {_cut(m.payload_preview or '')}".rstrip()
    if m.payload_error is not None:
        return f"[{m.payload_error}]"
    if m.payload is None:
        return ""
    text = m.payload if isinstance(m.payload, str) else orjson.dumps(m.payload).decode()
    return _cut(text)


def _cut(text: str) -> str:
    """One line of at most BODY_MAX characters; control characters (newlines, a payload's
    escape sequences) become spaces, so no message moves the cursor or recolours the screen."""
    cut = text if len(text) <= BODY_MAX else text[:BODY_MAX - 1] + "…"
    return cut.translate(_CONTROLS)


def worker_lines(status: Status, worker: str, history: Sequence[StateChange],
                 sent: Sequence[Message]) -> list[str]:
    """A worker: its row, its state history, its liveness as an agent, its messages."""
    found = next((w for w in status.worker_list if w.worker == worker), None)
    if found is None:
        return [f"worker {worker}: no longer in the workers table"]
    lines = [f"worker {worker}", f"  state   {found.state}", f"  task    {found.task}",
             f"  branch  {found.branch}",
             f"  changed {render.seconds((status.now_ms - found.updated_ms) / 1000)} ago",
             "", f"state history ({len(history)}, from its state_change messages):"]
    lines += [f"  {iso_utc(h.ts_ms)[11:23]}  #{h.seq:<6} {h.from_state or '(new)'} → "
              f"{h.to_state}  ({h.command or '?'})" for h in history] or ["  none in the log"]
    return lines + [""] + _liveness_lines(status, worker) + [""] + _message_lines(sent)


def agent_lines(status: Status, agent: str, recent: Sequence[Message]) -> list[str]:
    """An agent: liveness, the claims it holds, its cursor, its last messages."""
    lines = [f"agent {agent}"] + _liveness_lines(status, agent)
    held = [c for c in status.claims.claims if c.agent == agent]
    lines += ["", f"claims ({len(held)}):"]
    lines += [f"  {c.task_id}  fence {c.fence}  lease left "
              f"{render.seconds((c.lease_until_ms - status.now_ms) / 1000)}"
              f"  attempt {c.attempts}/{c.max_attempts}" for c in held] or ["  none held"]
    consumer = status.consumer(agent)
    lines.append("")
    lines.append("cursor: none (never acked)" if consumer is None else
                 f"cursor: {consumer.cursor}, {consumer.pending} pending, lag {consumer.lag},"
                 f" last ack {render.last_ack(consumer)}")
    return lines + [""] + _message_lines(recent)


def row_lines(title: str, columns: Sequence[str], row: Sequence[str],
              recent: Sequence[Message] = ()) -> list[str]:
    """Any other row: its cells by column, and the messages about it when there are any."""
    width = max(len(c) for c in columns)
    lines = [title] + [f"  {c.ljust(width)}  {v}" for c, v in zip(columns, row)]
    return lines + ([""] + _message_lines(recent) if recent else [])


def _liveness_lines(status: Status, agent: str) -> list[str]:
    beat = next((a for a in status.agents if a.agent == agent), None)
    if beat is None:
        return ["liveness: no heartbeat from it"]
    progress = "" if beat.progress is None else f", progress {beat.progress:g}"
    return [f"liveness: {beat.state}, silent {render.seconds(beat.age_s)}, status {beat.status},"
            f" task {beat.task or '-'}{progress}"]


def _message_lines(recent: Sequence[Message]) -> list[str]:
    return [f"last messages ({len(recent)}, newest first):"] + (
        ["  " + message_line(m) for m in recent] or ["  none"])
