"""`bus` commands for coordination: heartbeats, liveness, claims, tasks, file reservations.

`bus task` is the task graph: add tasks with dependencies, list what is ready,
take and finish. Priorities run from 0 (the most urgent, listed first) to 4,
as in beads; among equal priorities the oldest task comes first. `bus reserve`,
`bus reservations`, `bus unreserve` and `bus hooks` are file reservations.
"""

from __future__ import annotations

import os
import re
from typing import Any
from typing import Callable

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.cli.output import echo_rows
from bus.coordination import githooks
from bus.coordination.claims import ClaimResult
from bus.coordination.heartbeats import KEEP
from bus.coordination.heartbeats import STATUSES
from bus.coordination.heartbeats import Thresholds
from bus.coordination.reservations import DEFAULT_TTL_MS
from bus.coordination.reservations import EXCLUSIVE
from bus.coordination.reservations import PathsReserved
from bus.coordination.reservations import ReservationConflict
from bus.coordination.reservations import SHARED
from bus.coordination.reservations import worker_of_worktree
from bus.coordination.tasks import PRIORITY_DEFAULT
from bus.coordination.tasks import PRIORITY_HIGHEST
from bus.coordination.tasks import PRIORITY_LOWEST
from bus.coordination.tasks import STATES
from bus.coordination.tasks import Task
from bus.coordination.tasks import TaskDetail
from bus.log.messages import iso_utc
from bus.log.messages import now_ms
from bus.storage.errors import BusNotFound
from bus.storage.errors import ValidationFailed

task_option = click.option("--task", "task_id", required=True, help="Task id.")
agent_option = click.option("--agent", required=True, help="Agent id.")
fence_option = click.option("--fence", type=click.IntRange(1),
                            help="The fence bus claim gave; refused (exit 1) once another agent"
                                 " took the task over.")
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


# --- bus task -----------------------------------------------------------------


task_argument = click.argument("task_id", metavar="ID")
after_option = click.option("--after", "after", multiple=True, metavar="DEP",
                            help="A task this one waits on (repeat for several).")
_TASK_COLUMNS = ["task", "priority", "state", "waiting_on", "title"]


def _task_row(task: Task) -> tuple[object, ...]:
    return (task.task_id, task.priority, task.state, task.waiting_on, task.title or "")


@click.group()
def task() -> None:
    """A graph of tasks: dependencies, a ready list, claim the next, mark done.

    Priority 0 is the most urgent, 4 the least (default 2). A task is ready
    when every task it waits on is done, it is open, and no live lease holds it.

    \b
    Example:
      bus task add design --title "Design the schema"
      bus task add build --after design --priority 1
      bus task ready
      bus task claim-next --agent worker-1
      bus task done design --agent worker-1 --fence 1
    """


@task.command("add")
@task_argument
@click.option("--title", help="What the task is, for people.")
@after_option
@click.option("--priority", default=PRIORITY_DEFAULT, show_default=True,
              type=click.IntRange(PRIORITY_HIGHEST, PRIORITY_LOWEST),
              help="0 is the most urgent, 4 the least.")
@json_option
@pass_bus_context
def task_add(obj: BusContext, task_id: str, title: str | None, after: tuple[str, ...],
             priority: int, as_json: bool) -> None:
    """Add a task that waits on the --after tasks (each must exist).

    Example: bus task add build --title "Build it" --after design --priority 1
    """
    added = obj.open().tasks.add(task_id, title, after=after, priority=priority)
    if as_json:
        echo_json({**added.to_json_dict(), "after": list(dict.fromkeys(after))})
        return
    waits = f", waiting on {', '.join(dict.fromkeys(after))}" if after else ""
    click.echo(f"added {task_id} (priority {priority}{waits})")


@task.command("depend")
@task_argument
@click.option("--after", "after", multiple=True, required=True, metavar="DEP",
              help="A task this one waits on (repeat for several).")
@json_option
@pass_bus_context
def task_depend(obj: BusContext, task_id: str, after: tuple[str, ...], as_json: bool) -> None:
    """Make an open task wait on more tasks; one that would close a cycle is refused.

    Example: bus task depend deploy --after review
    """
    added = obj.open().tasks.add_dependencies(task_id, after)
    if as_json:
        echo_json({"task": task_id, "added": added})
    elif added:
        click.echo(f"{task_id} now waits on {', '.join(added)} too")
    else:
        click.echo(f"{task_id} waited on {', '.join(dict.fromkeys(after))} already")


@task.command("ready")
@click.option("--limit", type=click.IntRange(1), help="Show at most this many.")
@json_option
@pass_bus_context
def task_ready(obj: BusContext, limit: int | None, as_json: bool) -> None:
    """List the tasks that can be taken now: most urgent first, then oldest.

    Example: bus task ready --json
    """
    found = obj.open().tasks.ready(limit)
    echo_listing(found, as_json, "no task is ready", ["task", "priority", "title"],
                 lambda t: (t.task_id, t.priority, t.title or ""))


@task.command("list")
@click.option("--state", type=click.Choice(STATES), help="Only the tasks in this state.")
@json_option
@pass_bus_context
def task_list(obj: BusContext, state: str | None, as_json: bool) -> None:
    """List the tasks, oldest first.

    Example: bus task list --state open
    """
    found = obj.open().tasks.list(state)
    echo_listing(found, as_json, f"no {state} tasks" if state else "no tasks yet",
                 _TASK_COLUMNS, _task_row)


@task.command("show")
@task_argument
@json_option
@pass_bus_context
def task_show(obj: BusContext, task_id: str, as_json: bool) -> None:
    """Show one task: state, dependencies, dependents, holder, fence and events.

    Example: bus task show build
    """
    detail = obj.open().tasks.detail(task_id)
    if as_json:
        echo_json(detail.to_json_dict())
    else:
        for line in _detail_lines(detail):
            click.echo(line)


@task.command("claim-next")
@click.option("--agent", required=True, help="Agent id that takes the task.")
@lease_options
@json_option
@pass_bus_context
def task_claim_next(obj: BusContext, agent: str, lease_ms: int, max_attempts: int,
                    as_json: bool) -> None:
    """Claim the first ready task; exit 1 when none is ready.

    Example: bus task claim-next --agent worker-1 --lease-ms 600000
    """
    claimed = obj.open().tasks.claim_next(agent, lease_ms, max_attempts=max_attempts)
    if claimed is None:
        if as_json:
            echo_json({"claimed": False, "task": None})
            obj.ctx.exit(1)
        raise click.ClickException("no task is ready: see `bus task list --state open` for"
                                   " what the open ones wait on")
    if as_json:
        echo_json({"claimed": True, **claimed.to_json_dict()})
        return
    title = f": {claimed.task.title}" if claimed.task.title else ""
    click.echo(f"{agent} holds {claimed.task.task_id}{title}"
               f" until {iso_utc(claimed.claim.lease_until_ms)} (fence {claimed.fence})")


@task.command("done")
@task_argument
@click.option("--agent", required=True, help="Agent id that holds the task.")
@click.option("--fence", type=click.IntRange(1),
              help="The fence claim-next gave; a stale one is refused.")
@json_option
@pass_bus_context
def task_done(obj: BusContext, task_id: str, agent: str, fence: int | None,
              as_json: bool) -> None:
    """Mark a task you hold done: its lease ends, its dependents may become ready.

    Example: bus task done build --agent worker-1 --fence 3
    """
    # A stale --fence or another holder's task: exit 1 naming the flag (their errors are
    # `refused_by_state`, bus/cli/flags.py), not a usage error.
    done = obj.open().tasks.complete(task_id, agent, fence=fence)
    if as_json:
        echo_json(done.to_json_dict())
    else:
        click.echo(f"{task_id} is done")


@task.command("cancel")
@task_argument
@click.option("--agent", help="Who cancels it (default: bus).")
@click.option("--reason", help="Why, for the log.")
@json_option
@pass_bus_context
def task_cancel(obj: BusContext, task_id: str, agent: str | None, reason: str | None,
                as_json: bool) -> None:
    """Cancel an open task; tasks waiting on it stay blocked (cancelled is not done).

    Example: bus task cancel old-idea --reason "not needed"
    """
    cancelled = obj.open().tasks.cancel(task_id, agent, reason)
    if as_json:
        echo_json(cancelled.to_json_dict())
    else:
        click.echo(f"{task_id} is cancelled")


def _detail_lines(detail: TaskDetail) -> list[str]:
    t = detail.task
    state = t.state
    if t.state == "open":
        state = ("ready" if detail.ready else f"held by {detail.holder}" if detail.holder
                 else f"blocked (waiting on {t.waiting_on})" if t.waiting_on else "open")
    lines = [f"task:         {t.task_id}" + (f"  {t.title}" if t.title else ""),
             f"state:        {state}", f"priority:     {t.priority}",
             f"created:      {iso_utc(t.created_at_ms)}"]
    if t.finished_at_ms is not None:
        lines.append(f"{t.state}:" + " " * (13 - len(t.state)) +
                     f"{iso_utc(t.finished_at_ms)} by {t.finished_by}")
    lines.append("waits on:     " + _neighbours(detail.dependencies))
    lines.append("needed by:    " + _neighbours(detail.dependents))
    claim = detail.claim
    if claim is not None:
        fence = detail.to_json_dict()["fence"]
        lines.append(f"lease:        {claim.agent} until {iso_utc(claim.lease_until_ms)}"
                     + (" (expired)" if detail.holder is None else "")
                     + (f", fence {fence}" if fence is not None else ""))
    lines.append("events:" if detail.events else "events:       none")
    lines.extend(f"  #{seq} {iso_utc(ts)} {sender} {type_}"
                 for seq, ts, sender, type_ in detail.events)
    return lines


def _neighbours(found: list[Task]) -> str:
    return ", ".join(f"{t.task_id} ({t.state})" for t in found) or "none"


# --- bus reserve, reservations, unreserve, hooks ------------------------------


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")


class Duration(click.ParamType):
    """90s, 30m, 2h, 1d, 500ms; a bare number is seconds. Converts to milliseconds."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        match = _DURATION.fullmatch(str(value).strip())
        ms = round(float(match.group(1)) * _UNITS_MS[match.group(2) or "s"]) if match else 0
        if ms <= 0:
            self.fail(f"{value!r} is not a duration; use 90s, 30m, 2h or 1d", param, ctx)
        return ms


holder_option = click.option("--agent", required=True, help="The agent that holds them.")


@click.command()
@holder_option
@click.argument("patterns", nargs=-1, required=True, metavar="PATTERN...")
@click.option("--exclusive/--shared", "exclusive", default=True, show_default=True,
              help="Exclusive: nobody else may reserve an overlapping pattern; shared:"
                   " others may too, with --shared.")
@click.option("--ttl", "ttl_ms", type=Duration(), default=f"{DEFAULT_TTL_MS // 1000}s",
              show_default=True, help="How long it lasts: 90s, 30m, 2h, 1d.")
@click.option("--reason", help="What the agent is doing with them, for the others.")
@click.option("--check", is_flag=True,
              help="Reserve nothing: exit 0 when no other live agent holds any PATH"
                   " exclusively, 1 naming the holders.")
@json_option
@pass_bus_context
def reserve(obj: BusContext, agent: str, patterns: tuple[str, ...], exclusive: bool,
            ttl_ms: int, reason: str | None, check: bool, as_json: bool) -> None:
    """Reserve files by gitignore-style globs, relative to the repository root.

    All or nothing: when a pattern conflicts with another live agent's
    reservation (some path matches both, and either is exclusive), exit 1
    listing each conflict, and nothing is reserved. A reservation ends at its
    TTL, when its holder's heartbeat turns dead, or when its worker finishes.

    \b
    Example:
      bus reserve --agent agent-a 'src/auth/**' --ttl 2h --reason "login rework"
      bus reserve --check --agent agent-b src/auth/login.py
    """
    if check:
        _refuse_reserve_options(click.get_current_context())
        _check(obj, agent, list(patterns), as_json)
        return
    bus = obj.open()
    try:
        made = bus.reservations.reserve(agent, list(patterns),
                                        mode=EXCLUSIVE if exclusive else SHARED,
                                        ttl_ms=ttl_ms, reason=reason)
    except ReservationConflict as exc:
        if not as_json:
            raise
        echo_json({"granted": False, "agent": agent,
                   "conflicts": [c.to_json_dict() for c in exc.conflicts]})
        obj.ctx.exit(1)
    if as_json:
        echo_json({"granted": True, "reservations": [r.to_json_dict() for r in made]})
        return
    for r in made:
        click.echo(f"{agent} reserved {r.pattern} ({r.mode}) until {iso_utc(r.expires_at_ms)}")


def _refuse_reserve_options(ctx: click.Context) -> None:
    given = [flag for name, flag in (("exclusive", "--exclusive/--shared"), ("ttl_ms", "--ttl"),
                                     ("reason", "--reason"))
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"--check reserves nothing: drop {', '.join(given)}")


def _check(obj: BusContext, agent: str, paths: list[str], as_json: bool) -> None:
    try:
        held = obj.open().reservations.check_paths(agent, paths)
    except ValidationFailed as exc:
        if exc.field != "paths":
            raise
        raise ValidationFailed("patterns", exc.reason) from None  # the PATHs typed as PATTERN...
    if as_json:
        echo_json({"ok": not held, "agent": agent, "held": [h.to_json_dict() for h in held]})
        if held:
            obj.ctx.exit(1)
    elif held:
        raise PathsReserved(held)
    else:
        click.echo(f"no other live agent holds any of the {len(paths)} path(s) exclusively")


@click.command()
@click.option("--agent", help="Only this agent's.")
@click.option("--path", help="Only those whose pattern matches this path (from the repository"
                             " root).")
@json_option
@pass_bus_context
def reservations(obj: BusContext, agent: str | None, path: str | None, as_json: bool) -> None:
    """List the live file reservations (ended ones are not shown).

    Example: bus reservations --path src/auth/login.py
    """
    found = obj.open().reservations.list(agent, path)
    echo_listing(found, as_json, "no live reservations",
                 ["pattern", "agent", "mode", "expires", "reason"],
                 lambda r: (r.pattern, r.agent, r.mode, iso_utc(r.expires_at_ms), r.reason or ""))


@click.command()
@holder_option
@click.argument("patterns", nargs=-1, metavar="[PATTERN...]")
@json_option
@pass_bus_context
def unreserve(obj: BusContext, agent: str, patterns: tuple[str, ...], as_json: bool) -> None:
    """Remove an agent's reservations: those of the PATTERNs, or all when none is given.

    Example: bus unreserve --agent agent-a 'src/auth/**'
    """
    removed = obj.open().reservations.unreserve(agent, list(patterns) if patterns else None)
    if as_json:
        echo_json({"agent": agent, "released": [r.to_json_dict() for r in removed]})
    elif not removed:
        click.echo(f"{agent} held no reservations")
    for r in removed if not as_json else ():
        click.echo(f"{agent} released {r.pattern}")


@click.group()
def hooks() -> None:
    """Git hooks that honour file reservations.

    Example: bus hooks install --repo .
    """


@hooks.command()
@click.option("--repo", default=".", show_default=True, type=click.Path(file_okay=False),
              help="The git repository (any of its worktrees shares the hook).")
@json_option
@pass_bus_context
def install(obj: BusContext, repo: str, as_json: bool) -> None:
    """Install the pre-commit hook: a commit touching paths another live agent holds
    exclusively is refused, naming the holder and the expiry.

    A pre-commit hook already there is kept and run first; installing twice
    changes nothing. The hook uses $BUS_DB (else this bus file) and acts as
    $BUS_AGENT (else the worker whose worktree the commit is made in).

    Example: bus hooks install --repo .
    """
    done = githooks.install_pre_commit(repo, obj.db)
    if as_json:
        echo_json({**done.to_json_dict(), "db": os.path.abspath(obj.db)})
        return
    verb = "updated" if done.updated else "installed"
    click.echo(f"{verb} {done.hook} (bus {os.path.abspath(obj.db)})")
    if done.chained:
        click.echo(f"the hook that was there runs first: {done.chained}")


@hooks.command("pre-commit")
@click.option("--agent", envvar="BUS_AGENT",
              help="Who commits (env: BUS_AGENT; default: the worker whose worktree this is).")
@json_option
@pass_bus_context
def pre_commit(obj: BusContext, agent: str | None, as_json: bool) -> None:
    """What the installed hook runs: refuse the staged paths others hold exclusively.

    Example: BUS_AGENT=agent-a bus hooks pre-commit
    """
    try:
        bus = obj.open()  # first: a damaged bus file is named before git is asked anything
    except BusNotFound:
        click.echo(f"agentbus pre-commit: no bus at {obj.db}; nothing is reserved", err=True)
        return
    if not githooks.in_work_tree():  # run by hand elsewhere: git would commit nothing here
        click.echo("agentbus pre-commit: not in a git work tree; nothing is staged", err=True)
        return
    paths = githooks.staged_paths()
    committer = agent
    if not committer:
        with bus.read() as conn:
            committer = worker_of_worktree(conn, githooks.worktree_top())
    held = bus.reservations.check_paths(committer, paths) if paths else []
    if as_json:
        echo_json({"ok": not held, "agent": committer, "held": [h.to_json_dict() for h in held]})
        if held:
            obj.ctx.exit(1)
    elif held:
        raise PathsReserved(held)


COMMANDS = [heartbeat, alive, forget, claim, renew, release, claims, reap, task, reserve,
            reservations, unreserve, hooks]
