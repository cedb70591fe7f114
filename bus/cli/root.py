"""The `bus` command's click group: the bus from the shell.

Human-readable output by default, JSON with --json (one object per line for
message streams). Exit codes: 0 ok, 1 error (`Error: ...` on stderr),
2 usage, 75 when the database stayed busy (retry later).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from bus import __version__
from bus.api import MAX_PAYLOAD_BYTES
from bus.cli.context import DB_OPTION_NAME
from bus.cli.context import DEFAULT_DB
from bus.cli.context import BusContext
from bus.cli.context import db_option
from bus.cli.layout import SECTIONS
from bus.cli.layout import SectionedGroup
from bus.cli.layout import add_db_after_command
from bus.cli.layout import add_moved_aliases
from bus.cli.layout import leaf_commands
from bus.cli.output import format_message

__all__ = ["main", "format_message"]

# The modules whose COMMANDS make up `bus`, one per section of `bus --help` (layout.SECTIONS),
# in the order they are registered.
COMMAND_MODULES = ("log", "coordination", "channels", "pump", "agents", "history", "replication",
                   "admin")
# The module of each command: one module per help section, in SECTIONS' order. A command
# run by name loads its own module alone, not the rest of the CLI (the pump, lxml, the
# views...): every `bus` process pays its imports, and an MCP client waits for `bus mcp`'s.
MODULE_OF = {name: module for (_, names), module in zip(SECTIONS, COMMAND_MODULES)
             for name in names}


class _Root(SectionedGroup):
    """The `bus` group, whose commands are imported when first needed.

    Any use of `commands` (help, completion, an old name) loads them all; a command
    run by its name is found without the others (MODULE_OF).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, click.Command] | None = None
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        if self._loaded is None:
            self._loaded = {}
            _register_all(self)
        return self._loaded

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._loaded = dict(value) if value else None  # click's __init__ passes {}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if self._loaded is None and cmd_name in MODULE_OF:
            return _alone(cmd_name)
        return super().get_command(ctx, cmd_name)


def _alone(name: str) -> click.Command:
    module = importlib.import_module(f"bus.cli.{MODULE_OF[name]}")
    command = next(c for c in module.COMMANDS if c.name == name)
    leaves = leaf_commands(command) if isinstance(command, click.Group) else [command]
    for leaf in leaves:  # as add_db_after_command
        if not any(p.name == DB_OPTION_NAME for p in leaf.params):
            leaf.params.append(db_option())
    return command


def _register_all(root: click.Group) -> None:
    for name in COMMAND_MODULES:
        for command in importlib.import_module(f"bus.cli.{name}").COMMANDS:
            root.add_command(command)
    add_moved_aliases(root)
    add_db_after_command(root)


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
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

