"""`bus` commands that keep watching: top (terminal) and serve (web page)."""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import pass_bus_context


@click.command()
@pass_bus_context
def top(obj: BusContext) -> None:
    """Watch agents, consumers, claims, throughput and lag live; q or Ctrl-C quits.

    The screen changes when something commits to the bus (not on a timer),
    and reads the file read-only.

    Example: bus top
    """
    from bus.views.top import run_top  # Textual loads only for the command that draws

    run_top(obj.db, obj.durability)


COMMANDS = [top]
