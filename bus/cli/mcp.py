"""`bus mcp`: the bus as an MCP server for one agent, over stdio."""

from __future__ import annotations

import signal
from typing import Any

import click
import orjson

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra
from bus.cli.extras import require_extra
from bus.cli.agents import resolve_agent
from bus.cli.output import echo_json
from bus.storage.errors import ValidationFailed

TOOLS_HELP = (
    "Tool groups to list beside the daily loop, comma-separated: tasks (the graph and its"
    " leases), files (reservations), channels, pump, admin (the log's other tools: search,"
    " heartbeat, liveness...), workers (the worker lifecycle), or all. Without it only the"
    " daily loop is listed: join (without --agent), publish, publish_many, exchange, reply,"
    " poll, ack, task_ready, task_claim_next, task_done, reserve, unreserve.")


def _chosen_groups(ctx: click.Context, param: click.Parameter,
                   value: str | None) -> frozenset[str]:
    from bus.mcpserver.toolsets import chosen_groups  # no SDK: checked before serving

    try:
        return chosen_groups(value)
    except ValidationFailed as exc:
        raise click.BadParameter(exc.reason, ctx, param) from exc


def tools_option(function: Any) -> Any:
    """`--tools GROUP,...`: the tool groups a server lists beside the daily loop."""
    return click.option("--tools", "tools", metavar="GROUP,...", default=None,
                        callback=_chosen_groups, help=TOOLS_HELP)(function)


@click.command()
@click.option("--agent", default=None,
              help="The agent every tool acts as: it publishes, acks and claims as this id only;"
                   " `auto`: the worker whose worktree contains the working directory. Without"
                   " it the agent chooses its name with the join tool.")
@tools_option
@click.option("--list", "list_only", is_flag=True,
              help="Print the tools and resources the server lists instead of serving.")
@click.option("--call", "tool", metavar="TOOL",
              help="Call one tool as the agent would, print its JSON result and exit.")
@click.option("--args", "arguments", default="{}", show_default=True, metavar="JSON",
              help="The arguments of --call, a JSON object.")
@json_option
@pass_bus_context
def mcp(obj: BusContext, agent: str | None, tools: frozenset[str], list_only: bool,
        tool: str | None, arguments: str, as_json: bool) -> None:
    """Serve the bus to an MCP client (an LLM agent) over stdin/stdout.

    The client starts this command itself; register it in the client's
    configuration (see README.md). stdout carries the protocol only. --list
    prints the tools and resources; --call runs one tool through the same
    server, to see what an agent would get.

    Without --agent, the agent calls join(name) first (one configuration
    serves every session of a project); join's reclaim_token takes the name
    back after a restart.

    Every model request carries the listed tools' schemas, so only the
    daily loop is listed unless --tools names more groups.

    \b
    Example:
      bus --db .worker-state/bus.db mcp --agent planner
      bus mcp                        # the agent joins under a name of its own
      bus mcp --agent planner --list
      bus mcp --agent planner --tools tasks,files   # the daily loop and two groups
      bus mcp --agent auto   # started in a worker's worktree: that worker
      bus mcp --agent planner --call publish --args '{"type": "note", "to": "worker-1"}'
    """
    # The SDK takes half a second to import and no other command needs it; serving starts
    # before it is imported (bus/mcpserver/stdio.py). It comes with the mcp extra: without
    # it, the error names that extra.
    require_extra("mcp", "mcp", "bus mcp")
    from bus.mcpserver.session import AgentSession

    bus = obj.open()
    session = AgentSession.open_on(bus, resolve_agent(bus, agent), tools)
    if tool is None and not list_only:
        from bus.mcpserver.stdio import serve_stdio

        # SIGINT ends the server at once and without a word, as SIGTERM does (a shell shows
        # status 130): there is nothing to save, and the bus file is safe against a process
        # ending at any point. A KeyboardInterrupt would unwind the event loop and its
        # threads (about 0.4 s), and click would print "Aborted!" on the client's stderr.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        serve_stdio(session)
        return
    server = import_extra("bus.mcpserver.server", "mcp", "bus mcp").build_server(session)
    if tool is not None:
        _call(server, tool, _arguments(arguments))
    else:
        _list(server, session, as_json)


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.UsageError(f"--args is not JSON ({exc}); give an object such as"
                               """ '{"type": "note"}'""") from exc
    if not isinstance(value, dict):
        raise click.UsageError("--args must be a JSON object of argument names and values")
    return value


def _call(server: Any, tool: str, arguments: dict[str, Any]) -> None:
    from bus.mcpserver.server import call_tool

    from bus.mcpserver.failures import Failure

    failed, result = call_tool(server, tool, arguments)
    if failed:
        error = Failure(result["error"]["code"], result["error"].get("argument"),
                        result["error"]["message"])
        raise click.ClickException(error.text()) from _Refused(error.argument)
    echo_json(result)


class _Refused(Exception):
    """The argument a tool error names: `--json` shows it as the error's field."""

    def __init__(self, field: str | None) -> None:
        super().__init__(field)
        self.field = field


def _list(server: Any, session: Any, as_json: bool) -> None:
    from bus.mcpserver.server import catalog

    listed = catalog(server, session)
    if as_json:
        echo_json(listed)
        return
    more = listed.pop("more")
    for kind, items in listed.items():
        click.echo(f"{kind}:")
        for item in items:
            click.echo(f"  {item['name']:<32} {item['description'].splitlines()[0]}")
    if more:
        click.echo("more with --tools GROUP:")
        for group in more:
            click.echo(f"  {group['name']:<32} {', '.join(group['tools'])}")


COMMANDS = [mcp]
