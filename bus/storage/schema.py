"""The migration runner: applies migrations/NNNN_name.sql in order.

The schema version lives in `PRAGMA user_version` and the file is marked as
ours with `PRAGMA application_id`, both in the same transaction as the
migration's DDL, so a crash leaves the file at the old version or the new one,
never between. `meta.schema_version` mirrors the version for people reading
the file with plain SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import apsw

from bus.storage import migration_files
from bus.storage.db import APPLICATION_ID
from bus.storage.db import write_transaction
from bus.storage.errors import SchemaTooNew
from bus.storage.migration_files import Migration
from bus.storage.migration_files import migrations_in

MIGRATIONS_DIR = migration_files.MIGRATIONS_DIR  # tests point it at other files
_VERSION_SQL = "PRAGMA user_version"
_META_VERSION_SQL = (
    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


@dataclass(frozen=True)
class SchemaStatus:
    current: int
    latest: int
    pending: tuple[Migration, ...]

    @property
    def readable(self) -> bool:
        """Whether a read-only reader of this code reads the file as it is: no pending
        migration changes what readers see (so `bus status` needs no `bus migrate`)."""
        return all(m.readers_unchanged() for m in self.pending)


def available_migrations(directory: Path | None = None) -> tuple[Migration, ...]:
    """The migration files in version order; numbering must run 1, 2, 3, ..."""
    return migrations_in(directory or MIGRATIONS_DIR)


def current_version(conn: apsw.Connection) -> int:
    return conn.execute(_VERSION_SQL).get


def schema_status(conn: apsw.Connection, path: str = "") -> SchemaStatus:
    """Where the database stands; raises SchemaTooNew if it is ahead of the code."""
    migrations = available_migrations()
    latest = migrations[-1].version if migrations else 0
    current = current_version(conn)
    if current > latest:
        raise SchemaTooNew(current, latest, path)
    return SchemaStatus(current, latest, tuple(m for m in migrations if m.version > current))


def migrate(conn: apsw.Connection, path: str = "") -> list[Migration]:
    """Apply every pending migration, each in its own transaction; return those applied.

    Safe when several processes open a new file at once: each migration
    re-reads the version under the write lock and skips work already done.
    Foreign keys are off while migrations run, so a migration can rebuild a
    parent table (create, copy, drop, rename) without its DROP cascading into
    the children; `PRAGMA foreign_key_check` must come back empty before each
    commit (https://sqlite.org/lang_altertable.html#otheralter).
    """
    pending = schema_status(conn, path).pending
    if not pending:
        return []
    if conn.in_transaction:  # PRAGMA foreign_keys is a no-op inside a transaction
        raise RuntimeError("migrate() needs a connection outside any transaction")
    enforced = conn.execute("PRAGMA foreign_keys").get
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        return [m for m in pending if _apply(conn, m)]
    finally:
        conn.execute("PRAGMA foreign_keys = ON" if enforced else "PRAGMA foreign_keys = OFF")
        conn.execute("PRAGMA legacy_alter_table = OFF")  # in case a migration failed mid-way


def _apply(conn: apsw.Connection, migration: Migration) -> bool:
    """Run one migration in one transaction; False if another process already did."""
    with write_transaction(conn):
        if current_version(conn) >= migration.version:
            return False
        # A script runs statement by statement as its cursor is consumed.
        conn.execute(migration.sql()).fetchall()
        broken = conn.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"migration {migration.path.name} breaks foreign keys: {broken[:5]}")
        # PRAGMAs take no bound parameters; both values are integers we own.
        conn.execute(f"PRAGMA user_version = {int(migration.version)}")
        conn.execute(f"PRAGMA application_id = {int(APPLICATION_ID)}")
        conn.execute(_META_VERSION_SQL, (str(migration.version),))
    return True
