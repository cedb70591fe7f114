"""Agent names taken at run time (`bus mcp` without --agent): a name, its holder, its token.

    with bus.write() as conn:
        token = join_name(conn, "alice")           # a new name: a fresh reclaim token
        join_name(conn, "alice", token)            # after a restart: the name back
        renew_name(conn, "alice", token)           # the serving process, every HOLD_MS / 4

A name is held while its holder renews it (HOLD_MS, the stale threshold of
liveness): no other session can take it then, nor the name of an agent whose
heartbeat is that fresh. The reclaim token takes it back at any time, so a
session restarted before its hold ran out is itself again. Only the token's
SHA-256 is stored: reading the file does not give the name away.

The names live in `meta` (one row `agent_name:<name>` each, JSON), as other
small per-bus state does, so they need no schema version of their own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import apsw
import orjson

from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.coordination.heartbeats import STOPPED
from bus.log.messages import now_ms
from bus.log.messages import validate_agent_id

HOLD_MS = 100_000  # as long as liveness's "stale": a holder silent that long has let go
_KEY_PREFIX = "agent_name:"
_GET_SQL = "SELECT value FROM meta WHERE key = ?"
_PUT_SQL = ("INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value")
_BEAT_SQL = "SELECT ts_ms, status FROM heartbeats WHERE agent_id = ?"
# A compound SELECT with LIMIT 1 stops at the first part that finds the name, so the
# key lookups come first and only a name none of them knows pays for the last part:
# "a message from it" reads the log (no index has from_agent first: one would be paid
# on every publish), which is the rare case of a recipient never seen.
_EVER_SEEN_SQL = (
    "SELECT 1 FROM heartbeats WHERE agent_id = :name"
    " UNION ALL SELECT 1 FROM cursors WHERE agent_id = :name"
    " UNION ALL SELECT 1 FROM workers WHERE worker_id = :name"
    " UNION ALL SELECT 1 FROM meta WHERE key = :key"
    " UNION ALL SELECT 1 FROM receipts WHERE agent = :name"
    " UNION ALL SELECT 1 FROM tokens WHERE agent = :name"
    " UNION ALL SELECT 1 FROM messages WHERE from_agent = :name"
    " LIMIT 1"
)


class NameTaken(BusError):
    """A live agent (a holder that renews, or a fresh heartbeat) has the name."""

    error_code = "name_taken"

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"name: {name!r} is taken ({why}); choose another name, or give the"
                         " reclaim_token join returned for it")
        self.field = "name"
        self.name = name


class BadReclaimToken(BusError):
    """The token given is not the one join gave for the name (or the name was never joined)."""

    error_code = "bad_reclaim_token"

    def __init__(self, name: str, joined: bool) -> None:
        why = ("is not the token join returned for it" if joined
               else "cannot reclaim it: nobody ever joined under this name")
        super().__init__(f"reclaim_token: {why} ({name!r}); join without a token to take a"
                         " free name, or give the token of your earlier join")
        self.field = "reclaim_token"
        self.name = name


def ever_seen(conn: apsw.Connection, name: str) -> bool:
    """Whether any trace of an agent `name` is on the bus: a heartbeat, a cursor, a worker,
    a joined name, a delivery to it, a token or a message from it."""
    return conn.execute(_EVER_SEEN_SQL, {"name": name, "key": _KEY_PREFIX + name}).get is not None


def recipient_warning(conn: apsw.Connection, to: str | None) -> str | None:
    """What to tell the sender of a message to `to` when no agent of that name was ever
    seen (`ever_seen`); None for a broadcast or a known name. Such a message is still
    accepted, since its agent may come later, but the name is likely a typo."""
    if to is None or ever_seen(conn, to):
        return None
    return (f"no agent named {to!r} is known to this bus (no heartbeat, cursor, worker,"
            " token, delivery or message from it); the message waits for it. Check the"
            " name: bus status lists the agents")


def join_name(conn: apsw.Connection, name: str, reclaim_token: str | None = None,
              now: int | None = None) -> str:
    """Take `name` (or take it back with its token); return the reclaim token.

    Raises NameTaken when a live agent has the name and no token is given,
    BadReclaimToken for a wrong token, ValidationFailed for a bad name.
    """
    name = validate_agent_id(name, "name")
    now = now_ms() if now is None else now
    with write_transaction(conn):
        held = _held(conn, name)
        if reclaim_token is not None:
            if held is None or not hmac.compare_digest(held["token_sha256"],
                                                       _digest(reclaim_token)):
                raise BadReclaimToken(name, held is not None)
            token = reclaim_token
        else:
            _refuse_live(conn, name, held, now)
            token = secrets.token_urlsafe(24)
        _hold(conn, name, _digest(token), now)
    return token


def renew_name(conn: apsw.Connection, name: str, token: str, now: int | None = None) -> bool:
    """Hold `name` HOLD_MS longer; False when another session took it back with the token's
    successor (a join after the hold ran out), so this one holds it no more."""
    now = now_ms() if now is None else now
    with write_transaction(conn):
        held = _held(conn, name)
        if held is None or not hmac.compare_digest(held["token_sha256"], _digest(token)):
            return False
        _hold(conn, name, held["token_sha256"], now)
    return True


def _refuse_live(conn: apsw.Connection, name: str, held: dict | None, now: int) -> None:
    if held is not None and held["held_until_ms"] > now:
        raise NameTaken(name, "another session holds it")
    beat = conn.execute(_BEAT_SQL, (name,)).fetchone()
    if beat is not None and beat[1] != STOPPED and now - beat[0] < HOLD_MS:
        raise NameTaken(name, f"an agent of that name beat {(now - beat[0]) / 1000:.0f} s ago")


def _held(conn: apsw.Connection, name: str) -> dict | None:
    row = conn.execute(_GET_SQL, (_KEY_PREFIX + name,)).fetchone()
    return None if row is None else orjson.loads(row[0])


def _hold(conn: apsw.Connection, name: str, digest: str, now: int) -> None:
    value = orjson.dumps({"token_sha256": digest, "held_until_ms": now + HOLD_MS}).decode()
    conn.execute(_PUT_SQL, (_KEY_PREFIX + name, value))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
