"""Files that break under a running view, the ways a person breaks them."""

from __future__ import annotations

import os
from pathlib import Path

import apsw


def foreign_sqlite(path: Path) -> Path:
    """A SQLite file of another application: the identity check refuses it."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA application_id = 1234; CREATE TABLE t (x)")
    conn.close()
    return path


def break_the_file(db: Path, how: str, tmp_path: Path) -> str:
    """Make `db` unreadable as a bus in one of the ways a person can; a pattern of the
    error expected."""
    if how == "overwritten":  # the same file, its bytes garbage
        db.write_bytes(b"not a database at all " * (db.stat().st_size // 22 + 1))
        # Seen by a connection that was open (a page it had not cached), by a new one
        # (the header), or by a new one mid-write: the old header then garbage pages
        # (SQLite's own word), or the file still empty.
        return (r"is corrupt \(database disk image is malformed\)|wrong file header"
                r"|is not a readable SQLite database \(file is not a database\)"
                r"|no bus database at")
    if how == "replaced":  # another file renamed over the path
        os.replace(foreign_sqlite(tmp_path / "foreign.db"), db)
        return r"a SQLite database of another application \(application_id 0x4d2\)"
    db.unlink()
    return "no bus database at"
