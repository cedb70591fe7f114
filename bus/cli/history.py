"""`bus export` and `bus history`: the JSONL export, and the Spark history job over it.

`bus export` appends the log to the export (bus/log/export.py); `bus history` runs
the Spark job (bus.history) over it.

PySpark and Java are optional (the `[spark]` extra): nothing here imports
pyspark until the command runs, so every other command works without them,
`--job-path` too, and this one says what is missing instead of failing with
a traceback.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import orjson

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.extras import extra_missing
from bus.cli.extras import import_extra
from bus.cli.output import echo_json
from bus.history import QUERY_NAMES
from bus.history import STUCK_AFTER_SECONDS
from bus.history import job_path
from bus.history.errors import ServerError
from bus.history.errors import first_line
from bus.history.serve import ServerState
from bus.history.serve import live_server
from bus.history.serve import read_state
from bus.history.serve import server_master
from bus.history.serve import start_server
from bus.history.serve import state_path
from bus.history.serve import stop_server
from bus.history.report import Output
from bus.history.report import output_problem

PROGRESS_MIN = 50_000  # messages of backlog that earn a progress bar


# --- bus export ---------------------------------------------------------------


@click.command()
@click.option("--out", type=click.Path(),
              help="JSONL file, or directory with --partition-by (default: where the export"
                   " went before, else bus.jsonl beside the db).")
@click.option("-f", "--follow", is_flag=True, help="Keep exporting as messages arrive, until Ctrl-C.")
@click.option("--partition-by", type=click.Choice(["date"]),
              help="Write date=YYYY-MM-DD/part-*.jsonl under the --out directory (for Spark);"
                   " without --out, as the export went before.")
@json_option
@pass_bus_context
def export(obj: BusContext, out: str | None, follow: bool, partition_by: str | None,
           as_json: bool) -> None:
    """Append new messages to the JSONL export, once each, in seq order.

    Safe to kill at any moment: the next run neither loses nor repeats a line.

    Example: bus export --follow & tail -f .worker-state/bus.jsonl
    """
    bus = obj.open()
    with bus.exporter(out, partition_by) as exporter:
        try:
            total = _export_with_progress(exporter)
            if as_json:
                echo_json({"path": str(exporter.path), "exported": total})
            else:
                click.echo(f"exported {total} message(s) to {exporter.path}")
            if follow:
                exporter.follow(bus.wait_for_change)
        except KeyboardInterrupt:
            if not follow:
                raise


def _export_with_progress(exporter) -> int:
    """Export the backlog, with a progress bar on a terminal when it is large."""
    pending = exporter.pending()
    if pending < PROGRESS_MIN or not sys.stderr.isatty():
        return exporter.export()
    total = 0
    with click.progressbar(length=pending, label="exporting", file=sys.stderr) as bar:
        for done in exporter.export_batches():
            total += done
            bar.update(done)
    return total


# --- bus history --------------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--export", "export_path", type=click.Path(),
              help="Export JSONL file or date-partitioned directory"
                   " (default: where `bus export` writes).")
@click.option("--lake", type=click.Path(file_okay=False),
              help="The history lake the export streams into, and the queries read"
                   " (default: beside the export: bus.jsonl -> bus.lake).")
@click.option("--query", default="all", show_default=True,
              type=click.Choice([*QUERY_NAMES, "all"]), help="Which query to run.")
@click.option("--full", is_flag=True, help="Every row of each query, not the summary.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per result row (all rows).")
@click.option("--csv", "as_csv", is_flag=True,
              help="CSV with a header row, for one --query (all rows).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Also write <query>.parquet, <query>.csv and report.html (charts) here.")
@click.option("--png", is_flag=True, help="With --out: each chart as a PNG too.")
@click.option("--strict", is_flag=True,
              help="Fail on a line that is not an export record (default: skip and count).")
@click.option("--stuck-after-seconds", type=click.FloatRange(min=0), default=STUCK_AFTER_SECONDS,
              show_default=True, help="A task whose last state is not terminal for longer"
                                      " than this (before the newest message) is stuck.")
@click.option("--limit", type=click.IntRange(min=1),
              help="With --full, --json or --csv: at most this many rows per query.")
@click.option("--job-path", "show_job_path", is_flag=True,
              help="Print the path of the job's file, for spark-submit, and run nothing"
                   " (needs neither PySpark nor Java).")
@pass_bus_context
def history(obj: BusContext, export_path: str | None, lake: str | None, query: str, full: bool,
            as_json: bool,
            as_csv: bool, out_dir: str | None, png: bool, strict: bool,
            stuck_after_seconds: float, limit: int | None, show_job_path: bool) -> None:
    """History by Spark: volume, lifecycles, latency, silences, dead tasks, lead times.

    Streams what the export gained since the last run into the history lake
    (Parquet tables any engine reads, docs/history.md), then queries it:
    also time blocked and throughput per agent. Prints a summary (totals and
    the top rows of each query); --full for every row. Runs in this process
    on local[*] (SPARK_MASTER to change it); needs PySpark and Java 17+
    (`pip install 'agentbus[spark]'`). The same job runs on a cluster with
    `spark-submit "$(bus history --job-path)" --export PATH` (docs/spark.md).

    \b
    Example:
      bus export && bus history
      bus history --query lifecycle --full
      bus history --export history/ --query threads --json
      bus history --out report/ --png     # then open report/report.html
      bus history --job-path              # the file to give spark-submit
      bus history serve                   # a warm Spark for the runs that follow
    """
    if click.get_current_context().invoked_subcommand:  # `bus history serve`: that runs
        return
    if show_job_path:  # before anything that needs the extra, the export or the bus
        path = str(job_path())
        click.echo(orjson.dumps({"job_path": path}).decode() if as_json or obj.as_json else path)
        return
    if as_json and as_csv:
        raise click.UsageError("--json and --csv exclude each other")
    fmt = "json" if as_json else "csv" if as_csv else "table"
    problem = output_problem(fmt, query, out_dir, png)
    if problem:
        raise click.UsageError(problem)
    job = load_job()
    require_java()
    path = resolve_export(obj, export_path)
    output = Output(fmt, full, limit, out_dir=out_dir, png=png)
    seen = run_job(job, path, query, output, stuck_after_seconds, strict, lake,
                   live_server(obj.db))
    if seen.malformed:
        click.echo(seen.malformed_note(), err=True)
    if out_dir:
        click.echo(f"report written to {Path(out_dir) / 'report.html'}", err=True)


def load_job() -> ModuleType:
    """bus.history.job, imported now; a missing PySpark names the extra that installs it."""
    try:
        return import_extra("bus.history.job", "spark", "bus history")
    except ImportError as exc:  # there, but broken or partial (not a missing module)
        raise click.ClickException(f"PySpark cannot be imported: {exc}") from exc


def require_java() -> None:
    """Spark runs JAVA_HOME/bin/java, else java from PATH: check the one it will use."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        if not os.access(Path(java_home) / "bin" / "java", os.X_OK):
            raise click.ClickException(
                f"Java was not found: JAVA_HOME is {java_home} but it has no bin/java;"
                " Spark needs Java 17 or newer: fix JAVA_HOME or unset it")
        return
    if shutil.which("java") is None:
        raise click.ClickException(
            "Java was not found (no `java` on PATH and JAVA_HOME is not set); Spark needs"
            " Java 17 or newer, e.g. `apt-get install openjdk-17-jre-headless`")


def resolve_export(obj: BusContext, export_path: str | None) -> str:
    """--export, else the bus's export path (bus.jsonl beside a bus not created yet)."""
    if export_path is None:
        if Path(obj.db).exists():
            export_path = str(obj.open().export_path())
        else:
            export_path = str(Path(obj.db).absolute().parent / "bus.jsonl")
    if not Path(export_path).exists():
        raise click.ClickException(f"no export at {export_path}; run `bus export` first"
                                   " (or name one with --export PATH)")
    return export_path


def run_job(job: ModuleType, path: str, query: str, output: Any,
            stuck_after_seconds: float, strict: bool, lake: str | None = None,
            server: ServerState | None = None) -> Any:
    """Update the lake and run the queries, on the warm server when one runs (else in this
    process); its Overview of the export."""
    from py4j.protocol import Py4JError  # only now: pyspark is known to be there
    from pyspark.errors import PySparkException

    from bus.history.errors import LakeError
    from bus.history.extract import MalformedExport
    from bus.history.queries import Options
    from bus.history.queries import query_names
    from bus.history.session import SparkStartError
    from bus.history.session import connect_spark
    from bus.history.session import start_spark

    try:
        spark = connect_spark(server.url) if server else start_spark(quiet=True)
    except SparkStartError as exc:
        raise click.ClickException(f"Spark could not start Java (it needs Java 17 or newer):"
                                   f"\n{exc}") from exc
    options = Options(stuck_after_seconds=stuck_after_seconds)
    try:
        return job.run(spark, path, query_names(query), output, options, out=sys.stdout,
                       strict=strict, lake=lake)
    except (MalformedExport, LakeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except ModuleNotFoundError as exc:  # --out's writers: pyarrow, plotly, matplotlib
        named = extra_missing(exc, "spark", "bus history --out")
        if named is None:
            raise
        raise named from exc
    except OSError as exc:  # the results are in; only --out could not be written
        raise click.ClickException(f"cannot write the report to --out {output.out_dir}:"
                                   f" {exc.strerror or exc}") from exc
    except (PySparkException, Py4JError) as exc:
        raise click.ClickException(f"the Spark job failed: {first_line(exc)}") from exc


@history.command("serve")
@click.option("--stop", is_flag=True, help="Stop the running server.")
@click.option("--status", is_flag=True, help="Say whether a server runs, and where.")
@json_option
@pass_bus_context
def serve(obj: BusContext, stop: bool, status: bool, as_json: bool) -> None:
    """Start (or stop) a warm Spark for `bus history`: a Spark Connect server on 127.0.0.1.

    While it runs, `bus history` connects to it (sc://127.0.0.1:PORT) instead of
    starting a JVM of its own. It runs in the background until --stop; its
    pid and port are kept beside the bus file, and a stale record (the
    process gone) is noticed and removed.

    \b
    Example:
      bus history serve && bus history && bus history --query lifecycle
      bus history serve --status
      bus history serve --stop
    """
    as_json = as_json or obj.as_json
    if stop or status:
        recorded = read_state(obj.db)
        state = stop_server(obj.db) if stop else live_server(obj.db)
        stale = recorded is not None and state is None and not stop
        _say(as_json, {"running": bool(state) and not stop, "stale_removed": stale,
                       **({"pid": state.pid, "url": state.url} if state else {})},
             (f"stopped the server at {state.url} (pid {state.pid})" if stop else
              f"running at {state.url} (pid {state.pid})") if state else
             "a stale server record (its process is gone) was removed" if stale else
             "no server runs")
        return
    load_job()  # the extra and Java, named as for a run
    require_java()
    import pyspark

    from bus.history.session import server_settings

    try:
        state, started = start_server(obj.db, os.path.dirname(pyspark.__file__),
                                      server_settings(server_master()))
    except ServerError as exc:
        raise click.ClickException(str(exc)) from exc
    _say(as_json, {"running": True, "started": started, "pid": state.pid, "url": state.url,
                   "state": str(state_path(obj.db))},
         f"{'started' if started else 'already running:'} Spark Connect at {state.url}"
         f" (pid {state.pid}); stop it with `bus history serve --stop`")


def _say(as_json: bool, fields: dict[str, Any], text: str) -> None:
    click.echo(orjson.dumps(fields).decode() if as_json else text)


COMMANDS = [export, history]
