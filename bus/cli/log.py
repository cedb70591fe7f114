"""`bus` commands for the message log: init, publish, poll, ack, tail, sql, migrate, status,
check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import apsw
import apsw.ext
import click
import orjson

from bus.api import Bus
from bus.cli.context import BusContext
from bus.cli.context import json_anywhere
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import PAYLOAD_PREVIEW
from bus.cli.output import echo_json
from bus.cli.output import echo_messages
from bus.cli.output import echo_query_rows
from bus.cli.output import shown_path
from bus.storage.db import connect
from bus.storage.db import environment_error
from bus.storage.errors import DatabaseCorrupt
from bus.storage.errors import ValidationFailed
from bus.harness.git_exclude import exclude_directory
from bus.storage.db import check_database
from bus.storage.schema import migrate
from bus.storage.schema import schema_status

FOLLOW_BATCH = 1000
FOLLOW_WAKE_S = 1.0  # re-check at least this often even without a wake
PROGRESS_MIN = 50_000  # messages of backlog that earn a progress bar


# --- commands -------------------------------------------------------------


@click.command()
@json_option
@pass_bus_context
def init(obj: BusContext, as_json: bool) -> None:
    """Create the bus database (and its directory) and bring its schema up to date.

    In a git checkout the bus's directory is added to the repository's
    .git/info/exclude (unless git ignores it already), so `git status` stays
    clean; outside git nothing else changes.

    Example: bus --db .worker-state/bus.db init
    """
    existed = Path(obj.db).exists()
    bus = obj.open(create=True)
    version = bus.schema_version()
    excluded = exclude_directory(Path(obj.db).absolute().parent)
    if as_json:
        echo_json({"path": obj.db, "created": not existed, "schema_version": version,
                   "git_exclude": excluded.to_json_dict()})
        return
    verb = "ready" if existed else "created"
    click.echo(f"bus {verb} at {obj.db} (schema version {version})")
    if excluded.added:
        click.echo(f"added {excluded.pattern.strip('/')}/ to {shown_path(excluded.exclude_file)}"
                   " so git status ignores it")


@click.command()
@click.option("--from", "from_agent", required=True, help="Sending agent id.")
@click.option("--type", "type_", required=True, help="Message type, e.g. task_assign.")
@click.option("--to", help="Recipient agent id; omit to broadcast.")
@click.option("--payload", help="JSON payload, or - to read it from stdin.")
@click.option("--payload-file", type=click.File("rb"), help="Read the JSON payload from a file (- for stdin).")
@click.option("--id", "message_id", help="Message UUID; publishing an existing id again is a no-op.")
@click.option("--correlation-id", help="Groups messages of one task or conversation.")
@click.option("--in-reply-to", help="Id of the message this one answers.")
@click.option("--task", "task_id", help="The task the message reports on (its correlation id).")
@click.option("--fence", type=click.IntRange(1),
              help="The task's fence from bus claim: the message is refused (exit 1) once"
                   " another agent took the task over. Needs --task.")
@json_option
@pass_bus_context
def publish(obj: BusContext, from_agent: str, type_: str, to: str | None, payload: str | None,
            payload_file: Any, message_id: str | None, correlation_id: str | None,
            in_reply_to: str | None, task_id: str | None, fence: int | None,
            as_json: bool) -> None:
    """Append one message to the bus.

    A message --to a name the bus has never seen (no heartbeat, cursor, worker, token,
    delivery or message from it) is accepted, since its agent may come later, with a
    warning on stderr (and a "warning" field with --json).

    Example: bus publish --from planner --to worker-1 --type task_assign --payload '{"task": "t1"}'

    A holder's result, refused if its lease went to another agent meanwhile:

    Example: bus publish --from worker-1 --type result --task t1 --fence 3 --payload '{"ok": true}'
    """
    value = _read_payload(payload, payload_file, obj.max_payload_bytes)
    bus = obj.open()
    result = bus.publish(from_agent, type_, value, to=to, id=message_id,
                         correlation_id=correlation_id, in_reply_to=in_reply_to,
                         task=task_id, fence=fence)
    warning = bus.recipient_warning(to)
    if warning:
        click.echo(f"Warning: {warning}", err=True)
    if as_json:
        echo_json({**result.to_json_dict(), **({"warning": warning} if warning else {})})
    elif result.duplicate:
        click.echo(f"duplicate: id {result.id} was already published as seq {result.seq}")
    else:
        click.echo(f"published seq {result.seq} id {result.id} (durable: {result.durable})")


@click.command()
@click.option("--agent", required=True, help="Consuming agent id.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Most messages to return.")
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for a message when none is waiting.")
@click.option("--from-latest", is_flag=True,
              help="An agent without a cursor starts at the last seq, not the whole log.")
@click.option("--include-own", is_flag=True,
              help="Show the agent's own messages too, broadcast or sent to itself (left out by"
                   " default: it sent them).")
@click.option("--seq", type=click.IntRange(1),
              help="Only this message, whole, acked or not (one a hook showed cut short).")
@json_option
@pass_bus_context
def poll(obj: BusContext, agent: str, limit: int, wait: float, from_latest: bool,
         include_own: bool, seq: int | None, as_json: bool) -> None:
    """Show the messages waiting for an agent; the cursor does not move (see `ack`).

    The agent's own messages are not shown unless --include-own; `ack`
    passes them. The direct messages shown get a delivery receipt (see `bus status`).
    --seq N: that message alone, whole (the rest of a body a hook cut).

    Example: bus poll --agent worker-1 --wait 30
    """
    bus = obj.open()
    if from_latest:
        bus.start_at_latest(agent)
    preview = _preview(as_json)
    if seq is not None:
        found = bus.message_for(agent, seq)
    else:
        found = bus.poll(agent, limit, wait=wait, preview=preview, include_own=include_own)
    echo_messages(found, as_json)
    bus.record_delivered(agent, found, "poll")
    if not found and not as_json:
        where = f"at seq {seq}" if seq is not None else f"above seq {bus.cursor(agent)}"
        click.echo(f"no messages for {agent} {where}", err=True)


@click.command()
@click.option("--agent", required=True, help="Consuming agent id.")
@click.option("--seq", required=True, type=int, help="Last seq the agent has handled.")
@click.option("--include-own", is_flag=True,
              help="Stop at SEQ, not past the agent's own messages after it (for a reader"
                   " that polls with --include-own).")
@json_option
@pass_bus_context
def ack(obj: BusContext, agent: str, seq: int, include_own: bool, as_json: bool) -> None:
    """Mark messages up to SEQ handled; the cursor never moves backwards.

    The agent's own messages that follow SEQ, which poll does not show, are
    passed too, so the cursor may land above SEQ.

    Example: bus ack --agent worker-1 --seq 42
    """
    position = obj.open().ack(agent, seq, include_own=include_own)
    if as_json:
        echo_json({"agent": agent, "last_acked_seq": position})
    else:
        click.echo(f"{agent} acked up to seq {position}")


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new messages until Ctrl-C.")
@click.option("--since", type=click.IntRange(0), help="Start after this seq (default: the last N).")
@click.option("-n", "--lines", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="How many recent messages to show when --since is not given.")
@json_option
@pass_bus_context
def tail(obj: BusContext, follow: bool, since: int | None, lines: int, as_json: bool) -> None:
    """Print the newest messages, for every agent; with --follow, keep going.

    Example: bus tail --follow --json
    """
    bus = obj.open()
    try:
        if since is None:
            shown = bus.last_messages(lines, preview=_preview(as_json))
            after = shown[-1].seq if shown else bus.last_seq()
            echo_messages(shown, as_json)
        else:
            after = _echo_all_after(bus, since, as_json)
        if follow:
            _follow(bus, after, as_json)
    except KeyboardInterrupt:
        if not follow:
            raise


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


# --- helpers --------------------------------------------------------------


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


def _read_payload(payload: str | None, payload_file: Any, limit: int) -> Any:
    """The JSON value given; input far over the size limit is refused before it is all read."""
    if payload is not None and payload_file is not None:
        raise click.UsageError("give --payload or --payload-file, not both")
    if payload == "-":
        text, source = _read_at_most(sys.stdin.buffer, limit), "--payload -"
    elif payload is not None:
        text, source = payload, "--payload"
    elif payload_file is not None:
        text, source = _read_at_most(payload_file, limit), "--payload-file"
    else:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=source) from None


def _preview(as_json: bool) -> int:
    """How much of a blob to read: a human line never loads a whole one, --json prints it."""
    return 0 if as_json else PAYLOAD_PREVIEW


def _read_at_most(stream: Any, limit: int) -> bytes:
    """Read a payload, refusing it once it is over twice the limit (the bus checks the JSON
    it stores, which drops whitespace, against the limit itself)."""
    cap = 2 * limit
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise ValidationFailed("payload", f"is over {cap} bytes as given; the limit is {limit}"
                                          " bytes of JSON (bus --max-payload-bytes): store large"
                                          " data in a file and send its path")
    return data


def _echo_all_after(bus: Bus, after: int, as_json: bool) -> int:
    """Print every message above `after` in batches; return the last seq printed."""
    while True:
        batch = bus.list_messages(after, FOLLOW_BATCH, preview=_preview(as_json))
        echo_messages(batch, as_json)
        if not batch:
            return after
        after = batch[-1].seq


def _follow(bus: Bus, after: int, as_json: bool) -> None:
    """Print new messages as they are committed, until Ctrl-C."""
    while True:
        bus.wait_for_change(FOLLOW_WAKE_S)
        after = _echo_all_after(bus, after, as_json)


@click.command()
@click.option("--out", type=click.Path(),
              help="JSONL file, or directory with --partition-by (default: where the export"
                   " went before, else bus.jsonl beside the db).")
@click.option("-f", "--follow", is_flag=True, help="Keep exporting as messages arrive, until Ctrl-C.")
@click.option("--partition-by", type=click.Choice(["date"]),
              help="Write date=YYYY-MM-DD/part-*.jsonl under the --out directory (for Spark);"
                   " without --out, as the export went before.")
@json_option
@pass_bus_context
def export(obj: BusContext, out: str | None, follow: bool, partition_by: str | None,
           as_json: bool) -> None:
    """Append new messages to the JSONL export, once each, in seq order.

    Safe to kill at any moment: the next run neither loses nor repeats a line.

    Example: bus export --follow & tail -f .worker-state/bus.jsonl
    """
    bus = obj.open()
    with bus.exporter(out, partition_by) as exporter:
        try:
            total = _export_with_progress(exporter)
            if as_json:
                echo_json({"path": str(exporter.path), "exported": total})
            else:
                click.echo(f"exported {total} message(s) to {exporter.path}")
            if follow:
                exporter.follow(bus.wait_for_change)
        except KeyboardInterrupt:
            if not follow:
                raise


def _export_with_progress(exporter) -> int:
    """Export the backlog, with a progress bar on a terminal when it is large."""
    pending = exporter.pending()
    if pending < PROGRESS_MIN or not sys.stderr.isatty():
        return exporter.export()
    total = 0
    with click.progressbar(length=pending, label="exporting", file=sys.stderr) as bar:
        for done in exporter.export_batches():
            total += done
            bar.update(done)
    return total


COMMANDS = [init, publish, poll, ack, tail, sql, migrate_command, check, export]
