"""Connections to the bus file: the one place that opens SQLite.

Every connection gets the same pragmas (WAL, a busy handler, foreign keys,
synchronous) and writes go through `write_transaction`, which starts with
BEGIN IMMEDIATE. A deferred transaction that reads first and writes later can
fail with SQLITE_BUSY without waiting when another writer committed in
between (https://sqlite.org/wal.html#sometimes_queries_return_sqlite_busy_in_wal_mode);
taking the write lock up front lets the busy handler do its job instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
import urllib.parse
from pathlib import Path
from typing import Callable

import apsw

from bus.storage import integrity
from bus.storage.errors import BusBusy
from bus.storage.errors import BusError
from bus.storage.errors import BusNotFound
from bus.storage.errors import BusReadOnly
from bus.storage.errors import DatabaseCorrupt
from bus.storage.errors import DiskFull
from bus.storage.errors import NotABusDatabase
from bus.storage.errors import SchemaTooNew
from bus.storage.errors import UnsupportedFilesystem
from bus.storage.errors import ValidationFailed
from bus.storage.file_errors import os_error
from bus.storage.file_errors import translate_os_errors
from bus.storage.migration_files import supported_version

APPLICATION_ID = 0x61627573  # "abus": marks a SQLite file as an agentbus database
BUSY_TIMEOUT_MS = 5000
# A writer that finds the lock taken sleeps 5 ms, then twice as long each
# time up to 100 ms (SQLite's own handler starts at 1 ms): see wait_when_busy.
BUSY_FIRST_SLEEP_S = 0.005
BUSY_LONGEST_SLEEP_S = 0.1
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024  # bytes
SYNCHRONOUS_BY_DURABILITY = {"normal": "NORMAL", "full": "FULL"}
# What a committed publish survives: with synchronous=NORMAL in WAL mode a
# commit survives a process crash but not power loss; FULL fsyncs the WAL.
DURABLE_BY_DURABILITY = {"normal": "commit", "full": "fsync"}
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "fuse.sshfs",
     "glusterfs", "fuse.glusterfs", "ceph", "fuse.ceph", "lustre", "gpfs"}
)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_IDENTITY_SQL = (
    "SELECT (SELECT application_id FROM pragma_application_id),"
    " (SELECT user_version FROM pragma_user_version),"
    " (SELECT count(*) FROM sqlite_schema)"
)


def connect(
    path: str | os.PathLike[str],
    durability: str = "normal",
    *,
    create: bool = True,
    readonly: bool = False,
    check: bool = False,
) -> apsw.Connection:
    """Open the bus database at `path` with the bus's pragmas applied.

    A writable connection is checked for damage at open (bus/storage/integrity.py);
    a read-only one only with `check` (a one-off reader such as `bus
    status`: a live view that opens every few seconds does not ask).

    A file this process cannot write (another user's, a read-only mount) is
    opened read-only: reads work and every write raises `BusReadOnly`
    (check with `conn.readonly("main")`).

    Raises `NotABusDatabase` for a file that is not SQLite or belongs to
    another application (the file is not modified), `DatabaseCorrupt` for a
    damaged one (see bus/storage/integrity.py), `BusNotFound` when the file is
    missing and `create` is false, `BusReadOnly` or `DiskFull` when it cannot
    be created, `UnsupportedFilesystem` for a path on a network filesystem
    and `ValidationFailed` for an unknown durability. One connection serves
    one thread.
    """
    path = Path(path)
    synchronous = synchronous_for(durability)
    if (readonly or not create) and not _has_content(path):
        raise BusNotFound(str(path))
    check_file_header(path)
    checked = _has_content(path) and check_before_open(path)
    readonly = readonly or not _prepare_writable(path)
    with translate_errors(path=str(path)):
        conn = _open_read_only(path) if readonly else apsw.Connection(str(path), flags=_READ_WRITE)
        try:
            connection_set_up(conn, path, readonly, synchronous,
                              check_integrity=not checked and (check or not readonly))
        except BaseException:
            conn.close()
            raise
    return conn


def connection_set_up(conn: apsw.Connection, path: Path, readonly: bool, synchronous: str, *,
                      check_integrity: bool) -> None:
    """Refuse a file the bus must not touch, then give a new connection the bus's settings.

    `check_integrity`: also look for damage now (a file judged whole before
    the open, by check_before_open, is not read twice).
    """
    conn.set_busy_handler(wait_when_busy())
    connection_check_identity(conn, path)
    if readonly:
        connection_read_only(conn)
    else:
        connection_apply_pragmas(conn, synchronous)
        integrity.refuse_if_marked(conn.filename)
    if check_integrity:
        integrity.connection_check_at_open(conn, path)


def check_before_open(path: Path) -> bool:
    """Judge an existing file before SQLite opens it for real; True when it was checked whole.

    A read-only connection to a WAL file creates its -wal and -shm files and
    cannot remove them when it closes, so a file refused after such an open
    would be left with two new files beside it. While no -wal file exists
    nobody is writing, so the file is read `immutable` (no locks, no files
    made: https://sqlite.org/uri.html#uriimmutable) and refused (foreign,
    newer, garbage, truncated or damaged) before anything is created. A
    verdict is trusted only if the file did not change during the read (a
    writer that came and went meanwhile): otherwise the real open judges.
    With a -wal (or a rollback -journal) file there, it returns False and the
    real connection checks.
    """
    if _being_written(path):
        return False
    before = _file_state(path)
    try:
        conn = apsw.Connection(_immutable_uri(path), flags=_READ_IMMUTABLE)
    except apsw.Error:
        return False  # the real open says what is wrong
    try:
        problem = _problem_before_open(conn, path)
    except apsw.Error:
        return False  # an I/O error, say: the real open reports it with its name
    finally:
        conn.close()
    if problem is None:
        return True
    if _file_state(path) != before or _being_written(path):
        return False
    if isinstance(problem, DatabaseCorrupt):
        integrity.mark_corrupt(str(path.absolute()), problem.detail)
    raise problem


def _problem_before_open(conn: apsw.Connection, path: Path) -> BusError | None:
    try:
        connection_check_identity(conn, path, mark=False)
        problem = integrity.problem_at_open(conn, path)
    except (NotABusDatabase, SchemaTooNew) as exc:
        return exc
    except apsw.CorruptError as exc:
        return DatabaseCorrupt(str(path), str(exc))
    return None if problem is None else DatabaseCorrupt(str(path), problem)


def _being_written(path: Path) -> bool:
    """Whether a writer may be at work: a -wal file, or a rollback -journal mid-transaction."""
    return Path(f"{path}-wal").exists() or Path(f"{path}-journal").exists()


def _file_state(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _immutable_uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(path.absolute()))}?immutable=1"


def _prepare_writable(path: Path) -> bool:
    """Make the directory; False when the existing file can only be read.

    Raises BusReadOnly (or DiskFull) when there is no file and none can be made.
    """
    reason = unwritable_reason(path)
    if reason is not None:
        if _has_content(path):
            return False
        raise BusReadOnly(str(path), reason)
    with translate_os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    check_local_filesystem(path)
    return True


def unwritable_reason(path: Path) -> str | None:
    """Why this process cannot write the bus at `path`, or None when it can.

    SQLite creates the -wal and -shm files beside the database, and the
    blobs live there too, so the directory must be writable as well.
    """
    if path.exists() and not os.access(path, os.W_OK):
        return _why_not_writable(path, "the file")
    directory = path.absolute().parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not os.access(directory, os.W_OK):
        return _why_not_writable(directory, f"the directory {directory}")
    return None


def _why_not_writable(path: Path, what: str) -> str:
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return f"{what} is on a read-only filesystem"
    st = path.stat()
    return (f"{what} is not writable by this user (uid {os.geteuid()}; owner uid "
            f"{st.st_uid}, mode {st.st_mode & 0o777:o})")


def _open_read_only(path: Path) -> apsw.Connection:
    """A read-only connection, even where SQLite cannot create the WAL's -shm file.

    Reading a WAL database needs the -shm file, which a reader without write
    access to the directory cannot create. When no -wal file exists nobody is
    writing, so the file is opened `immutable` (no locks, no -shm:
    https://sqlite.org/uri.html#uriimmutable).
    """
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    # Before the probe: the first readers of a file whose -shm is new take turns to build
    # its index, and one that finds another at it is told "busy" and must wait its turn.
    conn.set_busy_handler(wait_when_busy())
    try:
        conn.execute(_PROBE_SQL).get
        return conn
    except (apsw.ReadOnlyError, apsw.CantOpenError):
        conn.close()
    except apsw.NotADBError as exc:
        conn.close()
        raise NotABusDatabase(str(path), f"not a readable SQLite database ({exc})") from None
    except BaseException:
        conn.close()
        raise
    if Path(f"{path}-wal").exists():
        raise BusReadOnly(str(path), "a writer is using the file and this user cannot open its"
                                     " -shm file to read beside it")
    return apsw.Connection(_immutable_uri(path), flags=_READ_IMMUTABLE)


def synchronous_for(durability: str) -> str:
    """The `PRAGMA synchronous` value for a durability name."""
    try:
        return SYNCHRONOUS_BY_DURABILITY[durability]
    except (KeyError, TypeError):
        raise ValidationFailed(
            "durability", f"{durability!r} is not one of: normal, full"
        ) from None


def connection_apply_pragmas(conn: apsw.Connection, synchronous: str) -> None:
    """Switch one writable connection to WAL and set its per-connection pragmas."""
    connection_enable_wal(conn)
    conn.execute("PRAGMA foreign_keys = ON")
    # After a checkpoint resets the WAL, SQLite truncates it back to this size,
    # so one burst of writes does not leave a huge -wal file behind for good.
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}").fetchall()
    # Only values from SYNCHRONOUS_BY_DURABILITY reach this line.
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    # For code that uses `with conn:` directly; the bus itself uses write_transaction.
    conn.transaction_mode = "IMMEDIATE"


def wait_when_busy(timeout_ms: int = BUSY_TIMEOUT_MS) -> Callable[[int], bool]:
    """A busy handler: sleep 5, 10, 20, 40, then 100 ms at a time, give up after `timeout_ms`.

    SQLite's own (busy_timeout) first sleeps 1 ms. With many processes
    writing at once, every sleeper that wakes so soon and finds the lock
    free between two of the current writer's transactions takes it over,
    and each take-over costs both processes a failed attempt and the new
    writer a cold page cache. Starting at 5 ms, 16 processes publishing at
    once wrote 15,300-18,500/s in aggregate against 9,200-10,800/s
    (docs/benchmarks.md); a writer that waits at all waits a few
    milliseconds longer.
    """
    timeout_s = timeout_ms / 1000
    started = 0.0

    def wait(attempts: int) -> bool:
        nonlocal started
        now = time.monotonic()
        if attempts == 0:
            started = now
        left = timeout_s - (now - started)
        if left <= 0:
            return False
        time.sleep(min(BUSY_FIRST_SLEEP_S * 2 ** min(attempts, 5), BUSY_LONGEST_SLEEP_S, left))
        return True
    return wait


def connection_enable_wal(conn: apsw.Connection, timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
    """Put the file in WAL mode, retrying while other processes do the same.

    Changing the journal mode of a new file can return SQLITE_BUSY at once,
    without calling the busy handler (SQLite does so to avoid a deadlock
    between lock upgrades), when several processes open it together. So the
    busy timeout is applied here by hand.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except apsw.BusyError as exc:
            if time.monotonic() >= deadline:
                raise _busy(exc) from None
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.05)


def connection_read_only(conn: apsw.Connection) -> None:
    """Make a connection refuse every statement that is not a plain read.

    The file is already opened read-only; `query_only` also covers attached
    files, and the authorizer refuses at prepare time what would still touch
    the disk (ATTACH, VACUUM INTO, pragmas that set a value), so nothing is
    half done. A refused statement raises apsw.AuthError.
    """
    conn.execute("PRAGMA query_only = ON")
    conn.authorizer = _authorize_reads


# BEGIN/COMMIT and savepoints change nothing on disk; they let a view read
# several tables in one snapshot (query_only still refuses every write).
_READ_ACTIONS = frozenset({apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION,
                           apsw.SQLITE_RECURSIVE, apsw.SQLITE_TRANSACTION,
                           apsw.SQLITE_SAVEPOINT})
# Pragmas that take an argument and still only read.
_READ_PRAGMAS_WITH_ARGUMENT = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check",
})


def _authorize_reads(action: int, arg1: str | None, arg2: str | None,
                     _db: str | None, _trigger: str | None) -> int:
    if action in _READ_ACTIONS:
        return apsw.SQLITE_OK
    if action == apsw.SQLITE_PRAGMA and (arg2 is None or arg1 in _READ_PRAGMAS_WITH_ARGUMENT):
        return apsw.SQLITE_OK
    return apsw.SQLITE_DENY


def connection_check_identity(conn: apsw.Connection, path: Path, *, mark: bool = True) -> None:
    """Refuse a SQLite file that another application owns, or that a newer agentbus
    migrated (SchemaTooNew), before changing it.

    With `mark` false a CorruptError is raised as is (the caller decides
    whether the file is to be marked corrupt).
    """
    try:
        with translate_errors(conn) if mark else _NO_TRANSLATION:
            app_id, version, object_count = conn.execute(_IDENTITY_SQL).fetchone()
    except apsw.NotADBError as exc:  # (a CorruptError is DatabaseCorrupt by now)
        raise NotABusDatabase(str(path), f"not a readable SQLite database ({exc})") from None
    if app_id == APPLICATION_ID:
        if version > supported_version():
            raise SchemaTooNew(version, supported_version(), str(path))
        return
    if app_id != 0:
        raise NotABusDatabase(
            str(path), f"a SQLite database of another application (application_id {app_id:#x})"
        )
    if object_count:
        raise NotABusDatabase(str(path), "a SQLite database with tables that agentbus did not create")


def check_file_header(path: Path) -> None:
    """Refuse a non-empty file that does not start with SQLite's magic header.

    The header is read through SQLite's own VFS, never with a plain `open()`:
    on POSIX, closing any descriptor of a file drops every lock this process
    holds on it, so a second open beside a live connection would silently
    take that connection's locks away (sqlite.org/howtocorrupt.html, 2.2).
    SQLite's unix VFS shares one descriptor per file and defers a close while
    locks are held.
    """
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise NotABusDatabase(str(path), "a directory, not a database file")
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise NotABusDatabase(str(path), "under a path that is a file, not a directory") from None
    head = _first_bytes(path, len(_SQLITE_MAGIC))
    if head and head != _SQLITE_MAGIC:
        raise NotABusDatabase(str(path), "not a SQLite database (wrong file header)")


def _first_bytes(path: Path, count: int) -> bytes:
    """The file's first `count` bytes (fewer for a shorter file), read through SQLite's VFS."""
    with translate_errors(path=str(path)):
        file = apsw.VFSFile("", os.path.realpath(path),  # resolved, as SQLite opens it
                            [apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_READONLY, 0])
    try:
        return file.xRead(count, 0)
    finally:
        file.xClose()


def check_local_filesystem(path: Path, mounts: str | None = None) -> None:
    """Refuse a path on a network filesystem (Linux: looked up in /proc/self/mounts)."""
    fstype = filesystem_type(path, mounts)
    if fstype in NETWORK_FILESYSTEMS:
        raise UnsupportedFilesystem(str(path), fstype)


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding `path`, or None where it cannot be told."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = str(path.absolute().parent.resolve())
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts escapes spaces in mount points as \040.
        mount_point = fields[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fields[2]
    return best_type


# The failures of the environment rather than of the caller: each has a named BusError.
ENVIRONMENT_ERRORS = (apsw.BusyError, apsw.CorruptError, apsw.FullError, apsw.ReadOnlyError)


def environment_error(exc: BaseException, path: str = "") -> BusError | None:
    """The named BusError for a failure of the disk or the file, or None for any other.

    A CorruptError also marks the file, so this process writes to it no more.
    """
    if isinstance(exc, apsw.BusyError):
        return _busy(exc)
    if isinstance(exc, apsw.CorruptError):
        integrity.mark_corrupt(path, str(exc))
        return DatabaseCorrupt(path, str(exc))
    if isinstance(exc, apsw.FullError):
        return DiskFull(path, str(exc))
    if isinstance(exc, apsw.ReadOnlyError):
        return BusReadOnly(path, (path and unwritable_reason(Path(path))) or str(exc))
    if isinstance(exc, OSError):
        return os_error(exc, path)
    return None


class translate_errors:
    """Turn the environment's apsw errors (busy, corrupt, full, read-only) into BusErrors.

    Give it the connection (or the path) so the error names the file and a
    corrupt file is marked. A class rather than a generator: it wraps every
    read on the hot path.
    """

    __slots__ = ("conn", "path")

    def __init__(self, conn: apsw.Connection | None = None, path: str = "") -> None:
        self.conn = conn
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, ENVIRONMENT_ERRORS):
            path = self.conn.filename if self.conn is not None else self.path
            raise environment_error(exc, path) from exc
        return False


translate_busy = translate_errors  # the older name, still used across the package


def _busy(exc: apsw.BusyError) -> BusBusy:
    return BusBusy(
        f"the bus database stayed locked by another writer for more than "
        f"{BUSY_TIMEOUT_MS} ms ({exc}); retry later"
    )


class write_transaction:
    """A BEGIN IMMEDIATE transaction: committed on success, rolled back on error.

    Nested inside another transaction on the same connection it becomes a
    savepoint. BEGIN and COMMIT go through `execute`, not apsw's `with conn:`:
    apsw keeps the GIL while its context manager runs BEGIN, so a thread
    waiting there for the write lock froze every other thread of the process,
    the lock holder included, until busy_timeout ran out (apsw issue #551 on
    where the GIL is released; reproduced in tests/storage/test_db.py).
    """

    __slots__ = ("conn", "nested")

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self.nested = False

    def __enter__(self) -> apsw.Connection:
        self.nested = self.conn.in_transaction
        refuse_write(self.conn)
        _begin(self.conn, _SAVEPOINT_SQL if self.nested else _BEGIN_SQL)
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self.conn.execute(_RELEASE_SQL if self.nested else _COMMIT_SQL)
                return False
            except BaseException as failure:
                self._rollback()
                if isinstance(failure, ENVIRONMENT_ERRORS):
                    raise environment_error(failure, self.conn.filename) from failure
                raise
        self._rollback()
        if issubclass(exc_type, ENVIRONMENT_ERRORS):
            raise environment_error(exc, self.conn.filename) from exc
        return False

    def _rollback(self) -> None:
        # Some errors (disk full, I/O) end the transaction by themselves.
        if self.nested:
            self.conn.execute(_ROLLBACK_SAVEPOINT_SQL)
        elif self.conn.in_transaction:
            self.conn.execute(_ROLLBACK_SQL)


class read_transaction:
    """A read transaction: every read inside sees one snapshot of the file (a WAL reader
    keeps the snapshot its first read took until COMMIT), and the environment's
    errors become BusErrors as under `translate_errors`.

    Inside a transaction the connection has already (the caller's read or write
    transaction) it begins nothing: the reads join that one. Only for reads: a
    write inside would have to upgrade the snapshot, which fails at once
    (SQLITE_BUSY_SNAPSHOT, no busy wait) when another connection wrote since;
    a writer takes `write_transaction`.
    """

    __slots__ = ("conn", "nested")

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self.nested = False

    def __enter__(self) -> apsw.Connection:
        self.nested = self.conn.in_transaction
        if not self.nested:
            _begin(self.conn, _BEGIN_READ_SQL)
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.nested and self.conn.in_transaction:
            try:  # nothing was written: either only ends the snapshot
                self.conn.execute(_ROLLBACK_SQL if exc_type is not None else _COMMIT_SQL)
            except ENVIRONMENT_ERRORS as failure:
                if exc_type is None:
                    raise environment_error(failure, self.conn.filename) from failure
        if exc_type is not None and issubclass(exc_type, ENVIRONMENT_ERRORS):
            raise environment_error(exc, self.conn.filename) from exc
        return False


def _begin(conn: apsw.Connection, sql: str) -> None:
    """Run a BEGIN or SAVEPOINT, the environment's errors (a full disk, a gone file) as
    BusErrors naming the file."""
    try:
        conn.execute(sql)
    except ENVIRONMENT_ERRORS as exc:
        raise environment_error(exc, conn.filename) from exc


_BEGIN_READ_SQL = "BEGIN DEFERRED"
_BEGIN_SQL = "BEGIN IMMEDIATE"
_COMMIT_SQL = "COMMIT"
_ROLLBACK_SQL = "ROLLBACK"
_SAVEPOINT_SQL = "SAVEPOINT bus_nested"
_RELEASE_SQL = "RELEASE bus_nested"
_ROLLBACK_SAVEPOINT_SQL = "ROLLBACK TO bus_nested; RELEASE bus_nested"


def check_database(path: str | os.PathLike[str], full: bool = False) -> integrity.CheckReport:
    """Run quick_check (integrity_check with `full`) on the bus at `path`, read-only."""
    try:
        conn = connect(path, readonly=True)
    except DatabaseCorrupt as exc:  # too damaged to read its schema
        return integrity.CheckReport(os.fspath(path), full, (exc.detail,))
    try:
        return integrity.CheckReport(os.fspath(path), full, integrity.connection_problems(conn, full))
    finally:
        conn.close()


def refuse_write(conn: apsw.Connection) -> None:
    """Raise BusReadOnly or DatabaseCorrupt before a write that must not start."""
    integrity.refuse_if_marked(conn.filename)
    if conn.readonly("main"):
        path = conn.filename
        raise BusReadOnly(path, unwritable_reason(Path(path)) or "it was opened read-only")


def _has_content(path: Path) -> bool:
    """Whether `path` holds something: an empty file is no bus yet (and stays untouched)."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        raise NotABusDatabase(str(path), "under a path that is a file, not a directory") from None


_NO_TRANSLATION = contextlib.nullcontext()
_READ_IMMUTABLE = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
_READ_WRITE = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
_PROBE_SQL = "SELECT count(*) FROM sqlite_schema"
