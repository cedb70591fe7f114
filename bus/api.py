"""The `Bus`: the Python entry point to one bus file.

    with Bus.open(".worker-state/bus.db") as bus:
        bus.publish("planner", "task_assign", {"task": "t1"}, to="worker-1")
        for message in bus.poll("worker-1"):
            handle(message)
            bus.ack("worker-1", message.seq)

(`from bus import process_loop`, bus/log/consumer.py, is that loop written once:
the acks, a handler's failure, the wait for the next message.)

The `Bus` is the log. Each other part is a property of it, made once per Bus:
`bus.channels`, `bus.tasks`, `bus.claims`, `bus.reservations`, `bus.heartbeats`
and `bus.tokens` (bus/coordination/facades.py).

A Bus may be shared between threads: each thread gets its own SQLite
connection (SQLite connections must not be shared), opened on first use.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping
from typing import Sequence
from typing import TypeVar

import apsw

from bus.coordination import claims
from bus.log import cursors
from bus.log import export as jsonl_export
from bus.coordination import heartbeats
from bus.coordination import held_names as identities
from bus.log import messages
from bus.log import receipts
from bus.log import retention
from bus.log import search as full_text
from bus.storage.blob_errors import BusBlobStore
from bus.channels.engine import Channels
from bus.coordination.claims import LEASE_MS_MAX  # noqa: F401 - part of the facade's API
from bus.coordination.claims import TASK_ID_MAX  # noqa: F401 - part of the facade's API
from bus.coordination.facades import Claims
from bus.coordination.facades import Heartbeats
from bus.coordination.facades import Reservations
from bus.coordination.facades import Tasks
from bus.coordination.facades import Tokens
from bus.log.cursors import Cursor
from bus.storage.db import DURABLE_BY_DURABILITY
from bus.storage.db import connect
from bus.storage.db import read_transaction
from bus.storage.db import refuse_write
from bus.storage.db import synchronous_for
from bus.storage.db import translate_errors
from bus.storage.db import write_transaction
from bus.storage.errors import BusClosed
from bus.storage.errors import BusReadOnly
from bus.storage.errors import UnknownConsumer
from bus.storage.errors import ValidationFailed
from bus.log.export import JsonlExporter
from bus.log.group_commit import GroupCommit
from bus.log.messages import Message
from bus.log.messages import PublishResult
from bus.log.messages import clock_ms
from bus.log.payloads import BLOB_THRESHOLD
from bus.log.payloads import MAX_PAYLOAD_BYTES
from bus.log.payloads import PayloadPolicy
from bus.log.receipts import Receipt
from bus.storage.schema import current_version
from bus.log.search import SearchHit
from bus.storage.schema import migrate
from bus.log.wake import ChangeWatcher

POLL_LIMIT_MAX = 10_000
# A wait fetches again at least this often, for what time alone brings (bus.wait_for).
WAIT_SLICE_S = 1.0
T = TypeVar("T")
GC_GRACE_SECONDS = 3600.0


class _ThreadResources:
    """What one thread opened on a Bus: its connection and, once it waits, its watcher."""

    __slots__ = ("conn", "watcher", "closables", "__weakref__")

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self.watcher: ChangeWatcher | None = None
        self.closables: list[Any] = [conn]


def _close_left_open(lock: threading.Lock, still_open: set[Any], closables: list[Any]) -> None:
    """A finished thread's connection and watcher, unless Bus.close took them already."""
    with lock:
        mine = [c for c in reversed(closables) if c in still_open]
        still_open.difference_update(mine)
    for closable in mine:
        closable.close()


class Bus:
    """An open bus database. Create with `Bus.open(path)`; close with `close()`."""

    def __init__(self, path: str, durability: str, conn: apsw.Connection, *,
                 blob_threshold: int = BLOB_THRESHOLD, blob_dir: str | None = None,
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> None:
        self.path = path
        self.durability = durability
        self.durable = DURABLE_BY_DURABILITY[durability]
        self.blobs = BusBlobStore(blob_dir or Path(path).absolute().parent / "blobs")
        # Where each payload lives; handed to the channels and the pump too.
        self.payloads = PayloadPolicy(self.blobs, blob_threshold, max_payload_bytes)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[Any] = set()  # every connection and watcher not closed yet
        self._local.mine = self._thread_resources(conn)
        self._closed = False
        self._channels: Channels | None = None
        # Publishes from this Bus's threads share transactions (bus/log/group_commit.py).
        self._publishes: GroupCommit[messages.Row, PublishResult] = GroupCommit(self._write_group)

    @classmethod
    def open(cls, path: str | os.PathLike[str], durability: str = "normal", *,
             create: bool = True, blob_threshold: int = BLOB_THRESHOLD,
             blob_dir: str | os.PathLike[str] | None = None,
             max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> Bus:
        """Open the bus at `path`, creating and migrating it as needed.

        `durability` is "normal" (a publish survives a process crash) or
        "full" (it survives power loss too, at the cost of an fsync per
        commit). With `create=False` a missing file raises BusNotFound.
        Payloads whose JSON is longer than `blob_threshold` bytes are kept in
        the blob store, `blobs/` beside the database unless `blob_dir` says.
        A payload whose JSON is longer than `max_payload_bytes` (16 MiB by
        default) is refused with ValidationFailed before anything is written.
        Raises NotABusDatabase or SchemaTooNew for files it must not touch,
        DatabaseCorrupt for a damaged one; a file this process cannot write
        opens read-only (writes raise BusReadOnly).
        """
        synchronous_for(durability)
        messages.validate_positive_int(blob_threshold, "blob_threshold")
        messages.validate_positive_int(max_payload_bytes, "max_payload_bytes")
        path = os.fspath(path)
        conn = connect(path, durability, create=create)
        try:
            migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, durability, conn, blob_threshold=blob_threshold,
                   blob_dir=os.fspath(blob_dir) if blob_dir is not None else None,
                   max_payload_bytes=max_payload_bytes)

    # --- connections ------------------------------------------------------

    @property
    def conn(self) -> apsw.Connection:
        """This thread's connection to the bus file."""
        if self._closed:
            raise BusClosed(f"the bus at {self.path} is closed")
        mine = getattr(self._local, "mine", None)
        if mine is None:
            mine = self._local.mine = self._thread_resources(
                connect(self.path, self.durability, create=False))
        return mine.conn

    def read(self) -> read_transaction:
        """The door to this thread's connection for reading: `with bus.read() as conn:`
        reads one snapshot of the file, in one read transaction (bus/storage/db.py).

        Inside a transaction this thread has open already, the reads join it. Every part
        above the log reads through here (or `write`), never through `conn`.
        """
        return read_transaction(self.conn)

    def write(self) -> write_transaction:
        """The door to this thread's connection for writing: `with bus.write() as conn:`
        is one BEGIN IMMEDIATE transaction, committed when the block ends and rolled back
        if it raises; a locked file is waited for, then BusBusy. Inside a transaction
        this thread has open already, a savepoint of it (bus/storage/db.py).
        """
        return write_transaction(self.conn)

    def _thread_resources(self, conn: apsw.Connection) -> _ThreadResources:
        """`conn` as this thread's, closed with its watcher when the thread ends: a server's
        worker threads come and go (anyio retires one idle for 10 s)."""
        mine = _ThreadResources(conn)
        with self._lock:
            self._open.add(conn)
        weakref.finalize(mine, _close_left_open, self._lock, self._open, mine.closables)
        return mine

    def close(self) -> None:
        """Close every connection this Bus opened. Calling it twice is harmless."""
        with self._lock:
            self._closed = True
            left = list(self._open)
            self._open.clear()  # in place: a finished thread's finalizer reads this same set
        for closable in sorted(left, key=lambda c: isinstance(c, apsw.Connection)):
            closable.close()  # the watchers first, then the connections they watch

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def channels(self) -> Channels:
        """The message engine on this bus: channels, delivery, acks, dead letters."""
        if self._channels is None:
            self._channels = Channels(self)
        return self._channels

    @functools.cached_property
    def claims(self) -> Claims:
        """Leased claims on tasks: claim, renew, release, the dead and the reaper."""
        return Claims(self)

    @functools.cached_property
    def tasks(self) -> Tasks:
        """The task graph: tasks, their dependencies, the ready list and its claims."""
        return Tasks(self)

    @functools.cached_property
    def reservations(self) -> Reservations:
        """Reservations of paths by glob, exclusive or shared, and the check of paths."""
        return Reservations(self)

    @functools.cached_property
    def heartbeats(self) -> Heartbeats:
        """Agents' beats: record one, read everyone's liveness, forget an agent."""
        return Heartbeats(self)

    @functools.cached_property
    def tokens(self) -> Tokens:
        """The bearer tokens that let agents elsewhere reach `bus serve`."""
        return Tokens(self)

    # --- publishing -------------------------------------------------------

    def publish(self, from_agent: str, type: str, payload: Any = None, *, to: str | None = None,
                id: str | None = None, correlation_id: str | None = None,
                in_reply_to: str | None = None, task: str | None = None,
                fence: int | None = None) -> PublishResult:
        """Append one message to the log; `to=None` broadcasts it.

        Publishing again with the same `id` writes nothing and returns the
        original seq with `duplicate=True`, so retries are safe. Raises
        ValidationFailed for bad arguments and BusBusy when the database
        stays locked past the busy timeout.

        `task` names the task the message reports on; it becomes the
        correlation id (as on the bus's own task messages). With `fence`, the
        task's lease fence (`bus.claims.try_claim(...).fence`), the message is written
        only if that fence is still current, checked in the same transaction:
        otherwise StaleFence, and nothing is written.
        """
        correlation_id = _task_correlation(task, fence, correlation_id)
        row = messages.prepare_row(from_agent, type, payload, to=to, id=id,
                                   correlation_id=correlation_id, in_reply_to=in_reply_to)
        if fence is None:
            return self._insert([row])[0]
        return self._insert_fenced(row, correlation_id, fence)

    def _insert_fenced(self, row: messages.Row, task: str, fence: int) -> PublishResult:
        """One row, written only if `fence` is `task`'s current fence (one transaction).

        Not through the group commit: the fence check must share the insert's transaction.
        """
        conn = self.conn
        refuse_write(conn)
        with self.payloads.staging():  # a refused publish leaves no blob behind
            row = self.payloads.place(row)
            with write_transaction(conn):
                claims.check_fence(conn, task, fence)
                return self._write_rows([[row]], conn)[0][0]

    def publish_many(self, batch: Iterable[Mapping[str, Any]]) -> list[PublishResult]:
        """Publish several messages in one transaction: all are written or none.

        Each item is a dict of `publish` arguments (from_agent, type, payload,
        to, id, correlation_id, in_reply_to). Every item is validated first.
        """
        rows = messages.prepare_batch(batch)
        for index, row in enumerate(rows):
            self.payloads.check_size(row, f"messages[{index}].payload")
        return self._insert(rows)

    def _insert(self, rows: list[messages.Row]) -> list[PublishResult]:
        conn = self.conn
        refuse_write(conn)  # a read-only or corrupt bus says so before a blob is written
        if self.payloads.all_inline(rows):
            return self._write_now(rows, conn)
        with self.payloads.staging():
            # Blobs are written (and fsynced) before the transaction, outside the lock.
            return self._write_now([self.payloads.place(row) for row in rows], conn)

    def _write_now(self, rows: list[messages.Row], conn: apsw.Connection) -> list[PublishResult]:
        if conn.in_transaction:  # the caller's own transaction: write in it
            return self._write_rows([rows], conn)[0]
        return self._publishes.submit(rows)

    def _write_group(self, batches: list[Sequence[messages.Row]]) -> list[list[PublishResult]]:
        """A group commit, on the leading thread's own connection.

        Not on a connection of its own: `wait_for_change` on a thread must not
        wake for what that thread published itself, and PRAGMA data_version
        ignores only the commits of the waiter's own connection.
        """
        return self._write_rows(batches, self.conn)

    def _write_rows(self, batches: list[Sequence[messages.Row]],
                    conn: apsw.Connection) -> list[list[PublishResult]]:
        """Every batch's rows in one transaction on `conn`."""
        durable = self.durable
        rows = [row for batch in batches for row in batch]
        # Up to 64 rows outside a transaction are one statement: a transaction of its own.
        one_statement = not conn.in_transaction and len(rows) <= messages.ROWS_PER_INSERT
        with translate_errors(conn) if one_statement else write_transaction(conn):
            written = iter(messages.append(conn, rows, self.payloads))
        results = []
        for batch in batches:
            results.append([PublishResult(seq, row.id, duplicate, durable)
                            for row, (seq, duplicate) in zip(batch, written)])
        return results

    @property
    def blob_threshold(self) -> int:
        """Bytes of payload JSON above which a payload goes to the blob store."""
        return self.payloads.blob_threshold

    @property
    def max_payload_bytes(self) -> int:
        """Bytes of payload JSON one message may carry."""
        return self.payloads.max_payload_bytes

    # --- consuming --------------------------------------------------------

    def poll(self, agent: str, limit: int = 100, *, wait: float = 0.0, preview: int = 0,
             include_own: bool = False) -> list[Message]:
        """Messages for `agent` above its cursor, in seq order: those addressed to it and
        other agents' broadcasts (its own too with `include_own`).

        With `wait` > 0 and nothing waiting, waits up to `wait` seconds for a
        message (`wait_for`: woken by commits, no polling). Never moves the
        cursor: call `ack` once a message is handled, or it comes back on the
        next poll. With `preview` > 0 a payload in the blob store is not
        loaded: `payload_preview` holds its first `preview` bytes.
        """
        messages.validate_agent_id(agent)
        _validate_limit(limit)

        def select() -> list[Message]:
            with translate_errors(self.conn):
                after = cursors.position(self.conn, agent)
                return messages.select_for_agent(self.conn, agent, after, limit, self.blobs,
                                                 preview, include_own)
        return self.wait_for(select, wait)

    def reply_to(self, agent: str, message_id: str, after: int) -> Message | None:
        """The first message for `agent` answering `message_id` (its in_reply_to), above
        seq `after` (the question's own seq); None while nothing answered. Moves no cursor."""
        messages.validate_agent_id(agent)
        with translate_errors(self.conn):
            return messages.select_reply(self.conn, agent, message_id, after, self.blobs)

    def answer(self, agent: str, seq: int, type: str, payload: Any = None) -> PublishResult:
        """`agent` answers message `seq`, sent to it (or broadcast), and acknowledges it.

        The answer goes to the message's sender, with in_reply_to its id and
        the same correlation_id; it is written and the cursor moved to `seq`
        in one transaction, so an answered message is never handed out again
        and an acknowledged one was answered. Raises ValidationFailed ("seq")
        when no message `seq` was sent to `agent`.
        """
        messages.validate_agent_id(agent)
        messages.validate_positive_int(seq, "seq")
        row = messages.prepare_row(agent, type, payload)
        conn = self.conn
        refuse_write(conn)
        with self.payloads.staging():  # a refused answer leaves no blob behind
            row = self.payloads.place(row)
            with write_transaction(conn):
                asked = messages.select_address(conn, seq)
                if asked is None or asked.to_agent not in (None, agent):
                    raise ValidationFailed("seq", f"no message with seq {seq} was sent to"
                                                  f" {agent}; answer a seq that poll returned")
                row = row._replace(to_agent=asked.from_agent, in_reply_to=asked.id,
                                   correlation_id=asked.correlation_id)
                sent = self._write_rows([[row]], conn)[0][0]
                cursors.advance(conn, agent, messages.past_own(conn, agent, seq))
        return sent

    def ack_if_next(self, agent: str, seq: int) -> bool:
        """Ack `seq` for `agent` only when it is the first message waiting (True then).

        Acking never skips another message: with an older one still waiting,
        nothing moves. One transaction. As `ack`, it passes the agent's own
        messages that follow `seq`.
        """
        messages.validate_agent_id(agent)
        messages.validate_positive_int(seq, "seq")
        conn = self.conn
        with write_transaction(conn):
            if messages.first_waiting(conn, agent, cursors.position(conn, agent)) != seq:
                return False
            cursors.advance(conn, agent, messages.past_own(conn, agent, seq))
        return True

    def ack(self, agent: str, seq: int, *, include_own: bool = False) -> int:
        """Mark everything up to `seq` handled for `agent`; return the cursor position.

        The cursor only moves forward: acking an older seq is a no-op. A seq
        that was never assigned raises ValidationFailed. The agent's own
        messages right after `seq` are passed too (poll does not show them),
        so the position may be above `seq`; with `include_own` (for a reader
        that polls with it) the cursor stops at `seq`.
        """
        messages.validate_agent_id(agent)
        messages.validate_positive_int(seq, "seq")
        conn = self.conn
        with write_transaction(conn):
            if not include_own and (moved_to := cursors.advance_when_next_waits(
                    conn, agent, seq)) is not None:
                return moved_to  # a queue read in order: one statement
            target = seq if include_own else messages.past_own(conn, agent, seq)
            moved_to = cursors.advance(conn, agent, target)
            if moved_to is None:
                raise ValidationFailed(
                    "seq", f"no message has seq {seq}; the last seq is {messages.last_seq(conn)}"
                )
        return moved_to

    def start_at_latest(self, agent: str) -> int:
        """Give `agent` a cursor at the last seq if it has none; return its position.

        A new consumer then sees only what is published from now on, instead
        of the whole log. An existing cursor does not move.
        """
        messages.validate_agent_id(agent)
        conn = self.conn
        with write_transaction(conn):
            cursors.start_at_latest(conn, agent)
            return cursors.position(conn, agent)

    def set_cursor(self, agent: str, seq: int | None = None, *, force: bool = False,
                   create: bool = False) -> int:
        """Put `agent`'s cursor at `seq` (None: the last seq); return the position.

        Refuses, changing nothing: an agent with neither a cursor nor a
        heartbeat (UnknownConsumer; a typo would make a cursor that holds
        back retention for ever) unless `create`; a seq past the last one;
        and a move backwards (which replays messages) unless `force`.
        """
        messages.validate_agent_id(agent)
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
            raise ValidationFailed("seq", f"must be a seq >= 0, got {seq!r}")
        conn = self.conn
        with write_transaction(conn):
            last = messages.last_seq(conn)
            target = last if seq is None else seq
            if target > last:
                raise ValidationFailed("seq", f"is {target}; the last seq is {last}")
            _check_cursor_move(conn, agent, target, force, create)
            cursors.set_position(conn, agent, target)
        return target

    def delete_cursor(self, agent: str) -> int:
        """Remove `agent`'s cursor (it stops holding back retention); return where it was.

        Raises UnknownConsumer when the agent has no cursor.
        """
        messages.validate_agent_id(agent)
        conn = self.conn
        with write_transaction(conn):
            position = cursors.delete(conn, agent)
            if position is None:
                raise UnknownConsumer(agent, cursors.known(conn), "see `bus consumers`")
        return position

    # --- delivery receipts (bus/log/receipts.py) ------------------------------

    def record_delivered(self, agent: str, shown: Iterable[Message | int], via: str,
                         session: str | None = None) -> None:
        """Record that `agent`'s session was shown these messages (or seqs): their receipts
        say delivered. Call it where a model or a person is shown them (a hook's output, a
        tool's result, `bus inbox`), with `via` naming that place (hook:Stop, mcp:poll)
        and `session` the client's session id where it has one.

        Only messages addressed to `agent` get a receipt; with none among `shown` nothing
        is written. Inside the caller's transaction when this thread has one open. On a
        file opened read-only nothing is recorded and nothing is raised: showing a
        message must not fail for want of its receipt.
        """
        seqs = [item if isinstance(item, int) else item.seq for item in shown
                if isinstance(item, int) or item.to_agent == agent]
        if not seqs:
            return
        messages.validate_agent_id(agent)
        try:
            receipts.record_delivered(self.conn, agent, seqs, via, session)
        except BusReadOnly:
            pass

    def receipt(self, seq: int) -> Receipt | None:
        """Message `seq`'s receipt (sent, delivered or acked); None when it is not a
        direct message (or there is none)."""
        messages.validate_positive_int(seq, "seq")
        with translate_errors(self.conn):
            return receipts.receipt_for(self.conn, seq)

    def recipient_warning(self, to: str | None) -> str | None:
        """A warning for a message to `to` when the bus never saw an agent of that name
        (bus/coordination/held_names.py says what counts); None for a broadcast or a known name."""
        with translate_errors(self.conn):
            return identities.recipient_warning(self.conn, to)

    def wait_for(self, fetch: Callable[[], T], seconds: float,
                 done: Callable[[T], bool] = bool) -> T:
        """`fetch()`, then again after each commit to the file, until `done` says its result
        is enough (by default: it is not empty) or `seconds` pass; the last result.

        Every wait of the library and its commands for something to arrive is
        this one: a message, a reply, a channel delivery, a pump answer. It
        fetches again at least every WAIT_SLICE_S too, for what time alone
        brings (a channel's retry coming due).
        """
        found = fetch()
        deadline = time.monotonic() + seconds
        while not done(found) and (remaining := deadline - time.monotonic()) > 0:
            self.wait_for_change(min(WAIT_SLICE_S, remaining))
            found = fetch()
        return found

    def wait_for_change(self, timeout: float, interrupt: int | None = None) -> bool:
        """Block until another connection or process commits, or `timeout` seconds pass.

        Returns True when something changed (the first call on a thread
        returns True at once), False on timeout. Uses inotify where Linux
        has it, polling `PRAGMA data_version` every millisecond otherwise.
        `process_loop` (bus/log/consumer.py) is the consumer loop built on it:
        poll, handle, ack after each success, wait here when nothing is waiting.

        `interrupt`: a readable fd (a pipe's read end) whose data ends the wait
        early (False); the caller drains it (the pump wakes its database
        thread so).
        """
        conn = self.conn  # raises BusClosed after close()
        mine = self._local.mine
        watcher = mine.watcher
        if watcher is None:
            watcher = mine.watcher = ChangeWatcher(conn, self.path)
            mine.closables.append(watcher)
            with self._lock:
                self._open.add(watcher)
        with translate_errors(self.conn):
            return watcher.wait(timeout, interrupt)

    # --- retention --------------------------------------------------------

    def gc_blobs(self, grace_seconds: float = GC_GRACE_SECONDS) -> list[str]:
        """Delete blobs no message references and untouched for `grace_seconds`."""
        _validate_grace(grace_seconds)
        with translate_errors(self.conn):
            referenced = messages.referenced_blobs(self.conn)
        return self.blobs.gc(referenced, grace_seconds)

    def compact(self, keep_days: float, *, dry_run: bool = False,
                grace_seconds: float = GC_GRACE_SECONDS,
                now: int | None = None) -> retention.CompactReport:
        """Delete messages older than `keep_days` that every cursor has acked.

        Then delete orphaned blobs (after `grace_seconds`) and checkpoint the
        WAL with TRUNCATE (PASSIVE on a bus Litestream replicates: it must see every
        frame of the WAL before it goes). `dry_run` only counts the messages.
        """
        if isinstance(keep_days, bool) or not isinstance(keep_days, (int, float)) \
                or not 0 <= keep_days < float("inf"):
            raise ValidationFailed("keep_days", f"must be a number of days >= 0, got {keep_days!r}")
        _validate_grace(grace_seconds)
        cutoff = clock_ms(now) - int(keep_days * 86_400_000)
        # The blobs' grace period runs on the real clock: it protects real writes in flight.
        with translate_errors(self.conn):
            return retention.compact(self.conn, self.blobs, cutoff, grace_seconds, dry_run)

    # --- export -------------------------------------------------------------

    def export_path(self) -> Path:
        """Where the JSONL export goes: the file it went to before, else bus.jsonl beside the db."""
        with translate_errors(self.conn):
            return jsonl_export.export_path(self.conn, self.path)

    def export_partition_by(self) -> str | None:
        """How the export at `export_path()` is partitioned: "date" or None (one file).

        A partitioned export is a directory and a single one a file, from its
        first run on (JsonlExporter refuses the other), so the path says it.
        """
        return "date" if self.export_path().is_dir() else None

    def exporter(self, path: str | os.PathLike[str] | None = None,
                 partition_by: str | None = None) -> JsonlExporter:
        """A JsonlExporter for `path`, not yet opened.

        Without `path` it continues the export where it went before
        (`export_path()`), partitioned as it was (`export_partition_by()`)
        unless `partition_by` says.
        """
        refuse_write(self.conn)  # it records its position in the bus: say so before any file
        if path is None:
            path = self.export_path()
            partition_by = partition_by or self.export_partition_by()
        return JsonlExporter(self.conn, path, partition_by)

    def export_jsonl(self, path: str | os.PathLike[str] | None = None,
                     partition_by: str | None = None) -> int:
        """Append every message not exported yet to the JSONL export; return how many.

        `partition_by="date"` writes `date=YYYY-MM-DD/part-*.jsonl` under the
        directory `path` (for Spark). Exactly once across crashes (see
        bus/log/export.py); one exporter at a time.
        """
        with translate_errors(self.conn), self.exporter(path, partition_by) as exporter:
            return exporter.export()

    # --- inspection -------------------------------------------------------

    def cursor(self, agent: str) -> int:
        """The last seq `agent` acknowledged (0 before its first ack)."""
        messages.validate_agent_id(agent)
        with translate_errors(self.conn):
            return cursors.position(self.conn, agent)

    def list_cursors(self) -> list[Cursor]:
        """Every consumer's cursor with the number of messages waiting for it."""
        conn = self.conn
        with translate_errors(self.conn):
            return [Cursor(agent, seq, updated, messages.pending_count(conn, agent, seq))
                    for agent, seq, updated in cursors.list_rows(conn)]

    def list_messages(self, after: int = 0, limit: int = 100, *,
                      preview: int = 0) -> list[Message]:
        """All messages above seq `after`, whoever they are for (for tail and tools).

        `preview` as in `poll`.
        """
        _validate_limit(limit)
        with translate_errors(self.conn):
            return messages.select_after(self.conn, after, limit, self.blobs, preview)

    def message_for(self, agent: str, seq: int) -> list[Message]:
        """The message `seq` whole, acked or not, when it is one for `agent` (to it, or a
        broadcast); [] otherwise. For the rest of a body a hook showed cut short."""
        messages.validate_positive_int(seq, "seq")
        found = self.list_messages(seq - 1, 1)
        return [m for m in found if m.seq == seq and m.to_agent in (None, agent)]

    def last_messages(self, count: int, *, preview: int = 0) -> list[Message]:
        """The newest `count` messages, oldest first; `preview` as in `poll`."""
        _validate_limit(count)
        with translate_errors(self.conn):
            return messages.select_last(self.conn, count, self.blobs, preview)

    def enable_search(self) -> int:
        """Build the full-text index of payloads (bus/log/search.py); how many it holds.

        From then on every publish indexes its payload (at a cost: see
        `scripts/bench.py`) and compaction removes what it deletes.
        """
        return full_text.enable(self.conn)

    def disable_search(self) -> None:
        full_text.disable(self.conn)

    def search(self, query: str, *, type: str | None = None, from_agent: str | None = None,
               to: str | None = None, since_ms: int | None = None,
               limit: int = 50) -> list[SearchHit]:
        """Messages whose payload matches `query` (FTS5: words, "phrase", OR, NOT,
        prefix*), best first. Raises SearchDisabled until `enable_search()`.

            bus.search("deploy frontend", type="note", limit=10)
        """
        return full_text.search(self.conn, query, self.blobs, type=type, sender=from_agent,
                                to=to, since_ms=since_ms, limit=limit)

    def message_count(self) -> int:
        with translate_errors(self.conn):
            return messages.message_count(self.conn)

    def schema_version(self) -> int:
        with translate_errors(self.conn):
            return current_version(self.conn)

    def last_seq(self) -> int:
        """The highest seq assigned so far (0 for a new bus)."""
        with translate_errors(self.conn):
            return messages.last_seq(self.conn)


def _check_cursor_move(conn: apsw.Connection, agent: str, target: int, force: bool,
                       create: bool) -> None:
    if not cursors.exists(conn, agent):
        if not (create or heartbeats.has_beaten(conn, agent)):
            raise UnknownConsumer(agent, cursors.known(conn),
                                  "pass create=True to start a new consumer")
        return
    current = cursors.position(conn, agent)
    if target < current and not force:
        raise ValidationFailed("seq", f"{target} is behind {agent}'s cursor at {current}, which"
                                      " would hand it those messages again; pass force=True"
                                      " to replay them")


def _task_correlation(task: str | None, fence: object, correlation_id: str | None) -> str | None:
    """The correlation id of a message about `task`: the task's id."""
    if task is None:
        if fence is not None:
            raise ValidationFailed("fence", "is the fence of a task: name the task too")
        return correlation_id
    task = messages.validate_text(task, "task", claims.TASK_ID_MAX)
    if correlation_id is not None and correlation_id != task:
        raise ValidationFailed("correlation_id", f"is {correlation_id!r} but task is {task!r}; a"
                                                 " message about a task is correlated by its id:"
                                                 " pass one of them")
    return task


def _validate_grace(grace_seconds: object) -> None:
    if isinstance(grace_seconds, bool) or not isinstance(grace_seconds, (int, float)) \
            or not 0 <= grace_seconds < float("inf"):
        raise ValidationFailed("grace_seconds", f"must be seconds >= 0, got {grace_seconds!r}")


def _validate_limit(limit: object) -> None:
    messages.validate_positive_int(limit, "limit")
    if limit > POLL_LIMIT_MAX:
        raise ValidationFailed("limit", f"is {limit}; the most one call returns is {POLL_LIMIT_MAX}")
