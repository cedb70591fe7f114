"""`bus` commands for coordination: heartbeats, liveness, task claims, reaping, retention."""

from __future__ import annotations

from typing import Any
from typing import Callable

import click

from bus.api import GC_GRACE_SECONDS
from bus.coordination.claims import ClaimResult
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.cli.output import echo_rows
from bus.coordination.heartbeats import KEEP
from bus.coordination.heartbeats import STATUSES
from bus.coordination.heartbeats import Thresholds
from bus.log.messages import iso_utc
from bus.log.messages import now_ms

task_option = click.option("--task", "task_id", required=True, help="Task id.")
agent_option = click.option("--agent", required=True, help="Agent id.")
fence_option = click.option("--fence", type=click.IntRange(1),
                            help="The fence bus claim gave; refused (exit 1) once another agent"
                                 " took the task over.")
grace_option = click.option("--grace-seconds", default=GC_GRACE_SECONDS, show_default=True,
                            type=click.FloatRange(0),
                            help="Keep unreferenced blobs younger than this (writes in flight).")


def threshold_options(*names: str):
    """--warn/--stale/--dead: seconds of silence for each liveness state.

    One not given takes its default, lowered to fit the ones given.
    """
    defaults = Thresholds()

    def decorate(command):
        for name in reversed(names):
            command = click.option(
                f"--{name}", f"{name}_s", type=click.FloatRange(0, min_open=True),
                help=f"Seconds of silence after which an agent is {name}"
                     f" (default {getattr(defaults, name):g}).")(command)
        return command
    return decorate


@click.command()
@agent_option
@click.option("--status", default="idle", show_default=True, type=click.Choice(STATUSES))
@click.option("--task", help="What the agent is working on (default: as its last beat;"
                            " '' clears it and the progress).")
@click.option("--progress", type=float,
              help="Fraction done, from 0 to 1 (default: as its last beat, for the same task).")
@json_option
@pass_bus_context
def heartbeat(obj: BusContext, agent: str, status: str, task: str | None,
              progress: float | None, as_json: bool) -> None:
    """Record one heartbeat for an agent (for agents driven from the shell).

    Without --task the agent keeps its task and progress; --task '' clears both.

    Example: bus heartbeat --agent worker-1 --status working --task t1 --progress 0.5
    """
    bus = obj.open()
    ts = bus.heartbeats.beat(agent, status, KEEP if task is None else (task or None),
                             KEEP if progress is None else progress)
    if as_json:
        beat = next(b for b in bus.heartbeats.liveness() if b.agent == agent)
        echo_json({"agent": agent, "ts_ms": ts, "status": status, "task": beat.task,
                   "progress": beat.progress})
    else:
        click.echo(f"heartbeat for {agent} at {iso_utc(ts)} ({status})")


@click.command()
@threshold_options("warn", "stale", "dead")
@click.option("--all", "show_all", is_flag=True,
              help="Also show agents that stopped cleanly (state stopped).")
@json_option
@pass_bus_context
def alive(obj: BusContext, warn_s: float | None, stale_s: float | None, dead_s: float | None,
          show_all: bool, as_json: bool) -> None:
    """Show every agent's liveness from its last heartbeat, most silent first.

    States: alive, warn (30 s silent), stale (100 s), dead (300 s); agents
    whose last beat said stopped (worker done/fail/cancel) only with --all.

    Example: bus alive --all --json
    """
    found = obj.open().heartbeats.liveness(thresholds=Thresholds.given(warn_s, stale_s, dead_s),
                                           stopped=show_all)
    empty = "no heartbeats yet" if show_all else "no running agents; --all shows stopped ones too"
    echo_listing(found, as_json, empty,
                 ["agent", "state", "silent_s", "status", "task", "progress"],
                 lambda i: (i.agent, i.state, f"{i.age_s:.1f}", i.status, i.task or "",
                            "" if i.progress is None else f"{i.progress:.2f}"))


@click.command()
@click.argument("agent")
@json_option
@pass_bus_context
def forget(obj: BusContext, agent: str, as_json: bool) -> None:
    """Remove an agent's heartbeat row (refused while it holds claims).

    Example: bus forget worker-1
    """
    removed = obj.open().heartbeats.forget(agent)
    if as_json:
        echo_json({"agent": agent, "forgotten": removed})
    else:
        click.echo(f"forgot {agent}" if removed else f"{agent} had no heartbeat; nothing to forget")


def lease_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--lease-ms and --max-attempts, as every command that takes a lease has them."""
    command = click.option("--max-attempts", default=5, show_default=True,
                           type=click.IntRange(1),
                           help="Takes after which an expiring task is declared dead.")(command)
    return click.option("--lease-ms", default=60_000, show_default=True, type=click.IntRange(1),
                        help="Lease length; renew it (bus renew) before it runs out.")(command)


@click.command()
@task_option
@agent_option
@lease_options
@json_option
@pass_bus_context
def claim(obj: BusContext, task_id: str, agent: str, lease_ms: int, max_attempts: int,
          as_json: bool) -> None:
    """Take the lease on a task: exit 0 if the agent holds it, 1 if not.

    Each new holder gets the task's next fence (--json: "fence"); pass it to
    renew, release and publish --task as --fence, so they are refused once
    another agent has taken the task over.

    Example: bus claim --task t1 --agent worker-1 --lease-ms 30000
    """
    result = obj.open().claims.try_claim(task_id, agent, lease_ms, max_attempts=max_attempts)
    if as_json:
        echo_json(_result_json(result))
        if not result.granted:
            obj.ctx.exit(1)
    elif result.granted:
        c = result.claim
        click.echo(f"{agent} holds {task_id} until {iso_utc(c.lease_until_ms)}"
                   f" (attempt {c.attempts} of {c.max_attempts}, fence {c.fence})")
    else:
        raise click.ClickException(_refusal(task_id, result))


@click.command()
@task_option
@agent_option
@click.option("--lease-ms", type=click.IntRange(1), help="New lease length (default: the claim's).")
@fence_option
@json_option
@pass_bus_context
def renew(obj: BusContext, task_id: str, agent: str, lease_ms: int | None, fence: int | None,
          as_json: bool) -> None:
    """Extend the agent's unexpired lease on a task: exit 1 if it has none.

    With --fence, exit 1 unless it is the task's current fence.

    Example: bus renew --task t1 --agent worker-1 --fence 3
    """
    bus = obj.open()
    renewed = bus.claims.renew(task_id, agent, lease_ms, fence=fence)
    current = next((c for c in bus.claims.list() if c.task_id == task_id), None)
    if as_json:
        echo_json({"renewed": renewed, "claim": current.to_json_dict() if current else None})
        if not renewed:
            obj.ctx.exit(1)
    elif renewed:
        click.echo(f"{agent} holds {task_id} until {iso_utc(current.lease_until_ms)}")
    else:
        raise click.ClickException(f"{agent} has no unexpired lease on {task_id}"
                                   f"{_holder_note(current)}; bus claim takes a task that is free or expired")


@click.command()
@task_option
@agent_option
@fence_option
@json_option
@pass_bus_context
def release(obj: BusContext, task_id: str, agent: str, fence: int | None, as_json: bool) -> None:
    """Give a task back: exit 1 if the agent does not hold it.

    With --fence, exit 1 unless it is the task's current fence.

    Example: bus release --task t1 --agent worker-1 --fence 3
    """
    released = obj.open().claims.release(task_id, agent, fence=fence)
    if as_json:
        echo_json({"released": released, "task": task_id, "agent": agent})
        if not released:
            obj.ctx.exit(1)
    elif released:
        click.echo(f"{agent} released {task_id}")
    else:
        raise click.ClickException(f"{agent} does not hold {task_id}")


@click.command()
@click.option("--dead", is_flag=True, help="List tasks that ran out of attempts instead.")
@json_option
@pass_bus_context
def claims(obj: BusContext, dead: bool, as_json: bool) -> None:
    """List current claims (or, with --dead, tasks that ran out of attempts).

    Example: bus claims --dead --json
    """
    bus = obj.open()
    found = bus.claims.dead() if dead else bus.claims.list()
    if as_json:
        for item in found:
            echo_json(item.to_json_dict())
    elif not found:
        click.echo("no dead tasks" if dead else "no claims")
    elif dead:
        echo_rows(["task", "last_holder", "attempts", "died", "reason"],
                  [(d.task_id, d.last_holder, d.attempts, iso_utc(d.died_at_ms), d.reason)
                   for d in found], False)
    else:
        now = now_ms()
        echo_rows(["task", "agent", "fence", "state", "lease_until", "attempts"],
                  [(c.task_id, c.agent, c.fence, "expired" if c.expired(now) else "held",
                    iso_utc(c.lease_until_ms), f"{c.attempts}/{c.max_attempts}")
                   for c in found], False)


@click.command()
@threshold_options("dead")
@json_option
@pass_bus_context
def reap(obj: BusContext, dead_s: float | None, as_json: bool) -> None:
    """Release the claims of dead agents and announce each with task_released.

    Example: bus reap --dead 300
    """
    reaped = obj.open().claims.reap(thresholds=Thresholds.given(dead=dead_s))
    if as_json:
        for c in reaped:
            echo_json(c.to_json_dict())
    elif not reaped:
        click.echo("nothing to reap: no live lease is held by a dead agent")
    for c in reaped if not as_json else ():
        click.echo(f"released {c.task_id} held by {c.agent} (agent dead, fence {c.fence})")


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


def _result_json(result: ClaimResult) -> dict[str, object]:
    return {"granted": result.granted, "fence": result.fence,
            "claim": result.claim.to_json_dict() if result.claim else None,
            "dead": result.dead.to_json_dict() if result.dead else None}


def _refusal(task_id: str, result: ClaimResult) -> str:
    if result.dead is not None:
        return (f"{task_id} is dead: {result.dead.reason} (last holder {result.dead.last_holder});"
                " see bus claims --dead")
    c = result.claim
    return (f"{task_id} is held by {c.agent} until {iso_utc(c.lease_until_ms)}"
            f" (attempt {c.attempts} of {c.max_attempts}, fence {c.fence})")


def _holder_note(current) -> str:
    if current is None:
        return " (nobody holds it)"
    if current.expired(now_ms()):
        return f" (the lease of {current.agent} expired at {iso_utc(current.lease_until_ms)})"
    return f" (held by {current.agent} until {iso_utc(current.lease_until_ms)})"


COMMANDS = [heartbeat, alive, forget, claim, renew, release, claims, reap, gc, compact]
