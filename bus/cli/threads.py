"""`bus pump threads`: the pump's conversations as the thread registry holds them."""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_listing
from bus.log.messages import iso_utc
from bus.pump import threads as registry


@click.command("threads")
@click.option("--status", type=click.Choice(registry.STATUSES), help="Only open or closed threads.")
@click.option("--limit", default=100, show_default=True,
              type=click.IntRange(1, registry.LIST_LIMIT_MAX), help="Show the newest N.")
@json_option
@pass_bus_context
def threads(obj: BusContext, status: str | None, limit: int, as_json: bool) -> None:
    """List threads, oldest first: UUID, path (organism/caller/.../listener), parent, status.

    Example: bus pump threads --status open --json
    """
    found = registry.list_threads(obj.open().conn, status, limit)
    echo_listing(found, as_json, "no threads",
                 ["uuid", "path", "parent", "status", "created", "closed"],
                 lambda t: (t.uuid, registry.PATH_SEPARATOR.join(t.path), t.parent_uuid or "-",
                            t.status, iso_utc(t.created_at_ms),
                            "-" if t.closed_at_ms is None else iso_utc(t.closed_at_ms)))

