"""`bus channel ...` and `bus dlq ...`: the message engine's channels and dead letters.

`bus channel` creates, joins, inspects and changes channels and runs the
delivery timers (`tick`); its message commands (send, receive, acknowledge,
deliveries, query, thread) are in `bus.cli.channel_messages`. `bus dlq`
lists, shows, replays, discards and purges the channels' dead letters.
"""

from __future__ import annotations

from typing import Any

import click

from bus.channels.store import CHANNEL_TYPES
from bus.channels.store import DELIVERY_MODES
from bus.channels.store import Channel
from bus.cli import channel_messages
from bus.cli.channel_messages import choices
from bus.cli.channel_messages import engine_of
from bus.cli.channel_messages import format_channel_message
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_rows
from bus.log.messages import iso_utc

channel_argument = click.argument("name")
agent_option = click.option("--agent", required=True, help="Agent id.")


# --- bus channel ------------------------------------------------------------


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


for _command in channel_messages.COMMANDS:
    channel.add_command(_command)


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


# --- bus dlq --------------------------------------------------------------------


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
