"""`bus` commands that keep watching: top (terminal) and serve (web page)."""

from __future__ import annotations

from typing import Any
from typing import Callable

import click

from bus.api import Bus
from bus.cli.context import BusContext
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra
from bus.cli.mcp import tools_option


@click.command()
@pass_bus_context
def top(obj: BusContext) -> None:
    """Watch agents, workers, claims and the message stream live; q or Ctrl-C quits.

    The screen changes when something commits to the bus (not on a timer),
    and reads the file read-only. Keys: a, w, c, t, n, h, e switch between
    agents, workers, claims, tasks, consumers, channels and reservations; Enter
    opens the selected row (Escape goes back); s sorts by the next column, r
    reverses.

    Example: bus top
    """
    # Textual loads only for the command that draws, and comes with the views extra.
    run_top = import_extra("bus.views.top", "views", "bus top").run_top
    run_top(obj.db, obj.durability)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; another than this machine's needs a token"
                   " (bus token create), and then every request needs one.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port; the URL is printed).")
@click.option("--mcp", "with_mcp", is_flag=True,
              help="Also serve MCP over Streamable HTTP at /mcp (a bearer token per agent).")
@tools_option
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A name clients use to reach a non-loopback --host (the Host header);"
                   " repeat for more.")
@click.option("--certfile", type=click.Path(exists=True, dir_okay=False),
              help="Serve HTTPS with this certificate (PEM); needs --keyfile.")
@click.option("--keyfile", type=click.Path(exists=True, dir_okay=False),
              help="The private key of --certfile (PEM).")
@click.option("--require-token", is_flag=True,
              help="Require a token for the page too on loopback (always so on another --host).")
@click.option("--allow-remote", is_flag=True, hidden=True,
              help="Deprecated: a non-loopback --host now needs a token instead.")
@pass_bus_context
def serve(obj: BusContext, host: str, port: int, with_mcp: bool, tools: frozenset[str],
          allowed_hosts: tuple[str, ...], certfile: str | None, keyfile: str | None,
          require_token: bool, allow_remote: bool) -> None:
    """Serve a live status page with charts, and with --mcp the bus to MCP clients.

    The page updates as commits land and works offline (Plotly is served
    from the installed package). /messages browses the log (filters in the
    URL: type, sender, to, task, since, text), and every agent, worker, task
    and channel has a page of its own. It listens on 127.0.0.1 unless --host says
    otherwise; beyond this machine every request needs a token (a browser
    opens the page once with ?token=...). /mcp always needs one: a request
    acts as its token's agent. See docs/remote.md.

    \b
    Example:
      bus serve --port 8765   # then open http://127.0.0.1:8765/
      bus token create --agent worker-1
      bus serve --mcp --host 0.0.0.0 --certfile cert.pem --keyfile key.pem
      bus serve --mcp --tools tasks,files   # the daily loop and two tool groups
    """
    # Starlette and uvicorn load only for this command; plotly (whose JS the page
    # loads from the installed package) is checked now, not at the first request.
    views = import_extra("bus.views.serve", "views", "bus serve")
    import_extra("plotly", "views", "bus serve")
    if (certfile is None) != (keyfile is None):
        raise click.UsageError("--certfile and --keyfile go together; give both or neither")
    if tools and not with_mcp:
        raise click.UsageError("--tools chooses the tools served at /mcp; give --mcp too")
    if allow_remote:
        click.echo("note: --allow-remote is no longer needed: a non-loopback --host is served"
                   " when a token exists (bus token create), and every request needs one",
                   err=True)
    options = views.ServerOptions(host, port, allowed_hosts, certfile, keyfile, require_token)

    def ready(url: str) -> None:
        if options.plain_http_beyond_loopback:
            click.echo(f"warning: serving {host} over plain HTTP: tokens and the bus cross the"
                       " network readable by anyone on the path; give --certfile and --keyfile",
                       err=True)
        mcp_note = f" and MCP at {url}mcp" if with_mcp else ""
        click.echo(f"serving {obj.db} at {url}{mcp_note} (Ctrl-C stops)")

    try:
        views.serve(obj.db, options, durability=obj.durability, ready=ready, open_bus=obj.open,
                    extension=_mcp_endpoint(tools) if with_mcp else None)
    except KeyboardInterrupt:
        pass  # uvicorn has shut down cleanly and re-raised the Ctrl-C: stopping is the normal end


def _mcp_endpoint(tools: frozenset[str]) -> Callable[[Bus], Any]:
    """The MCP endpoint at /mcp, made once the server has opened the bus."""
    http = import_extra("bus.mcpserver.http", "mcp", "bus serve --mcp")
    return lambda bus: http.McpEndpoint(bus, tools)


COMMANDS = [top, serve]
