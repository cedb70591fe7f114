"""How `bus` lays out its commands: help sections by part, and renamed commands' old names.

Commands are grouped under the part of the system they belong to, so
`bus --help` reads as a map. A command that moved into a part's group (`bus
send` became `bus channel send`) keeps its old name as a hidden alias for one
release; the alias runs the same command and says on stderr what it is called now.
"""

from __future__ import annotations

import copy
from typing import Any

import click

from bus.cli.context import DB_OPTION_NAME
from bus.cli.context import BusGroup
from bus.cli.context import db_option

# Section title -> the top-level commands in it, in the order `bus --help` lists them.
SECTIONS = (
    ("Log", ("init", "publish", "poll", "ack", "tail", "search")),
    ("Coordination", ("heartbeat", "alive", "forget", "claim", "renew", "release", "claims",
                      "reap", "task", "reserve", "reservations", "unreserve", "hooks")),
    ("Channels", ("channel", "dlq")),
    ("Pump and XML", ("pump", "xml")),
    ("Agents", ("mcp", "hook", "inbox", "token")),
    ("Export and history", ("export", "history")),
    ("Beyond one host", ("replicate", "restore", "mirror")),
    ("Admin", ("status", "check", "top", "serve", "consumers", "consumer", "cursor", "sql",
               "tables", "schema", "migrate", "gc", "compact", "help")),
)

# Old top-level name -> the group it moved into (the command keeps its name there).
MOVED = {
    "send": "channel", "receive": "channel", "acknowledge": "channel",
    "deliveries": "channel", "query": "channel", "thread": "channel",
    "threads": "pump", "organism": "pump", "oob": "pump",
}


class _Renamed:
    """The invoke of a hidden alias: a note on stderr, then the command itself."""

    def __init__(self, command: click.Command, old: str, new: str) -> None:
        self.command, self.old, self.new = command, old, new

    def __call__(self, ctx: click.Context) -> Any:
        click.echo(f"note: `bus {self.old}` is now `bus {self.new}`; the old name goes"
                   " in the next release", err=True)
        return type(self.command).invoke(self.command, ctx)


def hidden_alias(command: click.Command, old_name: str, group_name: str) -> click.Command:
    """A copy of `command` under its old top-level name, hidden from help."""
    new_name = f"{group_name} {command.name}"
    alias = copy.copy(command)
    alias.name = old_name
    alias.hidden = True
    alias.help = f"Renamed: use `bus {new_name}`.\n\n{command.help or ''}"
    alias.invoke = _Renamed(alias, old_name, new_name)  # type: ignore[method-assign]
    return alias


def add_moved_aliases(root: click.Group) -> None:
    """Register every MOVED name on the root group, taken from its new group."""
    for old_name, group_name in MOVED.items():
        group = root.commands[group_name]
        assert isinstance(group, click.Group)
        root.add_command(hidden_alias(group.commands[old_name], old_name, group_name))


def format_sections(group: click.Group, ctx: click.Context,
                    formatter: click.HelpFormatter) -> None:
    """The group's visible commands under SECTIONS; any not placed there under Other."""
    visible = {name: cmd for name in group.list_commands(ctx)
               if (cmd := group.get_command(ctx, name)) is not None and not cmd.hidden}
    placed = {name for _, names in SECTIONS for name in names}
    sections = [(title, [n for n in names if n in visible]) for title, names in SECTIONS]
    sections.append(("Other", sorted(set(visible) - placed)))
    limit = formatter.width - 6 - max(map(len, visible), default=0)
    for title, names in sections:
        if names:
            with formatter.section(title):
                formatter.write_dl([(n, visible[n].get_short_help_str(limit)) for n in names])


def leaf_commands(group: click.Group) -> list[click.Command]:
    """Every command under `group` that is not itself a group, each once."""
    found: dict[int, click.Command] = {}
    for command in group.commands.values():
        if isinstance(command, click.Group):
            found.update((id(c), c) for c in leaf_commands(command))
        else:
            found[id(command)] = command
    return list(found.values())


def add_db_after_command(root: click.Group) -> None:
    """Let every command take --db after its name too, where people type it."""
    for command in leaf_commands(root):
        # Hidden aliases share their command's parameter list: add it once.
        if not any(p.name == DB_OPTION_NAME for p in command.params):
            command.params.append(db_option())


class SectionedGroup(BusGroup):
    """The root `bus` group: `--help` lists its commands by part."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        format_sections(self, ctx, formatter)
