"""Errors raised by the bus library.

Every error is a `BusError`; subclasses carry their data in attributes so
callers (the CLI, other agents) can react to the kind of failure without
parsing messages. Messages name the field, the problem and the fix.
"""

from __future__ import annotations

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


class ThreadNotFound(BusError):
    """No thread has this UUID in the registry."""

    error_code = "not_found"

    def __init__(self, uuid: str) -> None:
        super().__init__(
            f"thread: no thread has UUID {uuid}; list known threads with `bus pump threads`"
        )
        self.uuid = uuid


class ThreadClosed(BusError):
    """The thread was closed (it answered, or was cleaned up) and takes no more calls."""

    error_code = "conflict"

    def __init__(self, uuid: str, closed_at_ms: int) -> None:
        super().__init__(
            f"thread: {uuid} was closed at {closed_at_ms} (epoch ms); closed threads are "
            "kept for history only: start a new conversation from an open thread"
        )
        self.uuid = uuid
        self.closed_at_ms = closed_at_ms


class ThreadAmbiguous(BusError):
    """Several open threads share a path, so a path cannot name one of them."""

    error_code = "conflict"

    def __init__(self, path: tuple[str, ...], count: int) -> None:
        super().__init__(
            f"path: {count} open conversations share the path {'/'.join(path)}; "
            "address the thread by its UUID instead of its path"
        )
        self.path = path
        self.count = count


class ThreadConflict(BusError):
    """A caller-chosen thread UUID is already registered on another path."""

    error_code = "conflict"

    def __init__(self, uuid: str, existing: tuple[str, ...], wanted: tuple[str, ...]) -> None:
        super().__init__(
            f"thread_id: {uuid} is already registered for {'/'.join(existing)}, not "
            f"{'/'.join(wanted)}; use a fresh UUID for a new conversation"
        )
        self.uuid = uuid
        self.existing = existing
        self.wanted = wanted


class OrganismInvalid(ValidationFailed):
    """organism.yaml (or an OOB listener spec) was refused; `field` is the key path."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.args = (f"{source}: {field}: {reason}",)
        self.source = source


class OobRefused(BusError):
    """An out-of-band request was refused; `kind` says why (for clients and the audit)."""

    kind = "refused"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnsignedRequest(OobRefused):
    kind = "unsigned"


class BadSignature(OobRefused):
    kind = "bad_signature"


class MalformedRequest(OobRefused):
    """The request is not the signed JSON the protocol expects; `field` names the part."""

    kind = "malformed"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class StaleRequest(OobRefused):
    """The request's timestamp is outside the accepted window (too old or in the future)."""

    kind = "stale"

    def __init__(self, ts_ms: int, now_ms: int, window_ms: int) -> None:
        skew = (now_ms - ts_ms) / 1000
        when = f"{skew:.1f} s old" if skew >= 0 else f"{-skew:.1f} s in the future"
        super().__init__(
            f"ts_ms: the request is {when}; requests are accepted within "
            f"{window_ms / 1000:g} s of the server's clock: sign a fresh request "
            "(and check both clocks)"
        )
        self.ts_ms = ts_ms
        self.now_ms = now_ms
        self.window_ms = window_ms


class ReplayedRequest(OobRefused):
    kind = "replayed"

    def __init__(self, nonce: str) -> None:
        super().__init__(
            f"nonce: {nonce} was used by an earlier request; every request needs a "
            "fresh nonce (bus pump oob send makes one)"
        )
        self.nonce = nonce


class OobSocketError(BusError):
    """The out-of-band socket cannot be created or reached at `path`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"oob socket {path}: {reason}")
        self.path = path
        self.reason = reason


class OobKeyError(BusError):
    """A key file is missing, unreadable, of the wrong kind or too open."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"key file {path}: {reason}")
        self.path = path
        self.reason = reason


# The blob store's errors as the bus raises them (bus/blob_store.py translates):
# BusErrors, and still the `blobs` classes of the same name.
class BlobMissing(BusError, blobs.errors.BlobMissing):
    """No blob is stored under the reference."""

    error_code = "blob_missing"


class BlobCorrupt(BusError, blobs.errors.BlobCorrupt):
    """The stored bytes no longer hash to the reference."""

    error_code = "corrupt"


class BlobRefInvalid(ValidationFailed, blobs.errors.BlobRefInvalid):
    """A blob reference that is not 'sha256-<64 hex>' (field "ref"); no file was touched."""


class UnknownChannel(BusError):
    """No channel has the name."""

    error_code = "not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"channel: no channel named {name!r}; create it with"
                         " `bus channel create` or list them with `bus channel list`")
        self.field = "channel"
        self.name = name


class StoreFull(BusError):
    """Too many deliveries are waiting or unacknowledged: the send is refused."""

    error_code = "full"

    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"the bus holds {active} unfinished deliveries, the limit is {limit};"
                         " receivers must acknowledge (or dead letters be purged) before more"
                         " messages are accepted")
        self.active = active
        self.limit = limit


class Backpressure(BusBusy):
    """An organism's queue is full (seed 000's backpressure): the client must retry later."""

    def __init__(self, organism: str, pending: int, limit: int) -> None:
        super().__init__(f"organism {organism!r} has {pending} requests and work units waiting,"
                         f" its max_pending is {limit}; send again once the pump has caught"
                         " up, or raise max_pending in organism.yaml")
        self.organism = organism
        self.pending = pending
        self.limit = limit


class StoreCapacity(BusError):
    """The database file is too close to its size limit: the send is refused."""

    error_code = "full"

    def __init__(self, size: int, limit: int, reserve: int) -> None:
        super().__init__(f"the bus file is {size} bytes, within {reserve} bytes of its"
                         f" {limit}-byte limit; run `bus compact` or purge dead letters")
        self.size = size
        self.limit = limit
        self.reserve = reserve


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
