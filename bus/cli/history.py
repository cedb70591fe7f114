"""`bus history`: the Spark history queries (scripts/history.py) over the JSONL export.

PySpark and Java are optional: nothing here imports pyspark until the
command runs, so every other command works without them, and this one says
what is missing instead of failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import click

from bus.cli.context import BusContext
from bus.cli.context import pass_bus_context

# The job lives in scripts/ so that spark-submit can ship it to a cluster as it is.
JOB_PATH = Path(__file__).resolve().parents[2] / "scripts" / "history.py"
JOB_MODULE = "agentbus_history_job"
# The job's QUERIES, known here without importing pyspark (a test keeps them in step).
QUERY_NAMES = ("volume", "lifecycle", "stuck", "threads", "silence", "dead_tasks")
STUCK_AFTER_SECONDS = 3600.0


@click.command()
@click.option("--export", "export_path", type=click.Path(),
              help="Export JSONL file or date-partitioned directory"
                   " (default: where `bus export` writes).")
@click.option("--query", default="all", show_default=True,
              type=click.Choice([*QUERY_NAMES, "all"]), help="Which query to run.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per result row.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")
@click.option("--stuck-after-seconds", type=click.FloatRange(min=0), default=STUCK_AFTER_SECONDS,
              show_default=True, help="A task whose last state is not terminal for longer"
                                      " than this (before the newest message) is stuck.")
@click.option("--limit", type=click.IntRange(min=1), help="Print at most this many rows per query.")
@pass_bus_context
def history(obj: BusContext, export_path: str | None, query: str, as_json: bool, as_csv: bool,
            stuck_after_seconds: float, limit: int | None) -> None:
    """Message volume, task lifecycles, reply latency, silences and dead tasks, by Spark.

    Runs in this process on local[*] (SPARK_MASTER to change it); needs
    PySpark and Java 17+. The same job runs on a cluster with
    `spark-submit scripts/history.py --export PATH`.

    \b
    Example:
      bus export && bus history --query lifecycle
      bus history --export history/ --query threads --json
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv exclude each other")
    job = load_job()
    require_java()
    path = resolve_export(obj, export_path)
    run_job(job, path, query, "json" if as_json else "csv" if as_csv else "table",
            stuck_after_seconds, limit)


def load_job() -> ModuleType:
    """scripts/history.py as a module; a clear error when PySpark is missing."""
    if importlib.util.find_spec("pyspark") is None:
        raise click.ClickException(
            "PySpark is not installed; install it with `pip install 'agentbus[spark]'`"
            " (`make demo` does)")
    if not JOB_PATH.is_file():
        raise click.ClickException(f"the history job {JOB_PATH} is missing; `bus history`"
                                   " runs from a checkout of agentbus")
    if JOB_MODULE in sys.modules:  # loaded once per process, like any import
        return sys.modules[JOB_MODULE]
    spec = importlib.util.spec_from_file_location(JOB_MODULE, JOB_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[JOB_MODULE] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # a broken or partial PySpark
        del sys.modules[JOB_MODULE]
        raise click.ClickException(f"PySpark cannot be imported: {exc}") from exc
    except BaseException:
        del sys.modules[JOB_MODULE]
        raise
    return module


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


def run_job(job: ModuleType, path: str, query: str, fmt: str, stuck_after_seconds: float,
            limit: int | None) -> None:
    from pyspark.errors import PySparkException  # only now: pyspark is known to be there
    from py4j.protocol import Py4JError

    try:
        spark = job.start_spark(quiet=True)
    except job.SparkStartError as exc:
        raise click.ClickException(f"Spark could not start Java (it needs Java 17 or newer):"
                                   f"\n{exc}") from exc
    options = job.Options(stuck_after_seconds=stuck_after_seconds)
    try:
        job.run(spark, path, job.query_names(query), fmt, options, out=sys.stdout, limit=limit)
    except (PySparkException, Py4JError) as exc:
        raise click.ClickException(f"the Spark job failed: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


COMMANDS = [history]
