"""The mirror's errors: each refuses before anything in the bus changes.

Each is a `BusError`; `bus.storage.errors` re-exports them under its own import path too.
"""

from __future__ import annotations

from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed


class NatsUrlInvalid(ValidationFailed):
    """--url is not a NATS server URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__("--url", f"{url!r} {reason}; give nats://host:4222 (or tls://, ws://,"
                         " wss://), several separated by commas", value=url)
        self.url = url


class NatsUnreachable(BusError):
    """No NATS server answered at the URL."""

    error_code = "unavailable"

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"nats: no server answered at {url} ({detail}); start one"
                         " (nats-server -js) or check --url")
        self.url = url
        self.detail = detail


class JetStreamUnavailable(BusError):
    """The server answered but has no JetStream (started without -js, or not enabled for us)."""

    error_code = "unavailable"

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"nats: the server at {url} has no JetStream ({detail}); start it with"
                         " -js or enable JetStream for this account")
        self.url = url


class StreamMismatch(BusError):
    """A stream of that name exists but is not a mirror of a bus (other subjects or metadata)."""

    error_code = "conflict"

    def __init__(self, stream: str, found: str, wanted: str) -> None:
        super().__init__(f"--stream: the stream {stream} exists with {found}, not {wanted};"
                         " name another stream (or delete that one with `nats stream rm`)")
        self.stream = stream
        self.found = found


class SubjectsTaken(BusError):
    """Another stream already captures the subjects the mirror publishes to."""

    error_code = "conflict"

    def __init__(self, stream: str, subjects: list[str], detail: str) -> None:
        super().__init__(f"--stream: cannot create {stream}: another stream already captures"
                         f" {', '.join(subjects)} ({detail}); mirror into that stream or"
                         " remove its subjects")
        self.stream = stream
        self.subjects = subjects


class StreamOfAnotherBus(BusError):
    """The stream's last message is not this bus's message at that seq."""

    error_code = "conflict"

    def __init__(self, stream: str, seq: int, reason: str) -> None:
        super().__init__(f"--stream: {stream} mirrors another bus: its last message is seq"
                         f" {seq}, {reason}; give each bus its own stream")
        self.stream = stream
        self.seq = seq


class ImportSubjectsInvalid(ValidationFailed):
    """--import names no subject, a malformed one, or one the mirror itself publishes to."""

    def __init__(self, subjects: str, reason: str) -> None:
        super().__init__("--import", f"{subjects!r} {reason}; give subjects outside bus.> such"
                         " as 'inbox.>' or 'agents.*.out', separated by commas", value=subjects)
        self.subjects = subjects
