"""agentbus: a SQLite-backed message bus for coordinating software agents."""

from __future__ import annotations

from bus.api import Bus
from bus.claims import StaleFence
from bus.consumer import Consumer
from bus.consumer import LoopStats
from bus.consumer import process_loop
from bus.cursors import Cursor
from bus.errors import BusBusy
from bus.errors import BusClosed
from bus.errors import BusError
from bus.errors import BusNotFound
from bus.errors import NotABusDatabase
from bus.errors import SchemaTooNew
from bus.errors import UnsupportedFilesystem
from bus.errors import ValidationFailed
from bus.messages import Message
from bus.messages import PublishResult

__version__ = "0.1.0"

__all__ = [
    "Bus", "BusBusy", "BusClosed", "BusError", "BusNotFound", "Consumer", "Cursor",
    "LoopStats", "Message", "NotABusDatabase", "PublishResult", "SchemaTooNew",
    "StaleFence", "UnsupportedFilesystem", "ValidationFailed", "__version__", "process_loop",
]
