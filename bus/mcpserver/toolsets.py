"""Which tools a server lists: the daily loop always, the other groups when asked.

Every model request carries the schemas of the tools its client lists, so
`bus mcp` lists only an agent's daily loop unless `--tools` names more
groups (`--tools tasks,files`, `--tools all`). A tool group is a class
(server.py says how to write one) named here or registered under the
`agentbus.mcp_tools` entry point, whose name is the group's: `workers`
registers the worker lifecycle's tools so (setup.cfg). Its tools in DAILY
are listed always; the others when its group is chosen.

This module imports no group and nothing of the SDK: `bus mcp` checks
`--tools` and the stdio start keys its cache on the choice before either is
loaded.
"""

from __future__ import annotations

import importlib.metadata

from bus.storage.errors import ValidationFailed

# An agent's daily loop, listed first and in this order: who am I, talk (one message or a
# batch in one transaction), take work, finish it, guard the files it edits. `join` is served
# only where the server is not fixed to an agent. Twelve at most: every model request carries them.
DAILY = ("join", "publish", "publish_many", "exchange", "reply", "poll", "ack", "task_ready",
         "task_claim_next", "task_done", "reserve", "unreserve")
ALL = "all"
# Our own groups: name -> its class, spelled as an entry point's value.
OWN_GROUPS = {
    "admin": "bus.mcpserver.log_tools:LogTools",
    "channels": "bus.mcpserver.channel_tools:ChannelTools",
    "files": "bus.mcpserver.reservation_tools:ReservationTools",
    "pump": "bus.mcpserver.pump_tools:PumpTools",
    "tasks": "bus.mcpserver.task_tools:TaskTools",
}
# Packages above bus (workers) register their groups under this entry-point group.
ENTRY_POINT = "agentbus.mcp_tools"


def group_entries() -> dict[str, importlib.metadata.EntryPoint]:
    """Every tool group by name, ours then the registered ones; nothing is loaded yet."""
    own = {name: importlib.metadata.EntryPoint(name, value, ENTRY_POINT)
           for name, value in OWN_GROUPS.items()}
    registered = {point.name: point
                  for point in importlib.metadata.entry_points(group=ENTRY_POINT)}
    return {**own, **dict(sorted(registered.items()))}


def chosen_groups(text: str | None) -> frozenset[str]:
    """The groups named by `--tools` ("tasks,files", "all"; None or "" for none).

    Raises ValidationFailed naming the groups there are for a name that is none of them.
    """
    names = {name.strip() for name in (text or "").split(",") if name.strip()}
    if not names:
        return frozenset()
    # Ours are known without reading the installed packages' metadata (a few milliseconds).
    if names <= OWN_GROUPS.keys():
        return frozenset(names)
    known = group_entries()
    if ALL in names:
        return frozenset(known)
    unknown = sorted(names - known.keys())
    if unknown:
        raise ValidationFailed("tools", (
            f"no tool group is named {', '.join(unknown)}; the groups are"
            f" {', '.join(sorted(known))}, or {ALL} (the daily loop is always listed)"))
    return frozenset(names)
