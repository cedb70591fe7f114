"""`bus` commands for the operator: status, check, top, serve, consumers and cursors, sql,
tables and schema, migrate, gc and compact, help."""

from __future__ import annotations

from typing import Any
from typing import Callable

import apsw
import apsw.ext
import click

from bus.api import Bus
from bus.api import GC_GRACE_SECONDS
from bus.cli.agents import tools_option
from bus.cli.context import BusContext
from bus.cli.context import json_anywhere
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.cli.output import echo_query_rows
from bus.log.messages import iso_utc
from bus.storage.db import check_database
from bus.storage.db import connect
from bus.storage.db import environment_error
from bus.storage.db import translate_busy
from bus.storage.errors import DatabaseCorrupt
from bus.storage.errors import UnknownConsumer
from bus.storage.schema import migrate
from bus.storage.schema import schema_status
from bus.views.render import CONSUMER_COLUMNS
from bus.views.render import consumer_row
from bus.views.render import last_ack
from bus.views.render import status_lines
from bus.views.status import read_status
from bus.views.tables import list_tables
from bus.views.tables import table_schema

grace_option = click.option("--grace-seconds", default=GC_GRACE_SECONDS, show_default=True,
                            type=click.FloatRange(0),
                            help="Keep unreferenced blobs younger than this (writes in flight).")


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


# --- bus check ----------------------------------------------------------------


@click.command()
@click.option("--full", is_flag=True,
              help="Run integrity_check (also compares every index with its table; slower)"
                   " instead of quick_check.")
@json_option
@pass_bus_context
def check(obj: BusContext, full: bool, as_json: bool) -> None:
    """Check the bus file for damage with SQLite's quick_check (--full: integrity_check).

    Only reads. Exits 1 when the file is damaged, after listing what SQLite found.

    Example: bus check --full
    """
    report = check_database(obj.db, full)
    if as_json:
        echo_json(report.to_json_dict())
    elif report.ok:
        click.echo(f"{obj.db}: ok ({report.to_json_dict()['check']})")
    else:
        for problem in report.problems:
            click.echo(problem)
    if not report.ok:
        raise DatabaseCorrupt(obj.db, f"{len(report.problems)} problem(s) found")


# --- bus top and bus serve: they keep watching --------------------------------


@click.command()
@pass_bus_context
def top(obj: BusContext) -> None:
    """Watch agents, workers, claims and the message stream live; q or Ctrl-C quits.

    The screen changes when something commits to the bus (not on a timer),
    and reads the file read-only. Keys: a, w, c, t, n, h, e switch between
    agents, workers, claims, tasks, consumers, channels and reservations; Enter
    opens the selected row (Escape goes back); s sorts by the next column, r
    reverses.

    Example: bus top
    """
    # Textual loads only for the command that draws, and comes with the views extra.
    run_top = import_extra("bus.views.top", "views", "bus top").run_top
    run_top(obj.db, obj.durability)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; another than this machine's needs a token"
                   " (bus token create), and then every request needs one.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port; the URL is printed).")
@click.option("--mcp", "with_mcp", is_flag=True,
              help="Also serve MCP over Streamable HTTP at /mcp (a bearer token per agent).")
@tools_option
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A name clients use to reach a non-loopback --host (the Host header);"
                   " repeat for more.")
@click.option("--certfile", type=click.Path(exists=True, dir_okay=False),
              help="Serve HTTPS with this certificate (PEM); needs --keyfile.")
@click.option("--keyfile", type=click.Path(exists=True, dir_okay=False),
              help="The private key of --certfile (PEM).")
@click.option("--require-token", is_flag=True,
              help="Require a token for the page too on loopback (always so on another --host).")
@click.option("--allow-remote", is_flag=True, hidden=True,
              help="Deprecated: a non-loopback --host now needs a token instead.")
@pass_bus_context
def serve(obj: BusContext, host: str, port: int, with_mcp: bool, tools: frozenset[str],
          allowed_hosts: tuple[str, ...], certfile: str | None, keyfile: str | None,
          require_token: bool, allow_remote: bool) -> None:
    """Serve a live status page with charts, and with --mcp the bus to MCP clients.

    The page updates as commits land and works offline (Plotly is served
    from the installed package). /messages browses the log (filters in the
    URL: type, sender, to, task, since, text), and every agent, worker, task
    and channel has a page of its own. It listens on 127.0.0.1 unless --host says
    otherwise; beyond this machine every request needs a token (a browser
    opens the page once with ?token=...). /mcp always needs one: a request
    acts as its token's agent. See docs/remote.md.

    \b
    Example:
      bus serve --port 8765   # then open http://127.0.0.1:8765/
      bus token create --agent worker-1
      bus serve --mcp --host 0.0.0.0 --certfile cert.pem --keyfile key.pem
      bus serve --mcp --tools tasks,files   # the daily loop and two tool groups
    """
    # Starlette and uvicorn load only for this command; plotly (whose JS the page
    # loads from the installed package) is checked now, not at the first request.
    views = import_extra("bus.views.serve", "views", "bus serve")
    import_extra("plotly", "views", "bus serve")
    if (certfile is None) != (keyfile is None):
        raise click.UsageError("--certfile and --keyfile go together; give both or neither")
    if tools and not with_mcp:
        raise click.UsageError("--tools chooses the tools served at /mcp; give --mcp too")
    if allow_remote:
        click.echo("note: --allow-remote is no longer needed: a non-loopback --host is served"
                   " when a token exists (bus token create), and every request needs one",
                   err=True)
    options = views.ServerOptions(host, port, allowed_hosts, certfile, keyfile, require_token)

    def ready(url: str) -> None:
        if options.plain_http_beyond_loopback:
            click.echo(f"warning: serving {host} over plain HTTP: tokens and the bus cross the"
                       " network readable by anyone on the path; give --certfile and --keyfile",
                       err=True)
        mcp_note = f" and MCP at {url}mcp" if with_mcp else ""
        click.echo(f"serving {obj.db} at {url}{mcp_note} (Ctrl-C stops)")

    try:
        views.serve(obj.db, options, durability=obj.durability, ready=ready, open_bus=obj.open,
                    extension=_mcp_endpoint(tools) if with_mcp else None)
    except KeyboardInterrupt:
        pass  # uvicorn has shut down cleanly and re-raised the Ctrl-C: stopping is the normal end


def _mcp_endpoint(tools: frozenset[str]) -> Callable[[Bus], Any]:
    """The MCP endpoint at /mcp, made once the server has opened the bus."""
    http = import_extra("bus.mcpserver.http", "mcp", "bus serve --mcp")
    return lambda bus: http.McpEndpoint(bus, tools)


# --- bus sql and bus migrate --------------------------------------------------


@click.command()
@click.argument("query")
@click.option("--table", "shape", flag_value="table", default=True,
              help="Aligned columns (the default).")
@click.option("--csv", "shape", flag_value="csv", help="CSV with a header row; NULL is empty.")
@click.option("--nl", "shape", flag_value="nl", help="One JSON object per row, one per line.")
@click.option("--json", "as_json", is_flag=True, callback=json_anywhere,
              help="One JSON array of row objects.")
@pass_bus_context
def sql(obj: BusContext, query: str, shape: str, as_json: bool) -> None:
    """Run a read-only SQL query on the bus file and print the rows.

    Writes fail: the connection is opened read-only. Change the bus through
    the other commands. `bus tables` lists what there is to query.

    \b
    Example:
      bus sql "SELECT type, count(*) FROM messages GROUP BY type"
      bus sql --csv "SELECT * FROM cursors" > cursors.csv
    """
    conn = connect(obj.db, readonly=True)
    obj.ctx.call_on_close(lambda: conn.close(True))
    try:
        columns, rows = _run_read_only(conn, query)
    except apsw.CorruptError as exc:
        raise environment_error(exc, conn.filename) from exc
    except (apsw.ReadOnlyError, apsw.AuthError):
        raise click.ClickException(
            "bus sql is read-only and cannot change the database; "
            "use bus publish / bus ack / bus migrate to write"
        ) from None
    except apsw.Error as exc:
        raise click.ClickException(f"SQL failed: {exc}") from None
    echo_query_rows(columns, rows, "json" if as_json else shape)


@click.command("migrate")
@click.option("--status", "status_only", is_flag=True, help="Only report versions; change nothing.")
@json_option
@pass_bus_context
def migrate_command(obj: BusContext, status_only: bool, as_json: bool) -> None:
    """Apply pending schema migrations, or report them with --status.

    Example: bus migrate --status
    """
    conn = connect(obj.db, obj.durability, create=False)
    obj.ctx.call_on_close(conn.close)
    before = schema_status(conn, obj.db)
    applied = [] if status_only else migrate(conn, obj.db)
    after = schema_status(conn, obj.db)
    if as_json:
        echo_json({"path": obj.db, "version": after.current, "latest": after.latest,
                    "pending": [f"{m.version:04d}_{m.name}" for m in after.pending],
                    "applied": [f"{m.version:04d}_{m.name}" for m in applied]})
        return
    click.echo(f"schema version {after.current} (latest {after.latest})")
    for m in applied:
        click.echo(f"applied {m.version:04d}_{m.name}")
    if status_only:
        for m in before.pending:
            click.echo(f"pending {m.version:04d}_{m.name}")


def _run_read_only(conn: apsw.Connection, query: str) -> tuple[list[str], list[tuple]]:
    """Run one statement; return its column names and rows."""
    if apsw.ext.query_info(conn, query).query_remaining:
        raise click.UsageError("bus sql runs one statement at a time; drop what follows the first ';'")
    cursor = conn.execute(query)
    try:
        # The description exists only while the statement has rows to give.
        columns = [name for name, _decl in cursor.get_description()]
    except apsw.ExecutionCompleteError:
        return [], []
    return columns, cursor.fetchall()


# --- bus gc and bus compact ---------------------------------------------------


@click.command()
@grace_option
@json_option
@pass_bus_context
def gc(obj: BusContext, grace_seconds: float, as_json: bool) -> None:
    """Delete blobs that no message references (after a grace period).

    Example: bus gc --grace-seconds 600
    """
    removed = obj.open().gc_blobs(grace_seconds)
    if as_json:
        echo_json({"deleted": removed})
    else:
        click.echo(f"deleted {len(removed)} unreferenced blob(s)")


@click.command()
@click.option("--keep-days", default=7.0, show_default=True, type=click.FloatRange(0),
              help="Keep messages younger than this many days.")
@click.option("--dry-run", is_flag=True, help="Count what would go; change nothing.")
@grace_option
@json_option
@pass_bus_context
def compact(obj: BusContext, keep_days: float, dry_run: bool, grace_seconds: float,
            as_json: bool) -> None:
    """Delete old messages every cursor has acked, orphaned blobs, and shrink the WAL.

    A message is deleted only when it is older than --keep-days and every
    consumer (and the exporter, once used) has acknowledged it.

    Example: bus compact --keep-days 30 --dry-run
    """
    report = obj.open().compact(keep_days, dry_run=dry_run, grace_seconds=grace_seconds)
    if as_json:
        echo_json(report.to_json_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {report.messages} message(s) older than {iso_utc(report.cutoff_ms)}"
               f" acked by every cursor (through seq {report.acked_through})")
    if not dry_run:
        click.echo(f"deleted {len(report.blobs)} unreferenced blob(s)")
        note = " (passive checkpoint: Litestream replicates this bus)" \
            if report.checkpoint == "passive" else ""
        click.echo(f"WAL {report.wal_bytes_before} -> {report.wal_bytes_after} bytes{note}")


COMMANDS = [status, check, top, serve, consumers, consumer, cursor, sql, tables, schema,
            migrate_command, gc, compact, help_command]
