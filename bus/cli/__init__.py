"""The `bus` command: the bus from the shell.

Human-readable output by default, JSON with --json (one object per line for
message streams). Exit codes: 0 ok, 1 error (`Error: ...` on stderr),
2 usage, 75 when the database stayed busy (retry later).
"""

from __future__ import annotations

import click

from bus import __version__
from bus.api import MAX_PAYLOAD_BYTES
from bus.cli import admin
from bus.cli import channels
from bus.cli import coordination
from bus.cli import harness
from bus.cli import history
from bus.cli import live
from bus.cli import mcp
from bus.cli import messaging
from bus.cli import pump
from bus.cli import reservations
from bus.cli import search
from bus.cli import tasks
from bus.cli import xml
from bus.cli.context import DEFAULT_DB
from bus.cli.context import BusContext
from bus.cli.layout import SectionedGroup
from bus.cli.layout import add_db_after_command
from bus.cli.layout import add_moved_aliases
from bus.cli.output import format_message

__all__ = ["main", "format_message"]


@click.group(cls=SectionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="BUS_DB", default=DEFAULT_DB, show_default=True,
              type=click.Path(dir_okay=False), help="Bus database file (env: BUS_DB).")
@click.option("--durability", envvar="BUS_DURABILITY", default="normal", show_default=True,
              type=click.Choice(["normal", "full"]),
              help="normal: a publish survives a crash; full: power loss too (fsync).")
@click.option("--max-payload-bytes", envvar="BUS_MAX_PAYLOAD_BYTES", default=MAX_PAYLOAD_BYTES,
              show_default=True, type=click.IntRange(1),
              help="Refuse a message whose payload JSON is longer (env: BUS_MAX_PAYLOAD_BYTES).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output and JSON errors, as if --json followed the command.")
@click.version_option(__version__, "--version", prog_name="bus")
@click.pass_context
def main(ctx: click.Context, db: str, durability: str, max_payload_bytes: int,
         as_json: bool) -> None:
    """agentbus: a message bus for agents in one SQLite file.

    \b
    Example:
      bus init
      bus publish --from planner --to worker-1 --type task_assign --payload '{"task": "t1"}'
      bus poll --agent worker-1
      bus ack --agent worker-1 --seq 1
    """
    ctx.obj = BusContext(ctx, db, durability, max_payload_bytes, as_json)


for _module in (messaging, coordination, tasks, reservations, history, channels, pump, xml,
                search, mcp, harness, admin, live):
    for _command in _module.COMMANDS:
        main.add_command(_command)
add_moved_aliases(main)
add_db_after_command(main)
