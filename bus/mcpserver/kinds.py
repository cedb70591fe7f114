"""What each tool does to the bus, declared per tool: the MCP annotations a client reads.

A tool group declares `TOOLS = {"tool_name": KIND, ...}` with one of the kinds
below; the server turns each into the tool's `ToolAnnotations` (readOnlyHint,
idempotentHint, destructiveHint). This module imports nothing of the SDK, so a
tool group can declare its kinds without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolKind:
    """MCP's three hints: reads only; calling twice does what calling once did; may undo work."""

    read_only: bool
    idempotent: bool
    destructive: bool


# Reads and changes nothing (poll, liveness, *_list, *_status).
READS = ToolKind(read_only=True, idempotent=True, destructive=False)
# Adds something new each call (publish, channel_send, exchange): calling twice adds twice.
ADDS = ToolKind(read_only=False, idempotent=False, destructive=False)
# Sets a state; calling again with the same arguments changes nothing more (ack, heartbeat, join).
SETS = ToolKind(read_only=False, idempotent=True, destructive=False)
# May discard or replay others' or earlier work (cursor_reset, release, dlq_replay).
DISCARDS = ToolKind(read_only=False, idempotent=False, destructive=True)
# Discards, but calling again with the same arguments changes nothing more (cursor_reset to a seq).
RESETS = ToolKind(read_only=False, idempotent=True, destructive=True)
