"""Channel messages: `bus channel send`, receive, acknowledge, deliveries, query, thread.

Message streams (receive, query, thread) print one line per message, or
with --json one object per line, on stdout. receive and query then print a
summary on stderr: how many were returned, how many matched in all and
whether more follow (with --json, the object
{"returned": N, "total_count": M, "has_more": bool}), so stdout stays a
pure stream of messages.
"""

from __future__ import annotations

import sys
from typing import Any
from typing import Callable

import click
import orjson

from bus.channels.delivery import ACK_STATUSES
from bus.channels.engine import Channels
from bus.channels.queries import MESSAGE_STATUSES
from bus.channels.queries import MESSAGE_TYPES
from bus.channels.queries import SORT_COLUMNS
from bus.channels.queries import ChannelMessage
from bus.channels.queries import QueryResult
from bus.channels.sending import DEFAULT_PRIORITY
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_messages
from bus.cli.output import echo_rows
from bus.cli.output import shortened
from bus.log.messages import iso_utc


agent_option = click.option("--agent", required=True, help="Agent id.")


def choices(values: Any) -> str:
    """Accepted values for an option's metavar; the library validates them."""
    return "|".join(values)


def engine_of(obj: BusContext) -> Channels:
    return obj.open().channels


@click.command()
@click.option("--channel", "channel_name", required=True, help="Channel to send on.")
@click.option("--from", "sender", required=True, help="Sending agent (a participant).")
@click.option("--type", "type_", required=True, metavar=choices(MESSAGE_TYPES),
              help="query gets a new correlation id; response needs --correlation-id.")
@click.option("--content", required=True, help="The message text, or - to read it from stdin.")
@click.option("--json-content", is_flag=True, help="Parse --content as JSON and send the value.")
@click.option("--topic", help="Topic (pubsub channels need one), e.g. build.frontend.success.")
@click.option("--priority", type=int, default=DEFAULT_PRIORITY, show_default=True,
              help="0 lowest to 4 highest.")
@click.option("--correlation-id", help="Thread id; a response quotes its query's.")
@click.option("--in-reply-to", help="Id of the message this one answers.")
@click.option("--timeout", type=float, help="Query only: seconds until it expires unanswered.")
@json_option
@pass_bus_context
def send(obj: BusContext, channel_name: str, sender: str, type_: str, content: str,
         json_content: bool, topic: str | None, priority: int, correlation_id: str | None,
         in_reply_to: str | None, timeout: float | None, as_json: bool) -> None:
    """Send a message on a channel; prints its seq, id and correlation id.

    Content is text; `-` reads stdin (one trailing newline dropped).

    \b
    Example:
      bus channel send --channel discussion --from agent-lead --type query --content 'Pool size?'
      bus channel send --channel discussion --from agent-researcher --type response \\
        --correlation-id CORR --content '20 connections'
    """
    value = _read_content(content, json_content)
    sent = engine_of(obj).send_message(channel_name, sender, type_, value, topic=topic,
                                       priority=priority, correlation_id=correlation_id,
                                       in_reply_to=in_reply_to, timeout=timeout)
    if as_json:
        echo_json(sent.to_json_dict())
        return
    corr = f" correlation_id {sent.correlation_id}" if sent.correlation_id else ""
    click.echo(f"sent seq {sent.seq} id {sent.id}{corr}")


def _read_content(content: str, json_content: bool) -> Any:
    text = content
    if content == "-":
        text = sys.stdin.read()
        text = text[:-1] if text.endswith("\n") else text
    if not json_content:
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--content") from None


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The MessageFilter options shared by receive and query."""
    options = [
        click.option("--channel", "channel_name", help="Only this channel."),
        click.option("--after-ms", type=int, help="Sent at or after (epoch ms)."),
        click.option("--before-ms", type=int, help="Sent before (epoch ms)."),
        click.option("--type", "types", multiple=True, metavar=choices(MESSAGE_TYPES),
                     help="Only these types (repeat the option)."),
        click.option("--sender", help="Only from this agent."),
        click.option("--topic", help="Topic or pattern with * and #."),
        click.option("--status", "statuses", multiple=True, metavar=choices(MESSAGE_STATUSES),
                     help="Only messages in these states (repeat the option)."),
        click.option("--correlation-id", help="Only this thread."),
        click.option("--content-pattern", help="Python regular expression searched in content."),
        click.option("--sort-by", metavar=choices(SORT_COLUMNS), help="[created_at]"),
        click.option("--sort-order", metavar="asc|desc", help="Default: see above."),
        click.option("--limit", type=int, help="Most messages to return [100]."),
        click.option("--offset", type=int, help="Skip this many matches first [0]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


_FILTER_KEYS = {"channel_name": "channel", "after_ms": "after_ms", "before_ms": "before_ms",
                "types": "types", "sender": "sender", "topic": "topic", "statuses": "status",
                "correlation_id": "correlation_id", "content_pattern": "content_pattern",
                "sort_by": "sort_by", "sort_order": "sort_order", "limit": "limit",
                "offset": "offset"}


def _filter(engine: Channels, options: dict[str, Any]) -> dict[str, Any]:
    """The given filter options as MessageFilter fields (the library validates them).

    A --channel that does not exist is an error rather than an empty result,
    so a typo does not look like silence.
    """
    if options.get("channel_name") is not None:
        engine.get_channel(options["channel_name"])
    return {_FILTER_KEYS[key]: value for key, value in options.items()
            if value is not None and value != ()}


@click.command()
@agent_option
@filter_options
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for a message when none is waiting.")
@json_option
@pass_bus_context
def receive(obj: BusContext, agent: str, wait: float, as_json: bool, **options: Any) -> None:
    """Take the messages waiting for an agent on its channels, oldest first.

    Each message printed counts as delivered: on an at_least_once channel it
    comes back after the ack timeout unless acknowledged (`bus channel acknowledge`).
    stderr gets a summary: how many were waiting and whether more are.

    Example: bus channel receive --agent agent-executor --channel planner-executor --wait 30
    """
    bus = obj.open()
    engine = bus.channels
    flt = _filter(engine, options)
    found = bus.wait_for(lambda: engine.receive_messages(agent, flt), wait,
                         done=lambda result: bool(result.messages))
    _echo_result(found, as_json, f"for {agent}", "more are waiting: receive again")


@click.command()
@agent_option
@click.option("--seq", required=True, type=int, help="The message's seq (from receive).")
@click.option("--status", required=True, metavar=choices(ACK_STATUSES),
              help="received / in_progress keep the delivery alive; completed / failed end it.")
@click.option("--note", help="Details, e.g. the result or the error.")
@json_option
@pass_bus_context
def acknowledge(obj: BusContext, agent: str, seq: int, status: str, note: str | None,
                as_json: bool) -> None:
    """Record an agent's acknowledgment of a message it received.

    \b
    Example:
      bus channel acknowledge --agent agent-executor --seq 3 --status completed \\
          --note 'Deployed.'
    """
    result = engine_of(obj).acknowledge_message(seq, agent, status, note)
    if as_json:
        echo_json({"seq": seq, "agent": agent, "status": result})
    else:
        click.echo(f"{agent} acknowledged seq {seq}: {result}")


@click.command()
@click.option("--seq", required=True, type=int, help="The message's seq.")
@json_option
@pass_bus_context
def deliveries(obj: BusContext, seq: int, as_json: bool) -> None:
    """Show each recipient's delivery of a message: the sender's view of its acks.

    Example: bus channel deliveries --seq 3
    """
    found = engine_of(obj).deliveries(seq)
    if as_json:
        for item in found:
            echo_json(item.to_json_dict())
    elif not found:
        click.echo(f"message {seq} has no deliveries")
    else:
        echo_rows(["recipient", "status", "attempts", "retries", "note"],
                  [(d.recipient, d.status, d.attempts, d.retry_count, d.note or "")
                   for d in found], False)


@click.command()
@filter_options
@json_option
@pass_bus_context
def query(obj: BusContext, as_json: bool, **options: Any) -> None:
    """Search every channel's messages (history; nothing is delivered), newest first.

    stderr gets a summary: how many matched and whether more follow.

    Example: bus channel query --type command --after-ms 1767225600000 --limit 50
    """
    engine = engine_of(obj)
    found = engine.query_messages(_filter(engine, options))
    _echo_result(found, as_json, "matching", "more follow: page with --offset")


@click.command()
@click.argument("correlation_id")
@json_option
@pass_bus_context
def thread(obj: BusContext, correlation_id: str, as_json: bool) -> None:
    """Print a thread: the messages sharing a correlation id, oldest first.

    Example: bus channel thread 0b6c3f2e-5d0e-4c1a-9f5e-2d7c1b8a9e10
    """
    found = engine_of(obj).get_thread(correlation_id)
    _echo_channel_messages(found, as_json)
    if not found and not as_json:
        click.echo(f"no messages with correlation id {correlation_id}", err=True)


def _echo_result(found: QueryResult, as_json: bool, what: str, hint: str) -> None:
    _echo_channel_messages(found.messages, as_json)
    shown = len(found.messages)
    if as_json:
        click.echo(orjson.dumps({"returned": shown, "total_count": found.total_count,
                                 "has_more": found.has_more}).decode(), err=True)
    elif not found.total_count:
        click.echo(f"no messages {what}", err=True)
    else:
        more = f"; {hint}" if found.has_more else ""
        click.echo(f"{shown} of {found.total_count} message(s) {what}{more}", err=True)


def _echo_channel_messages(found: list[ChannelMessage], as_json: bool) -> None:
    echo_messages(found, as_json, format_channel_message)


def format_channel_message(message: ChannelMessage) -> str:
    """One line: #seq time sender -> #channel type [topic prio corr reply attempt] content."""
    parts = [f"#{message.seq}", iso_utc(message.ts_ms), f"{message.sender} -> #{message.channel}",
             message.type]
    if message.topic:
        parts.append(f"topic={message.topic}")
    if message.priority != DEFAULT_PRIORITY:
        parts.append(f"priority={message.priority}")
    if message.correlation_id:
        parts.append(f"corr={message.correlation_id}")
    if message.in_reply_to:
        parts.append(f"reply-to={message.in_reply_to}")
    if message.attempt is not None and message.attempt > 1:
        parts.append(f"attempt={message.attempt}")
    if message.content_error:
        parts.append(f"!{message.content_error}")
    else:
        parts.append(shortened(orjson.dumps(message.content).decode()))
    return "  ".join(parts)


COMMANDS = [send, receive, acknowledge, deliveries, query, thread]
