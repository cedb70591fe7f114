"""`bus reserve`, `bus reservations`, `bus unreserve` and `bus hooks`: file reservations."""

from __future__ import annotations

import os
import re

import click

from bus.coordination import githooks
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.storage.errors import BusNotFound
from bus.storage.errors import ValidationFailed
from bus.log.messages import iso_utc
from bus.coordination.reservations import DEFAULT_TTL_MS
from bus.coordination.reservations import EXCLUSIVE
from bus.coordination.reservations import SHARED
from bus.coordination.reservations import PathsReserved
from bus.coordination.reservations import ReservationConflict
from bus.coordination.reservations import worker_of_worktree

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


agent_option = click.option("--agent", required=True, help="The agent that holds them.")


@click.command()
@agent_option
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
@agent_option
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
    committer = agent or worker_of_worktree(bus.conn, githooks.worktree_top())
    held = bus.reservations.check_paths(committer, paths) if paths else []
    if as_json:
        echo_json({"ok": not held, "agent": committer, "held": [h.to_json_dict() for h in held]})
        if held:
            obj.ctx.exit(1)
    elif held:
        raise PathsReserved(held)


COMMANDS = [reserve, reservations, unreserve, hooks]
