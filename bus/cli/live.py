"""`bus` commands that keep watching: top (terminal) and serve (web page)."""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra


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
              help="Address to listen on; only this machine's unless --allow-remote.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port; the URL is printed).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --host other machines can reach (the page has no login).")
@pass_bus_context
def serve(obj: BusContext, host: str, port: int, allow_remote: bool) -> None:
    """Serve a live, read-only status page with charts; Ctrl-C stops.

    The page updates as commits land and works offline (Plotly is served
    from the installed package). It reads the file read-only.

    Example: bus serve --port 8765   # then open http://127.0.0.1:8765/
    """
    # Starlette and uvicorn load only for this command; plotly (whose JS the page
    # loads from the installed package) is checked now, not at the first request.
    run_server = import_extra("bus.views.serve", "views", "bus serve").serve
    import_extra("plotly", "views", "bus serve")

    def ready(url: str) -> None:
        click.echo(f"serving {obj.db} read-only at {url} (Ctrl-C stops)")

    try:
        run_server(obj.db, host, port, allow_remote=allow_remote, durability=obj.durability,
                   ready=ready)
    except KeyboardInterrupt:
        pass  # uvicorn has shut down cleanly and re-raised the Ctrl-C: stopping is the normal end


COMMANDS = [top, serve]
