"""`bus replicate`, `bus restore` and `bus mirror`: the bus beyond one host (docs/replication.md).

Litestream replicates the file for a restore elsewhere (extra `[replicate]`);
the mirror feeds the log to NATS JetStream and brings messages back from it
(extra `[nats]`).
"""

from __future__ import annotations

import asyncio
import signal

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra
from bus.cli.output import echo_json
from bus.mirror import subjects as mirror_subjects
from bus.replica import config as replica_config
from bus.replica import process as replica_process


@click.command()
@click.option("--to", "url", required=True,
              help="Replica URL: file:///dir, s3://bucket/path, sftp://user@host/path.")
@click.option("--sync-interval", default=replica_config.DEFAULT_SYNC_INTERVAL, show_default=True,
              help="The most a write waits before it is at the replica: what a lost host can"
                   " lose (a Go duration, at least 100ms: 500ms, 1s, 10s).")
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


@click.group()
def mirror() -> None:
    """Mirror the log to another system, and bring its messages back.

    Example: bus mirror nats --url nats://127.0.0.1:4222 --stream BUS
    """


@mirror.command("nats")
@click.option("--url", required=True, help="NATS server URL(s), comma-separated.")
@click.option("--stream", required=True, help="JetStream stream to mirror into (made if missing).")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1, 5),
              help="Replicas of a stream this command makes (3 on a three-node cluster).")
@click.option("--import", "import_subjects", default=None, metavar="SUBJECTS",
              help="Also import messages published on these subjects (comma-separated).")
@click.option("--until-caught-up", is_flag=True,
              help="Stop once the stream holds the whole log (and the imports are in).")
@json_option
@pass_bus_context
def mirror_nats(obj: BusContext, url: str, stream: str, replicas: int,
                import_subjects: str | None, until_caught_up: bool, as_json: bool) -> None:
    """Publish the log to a NATS JetStream stream in seq order, exactly once, until stopped.

    Each message goes to bus.<type>.<recipient> (~all for a broadcast) with
    its id as Nats-Msg-Id, and Bus-Seq, Bus-From, Bus-Type, Bus-To headers;
    the body is its JSON as `bus tail --json` prints it. A restart (even after
    kill -9) resumes after the stream's last message. The position is the
    cursor mirror:nats:<stream>, so `bus consumers` shows the lag. With
    --import, messages published on SUBJECTS (headers Bus-From, Bus-Type,
    optional Bus-To; the payload's JSON as body) come into the log once each.

    Example: bus mirror nats --url nats://127.0.0.1:4222 --stream BUS --import 'inbox.>'
    """
    mirror_subjects.validate_url(url)
    mirror_subjects.validate_stream_name(stream)
    wanted = mirror_subjects.import_subjects(import_subjects) if import_subjects is not None \
        else None
    jetstream = import_extra("bus.mirror.jetstream", "nats", "bus mirror nats")
    importing = import_extra("bus.mirror.importing", "nats", "bus mirror nats")
    bus = obj.open()

    async def run() -> object:
        async with jetstream.JetStreamMirror(bus, url, stream, replicas) as engine:
            importer = importing.Importer(engine, wanted) if wanted else None
            if importer is not None:
                await importer.start()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, engine.stop)
            _say_started(engine, as_json)
            if until_caught_up:
                if importer is not None:
                    await importer.run(until_caught_up=True)
                return await engine.run(until_caught_up=True)
            await asyncio.gather(engine.run(), *([importer.run()] if importer else []))
            return engine.progress

    progress = asyncio.run(run())
    if as_json:
        echo_json(progress.to_json_dict())
    else:
        click.echo(f"stream {progress.stream} holds the log through seq {progress.position}:"
                   f" published {progress.published}, imported {progress.imported}"
                   f" ({progress.import_duplicates} already there,"
                   f" {len(progress.import_refused)} refused)")
        for refused in progress.import_refused:
            click.echo(f"refused {refused}", err=True)


def _say_started(engine, as_json: bool) -> None:
    progress = engine.progress
    if as_json:
        echo_json({"started": True, "stream": progress.stream, "url": engine.url,
                   "cursor": engine.cursor, "resumed_from": progress.resumed_from})
    else:
        click.echo(f"mirroring to stream {progress.stream} at {engine.url} from seq"
                   f" {progress.resumed_from} (cursor {engine.cursor})")


COMMANDS = [replicate, restore, mirror]
