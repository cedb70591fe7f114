"""`bus channel ...` and `bus dlq ...`: the message engine's channels and dead letters.

`bus channel` creates, joins, inspects and changes channels, runs the
delivery timers (`tick`), and sends and reads their messages (send, receive,
acknowledge, deliveries, query, thread). `bus dlq` lists, shows, replays,
discards and purges the channels' dead letters.

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
from bus.channels.queries import ChannelMessage
from bus.channels.queries import MESSAGE_STATUSES
from bus.channels.queries import MESSAGE_TYPES
from bus.channels.queries import QueryResult
from bus.channels.queries import SORT_COLUMNS
from bus.channels.sending import DEFAULT_PRIORITY
from bus.channels.store import CHANNEL_TYPES
from bus.channels.store import Channel
from bus.channels.store import DELIVERY_MODES
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_messages
from bus.cli.output import echo_rows
from bus.cli.output import shortened
from bus.log.messages import iso_utc

channel_argument = click.argument("name")
agent_option = click.option("--agent", required=True, help="Agent id.")


def choices(values: Any) -> str:
    """Accepted values for an option's metavar; the library validates them."""
    return "|".join(values)


def engine_of(obj: BusContext) -> Channels:
    return obj.open().channels


# --- bus channel --------------------------------------------------------------


@click.group()
def channel() -> None:
    """Channels (direct, group, broadcast, pubsub) and the messages sent on them.

    \b
    Example:
      bus channel create ci-events --type pubsub --owner ci-agent
      bus channel subscribe ci-events --agent deploy-agent --pattern 'build.*.success'
      bus channel send --channel ci-events --from ci-agent --type event \\
          --topic build.frontend.success --content '847 tests passed'
      bus channel receive --agent deploy-agent
    """


@channel.command("create")
@channel_argument
@click.option("--type", "type_", required=True, metavar=choices(CHANNEL_TYPES),
              help="Who receives: the other party, everyone, everyone but the owner, or"
                   " matching subscriptions.")
@click.option("--owner", required=True, help="Agent that owns the channel (joined at once).")
@click.option("--max-message-size", type=int, help="Largest content in bytes [1048576].")
@click.option("--delivery-mode", metavar=choices(DELIVERY_MODES),
              help="Acks and retries [at_least_once].")
@click.option("--ack-timeout", type=float,
              help="Seconds to acknowledge, from the send and again from each receive [30].")
@click.option("--max-retries", type=int, help="Redeliveries before a dead letter [3].")
@click.option("--retry-backoff-ms", type=int, help="First retry's wait, doubled each time [1000].")
@click.option("--max-pending", type=int, help="Unacknowledged deliveries per receiver before"
                                              " delivery pauses [unlimited].")
@click.option("--echo", is_flag=True, help="Senders receive their own messages too.")
@click.option("--priority-ordering", is_flag=True, help="Receive higher priorities first.")
@json_option
@pass_bus_context
def channel_create(obj: BusContext, name: str, type_: str, owner: str, as_json: bool,
                   **settings: Any) -> None:
    """Create a channel owned by --owner.

    Example: bus channel create planner-executor --type direct --owner agent-planner
    """
    # Only what was given, so the library's defaults apply; `is`, because 0 == False.
    given = {key: value for key, value in settings.items()
             if value is not None and value is not False}
    made = engine_of(obj).create_channel(name, type_, owner, **given)
    if as_json:
        echo_json(made.to_json_dict())
        return
    config = made.config
    click.echo(f"created {made.type} channel {made.name} owned by {made.owner}"
               f" ({config.delivery_mode}, ack timeout {config.ack_timeout:g} s,"
               f" {config.max_retries} retries)")


@channel.command("join")
@channel_argument
@agent_option
@click.option("--role", default="member", show_default=True, metavar="member|observer",
              help="Observers receive but cannot send.")
@json_option
@pass_bus_context
def channel_join(obj: BusContext, name: str, agent: str, role: str, as_json: bool) -> None:
    """Add an agent to a channel (or change its role).

    Example: bus channel join planner-executor --agent agent-executor
    """
    engine_of(obj).join_channel(name, agent, role)
    if as_json:
        echo_json({"channel": name, "agent": agent, "role": role})
    else:
        click.echo(f"{agent} joined {name} as {role}")


@channel.command("leave")
@channel_argument
@agent_option
@json_option
@pass_bus_context
def channel_leave(obj: BusContext, name: str, agent: str, as_json: bool) -> None:
    """Remove an agent (and its subscriptions) from a channel.

    Example: bus channel leave discussion --agent agent-reviewer
    """
    left = engine_of(obj).leave_channel(name, agent)
    if as_json:
        echo_json({"channel": name, "agent": agent, "left": left})
    else:
        click.echo(f"{agent} left {name}" if left else f"{agent} was not in {name}")


@channel.command("subscribe")
@channel_argument
@agent_option
@click.option("--pattern", required=True,
              help="Topic pattern: segments, * for one, # for the rest.")
@json_option
@pass_bus_context
def channel_subscribe(obj: BusContext, name: str, agent: str, pattern: str, as_json: bool) -> None:
    """Subscribe an agent to a topic pattern on a pubsub channel (joining it if needed).

    The bus's own channel `_system` carries dead-letter notices (topic
    _system.message.deadletter); subscribing creates it if needed.

    Example: bus channel subscribe ci-events --agent monitor-agent --pattern 'deploy.#'
    """
    added = engine_of(obj).subscribe(name, agent, pattern)
    if as_json:
        echo_json({"channel": name, "agent": agent, "pattern": pattern, "subscribed": added})
    else:
        click.echo(f"{agent} {'subscribed to' if added else 'was already subscribed to'}"
                   f" {pattern} on {name}")


@channel.command("unsubscribe")
@channel_argument
@agent_option
@click.option("--pattern", required=True, help="The pattern given to subscribe.")
@json_option
@pass_bus_context
def channel_unsubscribe(obj: BusContext, name: str, agent: str, pattern: str,
                        as_json: bool) -> None:
    """Drop one of an agent's topic subscriptions.

    Example: bus channel unsubscribe ci-events --agent monitor-agent --pattern 'deploy.#'
    """
    removed = engine_of(obj).unsubscribe(name, agent, pattern)
    if as_json:
        echo_json({"channel": name, "agent": agent, "pattern": pattern, "unsubscribed": removed})
    else:
        click.echo(f"{agent} {'unsubscribed from' if removed else 'was not subscribed to'}"
                   f" {pattern} on {name}")


@channel.command("list")
@json_option
@pass_bus_context
def channel_list(obj: BusContext, as_json: bool) -> None:
    """List every channel with its type, owner, state and open deliveries.

    Example: bus channel list --json
    """
    found = engine_of(obj).list_channels()
    if as_json:
        for item in found:
            echo_json(item.to_json_dict())
    elif not found:
        click.echo("no channels")
    else:
        echo_rows(["name", "type", "owner", "state", "delivery_mode", "open"],
                  [(c.name, c.type, c.owner, c.state, c.config.delivery_mode, c.open_deliveries)
                   for c in found], False)


@channel.command("show")
@channel_argument
@json_option
@pass_bus_context
def channel_show(obj: BusContext, name: str, as_json: bool) -> None:
    """Show a channel's config, state, participants, subscriptions and open deliveries.

    Example: bus channel show ci-events
    """
    engine = engine_of(obj)
    found = engine.get_channel(name)
    members = engine.participants(name)
    subscriptions = engine.subscriptions(name)
    if as_json:
        echo_json({**found.to_json_dict(),
                   "participants": [p.to_json_dict() for p in members],
                   "subscriptions": [{"pattern": p, "agent": a} for p, a in subscriptions]})
        return
    _echo_channel(found)
    click.echo("participants:")
    echo_rows(["agent", "role", "joined"],
              [(p.agent, p.role, iso_utc(p.joined_at_ms)) for p in members], False)
    if found.type == "pubsub" and subscriptions:
        click.echo("subscriptions:")
        echo_rows(["pattern", "agent"], subscriptions, False)
    elif found.type == "pubsub":
        click.echo("subscriptions: none")


def _echo_channel(found: Channel) -> None:
    config = found.config
    pending = "unlimited" if config.max_pending is None else config.max_pending
    click.echo(f"channel {found.name}: {found.type}, {found.state}, owner {found.owner},"
               f" created {iso_utc(found.created_at_ms)}")
    click.echo(f"config: max_message_size {config.max_message_size},"
               f" delivery_mode {config.delivery_mode}, ack_timeout {config.ack_timeout:g} s,"
               f" max_retries {config.max_retries}, retry_backoff_ms {config.retry_backoff_ms},"
               f" max_pending {pending}, echo {_yes(config.echo)},"
               f" priority_ordering {_yes(config.priority_ordering)}")
    click.echo(f"open deliveries: {found.open_deliveries}")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _state_command(command: str, state: str, summary: str) -> click.Command:
    """`bus channel pause|resume|drain|close NAME`: one state change each."""

    @json_option
    @pass_bus_context
    def change(obj: BusContext, name: str, as_json: bool) -> None:
        engine_of(obj).set_channel_state(name, state)
        if as_json:
            echo_json({"channel": name, "state": state})
        else:
            click.echo(f"channel {name} is {state}")

    change.__doc__ = f"{summary}\n\n    Example: bus channel {command} ci-events\n    "
    return channel.command(command)(channel_argument(change))


_state_command("pause", "paused", "Hold a channel: no sends, no deliveries, until resumed.")
_state_command("resume", "active", "Make a paused or draining channel active again.")
_state_command("drain", "draining", "Stop new sends; deliver (and retry) what the channel holds.")
_state_command("close", "closed", "Close a channel for good: no sends, no deliveries, no joins.")


@channel.command("tick")
@json_option
@pass_bus_context
def channel_tick(obj: BusContext, as_json: bool) -> None:
    """Run the due timers: redeliver unacknowledged messages, dead-letter, expire queries.

    `bus channel receive` runs them too; run this from cron or a loop when nobody receives.

    Example: bus channel tick --json
    """
    report = engine_of(obj).tick()
    if as_json:
        echo_json(report.to_json_dict())
    else:
        click.echo(f"redelivered {report.redelivered}, dead-lettered {report.dead_lettered},"
                   f" expired queries {report.expired_queries}")


# --- bus channel: messages ----------------------------------------------------


@channel.command()
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


@channel.command()
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


@channel.command()
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


@channel.command()
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


@channel.command()
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


@channel.command()
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


# --- bus dlq ------------------------------------------------------------------


@click.group()
def dlq() -> None:
    """The channels' dead-letter queue: deliveries that ran out of retries.

    \b
    Example:
      bus dlq list
      bus dlq replay 1
      bus dlq purge --older-than 604800
    """


@dlq.command("list")
@click.option("--limit", default=1000, show_default=True, type=int, help="Most to list.")
@json_option
@pass_bus_context
def dlq_list(obj: BusContext, limit: int, as_json: bool) -> None:
    """List dead letters, oldest first.

    Example: bus dlq list --json
    """
    found = engine_of(obj).dead_letters(limit)
    if as_json:
        for item in found:
            echo_json(item.to_json_dict())
    elif not found:
        click.echo("no dead letters")
    else:
        echo_rows(["id", "seq", "channel", "recipient", "retries", "dead_lettered_at",
                   "last_error"],
                  [(d.id, d.message.seq, d.message.channel, d.recipient, d.retry_count,
                    iso_utc(d.dead_lettered_at_ms), d.last_error) for d in found], False)


@dlq.command("show")
@click.argument("dead_letter_id", metavar="ID", type=int)
@json_option
@pass_bus_context
def dlq_show(obj: BusContext, dead_letter_id: int, as_json: bool) -> None:
    """Show one dead letter: why it died and the whole message.

    Example: bus dlq show 1
    """
    found = engine_of(obj).dead_letter(dead_letter_id)
    if as_json:
        echo_json(found.to_json_dict())
        return
    click.echo(f"dead letter {found.id}: seq {found.message.seq} to {found.recipient},"
               f" {found.retry_count} retries, dead since {iso_utc(found.dead_lettered_at_ms)}")
    click.echo(f"last error: {found.last_error}")
    click.echo(format_channel_message(found.message))


@dlq.command("replay")
@click.argument("dead_letter_id", metavar="ID", type=int)
@json_option
@pass_bus_context
def dlq_replay(obj: BusContext, dead_letter_id: int, as_json: bool) -> None:
    """Deliver a dead letter again to its recipient, retries reset.

    Example: bus dlq replay 1
    """
    seq, recipient = engine_of(obj).replay_dead_letter(dead_letter_id)
    if as_json:
        echo_json({"id": dead_letter_id, "seq": seq, "recipient": recipient})
    else:
        click.echo(f"replayed dead letter {dead_letter_id}: seq {seq} is waiting for {recipient}")


@dlq.command("discard")
@click.argument("dead_letter_id", metavar="ID", type=int)
@json_option
@pass_bus_context
def dlq_discard(obj: BusContext, dead_letter_id: int, as_json: bool) -> None:
    """Remove a dead letter from the queue (the message stays in the history).

    Example: bus dlq discard 1
    """
    engine_of(obj).discard_dead_letter(dead_letter_id)
    if as_json:
        echo_json({"id": dead_letter_id, "discarded": True})
    else:
        click.echo(f"discarded dead letter {dead_letter_id}")


@dlq.command("purge")
@click.option("--older-than", required=True, type=float, help="Seconds; 604800 is a week.")
@json_option
@pass_bus_context
def dlq_purge(obj: BusContext, older_than: float, as_json: bool) -> None:
    """Discard every dead letter older than --older-than seconds.

    Example: bus dlq purge --older-than 604800
    """
    purged = engine_of(obj).purge_dead_letters(older_than)
    if as_json:
        echo_json({"purged": purged, "older_than": older_than})
    else:
        click.echo(f"purged {purged} dead letter(s) older than {older_than:g} s")


COMMANDS = [channel, dlq]
