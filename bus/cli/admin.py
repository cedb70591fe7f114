"""`bus` commands for the operator: status, consumers and cursors, tables and schema."""

from __future__ import annotations

import apsw
import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.storage.db import connect
from bus.storage.db import translate_busy
from bus.storage.errors import UnknownConsumer
from bus.log.messages import iso_utc
from bus.views.render import CONSUMER_COLUMNS
from bus.views.render import consumer_row
from bus.views.render import last_ack
from bus.views.render import status_lines
from bus.views.status import read_status
from bus.views.tables import list_tables
from bus.views.tables import table_schema


@click.command()
@json_option
@pass_bus_context
def status(obj: BusContext, as_json: bool) -> None:
    """Show the whole bus on one screen.

    The file, the log, consumers (the exporter among them), agents by
    liveness, claims, workers, channels, the pump and the export. Reads the
    file read-only.

    Example: bus status --json
    """
    found = read_status(obj.db, obj.durability)
    if as_json:
        echo_json(found.to_json_dict())
        return
    for line in status_lines(found):
        click.echo(line)


@click.command()
@json_option
@pass_bus_context
def consumers(obj: BusContext, as_json: bool) -> None:
    """List every consumer (each cursor, and the exporter) with its pending count and lag.

    Example: bus consumers --json
    """
    found = read_status(obj.db, obj.durability)
    echo_listing(found.consumers, as_json, "no consumers yet (no agent has acked)",
                 CONSUMER_COLUMNS, consumer_row)


@click.group()
def consumer() -> None:
    """Inspect one consumer.

    Example: bus consumer info worker-1
    """


@consumer.command()
@click.argument("agent")
@json_option
@pass_bus_context
def info(obj: BusContext, agent: str, as_json: bool) -> None:
    """Show one consumer's cursor, pending messages, lag and last ack time.

    Example: bus consumer info worker-1 --json
    """
    found = read_status(obj.db, obj.durability)
    one = found.consumer(agent)
    if one is None:
        raise UnknownConsumer(agent, [c.agent for c in found.consumers], "see `bus consumers`")
    if as_json:
        echo_json(one.to_json_dict())
        return
    acked = "never" if one.last_ack_ms is None else (
        f"{iso_utc(one.last_ack_ms)} ({last_ack(one)})")
    click.echo(f"consumer {one.agent} ({one.kind})")
    click.echo(f"cursor: {one.cursor} (last seq {found.log.last_seq})")
    click.echo(f"pending: {one.pending}, lag: {one.lag}")
    click.echo(f"last ack: {acked}")


@click.group()
def cursor() -> None:
    """Move or remove a consumer's cursor.

    Example: bus cursor set worker-1 --latest
    """


@cursor.command("set")
@click.argument("agent")
@click.argument("seq", type=click.IntRange(0), required=False)
@click.option("--latest", is_flag=True, help="Put the cursor at the last seq (skip the backlog).")
@click.option("--force", is_flag=True, help="Allow moving backwards (the agent gets those"
                                            " messages again).")
@click.option("--create", is_flag=True, help="Allow an agent with no cursor and no heartbeat.")
@json_option
@pass_bus_context
def cursor_set(obj: BusContext, agent: str, seq: int | None, latest: bool, force: bool,
               create: bool, as_json: bool) -> None:
    """Put AGENT's cursor at SEQ, or at the last seq with --latest.

    Refuses an unknown agent (a typo would hold back retention for ever)
    unless --create, and a move backwards unless --force.

    Example: bus cursor set worker-1 --latest
    """
    if (seq is None) == (not latest):
        raise click.UsageError("give SEQ or --latest (one of them)")
    position = obj.open().set_cursor(agent, seq, force=force, create=create)
    if as_json:
        echo_json({"agent": agent, "last_acked_seq": position})
    else:
        click.echo(f"{agent} cursor at seq {position}")


@cursor.command("delete")
@click.argument("agent")
@json_option
@pass_bus_context
def cursor_delete(obj: BusContext, agent: str, as_json: bool) -> None:
    """Remove AGENT's cursor, so it no longer holds back retention (`bus compact`).

    Example: bus cursor delete worker-typo
    """
    was = obj.open().delete_cursor(agent)
    if as_json:
        echo_json({"agent": agent, "deleted": True, "last_acked_seq": was})
    else:
        click.echo(f"deleted {agent}'s cursor (it was at seq {was})")


@click.command()
@json_option
@pass_bus_context
def tables(obj: BusContext, as_json: bool) -> None:
    """List the tables `bus sql` can query, with what each holds.

    Example: bus tables
    """
    found = list_tables(_read_only(obj))
    echo_listing(found, as_json, "no tables", ["table", "purpose"],
                 lambda t: (t.name, t.purpose))


@click.command()
@click.argument("table", required=False)
@json_option
@pass_bus_context
def schema(obj: BusContext, table: str | None, as_json: bool) -> None:
    """Print the CREATE statements of TABLE and its indexes (of every table without one).

    Example: bus schema messages
    """
    conn = _read_only(obj)
    names = [table] if table else [t.name for t in list_tables(conn)]
    with translate_busy():
        found = {name: table_schema(conn, name) for name in names}
    if as_json:
        for name, statements in found.items():
            echo_json({"table": name, "sql": statements})
        return
    for statements in found.values():
        for sql in statements:
            click.echo(f"{sql};")


@click.command("help")
@click.argument("words", nargs=-1)
@click.pass_context
def help_command(ctx: click.Context, words: tuple[str, ...]) -> None:
    """Show the help of a command, like `bus COMMAND --help`.

    Example: bus help channel send
    """
    here = ctx.find_root()
    for word in words:
        command = here.command
        found = command.get_command(here, word) if isinstance(command, click.Group) else None
        if found is None:
            asked = " ".join(words)
            raise click.UsageError(f"no command `bus {asked}`; `bus --help` lists them")
        here = found.make_context(word, [], parent=here, resilient_parsing=True)
    click.echo(here.get_help())


def _read_only(obj: BusContext) -> apsw.Connection:
    conn = connect(obj.db, readonly=True)
    obj.ctx.call_on_close(conn.close)
    return conn


COMMANDS = [status, consumers, consumer, cursor, tables, schema, help_command]
