"""The message engine's errors: an unknown channel, and the limits that refuse a send.

Each is a `BusError`; `bus.storage.errors` re-exports them under their old import path.
"""

from __future__ import annotations

from bus.storage.errors import BusError


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


class StoreCapacity(BusError):
    """The database file is too close to its size limit: the send is refused."""

    error_code = "full"

    def __init__(self, size: int, limit: int, reserve: int) -> None:
        super().__init__(f"the bus file is {size} bytes, within {reserve} bytes of its"
                         f" {limit}-byte limit; run `bus compact` or purge dead letters")
        self.size = size
        self.limit = limit
        self.reserve = reserve
