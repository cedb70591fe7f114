"""`bus` commands for the message log: init, publish, poll, ack, tail, search."""

from __future__ import annotations

import sys
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

import click
import orjson

from bus.api import Bus
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import PAYLOAD_PREVIEW
from bus.cli.output import echo_json
from bus.cli.output import echo_messages
from bus.cli.output import format_message
from bus.cli.output import shown_path
from bus.harness.git_exclude import exclude_directory
from bus.log.search import LIMIT_MAX
from bus.storage.errors import ValidationFailed

FOLLOW_BATCH = 1000
FOLLOW_WAKE_S = 1.0  # re-check at least this often even without a wake


# --- commands -----------------------------------------------------------------


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


# --- bus search ---------------------------------------------------------------


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


# --- helpers ------------------------------------------------------------------


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


COMMANDS = [init, publish, poll, ack, tail, search]
