"""The `Bus`: the Python entry point to one bus file.

    with Bus.open(".worker-state/bus.db") as bus:
        bus.publish("planner", "task_assign", {"task": "t1"}, to="worker-1")
        for message in bus.poll("worker-1"):
            handle(message)
            bus.ack("worker-1", message.seq)

A Bus may be shared between threads: each thread gets its own SQLite
connection (SQLite connections must not be shared), opened on first use.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from typing import Iterable
from typing import Mapping

import apsw

from bus import cursors
from bus import messages
from bus.cursors import Cursor
from bus.db import DURABLE_BY_DURABILITY
from bus.db import connect
from bus.db import synchronous_for
from bus.db import translate_busy
from bus.db import write_transaction
from bus.errors import BusClosed
from bus.errors import ValidationFailed
from bus.messages import Message
from bus.messages import PublishResult
from bus.schema import current_version
from bus.schema import migrate

POLL_LIMIT_MAX = 10_000


class Bus:
    """An open bus database. Create with `Bus.open(path)`; close with `close()`."""

    def __init__(self, path: str, durability: str, conn: apsw.Connection) -> None:
        self.path = path
        self.durability = durability
        self.durable = DURABLE_BY_DURABILITY[durability]
        self._local = threading.local()
        self._local.conn = conn
        self._connections = [conn]
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], durability: str = "normal", *,
             create: bool = True) -> Bus:
        """Open the bus at `path`, creating and migrating it as needed.

        `durability` is "normal" (a publish survives a process crash) or
        "full" (it survives power loss too, at the cost of an fsync per
        commit). With `create=False` a missing file raises BusNotFound.
        Raises NotABusDatabase or SchemaTooNew for files it must not touch.
        """
        synchronous_for(durability)
        path = os.fspath(path)
        conn = connect(path, durability, create=create)
        try:
            migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, durability, conn)

    # --- connections ------------------------------------------------------

    @property
    def conn(self) -> apsw.Connection:
        """This thread's connection to the bus file."""
        if self._closed:
            raise BusClosed(f"the bus at {self.path} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, self.durability, create=False)
            with self._lock:
                self._connections.append(conn)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every connection this Bus opened. Calling it twice is harmless."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- publishing -------------------------------------------------------

    def publish(self, from_agent: str, type: str, payload: Any = None, *, to: str | None = None,
                id: str | None = None, correlation_id: str | None = None,
                in_reply_to: str | None = None) -> PublishResult:
        """Append one message to the log; `to=None` broadcasts it.

        Publishing again with the same `id` writes nothing and returns the
        original seq with `duplicate=True`, so retries are safe. Raises
        ValidationFailed for bad arguments and BusBusy when the database
        stays locked past the busy timeout.
        """
        row = messages.prepare_row(from_agent, type, payload, to=to, id=id,
                                   correlation_id=correlation_id, in_reply_to=in_reply_to)
        return self._insert([row])[0]

    def publish_many(self, batch: Iterable[Mapping[str, Any]]) -> list[PublishResult]:
        """Publish several messages in one transaction: all are written or none.

        Each item is a dict of `publish` arguments (from_agent, type, payload,
        to, id, correlation_id, in_reply_to). Every item is validated first.
        """
        return self._insert(messages.prepare_batch(batch))

    def _insert(self, rows: list[messages.Row]) -> list[PublishResult]:
        conn = self.conn
        results = []
        with write_transaction(conn):
            ts_ms = messages.now_ms()
            for row in rows:
                seq, duplicate = messages.insert_row(conn, row, ts_ms)
                results.append(PublishResult(seq, row.id, duplicate, self.durable))
        return results

    # --- consuming --------------------------------------------------------

    def poll(self, agent: str, limit: int = 100) -> list[Message]:
        """Messages for `agent` (addressed to it or broadcast) above its cursor, in seq order.

        Never moves the cursor: call `ack` once a message is handled, or it
        comes back on the next poll.
        """
        messages.validate_agent_id(agent)
        _validate_limit(limit)
        conn = self.conn
        with translate_busy():
            after = cursors.position(conn, agent)
            return messages.select_for_agent(conn, agent, after, limit)

    def ack(self, agent: str, seq: int) -> int:
        """Mark everything up to `seq` handled for `agent`; return the cursor position.

        The cursor only moves forward: acking an older seq is a no-op. A seq
        that was never assigned raises ValidationFailed.
        """
        messages.validate_agent_id(agent)
        messages.validate_positive_int(seq, "seq")
        conn = self.conn
        with write_transaction(conn):
            moved_to = cursors.advance(conn, agent, seq)
            if moved_to is None:
                raise ValidationFailed(
                    "seq", f"no message has seq {seq}; the last seq is {messages.last_seq(conn)}"
                )
        return moved_to

    # --- inspection -------------------------------------------------------

    def cursor(self, agent: str) -> int:
        """The last seq `agent` acknowledged (0 before its first ack)."""
        messages.validate_agent_id(agent)
        with translate_busy():
            return cursors.position(self.conn, agent)

    def list_cursors(self) -> list[Cursor]:
        """Every consumer's cursor with the number of messages waiting for it."""
        conn = self.conn
        with translate_busy():
            return [Cursor(agent, seq, updated, messages.pending_count(conn, agent, seq))
                    for agent, seq, updated in cursors.list_rows(conn)]

    def list_messages(self, after: int = 0, limit: int = 100) -> list[Message]:
        """All messages above seq `after`, whoever they are for (for tail and tools)."""
        _validate_limit(limit)
        with translate_busy():
            return messages.select_after(self.conn, after, limit)

    def last_messages(self, count: int) -> list[Message]:
        """The newest `count` messages, oldest first."""
        _validate_limit(count)
        with translate_busy():
            return messages.select_last(self.conn, count)

    def message_count(self) -> int:
        with translate_busy():
            return messages.message_count(self.conn)

    def schema_version(self) -> int:
        with translate_busy():
            return current_version(self.conn)

    def last_seq(self) -> int:
        """The highest seq assigned so far (0 for a new bus)."""
        with translate_busy():
            return messages.last_seq(self.conn)


def _validate_limit(limit: object) -> None:
    messages.validate_positive_int(limit, "limit")
    if limit > POLL_LIMIT_MAX:
        raise ValidationFailed("limit", f"is {limit}; the most one call returns is {POLL_LIMIT_MAX}")
