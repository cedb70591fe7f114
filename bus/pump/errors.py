"""The pump's errors: its thread registry, organism.yaml, the out-of-band channel, backpressure.

Each is a `BusError`; `bus.storage.errors` re-exports them under their old import path.
"""

from __future__ import annotations

from bus.storage.errors import BusBusy
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed


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


class Backpressure(BusBusy):
    """An organism's queue is full (backpressure): the client must retry later."""

    def __init__(self, organism: str, pending: int, limit: int) -> None:
        super().__init__(f"organism {organism!r} has {pending} requests and work units waiting,"
                         f" its max_pending is {limit}; send again once the pump has caught"
                         " up, or raise max_pending in organism.yaml")
        self.organism = organism
        self.pending = pending
        self.limit = limit
