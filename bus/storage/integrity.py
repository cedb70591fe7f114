"""Is the bus file intact? Checks at open, `bus check`, and the refusal to write after damage.

Writing into a damaged b-tree can spread the damage (SQLite reuses pages it
believes free), so a file found corrupt is never written again by this
process: the first CorruptError marks it, and `write_transaction` refuses
marked files before BEGIN. At open, a writable connection runs
`PRAGMA quick_check` on files up to QUICK_CHECK_AT_OPEN_MAX bytes (about
40 ms for 30 MB when cached); larger files rely on SQLite's own checks and
`bus check` (https://sqlite.org/pragma.html#pragma_quick_check).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import apsw

from bus.storage.errors import DatabaseCorrupt

QUICK_CHECK_AT_OPEN_MAX = 64 * 1024 * 1024  # bytes
PROBLEMS_MAX = 100  # problems one check reports at most
_CHECK_PRAGMAS = {False: "quick_check", True: "integrity_check"}
_PAGE_SIZE_SQL = "PRAGMA page_size"

_corrupt_files: dict[str, str] = {}  # absolute path -> what SQLite said first
_marks_lock = threading.Lock()


@dataclass(frozen=True)
class CheckReport:
    """The result of `bus.storage.db.check_database`: `problems` is empty when the file is intact."""

    path: str
    full: bool
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json_dict(self) -> dict[str, object]:
        return {"path": self.path, "check": "integrity_check" if self.full else "quick_check",
                "ok": self.ok, "problems": list(self.problems)}


def mark_corrupt(path: str, detail: str) -> None:
    """Remember that `path` is damaged: this process writes to it no more."""
    if path:
        with _marks_lock:
            _corrupt_files.setdefault(path, detail)


def refuse_if_marked(path: str) -> None:
    """Raise DatabaseCorrupt if this process has seen `path` damaged."""
    detail = _corrupt_files.get(path)
    if detail is not None:
        raise DatabaseCorrupt(path, f"found earlier by this process: {detail}")


def connection_check_at_open(conn: apsw.Connection, path: Path) -> None:
    """The cheap checks before a writable connection is handed out; raise DatabaseCorrupt."""
    name = conn.filename
    refuse_if_marked(name)
    problem = problem_at_open(conn, path)
    if problem is not None:
        _refuse(name, problem)


def problem_at_open(conn: apsw.Connection, path: Path) -> str | None:
    """What the cheap checks at open find wrong (None when nothing); marks nothing.

    The file must be a whole number of pages, and quick_check must pass on
    files up to QUICK_CHECK_AT_OPEN_MAX bytes.
    """
    size = path.stat().st_size
    page_size = conn.execute(_PAGE_SIZE_SQL).get
    if size % page_size:
        return f"the file is {size} bytes, not a whole number of {page_size}-byte pages"
    if size <= QUICK_CHECK_AT_OPEN_MAX:
        problems = connection_problems(conn, full=False, limit=1)
        if problems:
            return problems[0]
    return None


def connection_problems(conn: apsw.Connection, full: bool,
                        limit: int = PROBLEMS_MAX) -> tuple[str, ...]:
    """What quick_check (or integrity_check when `full`) finds; empty when intact."""
    try:
        # Pragmas take no bound parameters; the name is ours and the limit an int.
        rows = conn.execute(f"PRAGMA {_CHECK_PRAGMAS[full]}({int(limit)})").fetchall()
    except (apsw.CorruptError, apsw.NotADBError) as exc:
        return (str(exc),)
    problems = tuple(text for (text,) in rows if text != "ok")
    if not problems:
        with _marks_lock:  # restored or repaired in place: writable again
            _corrupt_files.pop(conn.filename, None)
    return problems


def _refuse(path: str, detail: str) -> None:
    mark_corrupt(path, detail)
    raise DatabaseCorrupt(path, detail)
