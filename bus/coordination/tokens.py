"""Bearer tokens: who may reach the bus over HTTP (`bus serve`), and as which agent.

A token is a random secret handed out once (`bus token create`); the file
keeps only its SHA-256, so reading the file gives no way in. A token acts as
one agent, may be read-only, may expire and may be revoked; a token that is
revoked or expired is unknown from then on.

Checking a token is a read: its last use is written at most once a minute
per token (`TokenChecker`), so a busy server costs the file no write per
request.

    with Bus.open("bus.db") as bus:
        new = bus.tokens.create("worker-1", expires_ms=30 * DAY_MS)
        print(new.token)                   # shown once, never again
        TokenChecker(bus).check(new.token) # -> Token(agent="worker-1", ...)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

import apsw

from bus.storage.db import write_transaction
from bus.storage.errors import ValidationFailed
from bus.log.messages import now_ms
from bus.log.messages import validate_agent_id

DAY_MS = 86_400_000
LAST_USED_GRAIN_MS = 60_000  # a token's last use is written at most this often
TOKEN_PREFIX = "abt_"  # recognisable in a leaked config file or a secret scanner
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS}

_INSERT_SQL = ("INSERT INTO tokens (id, agent, secret_sha256, read_only, created_ms, expires_ms)"
               " VALUES (?, ?, ?, ?, ?, ?)")
_COLUMNS = "id, agent, read_only, created_ms, expires_ms, revoked_ms, last_used_ms"
_LIST_SQL = f"SELECT {_COLUMNS} FROM tokens ORDER BY created_ms, id"
_BY_ID_SQL = f"SELECT {_COLUMNS} FROM tokens WHERE id = ?"
_BY_HASH_SQL = f"SELECT {_COLUMNS}, secret_sha256 FROM tokens WHERE secret_sha256 = ?"
_REVOKE_SQL = "UPDATE tokens SET revoked_ms = ? WHERE id = ? AND revoked_ms IS NULL"
# Another server process on the same file may have just written it: then it is fresh enough.
_USED_SQL = ("UPDATE tokens SET last_used_ms = ? WHERE id = ?"
             " AND (last_used_ms IS NULL OR last_used_ms <= ?)")
_ACTIVE_SQL = ("SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_ms IS NULL"
               " AND (expires_ms IS NULL OR expires_ms > ?))")


@dataclass(frozen=True)
class Token:
    """A token as `bus token list` shows it: never its secret."""

    id: str
    agent: str
    read_only: bool
    created_ms: int
    expires_ms: int | None
    revoked_ms: int | None
    last_used_ms: int | None

    def usable(self, now: int) -> bool:
        return self.revoked_ms is None and (self.expires_ms is None or self.expires_ms > now)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NewToken:
    """A token just created, with its secret: the only time the secret exists in full."""

    id: str
    agent: str
    token: str


def parse_duration_ms(text: str, field: str = "expires") -> int:
    """`30d`, `12h`, `15m`, `90s` in milliseconds; ValidationFailed names `field` otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ValidationFailed(field, f"{text!r} is not a duration; give a number and a unit,"
                                      " s, m, h or d (e.g. 30d or 12h)")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def secret_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def create_token(conn: apsw.Connection, agent: str, *, expires_ms: int | None = None,
                 read_only: bool = False, now: int | None = None) -> NewToken:
    """A new token for `agent`, valid for `expires_ms` from now (None: until revoked)."""
    agent = validate_agent_id(agent, "agent")
    if expires_ms is not None and expires_ms <= 0:
        raise ValidationFailed("expires", "must be a positive duration, e.g. 30d")
    created = now_ms() if now is None else now
    token_id = "tok-" + secrets.token_hex(4)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)  # 256 bits from the OS's CSPRNG
    with write_transaction(conn):
        conn.execute(_INSERT_SQL, (token_id, agent, secret_hash(secret), int(read_only),
                                   created, None if expires_ms is None else created + expires_ms))
    return NewToken(token_id, agent, secret)


def list_tokens(conn: apsw.Connection) -> list[Token]:
    return [_token(row) for row in conn.execute(_LIST_SQL)]


def revoke_token(conn: apsw.Connection, token_id: str, now: int | None = None) -> Token:
    """Revoke a token for good; revoking one already revoked is a no-op.

    Raises ValidationFailed("id") for an id no token has.
    """
    with write_transaction(conn):
        conn.execute(_REVOKE_SQL, (now_ms() if now is None else now, token_id))
        row = conn.execute(_BY_ID_SQL, (token_id,)).fetchone()
    if row is None:
        known = ", ".join(t.id for t in list_tokens(conn)) or "none yet"
        raise ValidationFailed("id", f"no token {token_id!r} (known: {known});"
                                     " see bus token list")
    return _token(row)


def any_usable_token(conn: apsw.Connection, now: int | None = None) -> bool:
    """Whether some token is neither revoked nor expired."""
    return bool(conn.execute(_ACTIVE_SQL, (now_ms() if now is None else now,)).get)


class TokenChecker:
    """Checks presented tokens against the file, writing last use coarsely.

    Reads the table on every check, so a revocation takes effect at the next
    request; writes a token's last use at most once per LAST_USED_GRAIN_MS.
    Safe to share between threads (the bus gives each thread its connection).
    """

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self._written: dict[str, int] = {}
        self._lock = threading.Lock()

    def check(self, presented: str | None, now: int | None = None) -> Token | None:
        """The usable token `presented` is, or None (missing, unknown, revoked, expired).

        Notes its last use as well: a write once a minute per token, which may
        wait for the write lock. An event loop calls `find` and `note_use_due`
        itself, and `note_use` in a thread only when one is due.
        """
        now = now_ms() if now is None else now
        token = self.find(presented, now)
        if token is not None and self.note_use_due(token.id, now):
            self.note_use(token.id, now)
        return token

    def find(self, presented: str | None, now: int) -> Token | None:
        """`check` without the write: one indexed read, which never waits (WAL readers)."""
        if not presented or not presented.startswith(TOKEN_PREFIX):
            return None
        digest = secret_hash(presented)
        with self.bus.read() as conn:
            row = conn.execute(_BY_HASH_SQL, (digest,)).fetchone()
        # The lookup is by hash, so timing tells nothing of the secret; compare anyway.
        if row is None or not hmac.compare_digest(row[-1], digest):
            return None
        token = _token(row[:-1])
        return token if token.usable(now) else None

    def note_use_due(self, token_id: str, now: int) -> bool:
        """Whether this use is to be written; if so, it counts as written from now."""
        with self._lock:
            last = self._written.get(token_id)
            if last is not None and now - last < LAST_USED_GRAIN_MS:
                return False
            self._written[token_id] = now
            return True

    def note_use(self, token_id: str, now: int) -> None:
        with self.bus.write() as conn:
            conn.execute(_USED_SQL, (now, token_id, now - LAST_USED_GRAIN_MS))


def _token(row: tuple[Any, ...]) -> Token:
    token_id, agent, read_only, created, expires, revoked, used = row
    return Token(token_id, agent, bool(read_only), created, expires, revoked, used)
