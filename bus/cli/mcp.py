"""`bus mcp`: the bus as an MCP server for one agent, over stdio."""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json


@click.command()
@click.option("--agent", required=True,
              help="The agent every tool acts as: it publishes, acks and claims as this id only.")
@click.option("--list", "list_only", is_flag=True,
              help="Print the tools and resources instead of serving.")
@json_option
@pass_bus_context
def mcp(obj: BusContext, agent: str, list_only: bool, as_json: bool) -> None:
    """Serve the bus to an MCP client (an LLM agent) over stdin/stdout.

    The client starts this command itself; register it in the client's
    configuration (see README.md). stdout carries the protocol only. With
    --list it prints the tools and resources and exits.

    \b
    Example:
      bus --db .worker-state/bus.db mcp --agent planner
      bus mcp --agent planner --list
    """
    # Imported here: the SDK takes most of a second to load, and no other command needs it.
    from bus.mcpserver import AgentSession
    from bus.mcpserver import build_server
    from bus.mcpserver import catalog

    server = build_server(AgentSession.open_on(obj.open(), agent))
    if not list_only:
        server.run("stdio")
        return
    listed = catalog(server)
    if as_json:
        echo_json(listed)
        return
    for kind, items in listed.items():
        click.echo(f"{kind}:")
        for item in items:
            click.echo(f"  {item['name']:<32} {item['description'].splitlines()[0]}")


COMMANDS = [mcp]
