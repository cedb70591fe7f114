"""`bus search`: full-text search over message payloads (bus/log/search.py)."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone

import click

from bus.api import Bus
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import format_message
from bus.log.search import LIMIT_MAX


class _Since(click.ParamType):
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""

    name = "TIME"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{value!r} is neither epoch milliseconds nor an ISO 8601 time like"
                      " 2026-11-22T18:00:00Z", param, ctx)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return int(when.timestamp() * 1000)


@click.command()
@click.argument("query", required=False)
@click.option("--type", "type_", help="Only messages of this type.")
@click.option("--from", "from_agent", help="Only messages from this agent.")
@click.option("--to", help="Only messages to this agent (or #channel, @organism).")
@click.option("--since", type=_Since(), help="Only messages since TIME (ISO 8601 or epoch ms).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, LIMIT_MAX))
@click.option("--enable", is_flag=True, help="Build the index (once per bus), then search.")
@click.option("--disable", is_flag=True, help="Drop the index: publishes stop paying for it.")
@json_option
@pass_bus_context
def search(obj: BusContext, query: str | None, type_: str | None, from_agent: str | None,
           to: str | None, since: int | None, limit: int, enable: bool, disable: bool,
           as_json: bool) -> None:
    """Find messages by the words of their payloads, best match first.

    QUERY is FTS5 syntax: words (all must occur), "a phrase", OR, NOT,
    prefix*. The index is optional per bus, since each publish pays for it:
    `bus search --enable` builds it from the log once, and from then on
    publishes keep it in step (compaction removes what it deletes).

    \b
    Example:
      bus search --enable
      bus search 'deploy* frontend' --from ci-agent --since 2026-11-22T00:00:00Z --json
    """
    if enable and disable:
        raise click.UsageError("give --enable or --disable, not both")
    if not (query or enable or disable):
        raise click.UsageError("give a QUERY (or --enable / --disable)")
    bus = obj.open()
    if enable or disable:
        _switch(bus, enable, as_json)
    if query:
        hits = bus.search(query, type=type_, from_agent=from_agent, to=to, since_ms=since,
                          limit=limit)
        for hit in hits:
            if as_json:
                echo_json(hit.to_json_dict())
            else:
                click.echo(format_message(hit.message))


def _switch(bus: Bus, enable: bool, as_json: bool) -> None:
    if enable:
        indexed = bus.enable_search()
        report = {"search": "enabled", "indexed": indexed}
        line = f"search enabled: {indexed} messages indexed"
    else:
        bus.disable_search()
        report, line = {"search": "disabled"}, "search disabled"
    if as_json:
        echo_json(report)
    else:
        click.echo(line)


COMMANDS = (search,)
