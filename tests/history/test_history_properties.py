"""The history queries that Spark computes without a sort against plain-Python definitions.

silence keeps each agent's longest gaps with max_by(..., k), stuck takes
each (worker, task)'s last state with max_by, and the overview sums small
per-sender groups on the driver: none of them is written the way the
question is asked. Hypothesis builds small histories full of ties (equal
times, equal gaps, several holders of a task) and each query must give
exactly what the definition, worked out here in Python, gives. Skipped
where PySpark or Java is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict

import pytest

pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from hypothesis import example  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from bus.history import extract  # noqa: E402
from bus.history import queries  # noqa: E402

from tests.support.history_support import T0  # noqa: E402
from tests.support.history_support import change  # noqa: E402
from tests.support.history_support import iso  # noqa: E402
from tests.support.history_support import messages_df  # noqa: E402
from tests.support.history_support import msg  # noqa: E402
from tests.support.history_support import spark  # noqa: E402,F401 (the fixture)

EXAMPLES = settings(max_examples=20)  # each example is a Spark job of about a second
AGENTS = ["a", "b", "c"]
WORKERS = ["w1", "w2"]
TASKS = ["t1", "t2"]
STATES = ["ASSIGNED", "WORKING", "IN_REVIEW", "COMPLETED", "FAILED"]
# Times on a 2-second grid over 20 s: equal times and equal gaps are common.
times = st.integers(0, 10).map(lambda step: T0 + 2_000 * step)


@st.composite
def sends(draw: st.DrawFn) -> list[tuple]:
    """Messages of a few agents: heartbeats and other types, in no particular order."""
    picks = draw(st.lists(st.tuples(st.sampled_from(AGENTS), st.sampled_from(
        ["heartbeat", "note"]), times), max_size=30))
    return [msg(seq, ts_ms, agent, type_) for seq, (agent, type_, ts_ms) in enumerate(picks, 1)]


def silence_by_definition(rows: list[tuple], top: int) -> list[tuple]:
    """Each agent's gaps between consecutive messages (heartbeats only, if it sends any),
    the `top` longest per agent (the earlier first among equal ones), longest first."""
    sent = defaultdict(list)
    for seq, _, ts_ms, _, agent, _, type_, *_ in rows:
        sent[agent].append((ts_ms, seq, type_))
    found = []
    for agent, messages in sent.items():
        beats = any(type_ == "heartbeat" for _, _, type_ in messages)
        basis = sorted((ts_ms, seq) for ts_ms, seq, type_ in messages
                       if type_ == "heartbeat" or not beats)
        gaps = sorted(((end[0] - start[0], start[0], end[0])
                       for start, end in zip(basis, basis[1:])), key=lambda g: (-g[0], g[2]))
        found += [(agent, "heartbeat" if beats else "any", iso(start), iso(end), gap / 1000.0)
                  for gap, start, end in gaps[:top]]
    return sorted(found, key=lambda row: (-row[4], row[0], row[2]))


@EXAMPLES
@given(rows=sends(), top=st.integers(1, 3))
@example(rows=[msg(1, T0, "a", "note"), msg(2, T0 + 2_000, "a", "note"),  # equal gaps, one kept
               msg(3, T0 + 4_000, "a", "note")], top=1)
def test_silence_is_the_longest_gaps_by_definition(
        spark: SparkSession, rows: list[tuple], top: int) -> None:
    """Whether silence finds the beating agents itself or is told them (Known)."""
    messages = messages_df(spark, rows)
    beaters = frozenset(row[4] for row in rows if row[6] == "heartbeat")
    expected = silence_by_definition(rows, top)
    for given_beaters in (None, beaters):
        result = queries.silence(messages, top=top, beaters=given_beaters).collect()
        assert [tuple(row) for row in result] == expected, given_beaters


@st.composite
def task_histories(draw: st.DrawFn) -> list[tuple]:
    """State changes of a few (worker, task) pairs, and the bus ending some holds."""
    rows = []
    for _ in range(draw(st.integers(0, 12))):
        seq = len(rows) + 1
        if draw(st.booleans()):
            rows.append(change(seq, draw(times), draw(st.sampled_from(WORKERS)),
                               draw(st.sampled_from(TASKS)), None, draw(st.sampled_from(STATES)),
                               "step"))
        else:
            rows.append(hold_end(seq, draw(times), draw(st.sampled_from(
                ["task_released", "task_reclaimed", "task_dead"])), draw(st.sampled_from(TASKS)),
                draw(st.sampled_from(WORKERS))))
    return draw(st.permutations(rows))  # rows need not come in seq order


def hold_end(seq: int, ts_ms: int, type_: str, task: str, worker: str) -> tuple:
    holder = {"task_released": "agent", "task_reclaimed": "previous_holder",
              "task_dead": "last_holder"}[type_]
    return msg(seq, ts_ms, "bus", type_, {"task": task, holder: worker}, corr=task)


def stuck_by_definition(rows: list[tuple], after_seconds: float) -> list[tuple]:
    """Each pair's last state change (by time, then seq); kept when not terminal, no later
    message ended that worker's hold, and older than `after_seconds` before the newest message."""
    newest = max(row[2] for row in rows)
    last = {}
    for seq, _, ts_ms, _, worker, _, type_, task, _, _, payload in sorted(
            rows, key=lambda row: (row[2], row[0])):
        if type_ == "state_change":
            last[worker, task] = (seq, ts_ms, json.loads(payload)["to"])
    found = []
    for (worker, task), (seq, ts_ms, state) in last.items():
        ended = any(ends_hold(row, worker, task) for row in rows if row[0] > seq)
        age = (newest - ts_ms) / 1000.0
        if state not in queries.TERMINAL_STATES and not ended and age > after_seconds:
            found.append((worker, task, state, iso(ts_ms), age))
    return sorted(found, key=lambda row: (-row[4], row[0], row[1]))


def ends_hold(row: tuple, worker: str, task: str) -> bool:
    """Is `row` the bus ending `worker`'s hold of `task` (task_dead: whoever holds it)?"""
    type_, payload = row[6], row[10]
    if type_ not in extract.HOLD_ENDING_TYPES or row[7] != task:
        return False
    holder = json.loads(payload).get({"task_released": "agent",
                                      "task_reclaimed": "previous_holder"}.get(type_, ""))
    return type_ == "task_dead" or holder == worker


@EXAMPLES
@given(rows=task_histories(), after_seconds=st.sampled_from([0.0, 3.0, 7.5]))
@example(rows=[  # at one time seq decides the last state, in whatever order rows come
    change(2, T0, "w1", "t1", None, "COMPLETED", "step"),
    change(1, T0, "w1", "t1", None, "WORKING", "step"),
    change(3, T0, "w2", "t2", None, "COMPLETED", "step"),
    change(4, T0, "w2", "t2", None, "WORKING", "step"),
    change(5, T0, "w1", "t2", None, "WORKING", "step"),
    hold_end(6, T0, "task_released", "t2", "w1"),  # ends w1's hold of t2, not w2's
    msg(7, T0 + 10_000, "x", "note")], after_seconds=3.0)
def test_stuck_is_the_live_non_terminal_holds_by_definition(
        spark: SparkSession, rows: list[tuple], after_seconds: float) -> None:
    """Whether stuck finds the newest message itself or is told its time (Known)."""
    messages = messages_df(spark, rows)
    expected = stuck_by_definition(rows, after_seconds) if rows else []
    for newest_ms in (None, max((row[2] for row in rows), default=None)):
        result = queries.stuck(messages, after_seconds=after_seconds, newest_ms=newest_ms).collect()
        assert [tuple(row) for row in result] == expected, newest_ms


@EXAMPLES
@given(rows=sends())
def test_survey_counts_what_the_export_holds_and_knows_the_newest_and_the_beaters(
        spark: SparkSession, rows: list[tuple]) -> None:
    raw = (messages_df(spark, rows).withColumnRenamed("from_agent", "from")
           .withColumn("bad_file", F.lit(None).cast("string")))  # read_export's columns
    seen, known = extract.survey(spark, raw)
    times = [row[2] for row in rows]
    assert (seen.messages, seen.agents, seen.first_ms, seen.last_ms, seen.malformed) == (
        len(rows), len({row[4] for row in rows}), min(times, default=None),
        max(times, default=None), 0)
    assert known == extract.Known(newest_ms=max(times, default=None), beaters=frozenset(
        row[4] for row in rows if row[6] == "heartbeat"))
