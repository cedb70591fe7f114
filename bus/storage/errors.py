"""`BusError`, the base of every error the library raises, and the log's own errors.

The errors of the parts above the log (the channels, the pump) live with the
part that raises them and are re-exported here (`RAISED_ABOVE`). Subclasses
carry their data in attributes so callers (the CLI, other agents) can react
to the kind of failure without parsing messages. Messages name the field,
the problem and the fix.
"""

from __future__ import annotations

import importlib

import blobs.errors


class BusError(Exception):
    """Base class of every error the bus library raises on purpose.

    `error_code` is a short, stable name of the kind of failure, for programs (the
    MCP server puts it in a tool error's `error.code`; docs/mcp.md lists them).
    """

    error_code = "refused"


class ValidationFailed(BusError):
    """An argument was rejected before anything was written.

    `field` names the offending argument (e.g. ``"from_agent"`` or
    ``"messages[3].type"``), `reason` says what is wrong and how to fix it.
    """

    error_code = "invalid_argument"

    def __init__(self, field: str, reason: str, **details: object) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.details = details


class SchemaTooNew(BusError):
    """The database was migrated by a newer agentbus than this one."""

    error_code = "schema"

    def __init__(self, found: int, supported: int, path: str = "") -> None:
        where = f" {path}" if path else ""
        super().__init__(
            f"the database{where} has schema version {found}, but this agentbus "
            f"supports up to version {supported}; upgrade agentbus to open it"
        )
        self.found = found
        self.supported = supported


class SchemaOutdated(BusError):
    """A read-only view found a database older than this code (it cannot migrate it)."""

    error_code = "schema"

    def __init__(self, found: int, latest: int, path: str = "") -> None:
        where = f" {path}" if path else ""
        super().__init__(
            f"the database{where} has schema version {found}, this agentbus expects "
            f"{latest}; run `bus migrate` first (views open the file read-only)"
        )
        self.found = found
        self.latest = latest


class UnknownConsumer(BusError):
    """A cursor command named an agent that has no cursor (nor, for set, a heartbeat)."""

    error_code = "not_found"

    def __init__(self, agent: str, known: list[str], hint: str) -> None:
        listed = ", ".join(known) if known else "none yet"
        super().__init__(f"agent: no consumer {agent!r} (known: {listed}); {hint}")
        self.field = "agent"
        self.agent = agent
        self.known = known


class AgentNotResolved(BusError):
    """`--agent auto` found no worker, or more than one, whose worktree holds the directory.

    `directory` is where it looked from, `candidates` the worker ids it could
    not choose between (empty when none matched).
    """

    error_code = "not_found"

    def __init__(self, message: str, directory: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.field = "agent"
        self.directory = directory
        self.candidates = candidates


class NotABusDatabase(BusError):
    """The file exists but is not a SQLite database, or not an agentbus one."""

    error_code = "not_a_bus"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"{path} is {reason}; it was left untouched. "
            "Point --db (or BUS_DB) at an agentbus database or at a new path"
        )
        self.path = path
        self.reason = reason


class BusNotFound(BusError):
    """No database exists at the path and creating one was not asked for."""

    error_code = "not_found"

    def __init__(self, path: str) -> None:
        super().__init__(
            f"no bus database at {path}; create it with `bus init` "
            "or point --db (or BUS_DB) at an existing one"
        )
        self.path = path


class UnsupportedFilesystem(BusError):
    """The database path is on a network filesystem, where WAL is unsafe."""

    error_code = "refused"

    def __init__(self, path: str, fstype: str) -> None:
        super().__init__(
            f"{path} is on a {fstype} filesystem; SQLite's WAL mode needs shared "
            "memory on one host, so network filesystems can corrupt the bus. "
            "Put the database on a local disk"
        )
        self.path = path
        self.fstype = fstype


class BusBusy(BusError):
    """The database stayed locked by another writer past the busy timeout."""

    error_code = "busy"


class BusClosed(BusError):
    """The Bus was used after close()."""

    error_code = "closed"















# The blob store's errors as the bus raises them (bus/storage/blob_errors.py translates):
# BusErrors, and still the `blobs` classes of the same name.
class BlobMissing(BusError, blobs.errors.BlobMissing):
    """No blob is stored under the reference."""

    error_code = "blob_missing"


class BlobCorrupt(BusError, blobs.errors.BlobCorrupt):
    """The stored bytes no longer hash to the reference."""

    error_code = "corrupt"


class BlobRefInvalid(ValidationFailed, blobs.errors.BlobRefInvalid):
    """A blob reference that is not 'sha256-<64 hex>' (field "ref"); no file was touched."""





class DatabaseCorrupt(BusError):
    """SQLite found the bus file damaged; the bus refuses to write to it from then on."""

    error_code = "corrupt"

    def __init__(self, path: str, detail: str) -> None:
        where = path or "the bus database"
        super().__init__(
            f"{where} is corrupt ({detail}); nothing was written. See the damage with "
            "`bus check --full`, then restore the file from a copy, or rebuild it with "
            f"`sqlite3 {path or 'bus.db'} .recover | sqlite3 recovered.db`"
        )
        self.path = path
        self.detail = detail


class BusReadOnly(BusError):
    """The bus cannot be written by this process; reads still work."""

    error_code = "read_only"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"{path or 'the bus database'} cannot be written: {reason}; nothing was written. "
            "Reads still work. Run as the user who owns the bus, make the file and its "
            "directory writable, or copy the bus to a writable place"
        )
        self.path = path
        self.reason = reason


class DiskFull(BusError):
    """The disk (or quota) holding the bus or its files is full; nothing partial is left."""

    error_code = "full"

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"no space left for {path or 'the bus'} ({detail}); nothing was written. Free "
            "disk space (or raise the quota), then retry; `bus compact` shrinks an old bus"
        )
        self.path = path
        self.detail = detail


class SearchDisabled(ValidationFailed):
    """The bus has no full-text index; `bus search --enable` builds it."""

    error_code = "search_disabled"

    def __init__(self) -> None:
        super().__init__("search", "full-text search is not enabled on this bus; run"
                                   " `bus search --enable` (or Bus.enable_search()) once")


class UnknownTask(BusError):
    """No task of the graph has the id (`field` says which argument named it)."""

    error_code = "not_found"

    def __init__(self, task_id: str, field: str = "task") -> None:
        super().__init__(f"{field}: no task {task_id!r} in the task graph; add it first with"
                         " `bus task add` (or list them with `bus task list`)")
        self.field = field
        self.task_id = task_id


class TaskCycle(ValidationFailed):
    """A dependency would close a cycle; `cycle` is the path, first task repeated last."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__("after", f"{cycle[0]} cannot wait on {cycle[1]}: that closes the cycle"
                                  f" {' -> '.join(cycle)} (each waits on the next); drop one"
                                  " of these dependencies", cycle=cycle)
        self.cycle = cycle


class TaskStateConflict(BusError):
    """The task is not in a state that allows the command (done twice, cancel after done...)."""

    error_code = "conflict"

    refused_by_state = True  # the CLI: exit 1, not a usage error (the id is well formed)

    def __init__(self, task_id: str, state: str, command: str, fix: str) -> None:
        self.reason = f"{task_id} is {state}, so `{command}` does nothing; {fix}"
        super().__init__(f"task: {self.reason}")
        self.field = "task"
        self.task_id = task_id
        self.state = state
        self.command = command


class NotTaskHolder(BusError):
    """`bus task done` by an agent that does not hold the task's claim."""

    error_code = "conflict"

    refused_by_state = True  # the CLI: exit 1, not a usage error

    def __init__(self, task_id: str, agent: str, holder: str | None) -> None:
        who = f"{holder} holds it" if holder else "nobody holds it"
        self.reason = (f"{agent} does not hold {task_id} ({who}); take it with"
                       " `bus task claim-next` or `bus claim` before marking it done")
        super().__init__(f"agent: {self.reason}")
        self.field = "agent"
        self.task_id = task_id
        self.agent = agent
        self.holder = holder


# The errors of the parts above the log live with the part that raises them;
# users keep catching them from here. Loaded on first use, so importing
# bus.storage.errors (which every part does) never imports the parts above it.
RAISED_ABOVE = {
    "bus.channels.errors": ("UnknownChannel", "StoreFull", "StoreCapacity"),
    "bus.pump.errors": ("ThreadNotFound", "ThreadClosed", "ThreadAmbiguous", "ThreadConflict",
                        "OrganismInvalid", "OobRefused", "UnsignedRequest", "BadSignature",
                        "MalformedRequest", "StaleRequest", "ReplayedRequest", "OobSocketError",
                        "OobKeyError", "Backpressure"),
    "bus.replica.errors": ("LitestreamMissing", "ReplicaUrlInvalid", "SyncIntervalInvalid",
                           "RestoreTargetExists", "RestoreFailed"),
    "bus.history.errors": ("LakeError", "LakeTooNew", "ServerError"),
    "bus.mirror.errors": ("NatsUrlInvalid", "NatsUnreachable", "JetStreamUnavailable",
                          "StreamMismatch", "SubjectsTaken", "StreamOfAnotherBus",
                          "ImportSubjectsInvalid"),
}
_HOME = {name: module for module, names in RAISED_ABOVE.items() for name in names}


def __getattr__(name: str) -> type[BusError]:
    """`from bus.storage.errors import ThreadNotFound` still works: the class from its own part."""
    if name not in _HOME:
        raise AttributeError(f"module 'bus.storage.errors' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
