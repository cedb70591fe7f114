"""`bus replicate`, `bus restore` and `bus mirror`: the bus beyond one host (docs/replication.md).

Litestream replicates the file for a restore elsewhere (extra `[replicate]`);
the mirror feeds the log to NATS JetStream and brings messages back from it
(extra `[nats]`).
"""

from __future__ import annotations

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.replica import config as replica_config
from bus.replica import process as replica_process


@click.command()
@click.option("--to", "url", required=True,
              help="Replica URL: file:///dir, s3://bucket/path, sftp://user@host/path.")
@click.option("--sync-interval", default=replica_config.DEFAULT_SYNC_INTERVAL, show_default=True,
              help="How often Litestream ships changes (a Go duration: 500ms, 1s, 10s).")
@click.option("--config-only", is_flag=True,
              help="Write litestream.yml beside the bus and stop (run Litestream yourself).")
@json_option
@pass_bus_context
def replicate(obj: BusContext, url: str, sync_interval: str, config_only: bool,
              as_json: bool) -> None:
    """Replicate the bus file with Litestream, continuously, until stopped.

    Writes litestream.yml beside the bus, then becomes `litestream replicate`
    on it (SIGTERM lets it finish its last sync). A lost host loses at most
    the writes newer than the last sync. `bus status` shows the replica's
    position; `bus restore` brings it back elsewhere.

    Example: bus replicate --to file:///backups/bus --sync-interval 1s
    """
    config = replica_config.replica_config(obj.db, url, sync_interval)
    obj.open()  # a bus, in WAL mode, before Litestream watches it
    if not config_only:
        replica_process.replicate_argv(obj.db)  # Litestream is there, before writing anything
    written = replica_config.write_config(config)
    if as_json:
        echo_json({"config": str(written), "db": config.db_path, "url": config.url,
                   "sync_interval": config.sync_interval, "running": not config_only})
    else:
        click.echo(f"wrote {written}" + ("" if config_only else "; starting litestream"))
    if not config_only:
        obj.ctx.close()  # the bus's connection, before the process becomes Litestream
        replica_process.exec_replicate(config.db_path)


@click.command()
@click.option("--from", "url", required=True, help="Replica URL `bus replicate --to` used.")
@click.argument("path", type=click.Path(dir_okay=False))
@json_option
def restore(url: str, path: str, as_json: bool) -> None:
    """Restore a replicated bus into the new file PATH, and check its integrity.

    Litestream restores the last state the replica holds; then the bus's own
    integrity check runs on it. An existing PATH is never overwritten.

    Example: bus restore --from file:///backups/bus restored/bus.db
    """
    restored = replica_process.restore(url, path)
    if as_json:
        echo_json({"restored": str(restored), "from": url, "integrity": "ok"})
    else:
        click.echo(f"restored {url} into {restored}; integrity check ok")


COMMANDS = [replicate, restore]
