"""`bus task ...`: the task graph: add tasks with dependencies, list what is ready, take and finish.

Priorities run from 0 (the most urgent, listed first) to 4, as in beads;
among equal priorities the oldest task comes first.
"""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.coordination import lease_options
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.log.messages import iso_utc
from bus.coordination.tasks import PRIORITY_DEFAULT
from bus.coordination.tasks import PRIORITY_HIGHEST
from bus.coordination.tasks import PRIORITY_LOWEST
from bus.coordination.tasks import STATES
from bus.coordination.tasks import Task
from bus.coordination.tasks import TaskDetail

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


COMMANDS = [task]
