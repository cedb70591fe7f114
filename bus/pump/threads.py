"""The thread registry: call chains behind opaque UUIDs.

A conversation is a chain of rows linked by parent id. The root row names
the organism; each child names the listener the call went to:

    my-org                      (root, from initialize_root)
      console                   (the client that started a conversation)
        greeter                 (console called greeter)
          calc.add              (greeter called calc.add)

Handlers only ever see a row's UUID. `extend_chain` makes a new row with a
new random UUID on every call, so two conversations on the same path have
different threads and a reply bubbles back (`prune_for_response`) to the
parent of the thread it answers, never to the other conversation. Chains are
tuples of names, not dotted strings: listener names may contain '.'.
Answered threads are closed, not deleted: the table is the history.

Every function takes a connection. Writes run in `write_transaction`, which
is BEGIN IMMEDIATE on its own and a savepoint inside a caller's transaction,
so the pump can record thread rows in the same commit as its replies:

    with write_transaction(conn):
        pruned = threads.prune_for_response(conn, thread_uuid)
        ...insert the reply on pruned.thread.uuid, ack the input...

`ThreadRegistry` wraps the same functions around a `Bus` and an organism
name for callers that do not manage transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import Sequence

import apsw
import orjson

from bus.storage.db import translate_busy
from bus.storage.db import write_transaction
from bus.storage.errors import ValidationFailed
from bus.log.messages import iso_utc
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from bus.log.messages import validate_agent_id
from bus.log.messages import validate_message_id
from bus.log.messages import validate_positive_int
from bus.pump.errors import ThreadAmbiguous
from bus.pump.errors import ThreadClosed
from bus.pump.errors import ThreadConflict
from bus.pump.errors import ThreadNotFound

if TYPE_CHECKING:
    from bus.api import Bus

STATUSES = ("open", "closed")
LIST_LIMIT_MAX = 10_000
PATH_SEPARATOR = "/"  # for display only: names cannot contain it
CONVERSATION_DEPTH = 1  # organism/client: the thread a client's request starts

_INSERT_SQL = (
    "INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms)"
    " VALUES (?, ?, ?, ?, ?) RETURNING id"
)
_BY_UUID_SQL = "SELECT id, status, closed_at_ms, depth, parent_id FROM threads WHERE uuid = ?"
_OPEN_ROOT_SQL = (
    "SELECT id FROM threads WHERE parent_id IS NULL AND name = ? AND status = 'open'"
)
# LIMIT 2: one row or "more than one" is all get_or_create needs to know.
_OPEN_CHILDREN_SQL = (
    "SELECT id FROM threads WHERE parent_id = ? AND name = ? AND status = 'open' LIMIT 2"
)
_OPEN_CHILDREN_COUNT_SQL = (
    "SELECT count(*) FROM threads WHERE parent_id = ? AND name = ? AND status = 'open'"
)
_CLOSE_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = ? WHERE id = ? AND status = 'open'"
)
_ROWS_SQL = (
    "SELECT t.id, t.uuid, p.uuid, t.status, t.created_at_ms, t.closed_at_ms"
    " FROM threads t LEFT JOIN threads p ON p.id = t.parent_id"
    " WHERE t.id IN (SELECT value FROM json_each(?)) ORDER BY t.id"
)
# Every listed row's ancestors, walked up by parent id: (start row, name) by depth.
_PATHS_SQL = (
    "WITH RECURSIVE up(start, id, parent_id, name, depth) AS ("
    " SELECT id, id, parent_id, name, depth FROM threads"
    " WHERE id IN (SELECT value FROM json_each(?))"
    " UNION ALL SELECT up.start, t.id, t.parent_id, t.name, t.depth"
    " FROM threads t JOIN up ON t.id = up.parent_id)"
    " SELECT start, name FROM up ORDER BY start, depth"
)
_LATEST_IDS_SQL = (
    "SELECT id FROM (SELECT id FROM threads WHERE status = coalesce(:status, status)"
    " ORDER BY id DESC LIMIT :limit) ORDER BY id"
)
_COUNT_SQL = "SELECT count(*) FROM threads WHERE status = coalesce(?, status)"
# The pump's hot path: one statement each, no path loading.
_EXTEND_SQL = (
    "INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms)"
    " SELECT ?, id, ?, depth + 1, ? FROM threads WHERE uuid = ? AND status = 'open'"
    " RETURNING uuid"
)
# An inline unit's thread once its handler only answered: written closed, its
# parent (the caller the answers go to) named by the same statement.
_ANSWERED_CHILD_SQL = (
    "INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms, status, closed_at_ms)"
    " SELECT ?1, id, ?2, depth + 1, ?3, 'closed', ?3 FROM threads"
    " WHERE uuid = ?4 AND status = 'open'"
    " RETURNING (SELECT p.name FROM threads p WHERE p.id = threads.parent_id), depth - 1"
)
# extend_uuid (or answered_child, :closed_at set) for many calls at once: calls is a
# JSON array of [child uuid, name, parent uuid]; one whose parent is not open writes nothing.
# (The one-call statements above stay: for a single call this one costs 17 us
# against 13, the JSON and json_each, on the path of every unit written alone.)
_ADD_CHILDREN_SQL = (
    "INSERT INTO threads (uuid, parent_id, name, depth, created_at_ms, status, closed_at_ms)"
    " SELECT c.value ->> 0, t.id, c.value ->> 1, t.depth + 1, :now,"
    " iif(:closed_at IS NULL, 'open', 'closed'), :closed_at"
    " FROM json_each(:calls) c JOIN threads t ON t.uuid = c.value ->> 2 AND t.status = 'open'"
    " RETURNING uuid, (SELECT p.name FROM threads p WHERE p.id = threads.parent_id), depth - 1"
)
# answer_to, and close_if_done of the caller when it is a client's conversation
# (depth 1), in one statement: a call's thread closes and so does its caller's,
# unless something else under it is still open. The call's row names the caller.
_ANSWER_CALL_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = :now"
    " WHERE status = 'open' AND parent_id IS NOT NULL AND (uuid = :call OR (uuid = :caller"
    " AND depth = 1 AND NOT EXISTS (SELECT 1 FROM threads c WHERE c.parent_id = threads.id"
    " AND c.status = 'open' AND c.uuid != :call)))"
    " RETURNING uuid, (SELECT p.name FROM threads p WHERE p.id = threads.parent_id), depth - 1"
)
_CALLER_SQL = (
    "SELECT t.id, t.status, t.name, t.depth, p.uuid, p.name, p.depth"
    " FROM threads t LEFT JOIN threads p ON p.id = t.parent_id WHERE t.uuid = ?"
)
# answer_to's usual case in one statement: close an open child, name its parent.
_CLOSE_CALLER_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = ?"
    " WHERE uuid = ? AND status = 'open' AND parent_id IS NOT NULL"
    " RETURNING (SELECT p.uuid FROM threads p WHERE p.id = threads.parent_id),"
    " (SELECT p.name FROM threads p WHERE p.id = threads.parent_id),"
    " (SELECT p.depth FROM threads p WHERE p.id = threads.parent_id)"
)

# A finished call's parent closes once nothing under it is still open: a
# conversation whose reply reached its client, a forwarding caller whose last
# answer came back.
_CLOSE_IF_DONE_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = ? WHERE uuid = ? AND status = 'open'"
    " AND parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM threads c"
    " WHERE c.parent_id = threads.id AND c.status = 'open')"
)
# _CLOSE_CALLER_SQL for a JSON array of uuids.
_CLOSE_CALLS_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = :now"
    " WHERE uuid IN (SELECT value FROM json_each(:uuids)) AND status = 'open'"
    " AND parent_id IS NOT NULL RETURNING uuid,"
    " (SELECT p.uuid FROM threads p WHERE p.id = threads.parent_id),"
    " (SELECT p.name FROM threads p WHERE p.id = threads.parent_id),"
    " (SELECT p.depth FROM threads p WHERE p.id = threads.parent_id)"
)
# close_if_done for a JSON array of uuids.
_CLOSE_ALL_IF_DONE_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = :now"
    " WHERE uuid IN (SELECT value FROM json_each(:uuids)) AND status = 'open'"
    " AND parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM threads c"
    " WHERE c.parent_id = threads.id AND c.status = 'open')"
)
# A call's thread and its callers' up to the conversation (depth 1): id, uuid, name, depth.
_CHAIN_SQL = (
    "WITH RECURSIVE up(id, parent_id, uuid, name, depth) AS ("
    " SELECT id, parent_id, uuid, name, depth FROM threads WHERE uuid = ?"
    " UNION ALL SELECT t.id, t.parent_id, t.uuid, t.name, t.depth"
    " FROM threads t JOIN up ON t.id = up.parent_id WHERE up.depth > 1)"
    " SELECT id, uuid, name, depth FROM up"
)
_CLOSE_IDS_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = ?"
    " WHERE id IN (SELECT value FROM json_each(?)) AND status = 'open'"
)
# close_if_done that names the parent, for close_done_chain's walk up.
_CLOSE_IF_DONE_UP_SQL = (
    "UPDATE threads SET status = 'closed', closed_at_ms = ? WHERE uuid = ? AND status = 'open'"
    " AND parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM threads c"
    " WHERE c.parent_id = threads.id AND c.status = 'open')"
    " RETURNING (SELECT p.uuid FROM threads p WHERE p.id = threads.parent_id), depth"
)
# Every row of an organism's trees, roots included (clear()).
_TREE_IDS_SQL = (
    "WITH RECURSIVE tree(id) AS (SELECT id FROM threads WHERE parent_id IS NULL AND name = ?"
    " UNION ALL SELECT t.id FROM threads t JOIN tree ON t.parent_id = tree.id)"
    " SELECT json_group_array(id) FROM tree"
)
_DELETE_IDS_SQL = "DELETE FROM threads WHERE id IN (SELECT value FROM json_each(?))"


@dataclass(frozen=True)
class Thread:
    """One registry row: `path` runs from the organism (root) to this thread's listener."""

    uuid: str
    path: tuple[str, ...]
    parent_uuid: str | None
    status: str
    created_at_ms: int
    closed_at_ms: int | None

    @property
    def name(self) -> str:
        """The listener this thread's calls go to (the organism for a root)."""
        return self.path[-1]

    @property
    def is_root(self) -> bool:
        return self.parent_uuid is None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid, "path": list(self.path), "parent": self.parent_uuid,
            "status": self.status, "created_at_ms": self.created_at_ms,
            "created": iso_utc(self.created_at_ms), "closed_at_ms": self.closed_at_ms,
            "closed": None if self.closed_at_ms is None else iso_utc(self.closed_at_ms),
        }


@dataclass(frozen=True)
class Pruned:
    """The outcome of `prune_for_response`.

    `closed` is the answering thread, now closed. `thread` is its parent,
    the caller's thread, where the reply goes (check `thread.status`: a
    caller that answered already has a closed thread). `target` is the
    caller's name, or None when the parent is the organism's root: the reply
    leaves the organism (egress to the client).
    """

    closed: Thread
    thread: Thread
    target: str | None


# --- reads ------------------------------------------------------------------


def get_thread(conn: apsw.Connection, uuid: str) -> Thread | None:
    """The thread with this UUID, or None."""
    uuid = validate_message_id(uuid, "thread")
    with translate_busy():
        row = conn.execute(_BY_UUID_SQL, (uuid,)).fetchone()
        return None if row is None else _load(conn, [row[0]])[0]


def lookup(conn: apsw.Connection, uuid: str) -> tuple[str, ...] | None:
    """The call chain behind a UUID (organism first), or None for an unknown UUID."""
    thread = get_thread(conn, uuid)
    return None if thread is None else thread.path


def find_root(conn: apsw.Connection, organism: str) -> Thread | None:
    """The open root thread of `organism`, or None before `initialize_root`."""
    organism = validate_agent_id(organism, "organism")
    with translate_busy():
        root_id = conn.execute(_OPEN_ROOT_SQL, (organism,)).get
        return None if root_id is None else _load(conn, [root_id])[0]


def list_threads(conn: apsw.Connection, status: str | None = None,
                 limit: int = 100) -> list[Thread]:
    """The newest `limit` threads (all, or only `status` ones), oldest first."""
    _validate_status(status)
    validate_positive_int(limit, "limit")
    if limit > LIST_LIMIT_MAX:
        raise ValidationFailed("limit", f"is {limit}; the most one call returns is "
                                        f"{LIST_LIMIT_MAX}")
    with translate_busy():
        ids = [row[0] for row in conn.execute(_LATEST_IDS_SQL, {"status": status, "limit": limit})]
        return _load(conn, ids)


def thread_count(conn: apsw.Connection, status: str | None = None) -> int:
    _validate_status(status)
    with translate_busy():
        return conn.execute(_COUNT_SQL, (status,)).get


# --- writes -------------------------------------------------------------------


def initialize_root(conn: apsw.Connection, organism: str, now: int | None = None) -> Thread:
    """The organism's open root thread, created on the first call.

    A restarted pump gets the same root back, so it can tell a restart from
    a first start (see `find_root`).
    """
    organism = validate_agent_id(organism, "organism")
    with write_transaction(conn):
        root_id = _open_root_id(conn, organism, _now(now))
        return _load(conn, [root_id])[0]


def get_or_create(conn: apsw.Connection, path: Sequence[str], now: int | None = None) -> Thread:
    """The open thread at `path` (organism first), creating the missing rows.

    Raises ThreadAmbiguous when several open conversations share a prefix of
    the path: those are told apart by UUID only. A new conversation is
    `extend_chain`, which never reuses a thread.
    """
    names = _validate_path(path)
    with write_transaction(conn):
        at = _now(now)
        current = _open_root_id(conn, names[0], at)
        for depth, name in enumerate(names[1:], start=1):
            found = conn.execute(_OPEN_CHILDREN_SQL, (current, name)).fetchall()
            if len(found) > 1:
                count = conn.execute(_OPEN_CHILDREN_COUNT_SQL, (current, name)).get
                raise ThreadAmbiguous(names[:depth + 1], count)
            current = found[0][0] if found else _insert(conn, current, name, depth, at)
        return _load(conn, [current])[0]


def extend_chain(conn: apsw.Connection, uuid: str, name: str, now: int | None = None) -> Thread:
    """A new thread under `uuid` for a call to listener `name`; always a new UUID.

    Raises ThreadNotFound for an unknown UUID and ThreadClosed for a closed one.
    """
    name = validate_agent_id(name, "name")
    uuid = validate_message_id(uuid, "thread")
    with write_transaction(conn):
        parent_id, depth, _ = _open_row(conn, uuid)
        child_id = _insert(conn, parent_id, name, depth + 1, _now(now))
        return _load(conn, [child_id])[0]


def prune_for_response(conn: apsw.Connection, uuid: str, now: int | None = None) -> Pruned:
    """Close the answering thread `uuid`; say where its reply goes (its parent).

    Raises ThreadNotFound, ThreadClosed (it answered already) or
    ValidationFailed for a root, which has no caller.
    """
    uuid = validate_message_id(uuid, "thread")
    with write_transaction(conn):
        row_id, depth, parent_id = _open_row(conn, uuid)
        if parent_id is None:
            raise ValidationFailed("thread", f"{uuid} is a root thread; a root has no "
                                             "caller to answer")
        conn.execute(_CLOSE_SQL, (_now(now), row_id))
        threads = {thread.uuid: thread for thread in _load(conn, [row_id, parent_id])}
    closed = threads.pop(uuid)
    parent, = threads.values()
    return Pruned(closed, parent, None if parent.is_root else parent.name)


def register_thread(conn: apsw.Connection, thread_id: str, initiator: str, target: str,
                    organism: str, now: int | None = None) -> Thread:
    """Register a caller-chosen UUID as organism/initiator/target.

    The initiator gets a new thread of its own under the root, so replies
    bubble to this conversation only. Registering the same UUID for the same
    path again returns the thread (a retried ingress); for another path it
    raises ThreadConflict.
    """
    thread_id = validate_message_id(thread_id, "thread_id")
    wanted = tuple(validate_agent_id(value, field) for value, field in (
        (organism, "organism"), (initiator, "initiator"), (target, "target")))
    with write_transaction(conn):
        existing = conn.execute(_BY_UUID_SQL, (thread_id,)).fetchone()
        if existing is not None:
            thread, = _load(conn, [existing[0]])
            if thread.path != wanted:
                raise ThreadConflict(thread_id, thread.path, wanted)
            return thread
        at = _now(now)
        initiator_id = _insert(conn, _open_root_id(conn, organism, at), initiator, 1, at)
        target_id = _insert(conn, initiator_id, target, 2, at, thread_id)
        return _load(conn, [target_id])[0]


def close_thread(conn: apsw.Connection, uuid: str, now: int | None = None) -> Thread:
    """Close a thread (kept for history); closing a closed thread changes nothing."""
    uuid = validate_message_id(uuid, "thread")
    with write_transaction(conn):
        row = conn.execute(_BY_UUID_SQL, (uuid,)).fetchone()
        if row is None:
            raise ThreadNotFound(uuid)
        conn.execute(_CLOSE_SQL, (_now(now), row[0]))
        return _load(conn, [row[0]])[0]


@dataclass(frozen=True)
class Caller:
    """Who an answer on a thread goes to: the parent thread's UUID, name and depth."""

    uuid: str
    name: str
    depth: int


def open_conversation(conn: apsw.Connection, organism: str, client: str, now: int) -> str:
    """A new conversation of `client` under the organism's root (made on the first call):
    its UUID. `initialize_root` then `extend_chain` in two statements, for a caller that
    checked both names (client.send); runs inside the caller's write transaction."""
    uuid = new_message_id()
    _insert(conn, _open_root_id(conn, organism, now), client, 1, now, uuid)
    return uuid


def extend_uuid(conn: apsw.Connection, uuid: str, name: str, now: int,
                child: str | None = None) -> str:
    """`extend_chain` for callers that checked their arguments: the new UUID only
    (`child`, if given, else a new one).

    One statement instead of four; the same errors (ThreadNotFound, ThreadClosed).
    Runs inside the caller's write transaction.
    """
    child = conn.execute(_EXTEND_SQL, (child or new_message_id(), name, now, uuid)).get
    if child is None:
        _open_row(conn, uuid)  # raises: unknown or closed
    return child


def answered_child(conn: apsw.Connection, uuid: str, child: str, name: str,
                   now: int) -> Caller:
    """`extend_uuid(conn, uuid, name, now, child)` then `answer_to(conn, child, now)` in
    one statement, for a call answered in the transaction that made it.

    The thread is written closed: the same row, one write fewer. Raises as
    extend_uuid does.
    """
    row = conn.execute(_ANSWERED_CHILD_SQL, (child, name, now, uuid)).fetchone()
    if row is None:
        _open_row(conn, uuid)  # raises: unknown or closed
    return Caller(uuid, *row)


def add_children(conn: apsw.Connection, calls: Sequence[tuple[str, str, str]], now: int,
                 closed: bool = False) -> dict[str, Caller]:
    """`extend_uuid` for many calls, (child uuid, name, parent uuid) each, in one
    statement (`answered_child` with `closed`): the caller of each child written, by
    child uuid. A call whose parent is not open is missing (nothing written for it)."""
    parents = {child: parent for child, _, parent in calls}
    rows = conn.execute(_ADD_CHILDREN_SQL, {"calls": orjson.dumps(calls), "now": now,
                                            "closed_at": now if closed else None})
    return {child: Caller(parents[child], name, depth) for child, name, depth in rows}


def close_calls(conn: apsw.Connection, uuids: Sequence[str], now: int) -> dict[str, Caller]:
    """Close the open call threads `uuids` in one statement: the caller of each one
    closed, by uuid (one that was not open, or a root, is missing)."""
    rows = conn.execute(_CLOSE_CALLS_SQL, {"uuids": orjson.dumps(uuids), "now": now})
    return {uuid: Caller(parent, name, depth) for uuid, parent, name, depth in rows}


def close_all_if_done(conn: apsw.Connection, uuids: Sequence[str], now: int) -> None:
    """`close_if_done` for each of `uuids`, in one statement."""
    conn.execute(_CLOSE_ALL_IF_DONE_SQL, {"uuids": orjson.dumps(uuids), "now": now})


def answer_call(conn: apsw.Connection, uuid: str, caller: str, now: int) -> Caller | None:
    """`answer_to(conn, uuid, now)` for a call made on thread `caller`, with
    `close_if_done(conn, caller, now)` when the caller is a client's conversation: one
    statement. None if `uuid` was not open (nothing closed then but maybe the
    conversation, which answer_to's closing would have closed too)."""
    rows = conn.execute(_ANSWER_CALL_SQL, {"now": now, "call": uuid, "caller": caller})
    return next((Caller(caller, name, depth) for closed, name, depth in rows
                 if closed == uuid), None)


def answer_to(conn: apsw.Connection, uuid: str, now: int) -> Caller:
    """`prune_for_response` that tolerates an answered thread: close `uuid` if it is
    open and return its parent (a root answers to itself).

    A broadcast caller gets several answers on one thread, and a thread whose
    handler answered before is closed; both still answer to the same caller.
    Runs inside the caller's write transaction; raises ThreadNotFound.
    """
    closed = conn.execute(_CLOSE_CALLER_SQL, (now, uuid)).fetchone()
    if closed is not None:
        return Caller(*closed)
    row = conn.execute(_CALLER_SQL, (uuid,)).fetchone()
    if row is None:
        raise ThreadNotFound(uuid)
    row_id, status, name, depth, parent_uuid, parent_name, parent_depth = row
    if status == "open" and parent_uuid is not None:
        conn.execute(_CLOSE_SQL, (now, row_id))
    if parent_uuid is None:
        return Caller(uuid, name, depth)
    return Caller(parent_uuid, parent_name, parent_depth)


def caller_at(conn: apsw.Connection, uuid: str) -> Caller:
    """The thread `uuid` itself as a Caller (its name and depth); raises ThreadNotFound."""
    row = conn.execute(_CALLER_SQL, (uuid,)).fetchone()
    if row is None:
        raise ThreadNotFound(uuid)
    return Caller(uuid, row[2], row[3])


def close_if_done(conn: apsw.Connection, uuid: str, now: int) -> bool:
    """Close `uuid` if no thread under it is open (never a root); whether it closed.

    Runs inside the caller's write transaction.
    """
    conn.execute(_CLOSE_IF_DONE_SQL, (now, uuid))
    return conn.changes() > 0


def close_chain(conn: apsw.Connection, uuid: str, now: int) -> Caller:
    """Close `uuid` and every caller's thread above it, up to the conversation (depth 1),
    which stays as it is: the conversation as a Caller (a FinalAnswer goes there).

    A chain ended by a handler deep in it (a FinalAnswer) is pruned whole: the
    forwarding callers between it and the client will get no answer to answer.
    Runs inside the caller's write transaction; raises ThreadNotFound.
    """
    chain = conn.execute(_CHAIN_SQL, (uuid,)).fetchall()
    if not chain:
        raise ThreadNotFound(uuid)
    _, top_uuid, top_name, top_depth = chain[-1]
    calls = [row_id for row_id, _, _, depth in chain if depth > CONVERSATION_DEPTH]
    if calls:
        conn.execute(_CLOSE_IDS_SQL, (now, orjson.dumps(calls)))
    return Caller(top_uuid, top_name, top_depth)


def close_done_chain(conn: apsw.Connection, uuid: str, now: int) -> None:
    """`close_if_done(uuid)`, then the same for its caller's thread while one closes, up
    to and including the conversation: a chain whose handler had nothing to say ends.

    A caller with another call still open under it stays open (a broadcast
    waits for its other answers). Runs inside the caller's write transaction.
    """
    while True:
        row = conn.execute(_CLOSE_IF_DONE_UP_SQL, (now, uuid)).fetchone()
        if row is None or row[1] <= CONVERSATION_DEPTH:
            return
        uuid = row[0]


def clear(conn: apsw.Connection, organism: str) -> int:
    """Delete every thread of `organism`, open or closed, roots included; how many.

    For tests and scratch buses (`registry.clear()`): the rows are
    the conversation history, and a running pump's units refer to them.
    """
    organism = validate_agent_id(organism, "organism")
    with write_transaction(conn):
        ids = conn.execute(_TREE_IDS_SQL, (organism,)).get
        conn.execute(_DELETE_IDS_SQL, (ids,))
        return conn.changes()


class ThreadRegistry:
    """The registry of one organism on a `Bus`, one transaction per call (through the
    bus's doors, `bus.read()` and `bus.write()`).

        registry = ThreadRegistry(bus, "my-org")
        root = registry.initialize_root()
        call = registry.extend_chain(registry.get_or_create(["my-org", "console"]).uuid, "greeter")
        registry.prune_for_response(call.uuid).target   # "console"
    """

    def __init__(self, bus: Bus, organism: str) -> None:
        self.bus = bus
        self.organism = validate_agent_id(organism, "organism")

    def initialize_root(self, now: int | None = None) -> Thread:
        with self.bus.write() as conn:
            return initialize_root(conn, self.organism, now)

    def get_or_create(self, path: Sequence[str], now: int | None = None) -> Thread:
        with self.bus.write() as conn:
            return get_or_create(conn, path, now)

    def lookup(self, uuid: str) -> tuple[str, ...] | None:
        with self.bus.read() as conn:
            return lookup(conn, uuid)

    def get(self, uuid: str) -> Thread | None:
        with self.bus.read() as conn:
            return get_thread(conn, uuid)

    def extend_chain(self, uuid: str, name: str, now: int | None = None) -> Thread:
        with self.bus.write() as conn:
            return extend_chain(conn, uuid, name, now)

    def prune_for_response(self, uuid: str, now: int | None = None) -> Pruned:
        with self.bus.write() as conn:
            return prune_for_response(conn, uuid, now)

    def register_thread(self, thread_id: str, initiator: str, target: str,
                        now: int | None = None) -> Thread:
        with self.bus.write() as conn:
            return register_thread(conn, thread_id, initiator, target, self.organism, now)

    def close(self, uuid: str, now: int | None = None) -> Thread:
        with self.bus.write() as conn:
            return close_thread(conn, uuid, now)

    def clear(self) -> int:
        """Delete all of this organism's threads (for tests and scratch buses only)."""
        with self.bus.write() as conn:
            return clear(conn, self.organism)


# --- helpers -------------------------------------------------------------------


def _open_root_id(conn: apsw.Connection, organism: str, at: int) -> int:
    root_id = conn.execute(_OPEN_ROOT_SQL, (organism,)).get
    return root_id if root_id is not None else _insert(conn, None, organism, 0, at)


def _open_row(conn: apsw.Connection, uuid: str) -> tuple[int, int, int | None]:
    """(row id, depth, parent row id) of an open thread; raises ThreadNotFound or ThreadClosed."""
    row = conn.execute(_BY_UUID_SQL, (uuid,)).fetchone()
    if row is None:
        raise ThreadNotFound(uuid)
    row_id, status, closed_at_ms, depth, parent_id = row
    if status == "closed":
        raise ThreadClosed(uuid, closed_at_ms)
    return row_id, depth, parent_id


def _insert(conn: apsw.Connection, parent_id: int | None, name: str, depth: int, at: int,
            uuid: str | None = None) -> int:
    return conn.execute(_INSERT_SQL, (uuid or new_message_id(), parent_id, name, depth, at)).get


def _load(conn: apsw.Connection, ids: Iterable[int]) -> list[Thread]:
    """Threads by row id, in id order, with their paths (two queries for any number)."""
    ids_json = orjson.dumps(list(ids))
    paths: dict[int, list[str]] = {}
    for start, name in conn.execute(_PATHS_SQL, (ids_json,)):
        paths.setdefault(start, []).append(name)
    return [Thread(uuid, tuple(paths[row_id]), parent, status, created, closed)
            for row_id, uuid, parent, status, created, closed
            in conn.execute(_ROWS_SQL, (ids_json,))]


def _validate_path(path: object) -> tuple[str, ...]:
    if isinstance(path, str) or not isinstance(path, Sequence) or not path:
        raise ValidationFailed("path", "must be a non-empty list of names, organism first "
                                       "(names may contain '.', so a dotted string is ambiguous)")
    return tuple(validate_agent_id(name, f"path[{i}]") for i, name in enumerate(path))


def _validate_status(status: object) -> None:
    if status is not None and status not in STATUSES:
        raise ValidationFailed("status", f"{status!r} is not one of: {', '.join(STATUSES)}")


def _now(now: int | None) -> int:
    return now_ms() if now is None else now
