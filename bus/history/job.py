"""The Spark history job over the agentbus JSONL export: the driver, and its command line.

    spark-submit --master spark://host:7077 "$(bus history --job-path)" --export /shared/bus/
    python -m bus.history.job --export .worker-state/bus.jsonl --format json
    bus history --query lifecycle        # the same job, from the `bus` command

The job first brings the history lake up to date (bus.history.pipeline: a
Structured Streaming query over what the export gained since the last run,
into partitioned Parquet tables), then queries the lake: the overview
(bus.history.extract's survey), the transforms (bus.history.queries: one pure
DataFrame -> DataFrame function per query) and the load (bus.history.report:
print a table, JSON lines or CSV; with --out, Parquet, CSV, report.html and
PNGs). The export is one JSONL file or a directory of them
(`date=YYYY-MM-DD/part-*.jsonl`); it and the lake are local paths (on a
cluster, a file system every node mounts at the same place).

This file is what spark-submit runs (`bus history --job-path` prints its
path): the driver imports bus.history from the installed agentbus; the
executors run only the queries' DataFrame expressions, in the JVM, and need
nothing of agentbus (docs/spark.md).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Iterator
from typing import Mapping
from typing import Sequence
from typing import TextIO

from pyspark.sql import DataFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bus.history.extract import MalformedExport
from bus.history.extract import survey_counts
from bus.history.errors import LakeError
from bus.history.lake import check_version
from bus.history.lake import default_lake
from bus.history.pipeline import TABLE_SCHEMAS
from bus.history.pipeline import read_table
from bus.history.pipeline import update_lake
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
        strict: bool = False, lake: str | None = None,
        files_per_batch: int | None = None) -> Overview:
    """Bring the lake up to date with the export, run each named query once over it,
    show the results.

    The lake defaults to one beside the export (lake.default_lake). Raises
    MalformedExport when `strict` and a line is not an export record;
    otherwise such lines are quarantined and counted in the returned Overview.
    """
    seen, results = compute(spark, export, names, options, strict, lake, files_per_batch)
    show(seen, results, output, out or sys.stdout)
    if output.out_dir:
        write_report(seen, results, export, Path(output.out_dir), output.png)
    return seen


def compute(spark: SparkSession, export: str, names: Sequence[str], options: Options,
            strict: bool = False, lake: str | None = None,
            files_per_batch: int | None = None) -> tuple[Overview, list[Result]]:
    """The overview and each query's rows, in the order of `names`, after the lake takes
    in what the export gained."""
    root = update_lake(spark, export, lake or default_lake(export), files_per_batch)
    return compute_lake(spark, root, names, options, strict, export)


def compute_lake(spark: SparkSession, lake: str | Path, names: Sequence[str],
                 options: Options, strict: bool = False,
                 export: str | None = None) -> tuple[Overview, list[Result]]:
    """The overview and each query's rows over the lake as it is.

    Each query reads the smallest of the lake's tables that answers it (the
    overview: the counts in `volume`), so it costs what those hold, not what
    all the messages do. The queries are submitted side by side (Spark runs
    jobs from several threads at once): a query's small stages and its
    driver-side planning leave cores idle that another query's tasks then
    use. `export` names the export in the place of a quarantined line
    (FILE:LINE).
    """
    check_version(Path(lake))
    tables = LakeTables(spark, Path(lake))
    seen, known = survey_counts(tables["volume"])
    seen = with_quarantine(seen, tables["quarantine"], export)
    if strict and seen.malformed:
        raise MalformedExport(f"{seen.malformed_note('in the export')}; --strict stops"
                              " at any (without it they are quarantined and counted)")
    with ThreadPoolExecutor(QUERY_THREADS) as pool:
        return seen, list(pool.map(
            lambda name: collect(name, QUERIES[name].transform(tables, options, known)), names))


class LakeTables(Mapping[str, DataFrame]):
    """The lake's tables by name (pipeline.TABLE_SCHEMAS), each read when asked for."""

    def __init__(self, spark: SparkSession, lake: Path) -> None:
        self.spark, self.lake = spark, lake

    def __getitem__(self, name: str) -> DataFrame:
        if name not in TABLE_SCHEMAS:
            raise KeyError(name)
        return read_table(self.spark, self.lake, name)

    def __iter__(self) -> Iterator[str]:
        return iter(TABLE_SCHEMAS)

    def __len__(self) -> int:
        return len(TABLE_SCHEMAS)


def with_quarantine(seen: Overview, quarantine: DataFrame, export: str | None) -> Overview:
    """The overview with the quarantined lines counted, and the first located."""
    first = quarantine.orderBy("source", F.col("line").asc_nulls_last(), "offset").first()
    if first is None:
        return seen
    where = str(Path(export) / first.source) if export and first.source else export or first.chunk
    return replace(seen, malformed=quarantine.count(),
                   first_malformed=f"{where}:{first.line if first.line is not None else '?'}")


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
    parser.add_argument("--lake", help="the history lake to update and query"
                                       " (default: beside the export, e.g. bus.lake)")
    parser.add_argument("--files-per-batch", type=int,
                        help="at most this many new landing files per micro-batch (default: all)")
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
                   Options(args.stuck_after_seconds, args.silence_top), strict=args.strict,
                   lake=args.lake, files_per_batch=args.files_per_batch)
    except (MalformedExport, LakeError) as exc:
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
