"""agentbus: a SQLite-backed message bus for coordinating software agents.

The names below are imported when first used (PEP 562), not with the package:
a command that needs only part of the bus (a Claude Code hook runs at every
tool call) does not pay for loading the facade and the engines behind it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Each public name and the module it lives in.
_EXPORTS = {
    "Bus": "bus.api", "StaleFence": "bus.coordination.claims", "Consumer": "bus.log.consumer",
    "LoopStats": "bus.log.consumer", "process_loop": "bus.log.consumer",
    "Cursor": "bus.log.cursors",
    "BusBusy": "bus.storage.errors", "BusClosed": "bus.storage.errors",
    "BusError": "bus.storage.errors",
    "BusNotFound": "bus.storage.errors", "NotABusDatabase": "bus.storage.errors",
    "SchemaTooNew": "bus.storage.errors",
    "UnsupportedFilesystem": "bus.storage.errors", "ValidationFailed": "bus.storage.errors",
    "Message": "bus.log.messages", "PublishResult": "bus.log.messages",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
