"""The history lake (bus/history/lake.py, pipeline.py): incremental, exactly once, open.

The pipeline runs in the module's one local Spark for most tests; the crash
test runs the job in processes of its own and kills them (SIGKILL, the whole
process group: Python and its JVM) at several points. The lake's files are
checked with pyarrow, not with Spark: the answer must not depend on the
engine that wrote it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

import orjson  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import StreamingQueryListener  # noqa: E402

from bus import Bus  # noqa: E402
from bus.cli import history as history_cli  # noqa: E402
from bus.log import messages as bus_messages  # noqa: E402
from bus.history import job  # noqa: E402
from bus.history import queries  # noqa: E402
from bus.history.errors import LakeError  # noqa: E402
from bus.history.errors import LakeTooNew  # noqa: E402
from bus.history.errors import LakeTooOld  # noqa: E402
from bus.history.lake import CHECKPOINT  # noqa: E402
from bus.history.lake import LAKE_FILE  # noqa: E402
from bus.history.lake import LAKE_SCHEMA_VERSION  # noqa: E402
from bus.history.lake import LANDING  # noqa: E402
from bus.history.lake import Chunk  # noqa: E402
from bus.history.lake import land  # noqa: E402
from bus.history.lake import open_lake  # noqa: E402
from bus.history.pipeline import update_lake  # noqa: E402

from tests.support.history_support import QUICK_JVM  # noqa: E402
from tests.support.history_support import T0  # noqa: E402
from tests.support.history_support import iso  # noqa: E402
from tests.support.history_support import load_script  # noqa: E402
from tests.support.history_support import spark  # noqa: E402,F401 (the fixture)
from tests.support.waiting import wait_until  # noqa: E402

HOUR_MS = 3_600_000


def line(seq: int, ts_ms: int | None = None, **fields: Any) -> bytes:
    """An export line (bus/log/export.py's format)."""
    ts_ms = T0 + seq * 1000 if ts_ms is None else ts_ms
    record = {"seq": seq, "id": f"m{seq}", "ts_ms": ts_ms, "ts": iso(ts_ms), "from": "w1",
              "to": None, "type": "note", "correlation_id": None, "in_reply_to": None,
              "payload_ref": None, "payload": None, **fields}
    return orjson.dumps(record) + b"\n"


def lake_table(lake: Path, table: str) -> Any:
    """A lake table as pyarrow reads it (hive partitions; hidden files left out)."""
    return ds.dataset(lake / table, format="parquet", partitioning="hive").to_table()


def ids(lake: Path) -> list[str]:
    return lake_table(lake, "messages").column("id").to_pylist()


def chunks(lake: Path) -> list[Chunk]:
    return sorted((Chunk.parse(path.name) for path in (lake / LANDING).iterdir()
                   if Chunk.parse(path.name)), key=lambda chunk: (chunk.source, chunk.start))


def test_a_second_run_lands_and_reads_only_what_the_export_gained(
        spark: SparkSession, tmp_path: Path) -> None:
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    first = b"".join(line(seq) for seq in range(1, 6))
    export.write_bytes(first + line(6)[:20])  # a torn last line: the exporter is mid-write
    update_lake(spark, str(export), str(lake))
    assert sorted(ids(lake)) == sorted(f"m{seq}" for seq in range(1, 6))
    with open(export, "r+b") as out:  # the exporter finishes the line and adds two
        out.seek(len(first))
        out.write(line(6) + line(7) + line(8))
    update_lake(spark, str(export), str(lake))
    assert sorted(ids(lake)) == sorted(f"m{seq}" for seq in range(1, 9))
    assert chunks(lake) == [Chunk("", 0, len(first), 0, 5),
                            Chunk("", len(first), export.stat().st_size, 5, 8)]
    # The stream's log of what each batch read: the second batch, the new chunk only.
    batch_files = sorted((lake / CHECKPOINT / "sources" / "0").iterdir())
    read = [json.loads(entry)["path"] for entry in batch_files[-1].read_text().splitlines()[1:]]
    assert len(read) == 1 and read[0].endswith(chunks(lake)[1].name)
    assert lake_table(lake, "messages").column("batch_id").unique().to_pylist() in ([0, 1], [1, 0])


class StreamStarts(StreamingQueryListener):
    """Counts the streaming queries the session starts."""

    def __init__(self) -> None:
        self.started = 0

    def onQueryStarted(self, event: Any) -> None:
        self.started += 1

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def test_a_run_with_nothing_new_starts_no_stream_unless_a_killed_run_left_chunks(
        spark: SparkSession, tmp_path: Path) -> None:
    """A stream's start and stop cost a second with nothing to read, so a run whose
    landing has nothing the last whole stream run did not take in starts none. Chunks a
    run landed before it was killed are streamed by the next."""
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    export.write_bytes(line(1) + line(2))
    starts = StreamStarts()
    spark.streams.addListener(starts)
    try:
        update_lake(spark, str(export), str(lake))  # streams m1, m2
        update_lake(spark, str(export), str(lake))  # nothing new
        with open(export, "ab") as out:
            out.write(line(3))
        land(export, lake)  # a run killed after its landing, before its stream ended
        update_lake(spark, str(export), str(lake))  # streams the landed m3
        update_lake(spark, str(export), str(lake))  # nothing new
        with open(export, "ab") as out:
            out.write(line(4))
        update_lake(spark, str(export), str(lake))  # streams m4
        # The listener hears the starts in order: once the last is heard, all are.
        wait_until(lambda: starts.started >= 3, what="the third stream's start")
    finally:
        spark.streams.removeListener(starts)
    assert starts.started == 3
    assert sorted(ids(lake)) == ["m1", "m2", "m3", "m4"]


def test_time_columns_are_utc_timestamps_and_tables_are_partitioned_by_utc_day(
        spark: SparkSession, tmp_path: Path) -> None:
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    just_before_midnight = T0 + 16 * HOUR_MS - 1  # 2026-01-05T23:59:59.999Z
    export.write_bytes(line(1, just_before_midnight)
                       + line(2, just_before_midnight + 1, type="state_change",
                              correlation_id="t1", payload={"from": None, "to": "ASSIGNED"}))
    update_lake(spark, str(export), str(lake))
    messages = lake_table(lake, "messages")
    assert str(messages.schema.field("ts").type) == "timestamp[us, tz=UTC]"
    days = dict(zip(messages.column("id").to_pylist(),
                    [str(day) for day in messages.column("day").to_pylist()]))
    assert days == {"m1": "2026-01-05", "m2": "2026-01-06"}
    states = lake_table(lake, "worker_states").to_pylist()
    assert [(row["worker"], row["task"], row["state"]) for row in states] == [
        ("w1", "t1", "ASSIGNED")]
    assert states[0]["ts"].isoformat() == "2026-01-06T00:00:00+00:00"


def test_a_corrupt_line_is_quarantined_with_its_file_line_and_offset(
        spark: SparkSession, tmp_path: Path) -> None:
    root, lake = tmp_path / "export", tmp_path / "export.lake"
    part = root / "date=2026-01-05" / "part-000000000001.jsonl"
    part.parent.mkdir(parents=True)
    good = line(1) + b"\n"
    part.write_bytes(good + b'{"seq": 2, "id": "m2", "ts_m\n' + line(3))
    update_lake(spark, str(root), str(lake))
    assert sorted(ids(lake)) == ["m1", "m3"]
    quarantined = lake_table(lake, "quarantine").to_pylist()
    assert [(row["source"], row["line"], row["offset"], row["text"]) for row in quarantined] == [
        ("date=2026-01-05/part-000000000001.jsonl", 3, len(good),
         '{"seq": 2, "id": "m2", "ts_m')]
    assert part.read_bytes()[len(good):].startswith(b'{"seq": 2, "id": "m2", "ts_m\n')
    seen, _ = job.compute_lake(spark, lake, ["volume"], queries.Options(), export=str(root))
    assert (seen.messages, seen.malformed, seen.first_malformed) == (2, 1, f"{part}:3")


@pytest.fixture
def bus_cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    import bus.cli

    monkeypatch.setitem(bus.cli.main.commands, "history", history_cli.history)
    return bus.cli.main


@pytest.mark.parametrize("version, error, says", [
    (99, LakeTooNew, "schema version 99, newer than 2"),
    (1, LakeTooOld, "schema version 1, older than 2, and lacks tables"),
])
def test_a_lake_of_another_schema_is_refused_by_name(
        spark: SparkSession, bus_cli: Any, tmp_path: Path, version: int,
        error: type[LakeError], says: str) -> None:
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    export.write_bytes(line(1))
    update_lake(spark, str(export), str(lake))
    (lake / LAKE_FILE).write_text(json.dumps({"format": "agentbus-history-lake",
                                              "schema_version": version}))
    with pytest.raises(error, match=says) as raised:
        update_lake(spark, str(export), str(lake))
    assert (raised.value.found, raised.value.supported) == (version, LAKE_SCHEMA_VERSION)
    result = CliRunner().invoke(bus_cli, ["--db", str(tmp_path / "bus.db"), "history",
                                          "--export", str(export), "--lake", str(lake)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: the history lake {lake} has schema version"
                                    f" {version}")


def test_an_export_shorter_than_what_the_lake_holds_of_it_is_refused(
        spark: SparkSession, tmp_path: Path) -> None:
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    export.write_bytes(line(1) + line(2))
    update_lake(spark, str(export), str(lake))
    export.write_bytes(line(1))
    with pytest.raises(LakeError, match="truncated or replaced"):
        update_lake(spark, str(export), str(lake))


def test_silence_over_batches_out_of_time_order_reads_every_message(
        spark: SparkSession, tmp_path: Path) -> None:
    """A later batch with a message older than an earlier batch's last (an export not in
    time order) makes the batches' spans overlap: merging them would invent a gap, so
    silence reads every message, and still gives each agent's real longest gaps."""
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    first = line(1, T0) + line(2, T0 + 10_000) + line(3, T0 + 100_000)
    export.write_bytes(first)
    update_lake(spark, str(export), str(lake))
    export.write_bytes(first + line(4, T0 + 50_000) + line(5, T0 + 120_000))
    update_lake(spark, str(export), str(lake))
    spans = job.LakeTables(spark, lake)["silences"]
    assert queries.spans_overlap(spans)
    _, [result] = job.compute_lake(spark, lake, ["silence"], queries.Options(silence_top=2))
    # w1 at 0, 10, 50, 100, 120 s: its longest gaps are 40 s and 50 s, not the 90 s
    # from batch one's 10 s to its 100 s.
    assert [(row[0], row[4]) for row in result.rows] == [("w1", 50.0), ("w1", 40.0)]


def test_messages_without_a_sender_keep_their_silences_across_batches(
        spark: SparkSession, tmp_path: Path) -> None:
    """Records without `from` are one agent of their own in silence, as in volume: the
    merge of the batches' spans keeps them (a join on the agent alone would drop them)."""
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    first = line(1, T0, **{"from": None}) + line(2, T0 + 10_000, **{"from": None})
    export.write_bytes(first)
    update_lake(spark, str(export), str(lake))
    export.write_bytes(first + line(3, T0 + 40_000, **{"from": None}))
    update_lake(spark, str(export), str(lake))
    _, [result] = job.compute_lake(spark, lake, ["silence"], queries.Options(silence_top=2))
    assert [(row[0], row[4]) for row in result.rows] == [(None, 30.0), (None, 10.0)]


def test_a_reply_that_lands_before_its_request_is_counted_when_the_request_comes(
        spark: SparkSession, tmp_path: Path) -> None:
    """A directory export's files land each on its own: a reply in one file can reach
    the lake a run before its request in another. The reply waits in `replies` without
    a latency, and the batch that brings the request adds it; a reply to a message the
    export never holds is never counted."""
    export, lake = tmp_path / "history", tmp_path / "history.lake"
    (export / "date=2026-01-06").mkdir(parents=True)
    (export / "date=2026-01-06" / "part-2.jsonl").write_bytes(
        line(2, correlation_id="c1", in_reply_to="m1")
        + line(3, correlation_id="c2", in_reply_to="m404"))
    update_lake(spark, str(export), str(lake))
    (export / "date=2026-01-05").mkdir()
    (export / "date=2026-01-05" / "part-1.jsonl").write_bytes(line(1, correlation_id="c1"))
    update_lake(spark, str(export), str(lake))
    update_lake(spark, str(export), str(lake))  # nothing new: the reply is not added twice
    _, [result] = job.compute_lake(spark, lake, ["threads"], queries.Options())
    assert result.rows == [("thread", "c1", 1, 1000, 1000, 1000),
                           ("all", None, 1, 1000, 1000, 1000)]
    waiting = lake_table(lake, "replies").to_pylist()
    assert sorted(((row["reply_id"], row["batch_id"], row["latency_ms"]) for row in waiting)) == [
        ("m2", 0, None), ("m2", 1, 1000), ("m3", 0, None)]


# --- the task graph's queries over a real bus -------------------------------------------


def test_lead_time_blocked_and_throughput_over_a_real_bus_task_graph(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": T0}
    monkeypatch.setattr(bus_messages, "now_ms", lambda: clock["now"])

    def at(ms: int) -> int:
        clock["now"] = T0 + ms
        return clock["now"]

    with Bus.open(tmp_path / "bus.db") as opened:
        opened.tasks.add("t1", "write the lake", now=at(0))
        opened.tasks.add("t2", "document it", now=at(0))
        claimed = opened.tasks.claim_next("w1", lease_ms=600_000, now=at(1_000))
        for ms, status, progress in [(10_000, "blocked", None), (40_000, "working", 0.5)]:
            opened.heartbeats.beat("w1", status, task=claimed.task.task_id, progress=progress)
            # A beat's announcements take the real clock: move them to the story's time.
            opened.conn.execute("UPDATE messages SET ts_ms = ? WHERE ts_ms > ?",
                                (at(ms), T0 + 86_400_000))
        opened.tasks.complete(claimed.task.task_id, "w1", now=at(61_000))
        opened.tasks.cancel("t2", "planner", "not needed", now=at(90_000))
        opened.export_jsonl()
    export = tmp_path / "bus.jsonl"
    _, results = job.compute(spark, str(export), ["lead_time", "blocked", "throughput"],
                             queries.Options())
    by_name = {result.name: result.records() for result in results}
    done = claimed.task.task_id
    assert [(r["task"], r["lead_s"], r["outcome"]) for r in by_name["lead_time"]
            if r["task"] == done] == [(done, 51.0, "done")]  # first event: the blocked beat
    assert [(r["task"], r["agent"], r["spells"], r["blocked_s"], r["still_blocked"])
            for r in by_name["blocked"]] == [(done, "w1", 1, 30.0, False)]
    assert [(r["agent"], r["day"], r["done"]) for r in by_name["throughput"]] == [
        ("w1", "2026-01-05", 1)]


# --- exactly once across kill -9 -----------------------------------------------------


def write_days(root: Path, first_seq: int, days: int, per_day: int) -> int:
    """`days` date parts of `per_day` lines each, from `first_seq`; the next seq."""
    seq = first_seq
    for _ in range(days):
        ts_ms = T0 + (seq // per_day) * 24 * HOUR_MS
        part = root / f"date={iso(ts_ms)[:10]}" / f"part-{seq:012d}.jsonl"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(b"".join(line(s, ts_ms + s) for s in range(seq, seq + per_day)))
        seq += per_day
    return seq


def progress(lake: Path) -> set[str]:
    """Everything the pipeline leaves as it goes: chunks, stream log entries, batch partitions."""
    found = set()
    for folder in (lake / LANDING, lake / CHECKPOINT / "offsets", lake / CHECKPOINT / "commits"):
        if folder.is_dir():
            found |= {f"{folder.name}/{p.name}" for p in folder.iterdir()
                      if not p.name.startswith(".")}
    if (lake / "messages").is_dir():
        found |= {str(p.relative_to(lake)) for p in (lake / "messages").glob("day=*/batch_id=*")}
    return found


def start_job(export: Path, lake: Path, scratch: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_MASTER": "local[1]", "SPARK_LOCAL_DIRS": str(scratch),
           "TMPDIR": str(scratch),
           "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '-Djava.io.tmpdir={scratch}"
                                  f" {QUICK_JVM}' --conf spark.ui.enabled=false pyspark-shell"}
    return subprocess.Popen([sys.executable, "-m", "bus.history.job", "--export", str(export),
                             "--lake", str(lake), "--files-per-batch", "1", "--query", "volume",
                             "--format", "json"], env=env, cwd=scratch, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(process: subprocess.Popen, lake: Path, moved: Callable[[set[str]], bool]) -> None:
    """SIGKILL the job's process group as soon as the lake shows the progress `moved` wants."""
    before = progress(lake)
    try:
        wait_until(lambda: moved(progress(lake) - before) or process.poll() is not None,
                   "the job's progress to reach the kill point", timeout=300, interval=0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stderr.close()


@pytest.mark.slow
def test_each_message_is_in_the_lake_exactly_once_after_kills_at_any_point(
        tmp_path: Path) -> None:
    export, lake, scratch = tmp_path / "export", tmp_path / "export.lake", tmp_path / "scratch"
    scratch.mkdir()
    seq = write_days(export, 1, days=4, per_day=50)
    kill_points = [
        lambda new: any(name.startswith("_landing/") for name in new),  # landed, not streamed
        lambda new: any(name.startswith("offsets/") for name in new),  # a batch planned
        lambda new: any(name.startswith("messages/") for name in new),  # a batch half written
        lambda new: any(name.startswith("commits/") for name in new),  # a batch committed
    ]
    killed = 0
    for index, point in enumerate(kill_points):
        if index == 2:  # the export grows between runs: landing and replays mix
            seq = write_days(export, seq, days=2, per_day=50)
        process = start_job(export, lake, scratch)
        kill_when(process, lake, point)
        killed += process.returncode == -signal.SIGKILL
    assert killed >= 3  # the kills hit running jobs, not finished ones
    process = start_job(export, lake, scratch)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    exported = sum(len(part.read_bytes().splitlines()) for part in export.rglob("*.jsonl"))
    found = ids(lake)
    assert exported == seq - 1
    assert len(found) == len(set(found)) == exported


# --- incremental equals full ---------------------------------------------------------


def lake_contents(spark: SparkSession, lake: Path, export: Path) -> dict[str, Any]:
    """Every table's rows (without the batch that wrote them, which depends on the runs)
    and every query's answer."""
    tables = {}
    for table in ("messages", "worker_states", "claims", "tasks", "quarantine"):
        if not (lake / table).is_dir():
            tables[table] = []
            continue
        rows = [{k: v for k, v in row.items() if k not in ("batch_id", "chunk")}
                for row in lake_table(lake, table).to_pylist()]
        tables[table] = sorted(rows, key=lambda row: json.dumps(row, default=str, sort_keys=True))
    seen, results = job.compute_lake(spark, lake, list(queries.QUERIES),
                                     queries.Options(stuck_after_seconds=60.0), export=str(export))
    return {"tables": tables, "overview": seen,
            "results": {result.name: result.rows for result in results}}


@pytest.fixture(scope="module")
def small_export(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A generated history with a corrupt line in it (the generator writes none)."""
    path = tmp_path_factory.mktemp("gen") / "history.jsonl"
    assert load_script("gen_history").main(["--out", str(path), "-n", "3000", "--seed", "3"]) == 0
    lines = path.read_bytes().splitlines(keepends=True)
    return b"".join(lines[:1500] + [b'{"seq": 1500.5, "oops\n'] + lines[1500:])


@pytest.fixture(scope="module")
def full_run(spark: SparkSession, small_export: bytes,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    export = tmp_path_factory.mktemp("full") / "bus.jsonl"
    export.write_bytes(small_export)
    lake = export.with_name("bus.lake")
    update_lake(spark, str(export), str(lake))
    return lake_contents(spark, lake, export)


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_incremental_runs_over_any_split_of_the_export_equal_one_full_run(
        spark: SparkSession, small_export: bytes, full_run: dict[str, Any],
        data: st.DataObject) -> None:
    """The export grows in steps cut anywhere, mid-line too (an exporter mid-write);
    after a run at each step and one at the end, the lake and every query are what one
    run over the whole export gives."""
    cuts = sorted(data.draw(st.lists(st.integers(1, len(small_export) - 1), max_size=3,
                                     unique=True), label="cuts"))
    with tempfile.TemporaryDirectory() as scratch:
        export, lake = Path(scratch) / "bus.jsonl", Path(scratch) / "bus.lake"
        for end in [*cuts, len(small_export)]:
            export.write_bytes(small_export[:end])
            update_lake(spark, str(export), str(lake))
        contents = lake_contents(spark, lake, export)
    assert contents["tables"] == full_run["tables"]
    assert contents["results"] == full_run["results"]
    assert replace(contents["overview"], first_malformed=None) == replace(
        full_run["overview"], first_malformed=None)  # the path names the export's folder


# --- other engines -------------------------------------------------------------------

# The four as scripts/bench_history.py times them against Spark, and three more.
DUCKDB_QUERIES = {
    **load_script("bench_history").DUCKDB_QUERIES,
    "throughput": """
        SELECT agent, strftime(ts, '%Y-%m-%d') AS day, count(DISTINCT task) AS done
        FROM tasks WHERE event = 'task_done' GROUP BY ALL ORDER BY day, agent""",
    "lead_time": """
        WITH ends AS (
            SELECT task, ts, ts_ms,
                   CASE event WHEN 'task_done' THEN 'done' WHEN 'task_cancelled' THEN 'cancelled'
                        ELSE lower(state) END AS outcome,
                   row_number() OVER (PARTITION BY task ORDER BY ts_ms, seq) AS nth
            FROM tasks
            WHERE event IN ('task_done', 'task_cancelled')
               OR state IN ('CANCELLED', 'COMPLETED', 'FAILED')),
        spans AS (
            SELECT task, min(ts) AS started, min(ts_ms) AS start_ms, count(*) AS events
            FROM tasks GROUP BY task)
        SELECT s.task, strftime(s.started, '%Y-%m-%dT%H:%M:%S.%gZ') AS started,
               strftime(e.ts, '%Y-%m-%dT%H:%M:%S.%gZ') AS ended,
               (e.ts_ms - s.start_ms) / 1000.0 AS lead_s, e.outcome, s.events
        FROM spans s LEFT JOIN ends e ON e.task = s.task AND e.nth = 1
        ORDER BY started, s.task""",
}


def test_duckdb_reads_the_lake_without_agentbus_and_gets_sparks_answers(
        spark: SparkSession, full_run: dict[str, Any], tmp_path: Path,
        small_export: bytes) -> None:
    duckdb = pytest.importorskip("duckdb")
    export, lake = tmp_path / "bus.jsonl", tmp_path / "bus.lake"
    export.write_bytes(small_export)
    update_lake(spark, str(export), str(lake))
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    for table in ("messages", "tasks", "quarantine"):
        depth = "*" if table == "quarantine" else "*/*"
        connection.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet("
                           f"'{lake}/{table}/{depth}/*.parquet', hive_partitioning = true)")
    counted = connection.execute(
        "SELECT count(*), count(DISTINCT id), min(ts_ms), max(ts_ms) FROM messages").fetchone()
    seen = full_run["overview"]
    assert counted == (seen.messages, seen.messages, seen.first_ms, seen.last_ms)
    assert connection.execute("SELECT source, line, text FROM quarantine").fetchall() == [
        ("", 1501, '{"seq": 1500.5, "oops')]
    for name, sql in DUCKDB_QUERIES.items():
        answer = [tuple(row) for row in connection.execute(sql).fetchall()]
        assert answer == full_run["results"][name], name
        assert answer, f"{name} has rows to compare"


def test_a_directory_that_is_not_a_lake_is_refused_and_a_half_made_one_is_finished(
        tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(LakeError, match="is not a history lake"):
        open_lake(taken)
    half = tmp_path / "half.lake"
    half.mkdir()
    (half / f".{LAKE_FILE}.tmp").write_text("{")  # a first run killed mid-write
    marker = json.loads((open_lake(half) / LAKE_FILE).read_text())
    assert marker["schema_version"] == LAKE_SCHEMA_VERSION
