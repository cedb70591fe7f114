"""Heartbeats and liveness: heartbeat(), liveness(), Thresholds and the Heartbeat thread.

Liveness is judged against an injected clock (`now=`, epoch milliseconds),
so the thresholds are tested to the millisecond without waiting. The
Heartbeat thread is tested in real time: through a blocking call in this
process, through a CPU-bound child process, and in a child killed with
SIGKILL (tests/support/procs_coordination.py). Waits are on conditions with
deadlines; the only sleeps are the blocking calls being simulated.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from pathlib import Path

import pytest

from bus import Bus
from bus import BusError
from bus import BusNotFound
from bus import ValidationFailed
from bus.log import glance
from bus.coordination import heartbeats
from bus.coordination.heartbeats import Heartbeat
from bus.coordination.heartbeats import Liveness
from bus.coordination.heartbeats import Thresholds
from tests.support.procs_coordination import Children
from tests.support.waiting import wait_until

T0 = 1_700_000_000_000  # an injected clock: 2023-11-14, epoch milliseconds
STARTUP_TIMEOUT = 60.0  # for a child to import bus, open the file and report
SHORT_TIMEOUT = 60.0
QUICK = Thresholds(warn=1.0, stale=2.0, dead=4.0)


@pytest.fixture
def children(tmp_path: Path, python_env: dict[str, str]):
    started = Children(python_env, tmp_path / "stderr")
    yield started
    started.cleanup()


def heartbeat_threads(agent: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"heartbeat-{agent}"]


def rows(bus: Bus) -> list[tuple]:
    return bus.conn.execute(
        "SELECT agent_id, ts_ms, status, current_task, progress FROM heartbeats"
        " ORDER BY agent_id").fetchall()


def row_of(bus: Bus, agent: str) -> tuple | None:
    found = [row for row in rows(bus) if row[0] == agent]
    return found[0] if found else None


def beat_at(bus: Bus, agent: str, ts_ms: int, status: str = "idle") -> None:
    """A heartbeat stamped `ts_ms` (the library's own beat, with its clock injected)."""
    heartbeats.beat(bus.conn, agent, status, None, None, now=ts_ms)


def state_of(bus: Bus, agent: str, now: int, thresholds: Thresholds | None = None) -> Liveness:
    [found] = [item for item in bus.heartbeats.liveness(now=now, thresholds=thresholds)
               if item.agent == agent]
    return found


# --- heartbeat() -----------------------------------------------------------------------


def test_heartbeat_returns_its_time_and_stores_the_fields(bus):
    before = time.time_ns() // 1_000_000
    ts = bus.heartbeats.beat("w-1", "working", task="t-1", progress=0.25)
    after = time.time_ns() // 1_000_000
    assert before <= ts <= after
    assert rows(bus) == [("w-1", ts, "working", "t-1", 0.25)]
    assert bus.heartbeats.liveness(now=ts) == [
        Liveness("w-1", "alive", 0.0, "working", "t-1", 0.25, ts)]


def test_heartbeat_upserts_one_row_per_agent(bus):
    first = bus.heartbeats.beat("w-1", "working", task="t-1", progress=0.5)
    for _ in range(5):
        bus.heartbeats.beat("w-2")
    last = bus.heartbeats.beat("w-1", "blocked")
    assert last >= first
    assert bus.conn.execute("SELECT count(*) FROM heartbeats").get == 2
    # the last beat replaces every field: task and progress are gone
    assert row_of(bus, "w-1") == ("w-1", last, "blocked", None, None)
    # only what changed is announced: w-2's repeated idle beats add nothing to the log
    assert [(m.from_agent, m.type, m.correlation_id, m.payload)
            for m in bus.list_messages()] == [
        ("w-1", "task_progress", "t-1", {"task": "t-1", "progress": 0.5}),
        ("w-1", "task_blocked", None, {"task": None})]


@pytest.mark.parametrize("progress", [0, 0.0, 0.5, 1, 1.0])
def test_heartbeat_accepts_progress_from_0_to_1(bus, progress):
    bus.heartbeats.beat("w-1", "working", progress=progress)
    stored = row_of(bus, "w-1")[4]
    assert stored == progress and isinstance(stored, float)


@pytest.mark.parametrize("status", ["idle", "working", "blocked"])
def test_heartbeat_accepts_the_three_statuses(bus, status):
    bus.heartbeats.beat("w-1", status)
    assert row_of(bus, "w-1")[2] == status


@pytest.mark.parametrize("field, arguments", [
    ("progress", {"progress": 50}),
    ("progress", {"progress": -0.01}),
    ("progress", {"progress": 1.0001}),
    ("progress", {"progress": math.nan}),
    ("progress", {"progress": math.inf}),
    ("progress", {"progress": True}),
    ("progress", {"progress": "0.5"}),
    ("status", {"status": "busy"}),
    ("status", {"status": "IDLE"}),
    ("status", {"status": ""}),
    ("status", {"status": None}),
    ("task", {"task": ""}),
    ("task", {"task": "x" * 257}),
    ("task", {"task": 7}),
    ("agent", {"agent": ""}),
    ("agent", {"agent": "has space"}),
    ("agent", {"agent": "x" * 129}),
    ("agent", {"agent": None}),
])
def test_heartbeat_rejects_bad_fields_and_writes_nothing(bus, field, arguments):
    ts = bus.heartbeats.beat("w-1", "working", task="t-1", progress=0.5)
    before = rows(bus)
    call = {"agent": "w-1", "status": "idle", "task": None, "progress": None, **arguments}
    with pytest.raises(ValidationFailed) as info:
        bus.heartbeats.beat(call["agent"], call["status"], call["task"], call["progress"])
    assert info.value.field == field
    assert rows(bus) == before == [("w-1", ts, "working", "t-1", 0.5)]


def test_heartbeat_accepts_task_of_256_characters(bus):
    bus.heartbeats.beat("w-1", "working", task="x" * 256)
    assert row_of(bus, "w-1")[3] == "x" * 256


# --- liveness() and Thresholds -------------------------------------------------------------


@pytest.mark.parametrize("silent_ms, state", [
    (0, "alive"), (29_999, "alive"), (30_000, "warn"), (99_999, "warn"), (100_000, "stale"),
    (299_999, "stale"), (300_000, "dead"), (86_400_000, "dead"),
])
def test_liveness_states_change_at_the_thresholds(bus, silent_ms, state):
    ts = bus.heartbeats.beat("w-1", "working", task="t-1", progress=0.75)
    assert bus.heartbeats.liveness(now=ts + silent_ms) == [
        Liveness("w-1", state, silent_ms / 1000, "working", "t-1", 0.75, ts)]


def test_liveness_of_a_beat_from_the_future_is_age_zero(bus):
    ts = bus.heartbeats.beat("w-1")
    [found] = bus.heartbeats.liveness(now=ts - 5_000)
    assert (found.state, found.age_s) == ("alive", 0.0)


def test_liveness_without_now_uses_the_clock(bus):
    ts = bus.heartbeats.beat("w-1")
    [found] = bus.heartbeats.liveness()
    assert found.ts_ms == ts
    assert found.state == "alive"
    assert 0 <= found.age_s < 30  # the real clock has moved on only a little


@pytest.mark.parametrize("silent_ms, state", [
    (999, "alive"), (1_000, "warn"), (1_999, "warn"), (2_000, "stale"), (3_999, "stale"),
    (4_000, "dead"),
])
def test_liveness_with_custom_thresholds(bus, silent_ms, state):
    beat_at(bus, "w-1", T0)
    assert state_of(bus, "w-1", T0 + silent_ms, QUICK).state == state
    assert state_of(bus, "w-1", T0 + silent_ms).state == "alive"  # the defaults are 30/100/300 s


def test_liveness_sorts_most_silent_state_first_then_by_age(bus):
    silences = {"alive-new": 1_000, "alive-old": 20_000, "warn": 50_000, "stale-a": 150_000,
                "stale-b": 150_000, "stale-old": 200_000, "dead": 400_000, "dead-old": 900_000}
    for agent, silent_ms in sorted(silences.items()):
        beat_at(bus, agent, T0 - silent_ms)
    found = bus.heartbeats.liveness(now=T0)
    assert [item.agent for item in found] == [
        "dead-old", "dead", "stale-old", "stale-a", "stale-b", "warn", "alive-old", "alive-new"]
    assert [item.state for item in found] == [
        "dead", "dead", "stale", "stale", "stale", "warn", "alive", "alive"]
    assert [item.age_s for item in found] == [900.0, 400.0, 200.0, 150.0, 150.0, 50.0, 20.0, 1.0]


def test_liveness_sorts_by_state_even_with_custom_thresholds(bus):
    beat_at(bus, "a", T0 - 3_000)
    beat_at(bus, "b", T0 - 5_000)
    beat_at(bus, "c", T0 - 500)
    found = bus.heartbeats.liveness(now=T0, thresholds=QUICK)
    assert [(item.agent, item.state) for item in found] == [
        ("b", "dead"), ("a", "stale"), ("c", "alive")]


def test_liveness_of_an_empty_bus_is_empty(bus):
    assert bus.heartbeats.liveness(now=T0) == []


@pytest.mark.parametrize("now", [time.time(), int(time.time()), 1_700_000_000, float(T0), True,
                                 "1700000000000"])
def test_liveness_rejects_now_not_in_epoch_ms(bus, now):
    bus.heartbeats.beat("w-1")
    with pytest.raises(ValidationFailed) as info:
        bus.heartbeats.liveness(now=now)
    assert info.value.field == "now"


def test_liveness_to_json_dict_rounds_the_age(bus):
    beat_at(bus, "w-1", T0, "blocked")
    [found] = bus.heartbeats.liveness(now=T0 + 1_234)
    assert found.to_json_dict() == {"agent": "w-1", "state": "alive", "age_s": 1.234,
                                    "status": "blocked", "task": None, "progress": None,
                                    "ts_ms": T0}


def test_thresholds_defaults_are_30_100_300_seconds():
    assert Thresholds() == Thresholds(warn=30.0, stale=100.0, dead=300.0)


@pytest.mark.parametrize("warn, stale, dead", [
    (5, 1, 10), (1, 10, 5), (0, 1, 2), (-1, 1, 2), (math.nan, 1, 2), (1, 2, math.nan),
])
def test_thresholds_refuse_an_order_other_than_warn_stale_dead(warn, stale, dead):
    with pytest.raises(ValidationFailed) as info:
        Thresholds(warn, stale, dead)
    assert info.value.field == "thresholds"


def test_thresholds_may_coincide():
    same = Thresholds(2.0, 2.0, 2.0)
    assert [same.state(age) for age in (1.999, 2.0)] == ["alive", "dead"]


# --- the Heartbeat thread ------------------------------------------------------------------


@pytest.fixture
def agent() -> str:
    """An agent id of this test's own, so a thread leaked by another test cannot interfere."""
    return f"hb-{uuid.uuid4().hex[:12]}"


def test_heartbeat_thread_beats_and_stops_when_the_block_ends(db_path, bus, agent):
    with Heartbeat(db_path, agent, interval=0.02, status="working", task="t-1") as hb:
        assert len(heartbeat_threads(agent)) == 1
        assert heartbeat_threads(agent)[0].daemon
        wait_until(lambda: hb.beats >= 5, "beaten 5 times")
        first = row_of(bus, agent)
        wait_until(lambda: row_of(bus, agent)[1] > first[1], "beaten again later")
    assert heartbeat_threads(agent) == []
    assert row_of(bus, agent)[2:] == ("working", "t-1", None)
    assert bus.conn.execute("SELECT count(*) FROM heartbeats").get == 1


def test_heartbeat_leaving_the_block_stops_the_thread_at_once(db_path, bus, agent):
    hb = Heartbeat(db_path, agent, interval=30.0)
    with hb:
        wait_until(lambda: hb.beats == 1, "beaten once")
        left = time.monotonic()
    # join() returned: without a wake-up it would have waited out the 30 s interval
    assert time.monotonic() - left < 10.0
    assert heartbeat_threads(agent) == []
    assert hb.beats == 1


def test_heartbeat_stop_with_a_last_status_beats_it_last(db_path, bus, agent):
    renewals: list[int] = []
    hb = Heartbeat(db_path, agent, interval=30.0, status="working", task="t-1",
                   on_beat=lambda: renewals.append(1)).start()
    wait_until(lambda: hb.beats == 1, "beaten once")
    hb.stop(last_status="stopped")
    assert heartbeat_threads(agent) == []
    assert hb.beats == 2 and len(renewals) == 1  # the last beat renews nothing
    assert row_of(bus, agent)[2:] == ("stopped", "t-1", None)
    assert [(a.agent, a.state) for a in bus.heartbeats.liveness()] == [(agent, "stopped")]


def test_heartbeat_stop_refuses_a_bad_last_status_and_still_stops(db_path, bus, agent):
    hb = Heartbeat(db_path, agent, interval=30.0, status="working").start()
    wait_until(lambda: hb.beats == 1, "beaten once")
    with pytest.raises(ValidationFailed) as info:
        hb.stop(last_status="gone")
    assert info.value.field == "status"
    hb.stop()
    assert heartbeat_threads(agent) == []
    assert row_of(bus, agent)[2] == "working"


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_heartbeat_stops_when_the_block_raises(db_path, bus, agent, error):
    started = time.monotonic()
    with pytest.raises(error):
        with Heartbeat(db_path, agent, interval=30.0) as hb:
            wait_until(lambda: hb.beats == 1, "beaten once")
            raise error("interrupted")
    assert time.monotonic() - started < 10.0
    assert heartbeat_threads(agent) == []


def test_heartbeat_update_beats_at_once_with_the_new_fields(db_path, bus, agent):
    with Heartbeat(db_path, agent, interval=30.0) as hb:
        wait_until(lambda: hb.beats == 1, "beaten once")
        assert row_of(bus, agent)[2:] == ("idle", None, None)

        hb.update(status="working", task="t-1", progress=0.25)
        # long before the 30 s interval is up
        wait_until(lambda: row_of(bus, agent)[2:] == ("working", "t-1", 0.25), "updated")
        wait_until(lambda: hb.beats == 2, "counted")  # the row shows a moment before

        hb.update(progress=0.5)  # the other fields stay as they were
        wait_until(lambda: row_of(bus, agent)[2:] == ("working", "t-1", 0.5), "updated")
        hb.update(status="blocked", task=None, progress=None)
        wait_until(lambda: row_of(bus, agent)[2:] == ("blocked", None, None), "updated")
    assert hb.beats == 4  # once the thread has stopped, as above


@pytest.mark.parametrize("field, changes", [
    ("progress", {"progress": 50}),
    ("progress", {"progress": -1}),
    ("progress", {"status": "working", "progress": 2.0}),
    ("status", {"status": "asleep"}),
    ("status", {"task": "t-9", "status": None}),
    ("task", {"task": "x" * 257}),
    ("task", {"task": ""}),
    ("colour", {"colour": "red"}),
    ("agent", {"agent": "someone-else"}),
])
def test_heartbeat_update_rejects_bad_values_and_changes_nothing(db_path, bus, agent, field,
                                                                 changes):
    with Heartbeat(db_path, agent, interval=30.0, status="idle", task="t-1",
                   progress=0.1) as hb:
        wait_until(lambda: hb.beats == 1, "beaten once")
        with pytest.raises(ValidationFailed) as info:
            hb.update(**changes)
        assert info.value.field == field
        hb.update(task="t-2")  # a good update: its beat shows what the bad one left
        wait_until(lambda: row_of(bus, agent)[3] == "t-2", "updated")
        assert row_of(bus, agent)[2:] == ("idle", "t-2", 0.1)
    # Read once the thread has stopped: a beat's row is visible a moment before
    # the thread counts it.
    assert hb.beats == 2  # the refused update sent no beat of its own
    assert heartbeat_threads(agent) == []


@pytest.mark.parametrize("field, arguments", [
    ("interval", {"interval": 0}),
    ("interval", {"interval": -1.0}),
    ("interval", {"interval": math.nan}),
    ("interval", {"interval": math.inf}),
    ("interval", {"interval": "10"}),
    ("interval", {"interval": None}),
    ("agent", {"agent": "a b"}),
    ("status", {"status": "asleep"}),
    ("progress", {"progress": 50}),
    ("task", {"task": ""}),
])
def test_heartbeat_rejects_bad_arguments_before_starting(db_path, bus, agent, field, arguments):
    call = {"agent": agent, "interval": 1.0, **arguments}
    name, interval = call.pop("agent"), call.pop("interval")
    with pytest.raises(ValidationFailed) as info:
        Heartbeat(db_path, name, interval, **call)
    assert info.value.field == field
    assert heartbeat_threads(name) == []
    assert rows(bus) == []


def test_heartbeat_on_a_missing_database_fails_in_the_caller(tmp_path, agent):
    missing = tmp_path / "missing.db"
    with pytest.raises(BusNotFound):
        with Heartbeat(missing, agent, interval=0.01):
            pytest.fail("the block must not run")
    assert heartbeat_threads(agent) == []
    assert not missing.exists()


def test_heartbeat_cannot_be_started_twice(db_path, bus, agent):
    with Heartbeat(db_path, agent, interval=30.0) as hb:
        with pytest.raises(BusError):
            hb.start()
        assert len(heartbeat_threads(agent)) == 1
    assert heartbeat_threads(agent) == []


def test_heartbeat_keeps_an_agent_alive_through_a_blocking_call(db_path, bus, agent):
    samples: list[list[Liveness]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            with Bus.open(db_path) as own:  # another thread, its own Bus and connection
                while not stop.is_set():
                    samples.append(own.heartbeats.liveness(thresholds=QUICK))
                    stop.wait(0.1)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    sampler = threading.Thread(target=sample, name="sampler")
    with Heartbeat(db_path, agent, interval=0.2, status="working", task="t-1") as hb:
        wait_until(lambda: hb.beats >= 1, "beaten once")
        sampler.start()
        try:
            time.sleep(3.0)  # the blocking call (an LLM request, a subprocess...)
        finally:
            stop.set()
            sampler.join(SHORT_TIMEOUT)
        beats = hb.beats
    assert not sampler.is_alive()
    assert not failures, failures
    assert len(samples) >= 15, f"only {len(samples)} samples in 3 s"
    states = [[(item.agent, item.state) for item in sample] for sample in samples]
    assert all(found == [(agent, "alive")] for found in states), states
    assert beats >= 10
    assert heartbeat_threads(agent) == []


def test_heartbeat_keeps_a_cpu_bound_process_alive(db_path, bus, children):
    child = children.start("busy", "busy-beat", str(db_path), "--agent", "busy",
                           "--interval", "0.2", "--seconds", "3")
    assert child.read_line(STARTUP_TIMEOUT) == "beating"
    samples = []
    deadline = time.monotonic() + SHORT_TIMEOUT
    while (line := child.next_line(timeout=0.1)) is None:  # sample every 0.1 s until it is done
        assert time.monotonic() < deadline, child.describe()
        samples.append([(item.agent, item.state, item.age_s)
                        for item in bus.heartbeats.liveness(thresholds=QUICK)])
    report = json.loads(line)
    child.wait_ok(SHORT_TIMEOUT)
    assert len(samples) >= 15, f"only {len(samples)} samples in 3 s"
    assert all(len(found) == 1 and found[0][:2] == ("busy", "alive") for found in samples), (
        samples)
    assert report["beats"] >= 10, report
    assert report["spins"] > 0


def test_heartbeat_of_a_killed_process_goes_warn_stale_dead(db_path, bus, children):
    child = children.start("victim", "beat", str(db_path), "--agent", "victim",
                           "--interval", "0.05", "--status", "working", "--task", "t-7",
                           "--progress", "0.5")
    assert json.loads(child.read_line(STARTUP_TIMEOUT))["beats"] >= 3
    child.kill(SHORT_TIMEOUT)
    [last] = bus.heartbeats.liveness()
    ts = last.ts_ms
    assert (last.agent, last.status, last.task, last.progress) == ("victim", "working", "t-7", 0.5)

    for silent_ms, state in [(0, "alive"), (29_999, "alive"), (30_000, "warn"),
                             (99_999, "warn"), (100_000, "stale"), (299_999, "stale"),
                             (300_000, "dead"), (3_600_000, "dead")]:
        assert bus.heartbeats.liveness(now=ts + silent_ms) == [
            Liveness("victim", state, silent_ms / 1000, "working", "t-7", 0.5, ts)], silent_ms
    beat_at(bus, "bystander", ts + 300_000)
    assert [(item.agent, item.state) for item in bus.heartbeats.liveness(now=ts + 300_000)] == [
        ("victim", "dead"), ("bystander", "alive")]
    # nothing beat for the victim after it was killed
    assert row_of(bus, "victim")[1] == ts


def test_presence_maps_a_sessions_moments_to_beats_and_keeps_the_task(bus: Bus):
    conn = bus.conn
    heartbeats.beat(conn, "w1", "working", "t1", 0.5)
    for moment, status in [("started", "idle"), ("working", "working"), ("idle", "idle"),
                           ("ended", "stopped")]:
        heartbeats.presence(conn, "w1", moment)
        [row] = heartbeats.liveness(conn, heartbeats.now_ms(), Thresholds())
        assert (row.status, row.task, row.progress) == (status, "t1", 0.5)
    assert row.state == "stopped"  # an ended session is never shown live
    with pytest.raises(ValidationFailed, match="moment: 'gone' is not one of: started,"):
        heartbeats.presence(conn, "w1", "gone")


@pytest.mark.parametrize("moment", list(heartbeats.PRESENCE_STATUS))
@pytest.mark.parametrize("before", heartbeats.STATUSES)
def test_presence_is_fresh_exactly_when_the_beat_would_change_nothing_but_its_time(
        bus: Bus, before: str, moment: str):
    """The hook's fast path skips a presence beat it judges fresh (bus/log/glance.py): that is
    right only when the beat would write every column as it is, bar the time."""
    conn = bus.conn
    heartbeats.beat(conn, "w1", before, "t1", 0.5)
    fresh = glance.presence_is_fresh(conn, "w1", moment)
    row_sql = "SELECT status, current_task, progress FROM heartbeats WHERE agent_id = 'w1'"
    kept = conn.execute(row_sql).fetchone()
    seq = bus.poll("observer", 1000)[-1].seq if bus.poll("observer", 1000) else 0
    heartbeats.presence(conn, "w1", moment)
    after = conn.execute(row_sql).fetchone()
    published = [m for m in bus.poll("observer", 1000) if m.seq > seq]
    assert fresh == (after == kept and published == [])
