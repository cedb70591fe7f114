"""The `workers` table as the lifecycle writes it, and its JSON mirror for people and git.

The row's shape and its readers are bus/coordination/worker_table.py's.

The row is the truth. After each transition the mirror
`<db dir>/workers/<worker>.json` is rewritten atomically; a crash between
the commit and the rewrite leaves it one step behind until the next one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import apsw
import orjson

from blobs.files import write_atomically
from bus.storage.errors import BusError
from bus.coordination.worker_table import AT_WORK_SQL
from bus.coordination.worker_table import COLUMNS
from bus.coordination.worker_table import Worker
from bus.coordination.worker_table import get_worker
from bus.coordination.worker_table import list_workers

__all__ = ["UnknownWorker", "Worker", "WorkerExists", "exists", "get", "insert",
           "list_workers", "others_on_task", "update", "write_mirror"]

_OTHERS_ON_TASK_SQL = (
    f"SELECT {COLUMNS} FROM workers WHERE task_id = ? AND worker_id != ?"
    f" AND {AT_WORK_SQL} ORDER BY created_at_ms, worker_id"
)
_INSERT_SQL = f"INSERT INTO workers ({COLUMNS}) VALUES ({', '.join('?' * 12)})"
_UPDATE_SQL = (
    "UPDATE workers SET state = ?, head_commit = ?, merge_commit = ?, note = ?,"
    " updated_at_ms = ? WHERE worker_id = ? AND state = ?"
)


class UnknownWorker(BusError):
    error_code = "not_found"

    def __init__(self, worker: str) -> None:
        super().__init__(f"no worker {worker!r}; `worker status` lists them")
        self.worker = worker


class WorkerExists(BusError):
    error_code = "conflict"

    def __init__(self, worker: str) -> None:
        super().__init__(f"worker {worker!r} exists already; choose another --worker id")
        self.worker = worker


def get(conn: apsw.Connection, worker: str) -> Worker:
    found = get_worker(conn, worker)
    if found is None:
        raise UnknownWorker(worker)
    return found


def exists(conn: apsw.Connection, worker: str) -> bool:
    return get_worker(conn, worker) is not None


def others_on_task(conn: apsw.Connection, task: str, worker: str) -> list[Worker]:
    """Unfinished workers on `task` other than `worker`."""
    return [Worker(*row) for row in conn.execute(_OTHERS_ON_TASK_SQL, (task, worker))]


def insert(conn: apsw.Connection, worker: Worker) -> None:
    try:
        conn.execute(_INSERT_SQL, tuple(asdict(worker).values()))
    except apsw.ConstraintError:
        raise WorkerExists(worker.worker) from None


def update(conn: apsw.Connection, old: Worker, new: Worker) -> None:
    """Write `new` over `old`; the state must still be old's (checked, not assumed)."""
    conn.execute(_UPDATE_SQL, (new.state, new.head_commit, new.merge_commit, new.note,
                               new.updated_at_ms, old.worker, old.state))
    if conn.changes() != 1:
        raise BusError(f"worker {old.worker} changed while it was being updated; try again")


def write_mirror(directory: Path, worker: Worker) -> Path:
    """Rewrite `<directory>/<worker>.json` atomically; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{worker.worker}.json"
    write_atomically(path, orjson.dumps(worker.to_json_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    return path
