"""The Spark history job (bus/history/), its generator and `bus history`.

One SparkSession (local[1]) serves the whole module; each transform runs on
a small DataFrame built here, against rows worked out by hand. One more JVM
starts in a subprocess: the script run, which must work outside pytest (it
starts first, so the two JVMs start side by side). Two more subprocesses
check the Java messages without starting a JVM. Skipped where PySpark or
Java is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

import orjson  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.testing import assertDataFrameEqual  # noqa: E402

import bus.cli  # noqa: E402
from bus import Bus  # noqa: E402
from bus.log import messages as bus_messages  # noqa: E402
from bus.cli import history as history_cli  # noqa: E402
from bus.log.export import format_line  # noqa: E402
from bus.history import QUERY_NAMES  # noqa: E402
from bus.history import extract  # noqa: E402
from bus.history import job  # noqa: E402
from bus.history import pipeline  # noqa: E402
from bus.history import queries  # noqa: E402
from bus.history import job_path  # noqa: E402
from bus.history import report  # noqa: E402
from workers.machine import TRANSITIONS  # noqa: E402

from tests.support.history_support import MEANING  # noqa: E402
from tests.support.history_support import QUICK_JVM  # noqa: E402
from tests.support.history_support import T0  # noqa: E402
from tests.support.history_support import change  # noqa: E402
from tests.support.history_support import expected  # noqa: E402
from tests.support.history_support import iso  # noqa: E402
from tests.support.history_support import load_script  # noqa: E402
from tests.support.history_support import messages_df  # noqa: E402
from tests.support.history_support import msg  # noqa: E402
from tests.support.history_support import spark  # noqa: E402,F401 (the fixture)

gen = load_script("gen_history")


# w1 takes t1 through a rejection to COMPLETED, then starts t3; w2 is WORKING on t2.
LIFECYCLE_ROWS = [
    change(1, T0, "w1", "t1", None, "ASSIGNED", "spawn"),
    change(2, T0 + 5_000, "w2", "t2", None, "ASSIGNED", "spawn"),
    change(3, T0 + 10_000, "w1", "t1", "ASSIGNED", "WORKING", "start"),
    msg(4, T0 + 20_000, "w1", "heartbeat", {"status": "working"}, corr="t1"),
    change(5, T0 + 25_000, "w2", "t2", "ASSIGNED", "WORKING", "start"),
    change(6, T0 + 70_000, "w1", "t1", "WORKING", "IN_REVIEW", "done"),
    change(7, T0 + 100_000, "w1", "t1", "IN_REVIEW", "WORKING", "reject"),
    change(8, T0 + 130_000, "w1", "t1", "WORKING", "IN_REVIEW", "done"),
    change(9, T0 + 160_000, "w1", "t1", "IN_REVIEW", "APPROVED", "approve"),
    change(10, T0 + 170_000, "w1", "t1", "APPROVED", "COMPLETED", "merge"),
    change(11, T0 + 200_000, "w1", "t3", None, "ASSIGNED", "spawn"),
]


# --- transforms -----------------------------------------------------------------------


def test_volume_counts_messages_per_hour_agent_and_type(spark: SparkSession) -> None:
    rows = [msg(1, T0, "w1", "heartbeat"), msg(2, T0 + 1_000, "w1", "heartbeat"),
            msg(3, T0 + 2_000, "w2", "heartbeat"), msg(4, T0 + 3_599_999, "w1", "progress"),
            msg(5, T0 + 3_600_000, "w1", "heartbeat")]
    assertDataFrameEqual(queries.volume(messages_df(spark, rows)), expected(
        spark, "hour string, agent string, type string, messages long", [
            ("2026-01-05T08:00Z", "w1", "heartbeat", 2),
            ("2026-01-05T08:00Z", "w1", "progress", 1),
            ("2026-01-05T08:00Z", "w2", "heartbeat", 1),
            ("2026-01-05T09:00Z", "w1", "heartbeat", 1),
        ]), checkRowOrder=True)


def test_volume_hours_are_utc_hours_before_and_after_the_epoch(spark: SparkSession) -> None:
    """volume finds the hour by arithmetic on ts_ms: it must agree with the calendar's
    UTC hour on each side of an hour's edge, before 1970 too."""
    times = [-3_600_001, -3_600_000, -1, 0, 3_599_999, T0 - 1, T0]
    rows = [msg(seq, ts_ms, "w1", f"t{seq}") for seq, ts_ms in enumerate(times, 1)]
    hours = {row.type: row.hour for row in queries.volume(messages_df(spark, rows)).collect()}
    assert hours == {f"t{seq}": datetime.fromtimestamp(ts_ms // 1000, timezone.utc)
                     .strftime("%Y-%m-%dT%H:00Z") for seq, ts_ms in enumerate(times, 1)}


def test_time_in_state_ends_at_the_next_change_of_the_same_worker_and_task(
        spark: SparkSession) -> None:
    result = queries.time_in_state(messages_df(spark, LIFECYCLE_ROWS))
    assertDataFrameEqual(result, expected(
        spark, "worker string, task string, state string, entered_ms long, left_ms long,"
               " seconds double", [
            ("w1", "t1", "ASSIGNED", T0, T0 + 10_000, 10.0),
            ("w1", "t1", "WORKING", T0 + 10_000, T0 + 70_000, 60.0),
            ("w1", "t1", "IN_REVIEW", T0 + 70_000, T0 + 100_000, 30.0),
            ("w1", "t1", "WORKING", T0 + 100_000, T0 + 130_000, 30.0),
            ("w1", "t1", "IN_REVIEW", T0 + 130_000, T0 + 160_000, 30.0),
            ("w1", "t1", "APPROVED", T0 + 160_000, T0 + 170_000, 10.0),
            ("w1", "t1", "COMPLETED", T0 + 170_000, None, None),  # not ended by t3's spawn
            ("w1", "t3", "ASSIGNED", T0 + 200_000, None, None),
            ("w2", "t2", "ASSIGNED", T0 + 5_000, T0 + 25_000, 20.0),
            ("w2", "t2", "WORKING", T0 + 25_000, None, None),
        ]))


def test_time_in_state_orders_changes_in_the_same_millisecond_by_seq(
        spark: SparkSession) -> None:
    rows = [change(2, T0, "w1", "t1", "ASSIGNED", "CANCELLED", "cancel"),
            change(1, T0, "w1", "t1", None, "ASSIGNED", "spawn")]
    assertDataFrameEqual(queries.time_in_state(messages_df(spark, rows)), expected(
        spark, "worker string, task string, state string, entered_ms long, left_ms long,"
               " seconds double", [
            ("w1", "t1", "ASSIGNED", T0, T0, 0.0),
            ("w1", "t1", "CANCELLED", T0, None, None),
        ]))


def test_lifecycle_gives_p50_and_p95_per_worker_and_state(spark: SparkSession) -> None:
    result = queries.lifecycle(messages_df(spark, LIFECYCLE_ROWS))
    assertDataFrameEqual(result, expected(
        spark, "worker string, state string, visits long, p50_s double, p95_s double,"
               " max_s double, total_s double", [
            ("w1", "APPROVED", 1, 10.0, 10.0, 10.0, 10.0),
            ("w1", "ASSIGNED", 1, 10.0, 10.0, 10.0, 10.0),
            ("w1", "IN_REVIEW", 2, 30.0, 30.0, 30.0, 60.0),
            ("w1", "WORKING", 2, 30.0, 60.0, 60.0, 90.0),  # visits of 60 s and 30 s
            ("w2", "ASSIGNED", 1, 20.0, 20.0, 20.0, 20.0),
        ]), checkRowOrder=True)


STUCK_ROWS = LIFECYCLE_ROWS + [
    change(12, T0 + 400_000, "w4", "t5", None, "IN_REVIEW", "done"),
    change(13, T0 + 500_000, "w5", "t6", None, "FAILED", "fail"),
    change(14, T0 + 1_000_000, "w3", "t4", None, "WORKING", "start"),
    msg(15, T0 + 4_000_000, "planner", "note"),  # the newest message: "now" for the data
]
STUCK_SCHEMA = "worker string, task string, state string, since string, stuck_s double"
DEAD_TASKS_SCHEMA = ("task string, released long, reclaimed long, dead boolean, agents string,"
                     " last_event string, last_reason string, last_at string")


def test_stuck_lists_non_terminal_last_states_older_than_the_threshold(
        spark: SparkSession) -> None:
    result = queries.stuck(messages_df(spark, STUCK_ROWS), after_seconds=3600)
    assertDataFrameEqual(result, expected(spark, STUCK_SCHEMA, [
        ("w2", "t2", "WORKING", iso(T0 + 25_000), 3975.0),
        ("w1", "t3", "ASSIGNED", iso(T0 + 200_000), 3800.0),
    ]), checkRowOrder=True)  # w4 at exactly 3600 s is not over it; w5 FAILED; t1 COMPLETED


def test_stuck_threshold_is_a_parameter(spark: SparkSession) -> None:
    result = queries.stuck(messages_df(spark, STUCK_ROWS), after_seconds=2000)
    assertDataFrameEqual(result, expected(spark, STUCK_SCHEMA, [
        ("w2", "t2", "WORKING", iso(T0 + 25_000), 3975.0),
        ("w1", "t3", "ASSIGNED", iso(T0 + 200_000), 3800.0),
        ("w4", "t5", "IN_REVIEW", iso(T0 + 400_000), 3600.0),
        ("w3", "t4", "WORKING", iso(T0 + 1_000_000), 3000.0),
    ]), checkRowOrder=True)


def bus_says(seq: int, ts_ms: int, type_: str, task: str, **payload: Any) -> tuple:
    """A message the bus publishes itself about a task (sender "bus", correlation = task)."""
    return msg(seq, ts_ms, "bus", type_, {"task": task, **payload}, corr=task)


# Three pairs stuck by their state alone, whose holds the bus ended: w6 released
# (the task then went to w7, whose hold is still live), w8 reclaimed by w9,
# and w10's task declared dead. An older release of w11 does not end w11's
# later hold of the same task.
HOLD_ENDED_ROWS = STUCK_ROWS[:-1] + [
    change(20, T0 + 20_000, "w6", "t7", None, "WORKING", "start"),
    bus_says(21, T0 + 320_000, "task_released", "t7", agent="w6", reason="agent dead"),
    change(22, T0 + 330_000, "w7", "t7", None, "ASSIGNED", "spawn"),
    change(23, T0 + 30_000, "w8", "t8", None, "WORKING", "start"),
    bus_says(24, T0 + 340_000, "task_reclaimed", "t8", previous_holder="w8", new_holder="w9",
             attempt=2),
    change(25, T0 + 40_000, "w10", "t9", None, "IN_REVIEW", "done"),
    bus_says(26, T0 + 350_000, "task_dead", "t9", last_holder="w3", attempts=3,
             reason="lease expired"),
    bus_says(27, T0 + 10_000, "task_released", "t10", agent="w11", reason="agent dead"),
    change(28, T0 + 50_000, "w11", "t10", None, "WORKING", "start"),
    bus_says(29, T0 + 360_000, "task_released", "t10", agent="w12", reason="agent dead"),
    STUCK_ROWS[-1],
]


def test_stuck_leaves_out_holds_the_bus_released_reclaimed_or_declared_dead(
        spark: SparkSession) -> None:
    result = queries.stuck(messages_df(spark, HOLD_ENDED_ROWS), after_seconds=3600)
    assertDataFrameEqual(result, expected(spark, STUCK_SCHEMA, [
        ("w11", "t10", "WORKING", iso(T0 + 50_000), 3950.0),  # released before, not after
        ("w2", "t2", "WORKING", iso(T0 + 25_000), 3975.0),
        ("w1", "t3", "ASSIGNED", iso(T0 + 200_000), 3800.0),
        ("w7", "t7", "ASSIGNED", iso(T0 + 330_000), 3670.0),
    ]))


def test_lifecycle_and_threads_percentiles_do_not_depend_on_partitioning(
        spark: SparkSession) -> None:
    """Exact nearest-rank p50/p95: 1, 4 or 7 input partitions give the same rows."""
    rows = [change(2 * i + 1, T0 + i * 1_000_003 % 7_919_000, "w1", f"t{i}", None,
                   "ASSIGNED", "spawn") for i in range(120)]
    rows += [change(2 * i + 2, T0 + i * 1_000_003 % 7_919_000 + (i * 7_907) % 100_000 + 1,
                    "w1", f"t{i}", "ASSIGNED", "WORKING", "start") for i in range(120)]
    rows += [msg(1_000 + i, T0 + i, "w2", "ask", corr=f"c{i % 3}", id_=f"q{i}")
             for i in range(150)]
    rows += [msg(2_000 + i, T0 + i + (i * 7_919) % 10_007, "w3", "tell", corr=f"c{i % 3}",
                 reply_to=f"q{i}") for i in range(150)]
    one = messages_df(spark, rows)
    for partitions in (4, 7):
        spread = one.repartition(partitions)
        assertDataFrameEqual(queries.lifecycle(spread), queries.lifecycle(one))
        assertDataFrameEqual(queries.threads(spread), queries.threads(one))
    ticks = sorted((i * 7_907) % 100_000 + 1 for i in range(120))
    working = queries.lifecycle(one).where("state = 'ASSIGNED'").first()
    # Nearest rank: the 60th and the 114th of 120 sorted values, values of the data.
    assert (working.p50_s, working.p95_s) == (ticks[59] / 1000, ticks[113] / 1000)


def test_threads_gives_reply_latency_per_correlation_id_and_overall(
        spark: SparkSession) -> None:
    rows = [
        msg(1, T0, "w1", "question", to="planner", corr="t1", id_="q1"),
        msg(2, T0 + 1_500, "planner", "answer", to="w1", corr="t1", reply_to="q1"),
        msg(3, T0 + 10_000, "w1", "question", corr="t1", id_="q2"),
        msg(4, T0 + 14_000, "planner", "answer", corr="t1", reply_to="q2"),
        msg(5, T0 + 20_000, "w1", "question", corr="t1", id_="q3"),
        msg(6, T0 + 20_500, "planner", "answer", corr="t1", reply_to="q3"),
        msg(7, T0 + 30_000, "w2", "review_request", corr="t2", id_="r1"),
        msg(8, T0 + 90_000, "orchestrator", "review_result", corr="t2", reply_to="r1"),
        msg(9, T0 + 40_000, "w3", "ping", id_="x1"),
        msg(10, T0 + 40_250, "w4", "pong", reply_to="x1"),  # no correlation_id at all
        msg(11, T0 + 50_000, "w3", "ask", corr="t3", id_="z1"),
        msg(12, T0 + 51_000, "w5", "tell", reply_to="z1"),  # the request's correlation_id
        msg(13, T0 + 60_000, "w5", "tell", corr="t1", reply_to="compacted-away"),
    ]
    result = queries.threads(messages_df(spark, rows))
    assertDataFrameEqual(result, expected(
        spark, "scope string, correlation_id string, replies long, p50_ms long, p95_ms long,"
               " max_ms long", [
            ("thread", None, 1, 250, 250, 250),
            ("thread", "t1", 3, 1_500, 4_000, 4_000),  # 1500, 4000, 500 ms
            ("thread", "t2", 1, 60_000, 60_000, 60_000),
            ("thread", "t3", 1, 1_000, 1_000, 1_000),
            ("all", None, 6, 1_000, 60_000, 60_000),
        ]), checkRowOrder=True)


def test_silence_gives_longest_gaps_per_agent_from_heartbeats_when_it_sends_them(
        spark: SparkSession) -> None:
    rows = [
        msg(1, T0, "w1", "heartbeat"), msg(2, T0 + 15_000, "w1", "heartbeat"),
        msg(3, T0 + 30_000, "w1", "heartbeat"),
        msg(4, T0 + 60_000, "w1", "progress"),  # not a beat: the 60 s gap stands
        msg(5, T0 + 90_000, "w1", "heartbeat"), msg(6, T0 + 105_000, "w1", "heartbeat"),
        msg(7, T0 + 1_000, "planner", "answer"), msg(8, T0 + 301_000, "planner", "answer"),
        msg(9, T0 + 302_000, "planner", "note"),
        msg(10, T0 + 5_000, "lone", "note"),  # one message: no gap
    ]
    result = queries.silence(messages_df(spark, rows), top=2)
    assertDataFrameEqual(result, expected(
        spark, "agent string, basis string, start string, `end` string, gap_s double", [
            ("planner", "any", iso(T0 + 1_000), iso(T0 + 301_000), 300.0),
            ("w1", "heartbeat", iso(T0 + 30_000), iso(T0 + 90_000), 60.0),
            ("w1", "heartbeat", iso(T0), iso(T0 + 15_000), 15.0),  # earliest of the 15 s ties
            ("planner", "any", iso(T0 + 301_000), iso(T0 + 302_000), 1.0),
        ]), checkRowOrder=True)


def test_dead_tasks_summarises_releases_and_deaths_per_task(spark: SparkSession) -> None:
    rows = [
        msg(1, T0 + 1_000, "bus", "task_released",
            {"task": "t1", "agent": "w1", "reason": "agent dead", "silent_s": 301.5}, corr="t1"),
        msg(2, T0 + 2_000, "bus", "task_released",
            {"task": "t2", "agent": "w4", "reason": "agent dead", "silent_s": 400.0}, corr="t2"),
        msg(3, T0 + 5_000, "bus", "task_released",
            {"task": "t1", "agent": "w2", "reason": "agent dead", "silent_s": 310.0}, corr="t1"),
        msg(4, T0 + 6_000, "w3", "task_done", {"task": "t1"}, corr="t1"),
        msg(6, T0 + 7_000, "bus", "task_reclaimed",
            {"task": "t3", "previous_holder": "w5", "new_holder": "w6", "attempt": 2}, corr="t3"),
        msg(5, T0 + 9_000, "bus", "task_dead",
            {"task": "t1", "last_holder": "w3", "attempts": 3, "reason": "lease expired",
             "died_at_ms": T0 + 9_000}, corr="t1"),
    ]
    result = queries.dead_tasks(messages_df(spark, rows))
    assertDataFrameEqual(result, expected(
        spark, DEAD_TASKS_SCHEMA, [
            ("t2", 1, 0, False, "w4", "task_released", "agent dead", iso(T0 + 2_000)),
            ("t3", 0, 1, False, "w5,w6", "task_reclaimed", "taken over by w6 at attempt 2",
             iso(T0 + 7_000)),
            ("t1", 2, 0, True, "w1,w2,w3", "task_dead", "lease expired", iso(T0 + 9_000)),
        ]), checkRowOrder=True)


# --- extract ------------------------------------------------------------------------


# The export's names for msg()'s fields after seq, before the payload.
ROW_FIELDS = ("id", "ts_ms", "ts", "from", "to", "type", "correlation_id", "in_reply_to",
              "payload_ref")


def export_line(seq: int, payload: Any, ref: str | None = None, **fields: Any) -> bytes:
    """A line as bus/log/export.py writes it (same key order)."""
    ts_ms = T0 + seq
    record = {"seq": seq, "id": f"m{seq}", "ts_ms": ts_ms, "ts": iso(ts_ms), "from": "w1",
              "to": None, "type": "note", "correlation_id": None, "in_reply_to": None,
              "payload_ref": ref, "payload": payload}
    return orjson.dumps({**record, **fields}) + b"\n"


def test_extract_keeps_payload_as_json_text_and_drops_a_torn_line(
        spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "bus.jsonl"
    path.write_bytes(
        export_line(1, {"from": None, "to": "ASSIGNED", "nested": {"x": [1, 2]}},
                    to="w2", correlation_id="t1", type="state_change")
        + export_line(2, None, ref="sha256:ab", in_reply_to="m1")
        + export_line(3, [1, "two", 3.5])
        + export_line(4, 42)
        + export_line(5, {"cut": "here"})[:40])  # the exporter is mid-write
    result = extract.extract(spark, str(path))
    assertDataFrameEqual(result, messages_df(spark, [
        (1, "m1", T0 + 1, iso(T0 + 1), "w1", "w2", "state_change", "t1", None, None,
         '{"from":null,"to":"ASSIGNED","nested":{"x":[1,2]}}'),
        (2, "m2", T0 + 2, iso(T0 + 2), "w1", None, "note", None, "m1", "sha256:ab", None),
        (3, "m3", T0 + 3, iso(T0 + 3), "w1", None, "note", None, None, None, '[1,"two",3.5]'),
        (4, "m4", T0 + 4, iso(T0 + 4), "w1", None, "note", None, None, None, "42"),
    ]), checkRowOrder=True)


# --- end to end: a real bus, the real exporter ---------------------------------------


class FakeClock:
    """Messages with the times a test chooses.

    SQLite stamps a published message; `publish` then sets the message's time
    to `now`. Other writes take their time from messages.now_ms(): ours too.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = T0
        monkeypatch.setattr(bus_messages, "now_ms", lambda: self.now)

    def publish(self, opened: Bus, *args: Any, **kwargs: Any) -> str:
        message_id = opened.publish(*args, **kwargs).id
        opened.conn.execute("UPDATE messages SET ts_ms = ? WHERE id = ?", (self.now, message_id))
        return message_id


def publish_history(db: Path, clock: FakeClock) -> dict[str, Any]:
    """A small real history: a lifecycle, a question and its answer, a task that dies."""
    with Bus.open(db) as opened:
        def at(ms: int, *args: Any, **kwargs: Any) -> str:
            clock.now = T0 + ms
            return clock.publish(opened, *args, **kwargs)

        at(0, "w1", "state_change", {"from": None, "to": "ASSIGNED", "command": "spawn"},
           correlation_id="t1")
        at(0, "orchestrator", "task_assign", {"task": "t1"}, to="w1", correlation_id="t1")
        at(5_000, "w1", "state_change", {"from": "ASSIGNED", "to": "WORKING",
                                         "command": "start"}, correlation_id="t1")
        question = at(20_000, "w1", "question", {"text": "which module?"}, to="planner",
                      correlation_id="t1")
        at(23_000, "planner", "answer", {"text": "bus/"}, to="w1", correlation_id="t1",
           in_reply_to=question)
        at(65_000, "w1", "state_change", {"from": "WORKING", "to": "IN_REVIEW",
                                          "command": "done"}, correlation_id="t1")
        at(65_000, "w2", "state_change", {"from": None, "to": "ASSIGNED", "command": "spawn"},
           correlation_id="t2")
        assert opened.claims.claim("t9", "w9", lease_ms=1_000, max_attempts=1, now=T0 + 100_000)
        died = opened.claims.try_claim("t9", "w8", lease_ms=1_000, max_attempts=1, now=T0 + 200_000)
        at(4_000_000, "planner", "note", {"text": "still here"})
        opened.export_jsonl()  # to bus.jsonl beside the database, where `bus history` looks
    return {"dead_reason": died.dead.reason}


@pytest.fixture(scope="session")
def real_export(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("real_bus") / "bus.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        facts = publish_history(db, FakeClock(monkeypatch))
    return {"db": db, "export": db.parent / "bus.jsonl", **facts}


@pytest.fixture(scope="session", autouse=True)
def script_run(real_export: dict[str, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen]:
    """`python <the job's file> ...` in a process of its own, as spark-submit runs it.

    Started before anything else (autouse, session scope) so that its JVM
    starts while the in-process one does: on a small machine the module runs
    in about two thirds of the time.
    """
    scratch = tmp_path_factory.mktemp("script")
    env = {**os.environ, "SPARK_MASTER": "local[1]", "SPARK_LOCAL_DIRS": str(scratch),
           "TMPDIR": str(scratch),
           "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '-Djava.io.tmpdir={scratch}"
                                  f" {QUICK_JVM}' --conf spark.ui.enabled=false pyspark-shell"}
    process = subprocess.Popen([sys.executable, str(job_path()),
                                "--export", str(real_export["export"]), "--query", "volume",
                                "--format", "json"], env=env, cwd=scratch, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield process
    if process.poll() is None:  # its test did not run (deselected): end it
        process.kill()
        process.communicate()


def test_end_to_end_real_bus_export_gives_lifecycle_threads_stuck_and_dead_tasks(
        spark: SparkSession, real_export: dict[str, Any]) -> None:
    messages = extract.extract(spark, str(real_export["export"])).persist()
    assertDataFrameEqual(queries.lifecycle(messages), expected(
        spark, "worker string, state string, visits long, p50_s double, p95_s double,"
               " max_s double, total_s double", [
            ("w1", "ASSIGNED", 1, 5.0, 5.0, 5.0, 5.0),
            ("w1", "WORKING", 1, 60.0, 60.0, 60.0, 60.0),
        ]))
    assertDataFrameEqual(queries.stuck(messages, 3600), expected(spark, STUCK_SCHEMA, [
        ("w1", "t1", "IN_REVIEW", iso(T0 + 65_000), 3935.0),
        ("w2", "t2", "ASSIGNED", iso(T0 + 65_000), 3935.0),
    ]), checkRowOrder=True)
    assertDataFrameEqual(queries.threads(messages).select("scope", "correlation_id", "p50_ms"),
                         expected(spark, "scope string, correlation_id string, p50_ms long",
                                  [("thread", "t1", 3_000), ("all", None, 3_000)]))
    assertDataFrameEqual(queries.dead_tasks(messages), expected(spark, DEAD_TASKS_SCHEMA, [
        ("t9", 0, 0, True, "w9", "task_dead", real_export["dead_reason"], iso(T0 + 200_000)),
    ]))
    messages.unpersist()


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("silence_top", [5, queries.SPAN_GAPS + 1])
def test_each_query_over_the_lake_gives_what_it_means_over_every_message(
        spark: SparkSession, tmp_path: Path, steps: int, silence_top: int) -> None:
    """Each query reads the lake's smallest table that answers it (batches' counts, spans
    and replies merged): over one batch or several, it must give what its function of
    all of extract's rows, every field pulled out of every payload, gives. A
    --silence-top beyond what a batch keeps reads every message instead."""
    path = tmp_path / "bus.jsonl"
    assert gen.main(["--out", str(path), "-n", "3000", "--seed", "4"]) == 0
    shifted = [(seq + 10_000, *rest) for seq, *rest in HOLD_ENDED_ROWS + LIFECYCLE_ROWS]
    with path.open("ab") as export:  # the generator writes no task_reclaimed
        export.writelines(export_line(row[0], None if row[10] is None else orjson.loads(row[10]),
                                      **dict(zip(ROW_FIELDS, row[1:10]))) for row in shifted)
        export.write(export_line(20_000, "not an object", type="task_dead"))
        # Anyone may publish a message of the bus's types: an attempt that is no number.
        export.write(export_line(20_001, {"task": "t8", "previous_holder": "w1",
                                          "new_holder": "w2", "attempt": "first"},
                                 type="task_reclaimed"))
    whole = path.read_bytes()
    lines = whole.splitlines(keepends=True)
    lake = tmp_path / "bus.lake"
    for step in range(1, steps):  # the export as it grew, a run at each size
        path.write_bytes(b"".join(lines[:len(lines) * step // steps]))
        pipeline.update_lake(spark, str(path), str(lake))
    path.write_bytes(whole)
    options = queries.Options(stuck_after_seconds=0.0, silence_top=silence_top)
    _, results = job.compute(spark, str(path), list(queries.QUERIES), options, lake=str(lake))
    messages = extract.extract(spark, str(path))
    messages = messages.select("*", *[F.get_json_object("payload", f"$.{name}").alias(
        f"payload_{name}") for name in extract.PAYLOAD_FIELDS]).drop("payload")
    assert sorted(MEANING) == sorted(queries.QUERIES)
    for result in results:
        meant = MEANING[result.name](messages, options)
        assert (result.name, result.rows) == (result.name, [tuple(row) for row in meant.collect()])
    dead = next(result for result in results if result.name == "dead_tasks")
    assert any(row[dead.columns.index("reclaimed")] for row in dead.rows)  # the added one
    assert len(list((lake / "silences").glob("batch_id=*"))) == steps


def test_extract_reads_a_date_partitioned_export_without_a_date_column(
        spark: SparkSession, db_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(monkeypatch)
    midnight = 1_767_657_600_000  # 2026-01-06T00:00:00.000Z
    with Bus.open(db_path) as opened:
        for seq, ms in enumerate([midnight - 2_000, midnight - 1, midnight, midnight + 5], 1):
            clock.now = ms
            clock.publish(opened, "w1", "note", {"n": seq})
        opened.export_jsonl(tmp_path / "export", partition_by="date")
    parts = sorted(p.relative_to(tmp_path / "export").as_posix()
                   for p in (tmp_path / "export").rglob("*.jsonl"))
    assert parts == ["date=2026-01-05/part-000000000001.jsonl",
                     "date=2026-01-06/part-000000000003.jsonl"]
    assert (tmp_path / "export" / ".export.lock").exists()  # hidden: Spark must skip it
    result = extract.extract(spark, str(tmp_path / "export"))
    assert result.columns == extract.MESSAGES_SCHEMA.fieldNames()
    assertDataFrameEqual(result.select("seq", "ts", "payload"), expected(
        spark, "seq long, ts string, payload string", [
            (1, "2026-01-05T23:59:58.000Z", '{"n":1}'), (2, "2026-01-05T23:59:59.999Z", '{"n":2}'),
            (3, "2026-01-06T00:00:00.000Z", '{"n":3}'), (4, "2026-01-06T00:00:00.005Z", '{"n":4}'),
        ]))


def test_run_all_queries_as_json_lines_names_each_query(
        spark: SparkSession, real_export: dict[str, Any]) -> None:
    import io

    out = io.StringIO()
    job.run(spark, str(real_export["export"]), queries.query_names("all"), report.Output("json"),
            out=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    # Every query with rows but those of the task graph's own events, which this bus has not
    # (tests/history/test_history_lake.py runs them over a bus that has).
    assert {line["query"] for line in lines} == set(queries.QUERIES) - {"blocked", "throughput"}
    assert {"query": "dead_tasks", "task": "t9", "released": 0, "reclaimed": 0, "dead": True,
            "agents": "w9",
            "last_event": "task_dead", "last_reason": real_export["dead_reason"],
            "last_at": iso(T0 + 200_000)} in lines


# --- the `bus history` command ------------------------------------------------------


@pytest.fixture
def bus_cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`bus` with `history` registered (whether or not bus/cli/__init__.py wires it yet)."""
    monkeypatch.setitem(bus.cli.main.commands, "history", history_cli.history)
    return bus.cli.main


# `bus` in a subprocess, with `history` registered whether or not it is wired yet.
WIRED_CLI = ("from bus.cli import main; from bus.cli.history import COMMANDS;"
             " [main.add_command(c) for c in COMMANDS]; main(prog_name='bus')")


def test_history_query_names_match_the_job_registry() -> None:
    assert QUERY_NAMES == tuple(queries.QUERIES)
    query = next(param for param in history_cli.history.params if param.name == "query")
    assert list(query.type.choices) == [*QUERY_NAMES, "all"]


# `bus` in a subprocess where `import pyspark` fails, as in an install without [spark].
WITHOUT_PYSPARK = ("import sys; sys.modules['pyspark'] = None; from bus.cli import main;"
                   " main(prog_name='bus')")


def test_history_job_path_prints_the_job_file_without_pyspark(
        python_env: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, "--db",
                           str(tmp_path / "none.db"), "history", "--job-path"],
                          env=python_env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{Path(job.__file__).resolve()}\n" and done.stderr == ""
    assert not (tmp_path / "none.db").exists()  # it opens no bus
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, "--json", "history",
                           "--job-path"], env=python_env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert (done.returncode, json.loads(done.stdout)) == (
        0, {"job_path": str(Path(job.__file__).resolve())})


def test_the_bus_command_imports_no_spark_or_chart_library_until_history_runs(
        python_env: dict[str, str], tmp_path: Path) -> None:
    heavy = ("pyspark", "py4j", "pyarrow", "matplotlib", "plotly")
    code = ("import sys; import bus.cli, bus.cli.history, bus.history.report;"
            f" print(sorted(m for m in sys.modules if m.partition('.')[0] in {heavy!r}))")
    done = subprocess.run([sys.executable, "-c", code], env=python_env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr


def test_history_without_pyspark_names_the_spark_extra(
        python_env: dict[str, str], tmp_path: Path, real_export: dict[str, Any]) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, "history", "--export",
                           str(real_export["export"])], env=python_env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ("Error: bus history needs pyspark, which the spark extra installs:"
                           " pip install 'agentbus[spark]'\n")


def test_history_full_prints_a_table_from_the_bus_export(
        spark: SparkSession, bus_cli: Any, real_export: dict[str, Any]) -> None:
    result = CliRunner().invoke(bus_cli, ["--db", str(real_export["db"]), "history",
                                          "--query", "lifecycle", "--full"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()[1:]  # after the "== lifecycle: ... ==" heading
    assert lines[0].split() == ["worker", "state", "visits", "p50_s", "p95_s", "max_s",
                                "total_s"]
    assert [line.split() for line in lines[2:]] == [
        ["w1", "ASSIGNED", "1", "5", "5", "5", "5"],
        ["w1", "WORKING", "1", "60", "60", "60", "60"],
    ]


def test_history_json_prints_one_object_per_row(
        spark: SparkSession, bus_cli: Any, real_export: dict[str, Any]) -> None:
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(real_export["export"]),
                                          "--query", "stuck", "--json",
                                          "--stuck-after-seconds", "3935"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.output.splitlines()] == []  # not over 3935 s
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(real_export["export"]),
                                          "--query", "stuck", "--json"])
    assert [json.loads(line) for line in result.output.splitlines()] == [
        {"worker": "w1", "task": "t1", "state": "IN_REVIEW", "since": iso(T0 + 65_000),
         "stuck_s": 3935.0},
        {"worker": "w2", "task": "t2", "state": "ASSIGNED", "since": iso(T0 + 65_000),
         "stuck_s": 3935.0},
    ]


def test_history_csv_has_a_header_row(
        spark: SparkSession, bus_cli: Any, real_export: dict[str, Any]) -> None:
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(real_export["export"]),
                                          "--query", "threads", "--csv"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["scope,correlation_id,replies,p50_ms,p95_ms,max_ms",
                                          "thread,t1,1,3000,3000,3000", "all,,1,3000,3000,3000"]


def test_history_without_an_export_says_run_bus_export_first(
        bus_cli: Any, tmp_path: Path) -> None:
    result = CliRunner().invoke(bus_cli, ["--db", str(tmp_path / "bus.db"), "history"])
    assert result.exit_code == 1
    assert "no export at" in result.output and "run `bus export` first" in result.output
    assert not (tmp_path / "bus.db").exists()  # asking for history creates no bus


def test_history_without_java_exits_1_naming_java(
        python_env: dict[str, str], tmp_path: Path, real_export: dict[str, Any]) -> None:
    (tmp_path / "bin").mkdir()
    env = {**python_env, "PATH": str(tmp_path / "bin")}  # a PATH without java
    env.pop("JAVA_HOME", None)
    done = subprocess.run([sys.executable, "-c", WIRED_CLI, "history", "--export",
                           str(real_export["export"])], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: Java was not found")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_history_when_java_cannot_start_spark_shows_what_java_said(
        python_env: dict[str, str], tmp_path: Path, real_export: dict[str, Any]) -> None:
    java = tmp_path / "jdk" / "bin" / "java"  # a Java that is too old to run Spark
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'UnsupportedClassVersionError: class file version 61.0'"
                    " >&2\nexit 1\n")
    java.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", WIRED_CLI, "history", "--export",
                           str(real_export["export"])],
                          env={**python_env, "JAVA_HOME": str(java.parent.parent)},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: Spark could not start Java")
    assert "class file version 61.0" in done.stderr and "Traceback" not in done.stderr


# --- the job as a script ------------------------------------------------------------


def test_history_script_runs_as_a_python_script(script_run: subprocess.Popen) -> None:
    stdout, stderr = script_run.communicate(timeout=180)
    assert script_run.returncode == 0, stderr[-3000:]
    assert "Exception" not in stderr  # Spark's WARN lines show; no stack trace among them
    assert [json.loads(line) for line in stdout.splitlines()] == [
        {"hour": "2026-01-05T08:00Z", "agent": "bus", "type": "task_dead", "messages": 1},
        {"hour": "2026-01-05T08:00Z", "agent": "orchestrator", "type": "task_assign",
         "messages": 1},
        {"hour": "2026-01-05T08:00Z", "agent": "planner", "type": "answer", "messages": 1},
        {"hour": "2026-01-05T08:00Z", "agent": "w1", "type": "question", "messages": 1},
        {"hour": "2026-01-05T08:00Z", "agent": "w1", "type": "state_change", "messages": 3},
        {"hour": "2026-01-05T08:00Z", "agent": "w2", "type": "state_change", "messages": 1},
        {"hour": "2026-01-05T09:00Z", "agent": "planner", "type": "note", "messages": 1},
    ]


# --- the generator ------------------------------------------------------------------


def generate(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    assert gen.main(["--out", str(out), *args]) == 0
    return out


def test_gen_history_same_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    first = generate(tmp_path, "a.jsonl", "-n", "3000", "--seed", "5").read_bytes()
    again = generate(tmp_path, "b.jsonl", "-n", "3000", "--seed", "5").read_bytes()
    other = generate(tmp_path, "c.jsonl", "-n", "3000", "--seed", "6").read_bytes()
    assert first == again and first != other
    assert first.count(b"\n") == 3000


def test_gen_history_lines_are_what_the_exporter_writes(tmp_path: Path) -> None:
    path = generate(tmp_path, "h.jsonl", "-n", "3000", "--seed", "2")
    for line in path.read_bytes().splitlines(keepends=True):
        record = orjson.loads(line)
        row = (record["seq"], record["id"], record["ts_ms"], record["from"], record["to"],
               record["type"], record["correlation_id"], record["in_reply_to"],
               orjson.dumps(record["payload"]).decode(), record["payload_ref"])
        assert format_line(row) == line
        bus_messages.validate_agent_id(record["from"])


def test_gen_history_follows_the_worker_state_machine_and_replies_to_earlier_ids(
        tmp_path: Path) -> None:
    path = generate(tmp_path, "h.jsonl", "-n", "20000", "--seed", "3")
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert all(a["ts_ms"] <= b["ts_ms"] for a, b in zip(records, records[1:]))
    seen: set[str] = set()
    states: dict[tuple[str, str], str] = {}
    for r in records:
        if r["in_reply_to"] is not None:
            assert r["in_reply_to"] in seen
        seen.add(r["id"])
        if r["type"] == "state_change":
            key, p = (r["from"], r["correlation_id"]), r["payload"]
            assert p["from"] == states.get(key)
            assert (p["from"] is None and p["to"] == "ASSIGNED"
                    or TRANSITIONS[(p["from"], p["command"])] == p["to"])
            states[key] = p["to"]
    types = {r["type"] for r in records}
    assert {"task_assign", "heartbeat", "review_request", "review_result", "answer",
            "task_released"} <= types


def test_gen_history_partitions_by_date_like_the_exporter(tmp_path: Path) -> None:
    args = ["-n", "3000", "--seed", "4", "--start", "2026-01-05T23:50:00Z"]
    single = generate(tmp_path, "h.jsonl", *args)
    root = generate(tmp_path, "parts", *args, "--partition-by", "date")
    parts = sorted(root.rglob("*.jsonl"))
    assert [p.parent.name for p in parts] == ["date=2026-01-05", "date=2026-01-06"]
    first_seq = orjson.loads(parts[1].read_bytes().splitlines()[0])["seq"]
    assert parts[1].name == f"part-{first_seq:012d}.jsonl"
    assert b"".join(p.read_bytes() for p in parts) == single.read_bytes()


def test_pump_conversations_reach_the_threads_report(spark: SparkSession, db_path: Path,
                                                     tmp_path: Path) -> None:
    """A broadcast and a request through the real pump, exported, then `threads`."""
    from bus.pump import Pump
    from bus.pump import client
    from bus.pump.organism import load_organism

    organism = tmp_path / "organism.yaml"
    organism.write_text(
        "name: org\nlisteners:\n"
        "  - {name: calc, root_tag: add, payload: 'tests.support.pump_tools:Add',"
        " handler: 'tests.support.pump_tools:add'}\n"
        "  - {name: s1, root_tag: search, payload: 'tests.support.pump_tools:Search',"
        " handler: 'tests.support.pump_tools:search_fast'}\n"
        "  - {name: s2, root_tag: search, payload: 'tests.support.pump_tools:Search',"
        " handler: 'tests.support.pump_tools:search_slow'}\n")
    with Bus.open(db_path) as opened:
        asked = client.send(opened, "org", b"<add><a>1</a><b>2</b></add>")
        raced = client.send(opened, "org", b"<search><query>q</query></search>")
        Pump(opened, load_organism(organism), oob=False).run(until_idle=True)
        opened.export_jsonl(tmp_path / "bus.jsonl")
    report = queries.threads(extract.extract(spark, str(tmp_path / "bus.jsonl")))
    rows = {(row.scope, row.correlation_id): row for row in report.collect()}
    assert (rows[("thread", asked.thread)].replies, rows[("thread", raced.thread)].replies,
            rows[("all", None)].replies) == (1, 2, 3)
    # search.slow sleeps 0.5 s: the slowest request-to-reply latency shows it.
    assert rows[("thread", raced.thread)].max_ms >= 500


@pytest.mark.parametrize("top", ["0", "100001"])
def test_history_script_rejects_a_silence_top_max_by_cannot_keep(
        top: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        job.parse_args(["--export", "x.jsonl", "--silence-top", top])
    assert exit_.value.code == 2
    assert f"--silence-top: must be 1 to 100000, not {int(top)}" in capsys.readouterr().err


TUNED_SESSION = """
from bus.history.session import start_spark
spark = start_spark(quiet=True)
print(spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get("spark.sql.adaptive.enabled"))
spark.stop()
"""


def test_a_local_master_gets_a_shuffle_partition_per_core_a_query_has_and_given_settings_stay(
        tmp_path: Path) -> None:
    """On local[4] the job's QUERY_THREADS (3) queries share 4 cores: 2 partitions each.
    A setting the launch gives (here adaptive execution on) is not overridden."""
    env = {**os.environ, "SPARK_MASTER": "local[4]", "TMPDIR": str(tmp_path),
           "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '-Djava.io.tmpdir={tmp_path}"
                                  f" {QUICK_JVM}' --conf spark.ui.enabled=false"
                                  " --conf spark.sql.adaptive.enabled=true pyspark-shell"}
    done = subprocess.run([sys.executable, "-c", TUNED_SESSION],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "true"]
