"""The streaming pipeline: the export's new lines into the lake's Parquet tables.

    update_lake(spark, "bus.jsonl", "bus.lake")   # land new bytes, then stream them in

Each run lands what the export gained (bus.history.lake), then runs a
Structured Streaming query over the landing directory: the text file source
(each line parsed with the export's explicit schema), `trigger(availableNow)`
so it processes what is there and stops, and a checkpoint in the lake. The
file source remembers every chunk it has read, so a run reads only the new
ones.

Each micro-batch writes every table in foreachBatch (write_batch). Exactly
once comes from the checkpoint and an idempotent write: the stream records a
batch's files (offsets/N) before running it and its end (commits/N) after,
and a run killed in between runs batch N again over the same files. Every
table is partitioned by (day, batch_id), or by batch_id alone (`silences`,
`quarantine`), and written with dynamic partition overwrite, so the replay
replaces the partitions of batch N a killed run left, whole or in part,
instead of adding to them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from urllib.parse import unquote
from urllib.parse import urlparse

from pyspark.sql import Observation
from pyspark.sql import DataFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bus.history.extract import EXPORT_SCHEMA
from bus.history.extract import PAYLOAD_FIELDS
from bus.history.extract import with_payload_fields
from bus.history.lake import CHECKPOINT
from bus.history.lake import Chunk
from bus.history.lake import all_streamed
from bus.history.lake import chunk_count
from bus.history.lake import LANDING
from bus.history.lake import land
from bus.history.lake import lake_lock
from bus.history.lake import locate_lines
from bus.history.lake import mark_streamed
from bus.history.lake import open_lake
from bus.history.lake import remove_leftovers
from bus.history.queries import GAPS_TYPE
from bus.history.queries import as_requests
from bus.history.queries import hold_end_events
from bus.history.queries import reply_latencies
from bus.history.queries import silence_spans
from bus.history.queries import state_changes
from bus.history.queries import task_events
from bus.history.queries import volume_counts

DAY_MS = 86_400_000

_TIME = [T.StructField("ts", T.TimestampType()), T.StructField("ts_ms", T.LongType()),
         T.StructField("seq", T.LongType())]
_PARTITION = [T.StructField("day", T.DateType()), T.StructField("batch_id", T.LongType())]
# The lake's tables (docs/history.md describes each column), partition columns last.
TABLE_SCHEMAS: dict[str, T.StructType] = {
    "messages": T.StructType([
        T.StructField("seq", T.LongType()), T.StructField("id", T.StringType()),
        T.StructField("ts", T.TimestampType()), T.StructField("ts_ms", T.LongType()),
        *[T.StructField(name, T.StringType()) for name in (
            "from_agent", "to_agent", "type", "correlation_id", "in_reply_to", "payload_ref",
            "payload")],
        *[T.StructField(f"payload_{name}", T.StringType()) for name in PAYLOAD_FIELDS],
        *_PARTITION]),
    "worker_states": T.StructType([
        *[T.StructField(name, T.StringType()) for name in ("worker", "task", "state")],
        *_TIME, *_PARTITION]),
    "claims": T.StructType([
        *[T.StructField(name, T.StringType()) for name in ("task", "event", "holder",
                                                           "new_holder")],
        T.StructField("attempt", T.LongType()), T.StructField("reason", T.StringType()),
        *_TIME, *_PARTITION]),
    "tasks": T.StructType([
        *[T.StructField(name, T.StringType()) for name in ("task", "event", "agent", "state")],
        *_TIME, *_PARTITION]),
    "volume": T.StructType([
        T.StructField("hour", T.TimestampType()), T.StructField("hour_ms", T.LongType()),
        T.StructField("agent", T.StringType()), T.StructField("type", T.StringType()),
        *[T.StructField(name, T.LongType()) for name in ("messages", "first_ms", "last_ms")],
        *_PARTITION]),
    "replies": T.StructType([
        *[T.StructField(name, T.StringType()) for name in ("correlation_id", "reply_id",
                                                           "request_id")],
        T.StructField("latency_ms", T.LongType()), *_TIME, *_PARTITION]),
    "silences": T.StructType([
        T.StructField("agent", T.StringType()), T.StructField("beats", T.BooleanType()),
        *[T.StructField(name, T.LongType()) for name in ("first_ms", "first_seq", "last_ms",
                                                         "last_seq")],
        T.StructField("gaps", GAPS_TYPE),
        T.StructField("batch_id", T.LongType())]),
    "quarantine": T.StructType([
        T.StructField("source", T.StringType()), T.StructField("line", T.LongType()),
        T.StructField("offset", T.LongType()), T.StructField("text", T.StringType()),
        T.StructField("chunk", T.StringType()), T.StructField("batch_id", T.LongType())]),
}


def update_lake(spark: SparkSession, export: str, lake: str,
                files_per_batch: int | None = None) -> Path:
    """Bring the lake up to date with the export; the lake's directory.

    `files_per_batch` caps the chunks per micro-batch (default: all new ones
    in one batch). Raises LakeTooNew for a lake of a newer schema, LakeError
    for an export the lake no longer matches.
    """
    root = open_lake(lake)
    with lake_lock(root):
        remove_leftovers(root)
        land(Path(export).absolute(), root)
        chunks = chunk_count(root)
        if all_streamed(root, chunks):  # a stream's start and stop alone cost a second
            return root
        _parquet_for_every_engine(spark)
        reader = spark.readStream.format("text")
        if files_per_batch:
            reader = reader.option("maxFilesPerTrigger", files_per_batch)
        stream = (reader.load(str(root / LANDING))
                  .select("value", F.col("_metadata.file_path").alias("chunk"))
                  .writeStream.foreachBatch(partial(write_batch, root))
                  .option("checkpointLocation", str(root / CHECKPOINT))
                  .trigger(availableNow=True).start())
        stream.awaitTermination()
        mark_streamed(root, chunks)
    return root


def _parquet_for_every_engine(spark: SparkSession) -> None:
    """Timestamps as Parquet's own TIMESTAMP(MICROS, UTC), not Spark's legacy INT96."""
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


def write_batch(root: Path, batch: DataFrame, batch_id: int) -> None:
    """Write one micro-batch to every table, replacing what an earlier try of it wrote.

    The lines are parsed once, on their way into `messages`; the other
    tables are derived from the partitions just written, which hold the
    columns they read (a cache of the parsed batch, payload text and all,
    would spill to disk on a large batch). The count of lines that are not
    records is taken on the same pass, so a batch without any is not read
    again to quarantine none.
    """
    parsed = parse_lines(batch)
    bad = F.col("seq").isNull() & (F.trim("value") != "")
    lines = Observation()
    records = (parsed.observe(lines, F.count(F.when(bad, 1)).alias("bad"))
               .where(F.col("seq").isNotNull()))
    _write_partitions(messages_table(records), root / "messages", batch_id, ("day", "batch_id"))
    written = _batch_rows(batch.sparkSession, root / "messages", batch_id)
    for name, derive in DERIVED.items():
        _write_partitions(derive(written), root / name, batch_id, ("day", "batch_id"))
    _write_partitions(replies_table(batch.sparkSession, root, written, batch_id),
                      root / "replies", batch_id, ("day", "batch_id"))
    _write_partitions(silence_spans(written), root / "silences", batch_id, ("batch_id",))
    if lines.get["bad"]:
        bad_lines = parsed.where(bad).select("chunk", "value").collect()
        _quarantine(batch.sparkSession, root, bad_lines, batch_id)


def _batch_rows(spark: SparkSession, table: Path, batch_id: int) -> DataFrame:
    """The rows batch `batch_id` wrote to `table`: its partitions only, not a listing of all.

    Named one by one: a glob would make Spark look for a streaming sink's
    metadata under it, and log a stack trace when it finds none.
    """
    written = [str(path) for path in sorted(table.glob(f"day=*/batch_id={batch_id}"))]
    if not written:  # no line of it was a record
        return spark.createDataFrame([], TABLE_SCHEMAS[table.name])
    return (spark.read.schema(TABLE_SCHEMAS[table.name]).option("basePath", str(table))
            .parquet(*written))


def _quarantine(spark: SparkSession, root: Path, bad: list, batch_id: int) -> None:
    frame = spark.createDataFrame(quarantine_rows(bad, batch_id), TABLE_SCHEMAS["quarantine"])
    _write_partitions(frame.drop("batch_id"), root / "quarantine", batch_id, ("batch_id",))


def parse_lines(batch: DataFrame) -> DataFrame:
    """Each line parsed with the export's schema (a line that is not a record: seq null),
    its payload fields pulled out, its time as a UTC timestamp and day."""
    record = F.from_json("value", EXPORT_SCHEMA, {"mode": "PERMISSIVE"})
    parsed = (batch.select("value", "chunk", record.alias("r"))
              .select("value", "chunk", "r.*")
              .withColumnsRenamed({"from": "from_agent", "to": "to_agent"})
              .drop("ts"))
    return (with_payload_fields(parsed.withColumn("payload_kept", F.col("payload")))
            .withColumnRenamed("payload_kept", "payload")
            .withColumn("ts", F.timestamp_millis("ts_ms"))
            # The UTC day by arithmetic: the same whatever the session's time zone.
            .withColumn("day", F.date_from_unix_date(F.floor(F.col("ts_ms") / DAY_MS).cast("int"))))


def messages_table(records: DataFrame) -> DataFrame:
    return records.select(*_columns("messages"))


def worker_states_table(records: DataFrame) -> DataFrame:
    """Each state a worker's task entered (its state_change messages)."""
    return state_changes(records, "ts", "day")


def claims_table(records: DataFrame) -> DataFrame:
    """The bus's ends of a hold: released from a dead holder, taken over, declared dead."""
    return hold_end_events(records, "ts", "day")


def tasks_table(records: DataFrame) -> DataFrame:
    """Every message about a task's progress (queries.task_events), with its time and day."""
    return task_events(records, "ts", "day")


def volume_table(records: DataFrame) -> DataFrame:
    """Messages per hour, agent and type of the batch (queries.volume_counts)."""
    return (volume_counts(records, "day")
            .withColumn("hour", F.timestamp_millis("hour_ms")))


def replies_table(spark: SparkSession, root: Path, written: DataFrame,
                  batch_id: int) -> DataFrame:
    """The batch's replies with their latency (null while the lake lacks the request),
    and the replies of earlier batches that were waiting for a request this batch brings
    (one export file's reply can land before another file's request)."""
    extra = ("ts", "ts_ms", "seq", "day")
    fresh = reply_latencies(written, read_table(spark, root, "messages"), *extra,
                            unanswered=True)
    earlier = read_table(spark, root, "replies").where(F.col("batch_id") < batch_id)
    answered = earlier.where(F.col("latency_ms").isNotNull()).select("reply_id")
    waiting = (earlier.where(F.col("latency_ms").isNull())
               .join(answered, "reply_id", "left_anti"))
    late = (waiting.join(as_requests(written), "request_id")
            .select(F.coalesce("correlation_id", "request_correlation_id").alias("correlation_id"),
                    "reply_id", "request_id",
                    (F.col("ts_ms") - F.col("request_ms")).alias("latency_ms"), *extra))
    return fresh.unionByName(late)


# The tables derived from the batch's rows in `messages` alone. silence_spans are of
# the batch as a whole, so that table is partitioned by batch alone.
DERIVED = {"worker_states": worker_states_table, "claims": claims_table, "tasks": tasks_table,
           "volume": volume_table}


def quarantine_rows(bad: list, batch_id: int) -> list[tuple]:
    """The lines that are not export records, each located in its export file."""
    by_chunk: dict[str, list[str]] = {}
    for row in bad:
        by_chunk.setdefault(row.chunk, []).append(row.value)
    rows = []
    for chunk_uri, texts in sorted(by_chunk.items()):
        chunk_path = Path(_local_path(chunk_uri))
        source = _source_of(chunk_path)
        for text, line, offset in locate_lines(chunk_path, texts):
            rows.append((source, line, offset, text, chunk_path.name, batch_id))
    return rows


def _source_of(chunk_path: Path) -> str:
    chunk = Chunk.parse(chunk_path.name)
    return chunk.source if chunk is not None else chunk_path.name


def _local_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def _write_partitions(frame: DataFrame, path: Path, batch_id: int,
                      partitions: tuple[str, ...]) -> None:
    """Append the batch's rows as its own partitions, replacing those of an earlier try."""
    (frame.withColumn("batch_id", F.lit(batch_id).cast("long"))
     .write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy(*partitions).parquet(str(path)))


def _columns(table: str) -> list[str]:
    return [field.name for field in TABLE_SCHEMAS[table].fields if field.name != "batch_id"]


def read_table(spark: SparkSession, lake: str | Path, table: str) -> DataFrame:
    """One of the lake's tables (empty, with its columns, before it has a row)."""
    path = Path(lake) / table
    schema = TABLE_SCHEMAS[table]
    if not path.is_dir() or not any(path.iterdir()):
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(str(path))

