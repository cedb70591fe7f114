"""The history queries: one pure DataFrame -> DataFrame transform each, and their registry.

Each transform takes the messages (extract's MESSAGES_SCHEMA rows, or the
lake's, which have the payload's fields pulled out) and returns a small
aggregate: that is what each query means. Most are two steps, so the lake
can keep the first per batch: a table of the messages (`state_changes`,
`volume_counts`, `reply_latencies`, `silence_spans`...), which the pipeline
writes, then the answer from that table's rows (`*_of`), which QUERIES runs
over the lake's tables. They are DataFrame expressions only, with no Python
function for Spark to ship, so executors need nothing of agentbus. QUERIES
registers them under the names `bus history --query` takes (QUERY_NAMES,
known without pyspark).

Times in results are ISO 8601 UTC strings like the export's `ts`: the
transforms format them with the session time zone, which `start_spark` sets
to UTC (a caller bringing its own session must do the same). Each query
names its time columns (`Query.times`), which the Parquet files store as
timestamps and the charts draw on a time axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from typing import Mapping

from pyspark.sql import Column
from pyspark.sql import DataFrame
from pyspark.sql import Window
from pyspark.sql import WindowSpec
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bus.history import STUCK_AFTER_SECONDS
from bus.history.extract import HEARTBEAT_TYPE
from bus.history.extract import HOLD_ENDING_TYPES
from bus.history.extract import TASK_EVENT_TYPES
from bus.history.extract import Known
from bus.history.extract import with_payload_fields
from bus.coordination.worker_table import TERMINAL_STATES

SILENCE_TOP = 3  # largest gaps reported per agent
MAX_SILENCE_TOP = 100_000  # the most max_by(..., k) keeps per group
ISO_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"  # the export's `ts` format (session time zone UTC)
HOUR_FORMAT = "yyyy-MM-dd'T'HH:00'Z'"
HOUR_MS = 3_600_000
SPAN_GAPS = 100  # gaps kept per agent and batch: silence_of answers --silence-top up to it
GAPS_TYPE = T.ArrayType(T.StructType([  # silence_spans' gaps, longest first
    T.StructField("start_ms", T.LongType()), T.StructField("ts_ms", T.LongType()),
    T.StructField("gap_s", T.DoubleType())]))



def volume(messages: DataFrame) -> DataFrame:
    """Messages per hour (UTC), sending agent and type."""
    return volume_of(volume_counts(messages))


def volume_counts(messages: DataFrame, *extra: str) -> DataFrame:
    """Messages per hour (`hour_ms`, UTC), sending agent and type, and the first and the
    last message's ts_ms of each: counts that add up (the lake's `volume` table)."""
    # UTC hours start at multiples of an hour since the epoch: integer
    # arithmetic per message, where date_trunc would work through a calendar.
    hour_ms = F.col("ts_ms") - F.pmod("ts_ms", F.lit(HOUR_MS))
    return (messages.groupBy(hour_ms.alias("hour_ms"), F.col("from_agent").alias("agent"), "type",
                             *extra)
            .agg(F.count(F.lit(1)).alias("messages"), F.min("ts_ms").alias("first_ms"),
                 F.max("ts_ms").alias("last_ms")))


def volume_of(counts: DataFrame) -> DataFrame:
    """volume from volume_counts' rows, of one pass or of many batches."""
    return (counts.groupBy(F.col("hour_ms").alias("hour"), "agent", "type")
            .agg(F.sum("messages").alias("messages"))
            .transform(ordered, "hour", "agent", "type")
            # Formatted once per group, not once per message: it is the costly part.
            .withColumn("hour", F.date_format(F.timestamp_millis("hour"), HOUR_FORMAT)))


def state_changes(messages: DataFrame, *extra: str) -> DataFrame:
    """state_change messages as (worker, task, state, ts_ms, seq, *extra): the lake's
    `worker_states` table."""
    return (with_payload_fields(messages).where(F.col("type") == "state_change")
            .select(F.col("from_agent").alias("worker"), F.col("correlation_id").alias("task"),
                    _field("to").alias("state"), "ts_ms", "seq", *extra))


def time_in_state(messages: DataFrame) -> DataFrame:
    """Each state a worker's task entered, until the worker's next state_change for it.

    `left_ms` and `seconds` are null for the state it is still in.
    """
    return time_in_state_of(state_changes(messages))


def time_in_state_of(states: DataFrame) -> DataFrame:
    """time_in_state from state_changes' rows."""
    by_task = Window.partitionBy("worker", "task").orderBy("ts_ms", "seq")
    return (states
            .withColumn("left_ms", F.lead("ts_ms").over(by_task))
            .select("worker", "task", "state", F.col("ts_ms").alias("entered_ms"), "left_ms",
                    ((F.col("left_ms") - F.col("ts_ms")) / 1000.0).alias("seconds")))


def lifecycle(messages: DataFrame) -> DataFrame:
    """p50/p95 time in each state per worker, over the states it has left."""
    return lifecycle_of(state_changes(messages))


def lifecycle_of(states: DataFrame) -> DataFrame:
    """lifecycle from state_changes' rows."""
    left = time_in_state_of(states).where(F.col("seconds").isNotNull())
    quantiles = exact_quantiles("seconds")
    return (left.groupBy("worker", "state")
            .agg(F.count(F.lit(1)).alias("visits"), quantiles.alias("q"),
                 F.max("seconds").alias("max_s"), F.sum("seconds").alias("total_s"))
            .select("worker", "state", "visits", F.col("q")[0].alias("p50_s"),
                    F.col("q")[1].alias("p95_s"), "max_s", F.round("total_s", 3).alias("total_s"))
            .transform(ordered, "worker", "state"))


def stuck(messages: DataFrame, after_seconds: float = STUCK_AFTER_SECONDS,
          newest_ms: int | None = None) -> DataFrame:
    """Tasks whose last state is not terminal, older than `after_seconds`, and still held.

    A (worker, task) pair no longer counts once the bus has ended that
    worker's hold after its last state change: `task_released` naming it,
    `task_reclaimed` naming it as the previous holder, or `task_dead` for the
    task (whoever held it). Age is measured against the newest message in
    the data, not the clock, so an old export gives the same answer tomorrow:
    `newest_ms` when the caller knows it (Known), else found here.
    """
    newest = messages.agg(F.max("ts_ms").alias("newest_ms")) if newest_ms is None else newest_ms
    return stuck_of(state_changes(messages), hold_end_events(messages), after_seconds, newest)


def stuck_of(states: DataFrame, hold_ends: DataFrame, after_seconds: float,
             newest: int | DataFrame) -> DataFrame:
    """stuck from state_changes' and hold_end_events' rows; `newest`: the newest message's
    ts_ms, or a one-row frame of it (`newest_ms`)."""
    # An aggregate, not a window: it combines before the shuffle and sorts nothing.
    latest = F.max_by(F.struct("state", "ts_ms", "seq"), F.struct("ts_ms", "seq"))
    last = (states.groupBy("worker", "task").agg(latest.alias("last"))
            .select("worker", "task", "last.*")
            .where(~F.col("state").isin(*sorted(TERMINAL_STATES))))
    ended = _ended_holds(hold_ends)
    still_held = last.join(ended, (last["task"] == ended["ended_task"])
                           & (ended["ended_holder"].isNull()
                              | (last["worker"] == ended["ended_holder"]))
                           & (ended["end_seq"] > last["seq"]), "left_anti")
    if isinstance(newest, DataFrame):
        still_held = still_held.crossJoin(newest)
    else:
        still_held = still_held.withColumn("newest_ms", F.lit(newest))
    return (still_held
            .withColumn("stuck_s", (F.col("newest_ms") - F.col("ts_ms")) / 1000.0)
            .where(F.col("stuck_s") > F.lit(after_seconds))
            .select("worker", "task", "state", _iso("ts_ms").alias("since"), "stuck_s")
            .transform(ordered, F.desc("stuck_s"), "worker", "task"))


def hold_end_events(messages: DataFrame, *extra: str) -> DataFrame:
    """The bus's ends of a hold (released from a dead holder, taken over, declared dead) as
    (task, event, holder, new_holder, attempt, reason, ts_ms, seq, *extra): the lake's
    `claims` table. `holder` is the one whose hold ended (task_dead: the last one)."""
    kind = F.col("type")
    return (with_payload_fields(messages).where(kind.isin(*HOLD_ENDING_TYPES))
            .select(F.coalesce(_field("task"), F.col("correlation_id")).alias("task"),
                    kind.alias("event"),
                    F.coalesce(_field("agent"), _field("last_holder"),
                               _field("previous_holder")).alias("holder"),
                    _field("new_holder").alias("new_holder"),
                    # try_cast: a message of the type from anyone else may hold anything.
                    _field("attempt").try_cast("long").alias("attempt"),
                    _field("reason").alias("reason"), "ts_ms", "seq", *extra))


def _ended_holds(hold_ends: DataFrame) -> DataFrame:
    """(ended_task, ended_holder, end_seq) of hold_end_events' rows; holder null = any
    (a task_dead ends the task's hold whoever has it)."""
    event = F.col("event")
    return hold_ends.select(
        F.col("task").alias("ended_task"),
        F.when(event != "task_dead", F.col("holder")).alias("ended_holder"),
        F.col("seq").alias("end_seq"))


def reply_latencies(messages: DataFrame, requests: DataFrame | None = None,
                    *extra: str, unanswered: bool = False) -> DataFrame:
    """Each reply in `messages` (in_reply_to names a message of `requests`, default
    `messages` itself) as (correlation_id, reply_id, request_id, latency_ms, *extra of the
    reply): the lake's `replies` table. With `unanswered`, a reply whose request is not
    in `requests` too, its latency null."""
    requests = as_requests(messages if requests is None else requests)
    # Broadcast: replies are few beside all messages (1.5% of a generated
    # export), of the order of the per-thread rows the driver collects
    # anyway; every message is then probed where it lies, not shuffled.
    replies = F.broadcast(messages.where(F.col("in_reply_to").isNotNull()))
    return (replies.join(requests, replies["in_reply_to"] == requests["request_id"],
                         "left" if unanswered else "inner")
            .select(F.coalesce("correlation_id", "request_correlation_id").alias("correlation_id"),
                    F.col("id").alias("reply_id"), F.col("in_reply_to").alias("request_id"),
                    (F.col("ts_ms") - F.col("request_ms")).alias("latency_ms"), *extra))


def as_requests(messages: DataFrame) -> DataFrame:
    """Messages as the requests a reply may name: (request_id, request_ms,
    request_correlation_id)."""
    return messages.select(F.col("id").alias("request_id"), F.col("ts_ms").alias("request_ms"),
                           F.col("correlation_id").alias("request_correlation_id"))


def threads(messages: DataFrame) -> DataFrame:
    """Request-to-reply latency per correlation_id, then over all replies (scope "all")."""
    return threads_of(reply_latencies(messages))


def threads_of(latencies: DataFrame) -> DataFrame:
    """threads from reply_latencies' rows."""
    quantiles = exact_quantiles("latency_ms").cast("array<long>")
    per_thread = (latencies.rollup("correlation_id")
                  .agg(F.grouping("correlation_id").alias("total"),
                       F.count(F.lit(1)).alias("replies"), quantiles.alias("q"),
                       F.max("latency_ms").alias("max_ms")))
    return (per_thread
            .select(F.when(F.col("total") == 1, "all").otherwise("thread").alias("scope"),
                    "correlation_id", "replies", F.col("q")[0].alias("p50_ms"),
                    F.col("q")[1].alias("p95_ms"), "max_ms", "total")
            .transform(ordered, "total", "correlation_id")
            .drop("total"))


def silence(messages: DataFrame, top: int = SILENCE_TOP,
            beaters: frozenset[str] | None = None) -> DataFrame:
    """The `top` longest gaps between consecutive messages of each agent.

    An agent that sends heartbeat messages is judged by those alone (its
    other messages are not proof of a live loop); any other by all it sends.
    `beaters` names the agents that send heartbeats when the caller knows
    them (Known), else they are found here.
    """
    gaps = _gaps(_silence_basis(messages, beaters))
    return _silence_rows(gaps.groupBy("from_agent")
                         .agg(F.max("beats").alias("beats"), _longest(top).alias("gaps")))


def _silence_basis(messages: DataFrame, beaters: frozenset[str] | None) -> DataFrame:
    """The messages each agent is judged by: (from_agent, ts_ms, seq, beats)."""
    return (_with_beats(messages, beaters)
            .select("from_agent", "ts_ms", "seq", "beats",
                    (F.col("type") == HEARTBEAT_TYPE).alias("beat"))
            .where(F.col("beat") | ~F.col("beats")))


def _gaps(basis: DataFrame) -> DataFrame:
    """Each basis message after an agent's first, with the gap since the one before."""
    return _with_gaps(basis).where(F.col("start_ms").isNotNull())


def _with_gaps(basis: DataFrame) -> DataFrame:
    """Each basis message with the gap since the agent's one before (null for its first)."""
    in_order = Window.partitionBy("from_agent").orderBy("ts_ms", "seq")
    return (basis.withColumn("start_ms", F.lag("ts_ms").over(in_order))
            .withColumn("gap_s", (F.col("ts_ms") - F.col("start_ms")) / 1000.0))


def _longest(top: int) -> Column:
    """The `top` longest gaps of a group, longest first, the earlier of equal gaps first:
    an aggregate over the rows as the window left them (in agent order already), not a
    second sort of every gap."""
    # A row without a gap (an agent's first message) has no ordering, which max_by skips.
    gap_order = F.when(F.col("start_ms").isNotNull(), F.struct("gap_s", -F.col("ts_ms")))
    return F.max_by(F.struct("start_ms", "ts_ms", "gap_s"), gap_order, top)


def _silence_rows(longest: DataFrame) -> DataFrame:
    """silence's rows from (from_agent, beats, gaps) rows."""
    return (longest.select("from_agent", "beats", F.explode("gaps").alias("gap"))
            .select(F.col("from_agent").alias("agent"),
                    F.when(F.col("beats"), "heartbeat").otherwise("any").alias("basis"),
                    _iso("gap.start_ms").alias("start"), _iso("gap.ts_ms").alias("end"),
                    F.col("gap.gap_s").alias("gap_s"))
            .transform(ordered, F.desc("gap_s"), "agent", "start"))


def silence_spans(messages: DataFrame) -> DataFrame:
    """Per agent: whether it beats (in these messages), the first and the last message it
    is judged by, and its SPAN_GAPS longest gaps between them: the lake's `silences` table,
    one row per agent and batch, which silence_of merges."""
    # One aggregate over the window's rows, the first message of each agent included.
    basis = _with_gaps(_silence_basis(messages, None))
    first, last = F.min(F.struct("ts_ms", "seq")), F.max(F.struct("ts_ms", "seq"))
    return (basis.groupBy("from_agent")
            .agg(F.max("beats").alias("beats"), first.alias("first"), last.alias("last"),
                 _longest(SPAN_GAPS).alias("gaps"))
            .select(F.col("from_agent").alias("agent"), "beats",
                    F.col("first.ts_ms").alias("first_ms"), F.col("first.seq").alias("first_seq"),
                    F.col("last.ts_ms").alias("last_ms"), F.col("last.seq").alias("last_seq"),
                    F.coalesce("gaps", F.array().cast(GAPS_TYPE)).alias("gaps")))


def silence_of(spans: DataFrame, top: int) -> DataFrame:
    """silence from silence_spans' rows of batches that follow one another in each agent's
    time (spans_overlap says when they do not): every gap inside a batch is among its
    stored ones or shorter than them, and the gaps between batches are those from one
    batch's last message to the next one's first."""
    judged = _judged_spans(spans)
    between = (judged.withColumn("start_ms", F.lag("last_ms").over(_spans_in_order()))
               .where(F.col("start_ms").isNotNull())
               .select("agent", "beats", F.struct(
                   "start_ms", F.col("first_ms").alias("ts_ms"),
                   ((F.col("first_ms") - F.col("start_ms")) / 1000.0).alias("gap_s")).alias("gap")))
    inside = judged.select("agent", "beats", F.explode("gaps").alias("gap"))
    return _silence_rows(
        inside.unionByName(between).select(F.col("agent").alias("from_agent"), "beats", "gap.*")
        .groupBy("from_agent").agg(F.max("beats").alias("beats"), _longest(top).alias("gaps")))


def spans_overlap(spans: DataFrame) -> bool:
    """Do two batches' spans of an agent's judged messages overlap in time (an export not
    in time order), so that only a pass over every message gives silence?"""
    before = F.lag(F.struct("last_ms", "last_seq")).over(_spans_in_order())
    return (_judged_spans(spans).withColumn("before", before)
            .where(F.col("before") > F.struct("first_ms", "first_seq")).limit(1).count() > 0)


def _judged_spans(spans: DataFrame) -> DataFrame:
    """The spans each agent is judged by: a beating agent's heartbeats, so the batches
    it beat in, alone; any other's every batch."""
    beats = spans.groupBy(F.col("agent").alias("judged")).agg(F.max("beats").alias("beater"))
    # Null-safe: the messages without a sender are an agent of their own, as in silence.
    return (spans.join(beats, spans["agent"].eqNullSafe(beats["judged"]))
            .where(F.col("beats") == F.col("beater")).drop("judged", "beater"))


def _spans_in_order() -> WindowSpec:
    return Window.partitionBy("agent").orderBy("first_ms", "first_seq")


def _with_beats(messages: DataFrame, beaters: frozenset[str] | None) -> DataFrame:
    """`messages` with `beats`: does the sender send heartbeats (any, in `messages`)?"""
    if beaters is not None:
        return messages.withColumn(
            "beats", F.coalesce(F.col("from_agent").isin(*sorted(beaters)), F.lit(False)))
    # Agents are few: a broadcast list of the beating ones is cheaper than a
    # whole-partition window over every message.
    beating = (messages.where(F.col("type") == HEARTBEAT_TYPE).select("from_agent").distinct()
               .withColumn("beats", F.lit(True)))
    return (messages.join(F.broadcast(beating), "from_agent", "left")
            .withColumn("beats", F.coalesce("beats", F.lit(False))))


def dead_tasks(messages: DataFrame) -> DataFrame:
    """Tasks the bus released from a dead holder, whose lease was taken over after it ran
    out (`task_reclaimed`), or that were declared dead; with every agent involved."""
    return dead_tasks_of(hold_end_events(messages))


def dead_tasks_of(hold_ends: DataFrame) -> DataFrame:
    """dead_tasks from hold_end_events' rows."""
    event = F.col("event")
    events = hold_ends.select(
        "task", F.array("holder", "new_holder").alias("involved"),
        F.when(event == "task_reclaimed", F.concat_ws(
            " ", F.lit("taken over by"), F.col("new_holder"), F.lit("at attempt"),
            F.col("attempt").cast("string")))
        .otherwise(F.col("reason")).alias("reason"), "event", "ts_ms", "seq")
    agents = F.array_sort(F.array_distinct(F.filter(
        F.flatten(F.collect_list("involved")), lambda agent: agent.isNotNull())))
    return (events.groupBy("task")
            .agg(F.sum((event == "task_released").cast("long")).alias("released"),
                 F.sum((event == "task_reclaimed").cast("long")).alias("reclaimed"),
                 F.max(event == "task_dead").alias("dead"),
                 F.array_join(agents, ",").alias("agents"),
                 F.max_by("event", "seq").alias("last_event"),
                 F.max_by("reason", "seq").alias("last_reason"),
                 F.max("ts_ms").alias("last_ms"))
            .select("task", "released", "reclaimed", "dead", "agents", "last_event",
                    "last_reason", _iso("last_ms").alias("last_at"))
            .transform(ordered, "last_at", "task"))


# --- over the lake's tasks table (bus.history.pipeline.tasks_table) ---------------------

TASK_END_EVENTS = ("task_done", "task_cancelled")


def task_events(messages: DataFrame, *extra: str) -> DataFrame:
    """Every message about a task's progress: state changes, the task graph's events and
    the bus's hold ends, as (task, event, agent, state, ts_ms, seq, *extra) rows; the task
    is the payload's `task`, else the correlation id. The lake's tasks table."""
    kind = F.col("type")
    about_tasks = kind.isin("state_change", *TASK_EVENT_TYPES, *HOLD_ENDING_TYPES)
    return (with_payload_fields(messages).where(about_tasks)
            .select(F.coalesce(_field("task"), F.col("correlation_id")).alias("task"),
                    kind.alias("event"), F.col("from_agent").alias("agent"),
                    F.when(kind == "state_change", _field("to")).alias("state"),
                    "ts_ms", "seq", *extra)
            .where(F.col("task").isNotNull()))


def lead_time(tasks: DataFrame) -> DataFrame:
    """Per task: from its first event to its end (task_done, task_cancelled, or a terminal
    state of its worker, whichever comes first); `ended` and `lead_s` null while it is open."""
    kind, state = F.col("event"), F.col("state")
    ending = kind.isin(*TASK_END_EVENTS) | state.isin(*sorted(TERMINAL_STATES))
    outcome = F.when(kind == "task_done", "done").when(kind == "task_cancelled", "cancelled") \
        .otherwise(F.lower(state))
    first_end = F.min_by(F.struct("ts_ms", outcome.alias("outcome")),
                         F.when(ending, F.struct("ts_ms", "seq")))
    return (tasks.groupBy("task")
            .agg(F.min("ts_ms").alias("start_ms"), first_end.alias("end"),
                 F.count(F.lit(1)).alias("events"))
            .select("task", _iso("start_ms").alias("started"), _iso("end.ts_ms").alias("ended"),
                    ((F.col("end.ts_ms") - F.col("start_ms")) / 1000.0).alias("lead_s"),
                    F.col("end.outcome").alias("outcome"), "events")
            .transform(ordered, "started", "task"))


def blocked(tasks: DataFrame) -> DataFrame:
    """Per task and agent: the spells it was blocked (from a task_blocked to the task's next
    event of another kind), their total seconds, and whether one is still open."""
    in_order = Window.partitionBy("task").orderBy("ts_ms", "seq")
    after = in_order.rowsBetween(1, Window.unboundedFollowing)
    is_blocked = F.col("event") == "task_blocked"
    spells = (tasks
              .withColumn("resumed_ms", F.min(F.when(~is_blocked, F.col("ts_ms"))).over(after))
              .withColumn("before", F.lag("event").over(in_order))
              # A spell starts at a task_blocked the event before it did not already start.
              .where(is_blocked & (F.col("before").isNull() | (F.col("before") != "task_blocked")))
              .withColumn("seconds", (F.col("resumed_ms") - F.col("ts_ms")) / 1000.0))
    return (spells.groupBy("task", "agent")
            .agg(F.count(F.lit(1)).alias("spells"),
                 F.round(F.coalesce(F.sum("seconds"), F.lit(0.0)), 3).alias("blocked_s"),
                 F.max(F.col("resumed_ms").isNull()).alias("still_blocked"),
                 F.min("ts_ms").alias("first_ms"))
            .select("task", "agent", "spells", "blocked_s", "still_blocked",
                    _iso("first_ms").alias("first_blocked"))
            .transform(ordered, F.desc("blocked_s"), "task", "agent"))


def throughput(tasks: DataFrame) -> DataFrame:
    """Tasks each agent finished (task_done) per UTC day."""
    done = tasks.where(F.col("event") == "task_done")
    day = F.date_format(F.timestamp_millis("ts_ms"), "yyyy-MM-dd")
    return (done.groupBy(F.col("agent"), day.alias("day"))
            .agg(F.countDistinct("task").alias("done"))
            .transform(ordered, "day", "agent"))


def ordered(result: DataFrame, *keys: str | Column) -> DataFrame:
    """`result` sorted by `keys` in one partition: for the small results of the queries.

    A global orderBy first samples its input in a job of its own to choose
    range bounds, which runs again everything since the last shuffle (for
    silence, the window over every message). The driver collects the
    result whole anyway, so one partition costs it nothing.
    """
    return result.repartition(1).sortWithinPartitions(*keys)


def exact_quantiles(column: str) -> Column:
    """[p50, p95] of `column`, exact: values at those ranks, whatever the partitioning.

    percentile_disc picks the first value whose cumulative share reaches p
    (the nearest rank), so the answer is one of the data's own values and
    the same on one core or a cluster; percentile_approx's sketch is not
    (10832 vs 10836 ms over the same data).
    """
    return F.expr(f"percentile_disc(array(0.5, 0.95)) WITHIN GROUP (ORDER BY {column})")


def _iso(ms_column: str) -> Column:
    return F.date_format(F.timestamp_millis(F.col(ms_column)), ISO_FORMAT)


def _field(name: str) -> Column:
    """A payload field as with_payload_fields pulled it out (see PAYLOAD_FIELDS)."""
    return F.col(f"payload_{name}")


@dataclass(frozen=True)
class Options:
    stuck_after_seconds: float = STUCK_AFTER_SECONDS
    silence_top: int = SILENCE_TOP


@dataclass(frozen=True)
class Query:
    """A query over the lake's tables (by name: bus.history.pipeline.TABLE_SCHEMAS)."""

    transform: Callable[[Mapping[str, DataFrame], Options, Known], DataFrame]
    title: str
    times: tuple[str, ...] = ()  # the result's time columns (ISO text: HOUR_FORMAT or ISO_FORMAT)


def lake_silence(tables: Mapping[str, DataFrame], options: Options, known: Known) -> DataFrame:
    """silence from the batches' spans; from every message when a span keeps too few gaps
    for --silence-top or spans overlap."""
    spans = tables["silences"]
    if options.silence_top > SPAN_GAPS or spans_overlap(spans):
        return silence(tables["messages"], options.silence_top, known.beaters)
    return silence_of(spans, options.silence_top)


def answered(replies: DataFrame) -> DataFrame:
    """The lake's replies whose request it holds (one still waiting has no latency)."""
    return replies.where(F.col("latency_ms").isNotNull())


# Each reads the smallest of the lake's tables that answers it; the functions of
# the messages above are what each means (tests hold the two to each other).
QUERIES: dict[str, Query] = {
    "volume": Query(lambda t, o, k: volume_of(t["volume"]), "messages per hour, agent and type",
                    ("hour",)),
    "lifecycle": Query(lambda t, o, k: lifecycle_of(t["worker_states"]),
                       "time in state per worker (seconds)"),
    "stuck": Query(lambda t, o, k: stuck_of(t["worker_states"], t["claims"],
                                            o.stuck_after_seconds, k.newest_ms),
                   "tasks stuck in a non-terminal state", ("since",)),
    "threads": Query(lambda t, o, k: threads_of(answered(t["replies"])),
                     "request-to-reply latency (ms)"),
    "silence": Query(lake_silence, "longest silences per agent", ("start", "end")),
    "dead_tasks": Query(lambda t, o, k: dead_tasks_of(t["claims"]),
                        "tasks released, taken over (reclaimed) or declared dead", ("last_at",)),
    "lead_time": Query(lambda t, o, k: lead_time(t["tasks"]), "lead time per task (seconds)",
                       ("started", "ended")),
    "blocked": Query(lambda t, o, k: blocked(t["tasks"]),
                     "time blocked per task and agent (seconds)", ("first_blocked",)),
    "throughput": Query(lambda t, o, k: throughput(t["tasks"]), "tasks done per agent and UTC day"),
}


def query_names(query: str) -> list[str]:
    """The queries `--query` names: one, or every one for "all"."""
    return list(QUERIES) if query == "all" else [query]
