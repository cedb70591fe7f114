"""Extract, for the history job: read the export, count what it holds.

The export is read once with an explicit schema (read_export); `survey`
totals it, and finds on the way what some queries would otherwise make a
pass of their own for (Known); `survey_counts` does the same from the
lake's counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote
from urllib.parse import urlparse

from pyspark.sql import DataFrame
from pyspark.sql import Row
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bus.history.report import Overview

HEARTBEAT_TYPE = "heartbeat"
# What the bus publishes when a holder's lease ends without a state change.
HOLD_ENDING_TYPES = ("task_released", "task_reclaimed", "task_dead")
# The task graph's own messages about a task (bus/coordination/tasks.py, heartbeats.py).
TASK_EVENT_TYPES = ("task_blocked", "task_progress", "task_done", "task_cancelled")
PART_GLOB = "*.jsonl"  # the exporter's part files; anything else in the directory is not read
CORRUPT_COLUMN = "_corrupt_record"

# One export line (bus/log/export.py). `payload` is any JSON value; typed as a
# string, Spark's JSON reader keeps objects and arrays as their raw JSON text,
# which get_json_object then reads field by field.
EXPORT_SCHEMA = T.StructType([
    T.StructField("seq", T.LongType()),
    T.StructField("id", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("ts", T.StringType()),
    T.StructField("from", T.StringType()),
    T.StructField("to", T.StringType()),
    T.StructField("type", T.StringType()),
    T.StructField("correlation_id", T.StringType()),
    T.StructField("in_reply_to", T.StringType()),
    T.StructField("payload_ref", T.StringType()),
    T.StructField("payload", T.StringType()),
])

# What the reader asks for: Spark puts a line that does not parse in the extra column.
READ_SCHEMA = T.StructType([*EXPORT_SCHEMA.fields, T.StructField(CORRUPT_COLUMN, T.StringType())])

# The payload fields the queries read, by the message types they read them
# from. with_payload_fields pulls each out once, for those types only, into
# a column `payload_<field>` of its own: get_json_object parses the whole
# payload text at every call, and 24 lines in 25 of a generated export
# (heartbeats, progress...) carry no field any query reads.
PAYLOAD_FIELDS = {
    "to": ("state_change",),
    "task": (*HOLD_ENDING_TYPES, *TASK_EVENT_TYPES),
    **dict.fromkeys(("agent", "last_holder", "previous_holder", "new_holder",
                     "attempt", "reason"), HOLD_ENDING_TYPES),
}
# What the transforms take: the export with `from`/`to` named as the bus's
# Message names them (and no SQL keywords as column names).
MESSAGES_SCHEMA = T.StructType([
    T.StructField("seq", T.LongType(), False),
    T.StructField("id", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("ts", T.StringType()),
    T.StructField("from_agent", T.StringType()),
    T.StructField("to_agent", T.StringType()),
    T.StructField("type", T.StringType()),
    T.StructField("correlation_id", T.StringType()),
    T.StructField("in_reply_to", T.StringType()),
    T.StructField("payload_ref", T.StringType()),
    T.StructField("payload", T.StringType()),
])


def extract(spark: SparkSession, path: str) -> DataFrame:
    """The export at `path` (file or directory, any Hadoop URI) as MESSAGES_SCHEMA rows.

    Lines that are not export records (see read_export) are left out.
    """
    return to_messages(read_export(spark, path))


def read_export(spark: SparkSession, path: str) -> DataFrame:
    """Every line of the export: EXPORT_SCHEMA columns and `bad_file`.

    A directory is read recursively (which also switches partition
    discovery off: a `date=` level adds no column), its `*.jsonl` files
    only: Spark already skips hidden names (`.x`, `_x`), the glob skips
    temporary and backup files (`part-1.jsonl.tmp`, `.bak`, `~`) that would
    otherwise be read twice over. `bad_file` names the file of a line that
    is not an export record (not JSON, a torn last line, no seq), else null.
    """
    reader = (spark.read.schema(READ_SCHEMA)
              .option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT_COLUMN))
    if _is_directory(spark, path):
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", PART_GLOB)
    raw = reader.json(path)
    malformed = F.col(CORRUPT_COLUMN).isNotNull() | F.col("seq").isNull()
    return (raw.withColumn("bad_file", F.when(malformed, F.input_file_name()))
            .drop(CORRUPT_COLUMN))


def to_messages(raw: DataFrame) -> DataFrame:
    """read_export's records, the lines `bad_file` marks left out: MESSAGES_SCHEMA
    (`from` and `to` renamed as the bus's Message names them). Of a narrower
    `raw` the columns it has, renamed the same way."""
    return (raw.where(F.col("seq").isNotNull() & F.col("bad_file").isNull())
            .drop("bad_file")
            .withColumnsRenamed({"from": "from_agent", "to": "to_agent"}))


def with_payload_fields(frame: DataFrame) -> DataFrame:
    """`frame` with the payload's PAYLOAD_FIELDS as `payload_<field>` columns
    (null for the other message types) in place of the payload text.

    The transforms take either: extract's rows (they call this first) or
    rows that went through it already (the lake's).
    """
    if "payload" not in frame.columns:
        return frame
    if all(f"payload_{name}" in frame.columns for name in PAYLOAD_FIELDS):
        return frame.drop("payload")  # pulled out already (the lake's rows keep the text too)
    kind = F.col("type")
    fields = [F.when(kind.isin(*types), F.get_json_object("payload", f"$.{name}"))
              .alias(f"payload_{name}") for name, types in PAYLOAD_FIELDS.items()]
    return frame.select("*", *fields).drop("payload")


def _is_directory(spark: SparkSession, path: str) -> bool:
    """Ask Hadoop's file system (local, hdfs://, s3a://...) what `path` is."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    file_system = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return file_system.getFileStatus(hadoop_path).isDirectory()


def overview(spark: SparkSession, raw: DataFrame) -> Overview:
    """Totals over read_export's rows, and where the first bad line is."""
    return survey(spark, raw)[0]


@dataclass(frozen=True)
class Known:
    """Facts about all the messages that survey's pass finds beside the totals.

    A query given one skips the pass over every message it would otherwise
    make to find it (a job of its own); None: the query finds it itself.
    """

    newest_ms: int | None = None  # the newest message's ts_ms
    beaters: frozenset[str] | None = None  # the agents that send heartbeats


def survey(spark: SparkSession, raw: DataFrame) -> tuple[Overview, Known]:
    """The overview of read_export's rows, and what the queries may take from the same pass.

    One aggregate per (sender, bad file): a few rows per agent, summed here.
    A count_distinct of senders beside the other totals would make Spark
    copy every row once per distinct aggregate (an Expand) to count them.
    """
    groups = (raw.groupBy(F.col("from").alias("agent"), "bad_file")
              .agg(F.count(F.lit(1)).alias("lines"), F.min("ts_ms").alias("first_ms"),
                   F.max("ts_ms").alias("last_ms"),
                   F.max(F.col("type") == HEARTBEAT_TYPE).alias("beats"))
              .collect())
    bad = [group for group in groups if group.bad_file is not None]
    return _summed([group for group in groups if group.bad_file is None],
                   sum(group.lines for group in bad), _first_malformed(spark, bad))


def survey_counts(counts: DataFrame) -> tuple[Overview, Known]:
    """survey of counts per agent and type (queries.volume_counts: the lake's `volume`),
    which hold records only."""
    groups = (counts.groupBy("agent")
              .agg(F.sum("messages").alias("lines"), F.min("first_ms").alias("first_ms"),
                   F.max("last_ms").alias("last_ms"),
                   F.max(F.col("type") == HEARTBEAT_TYPE).alias("beats"))
              .collect())
    return _summed(groups, 0, None)


def _summed(good: list[Row], malformed: int, first_malformed: str | None
            ) -> tuple[Overview, Known]:
    """The overview and Known from (agent, lines, first_ms, last_ms, beats) rows."""
    seen = Overview(sum(group.lines for group in good),
                    len({group.agent for group in good} - {None}),
                    _extreme(min, [group.first_ms for group in good]),
                    _extreme(max, [group.last_ms for group in good]),
                    malformed, first_malformed)
    beaters = frozenset(group.agent for group in good if group.beats and group.agent is not None)
    return seen, Known(newest_ms=seen.last_ms, beaters=beaters)


def _first_malformed(spark: SparkSession, bad: list[Row]) -> str | None:
    """FILE:LINE of the first bad line in the first file (by name) that has one."""
    if not bad:
        return None
    file = min(group.bad_file for group in bad)
    return f"{_local_name(file)}:{first_malformed_line(spark, file)}"


def _extreme(pick: Callable[[list[int]], int], values: list[int | None]) -> int | None:
    """min or max of the values that are not None (None when none is), as SQL's min/max."""
    known = [value for value in values if value is not None]
    return pick(known) if known else None


def first_malformed_line(spark: SparkSession, file: str) -> int:
    """The 1-based number of the first line of `file` that is not an export record.

    Read again as text: the JSON reader keeps no line numbers. Lines come in
    file order within a split, and splits start at known byte offsets, so
    (block start, id) orders the lines; blank lines are not records but not
    malformed either (the JSON reader skips them).
    """
    seq = F.from_json("value", EXPORT_SCHEMA).getField("seq")
    lines = spark.read.text(file).select(
        F.input_file_block_start().alias("block"), F.monotonically_increasing_id().alias("n"),
        (seq.isNull() & (F.trim("value") != "")).alias("bad"))
    first = lines.where("bad").orderBy("block", "n").first()
    if first is None:  # the file changed since it was read
        return 0
    before = (F.col("block") < first.block) | ((F.col("block") == first.block)
                                                & (F.col("n") <= first.n))
    return lines.where(before).count()


def _local_name(uri: str) -> str:
    """file:///x/y -> /x/y (what a person types); other schemes stay URIs."""
    return unquote(urlparse(uri).path) if uri.startswith("file:/") else uri


class MalformedExport(ValueError):
    """--strict and the export has lines that are not records."""
