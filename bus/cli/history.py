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
from typing import Any

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
@pass_bus_context
def history(obj: BusContext, export_path: str | None, query: str, full: bool, as_json: bool,
            as_csv: bool, out_dir: str | None, png: bool, strict: bool,
            stuck_after_seconds: float, limit: int | None) -> None:
    """Message volume, task lifecycles, reply latency, silences and dead tasks, by Spark.

    Prints a summary (totals and the top rows of each query); --full for
    every row. Runs in this process on local[*] (SPARK_MASTER to change
    it); needs PySpark and Java 17+. The same job runs on a cluster with
    `spark-submit scripts/history.py --export PATH` (docs/spark.md).

    \b
    Example:
      bus export && bus history
      bus history --query lifecycle --full
      bus history --export history/ --query threads --json
      bus history --out report/ --png     # then open report/report.html
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv exclude each other")
    job = load_job()
    fmt = "json" if as_json else "csv" if as_csv else "table"
    problem = job.output_problem(fmt, query, out_dir, png)
    if problem:
        raise click.UsageError(problem)
    require_java()
    path = resolve_export(obj, export_path)
    output = job.Output(fmt, full, limit, out_dir=out_dir, png=png)
    seen = run_job(job, path, query, output, stuck_after_seconds, strict)
    if seen.malformed:
        click.echo(seen.malformed_note(), err=True)
    if out_dir:
        click.echo(f"report written to {Path(out_dir) / 'report.html'}", err=True)


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
    if str(JOB_PATH.parent) not in sys.path:  # the job imports its modules beside it
        sys.path.append(str(JOB_PATH.parent))
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


def run_job(job: ModuleType, path: str, query: str, output: Any,
            stuck_after_seconds: float, strict: bool) -> Any:
    """Run the job in this process; its Overview of the export."""
    from pyspark.errors import PySparkException  # only now: pyspark is known to be there
    from py4j.protocol import Py4JError

    try:
        spark = job.start_spark(quiet=True)
    except job.SparkStartError as exc:
        raise click.ClickException(f"Spark could not start Java (it needs Java 17 or newer):"
                                   f"\n{exc}") from exc
    options = job.Options(stuck_after_seconds=stuck_after_seconds)
    try:
        return job.run(spark, path, job.query_names(query), output, options, out=sys.stdout,
                       strict=strict)
    except job.MalformedExport as exc:
        raise click.ClickException(str(exc)) from exc
    except ImportError as exc:  # --out's writers: pyarrow, plotly, matplotlib
        raise click.ClickException(f"--out needs {exc.name}, which is not installed; install"
                                   " it with `pip install 'agentbus[spark]'`") from exc
    except OSError as exc:  # the results are in; only --out could not be written
        raise click.ClickException(f"cannot write the report to --out {output.out_dir}:"
                                   f" {exc.strerror or exc}") from exc
    except (PySparkException, Py4JError) as exc:
        raise click.ClickException(f"the Spark job failed: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


COMMANDS = [history]
