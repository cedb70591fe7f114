"""The Spark history job over the agentbus JSONL export: the driver, and its command line.

    spark-submit --master spark://host:7077 "$(bus history --job-path)" --export hdfs:///bus/
    python -m bus.history.job --export .worker-state/bus.jsonl --format json
    bus history --query lifecycle        # the same job, from the `bus` command

The job is extract (bus.history.extract: read the export with an explicit
schema, total it), transform (bus.history.queries: one pure DataFrame ->
DataFrame function per query) and load (bus.history.report: print a table,
JSON lines or CSV; with --out, Parquet, CSV, report.html and PNGs). The
export is one JSONL file or a directory of them (`date=YYYY-MM-DD/part-*.jsonl`,
read recursively).

This file is what spark-submit runs (`bus history --job-path` prints its
path): the driver imports bus.history from the installed agentbus; the
executors run only the queries' DataFrame expressions, in the JVM, and need
nothing of agentbus (docs/spark.md).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence
from typing import TextIO

from pyspark.sql import DataFrame
from pyspark.sql import SparkSession

from bus.history.extract import CACHED_COLUMNS
from bus.history.extract import MalformedExport
from bus.history.extract import read_export
from bus.history.extract import survey
from bus.history.extract import to_messages
from bus.history.extract import with_payload_fields
from bus.history.queries import MAX_SILENCE_TOP
from bus.history.queries import QUERIES
from bus.history.queries import SILENCE_TOP
from bus.history.queries import STUCK_AFTER_SECONDS
from bus.history.queries import Options
from bus.history.queries import query_names
from bus.history.report import Output
from bus.history.report import Overview
from bus.history.report import Result
from bus.history.report import output_problem
from bus.history.report import show
from bus.history.report import write_report
from bus.history.session import QUERY_THREADS
from bus.history.session import start_spark



def run(spark: SparkSession, export: str, names: Sequence[str],
        output: Output = Output(), options: Options = Options(), out: TextIO | None = None,
        strict: bool = False) -> Overview:
    """Read the export once, run each named query once, show the results.

    Raises MalformedExport when `strict` and a line is not an export record;
    otherwise such lines are left out and counted in the returned Overview.
    """
    seen, results = compute(spark, export, names, options, strict)
    show(seen, results, output, out or sys.stdout)
    if output.out_dir:
        write_report(seen, results, export, Path(output.out_dir), output.png)
    return seen


def compute(spark: SparkSession, export: str, names: Sequence[str], options: Options,
            strict: bool = False) -> tuple[Overview, list[Result]]:
    """The overview and each query's rows, in the order of `names`.

    The queries are submitted side by side (Spark runs jobs from several
    threads at once): a query's small stages and its driver-side planning
    leave cores idle that another query's tasks then use.
    """
    # Parsed once for the overview and every query, and only what they read.
    raw = with_payload_fields(read_export(spark, export).select(*CACHED_COLUMNS)).persist()
    try:
        seen, known = survey(spark, raw)
        if strict and seen.malformed:
            raise MalformedExport(f"{seen.malformed_note('in the export')}; --strict stops"
                                  " at any (without it they are skipped and counted)")
        messages = to_messages(raw)
        with ThreadPoolExecutor(QUERY_THREADS) as pool:
            return seen, list(pool.map(
                lambda name: collect(name, QUERIES[name].run(messages, options, known)), names))
    finally:
        raw.unpersist()


def collect(name: str, result: DataFrame) -> Result:
    """The rows of one query, fetched once (every view works from them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        arrow_schema = to_arrow_schema(result.schema)
    except ImportError:  # no pyarrow: only --out needs it, and says so
        arrow_schema = None
    query = QUERIES[name]
    return Result(name, query.title, result.columns, [tuple(row) for row in result.collect()],
                  arrow_schema, query.times)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="History queries over the agentbus export.")
    parser.add_argument("--export", required=True,
                        help="export JSONL file or directory (date=YYYY-MM-DD/part-*.jsonl)")
    parser.add_argument("--query", default="all", choices=[*QUERIES, "all"])
    parser.add_argument("--format", default="table", choices=["table", "json", "csv"],
                        help="table: a summary (every row with --full); json, csv: every row")
    parser.add_argument("--full", action="store_true", help="the table with every row")
    parser.add_argument("--out", metavar="DIR",
                        help="write <query>.parquet, <query>.csv and report.html to DIR")
    parser.add_argument("--png", action="store_true", help="with --out: the charts as PNG too")
    parser.add_argument("--strict", action="store_true",
                        help="fail on a line that is not an export record (default: skip, count)")
    parser.add_argument("--stuck-after-seconds", type=float, default=STUCK_AFTER_SECONDS,
                        help="a non-terminal state older than this is stuck (default %(default)s)")
    parser.add_argument("--silence-top", type=_silence_top, default=SILENCE_TOP,
                        help="gaps reported per agent, 1 to 100000 (default %(default)s)")
    parser.add_argument("--limit", type=int, help="print at most this many rows per query")
    args = parser.parse_args(argv)
    problem = output_problem(args.format, args.query, args.out, args.png)
    if problem:
        parser.error(problem)
    return args


def _silence_top(text: str) -> int:
    """--silence-top: a count max_by accepts (1 to MAX_SILENCE_TOP)."""
    top = int(text)
    if not 1 <= top <= MAX_SILENCE_TOP:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_SILENCE_TOP}, not {top}")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    created = SparkSession.getActiveSession() is None
    spark = start_spark()
    output = Output(args.format, args.full, args.limit, out_dir=args.out, png=args.png)
    try:
        seen = run(spark, args.export, query_names(args.query), output,
                   Options(args.stuck_after_seconds, args.silence_top), strict=args.strict)
    except MalformedExport as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if created:  # ours to end; an embedding caller keeps its session
            spark.stop()
    if seen.malformed:
        print(seen.malformed_note(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
