"""The task graph (bus/coordination/tasks.py): dependencies, cycles, the ready list,
claim_next, done and cancel, against real files and real processes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from bus import Bus
from bus.coordination.claims import StaleFence
from bus.storage.errors import NotTaskHolder
from bus.storage.errors import TaskCycle
from bus.storage.errors import TaskStateConflict
from bus.storage.errors import UnknownTask
from bus.storage.errors import ValidationFailed
from tests.support.children import Barrier
from tests.support.children import Children
from tests.support.properties import scaled_settings

T0 = 1_700_000_000_000
PROGRAM = Path(__file__).parent.parent / "support" / "procs_tasks.py"
STARTUP_TIMEOUT = 60.0
RUN_TIMEOUT = 120.0


def ids(found) -> list[str]:
    return [t.task_id for t in found]


def log_types(bus: Bus, task: str) -> list[str]:
    return [m.type for m in bus.list_messages(0, 1000) if m.correlation_id == task]


# --- adding and the ready list ---------------------------------------------------


def test_tasks_ready_lists_most_urgent_first_then_oldest(bus):
    bus.tasks.add("low", priority=4, now=T0)
    bus.tasks.add("old", now=T0)
    bus.tasks.add("urgent", priority=0, now=T0 + 5)
    bus.tasks.add("new", now=T0)  # the same ms as "old": creation order decides
    assert ids(bus.tasks.ready(now=T0 + 10)) == ["urgent", "old", "new", "low"]
    assert ids(bus.tasks.ready(2, now=T0 + 10)) == ["urgent", "old"]


def test_tasks_wait_for_every_dependency_to_be_done(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", now=T0)
    bus.tasks.add("c", after=["a", "b"], now=T0)
    assert ids(bus.tasks.ready(now=T0)) == ["a", "b"]
    for task in ("a", "b"):
        assert bus.claims.claim(task, "w", now=T0)
        bus.tasks.complete(task, "w", now=T0)
        waiting = bus.tasks.find("c").waiting_on
        assert waiting == (1 if task == "a" else 0)
    assert ids(bus.tasks.ready(now=T0)) == ["c"]


def test_tasks_a_dependency_done_already_is_not_waited_on(bus):
    bus.tasks.add("a", now=T0)
    bus.claims.claim("a", "w", now=T0)
    bus.tasks.complete("a", "w", now=T0)
    added = bus.tasks.add("b", after=["a"], now=T0)
    assert added.waiting_on == 0 and ids(bus.tasks.ready(now=T0)) == ["b"]


def test_tasks_unknown_dependency_is_refused_and_nothing_is_added(bus):
    bus.tasks.add("a", now=T0)
    with pytest.raises(UnknownTask) as refused:
        bus.tasks.add("b", after=["a", "nope"], now=T0)
    assert refused.value.field == "after" and "'nope'" in str(refused.value)
    assert bus.tasks.find("b") is None and ids(bus.tasks.list()) == ["a"]


def test_tasks_an_id_in_use_is_refused(bus):
    bus.tasks.add("a", title="first", now=T0)
    with pytest.raises(ValidationFailed) as refused:
        bus.tasks.add("a", title="second", now=T0)
    assert refused.value.field == "task" and "task depend" in str(refused.value)
    assert bus.tasks.find("a").title == "first"


def test_tasks_a_cycle_is_refused_with_its_path(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", after=["a"], now=T0)
    bus.tasks.add("c", after=["b"], now=T0)
    with pytest.raises(TaskCycle) as refused:
        bus.tasks.add_dependencies("a", ["c"])
    assert refused.value.cycle == ["a", "c", "b", "a"]
    assert refused.value.field == "after" and "a -> c -> b -> a" in str(refused.value)
    with pytest.raises(TaskCycle) as itself:
        bus.tasks.add_dependencies("a", ["a"])
    assert itself.value.cycle == ["a", "a"]
    assert bus.tasks.detail("a").dependencies == [] and ids(bus.tasks.ready(now=T0)) == ["a"]


def test_tasks_priority_outside_zero_to_four_is_refused(bus):
    for bad in (-1, 5, True, "1"):
        with pytest.raises(ValidationFailed) as refused:
            bus.tasks.add("a", priority=bad)
        assert refused.value.field == "priority" and "0 (most urgent) to 4" in str(refused.value)
    assert bus.tasks.list() == []


# --- leases -------------------------------------------------------------------


def test_tasks_a_live_lease_hides_a_task_until_it_expires(bus):
    bus.tasks.add("a", now=T0)
    assert bus.claims.claim("a", "w", 1000, now=T0)
    assert bus.tasks.ready(now=T0 + 999) == []
    assert ids(bus.tasks.ready(now=T0 + 1000)) == ["a"]
    counts = bus.tasks.counts(now=T0 + 999)
    assert (counts.ready, counts.held, counts.blocked) == (0, 1, 0)


def test_tasks_claim_next_takes_the_first_ready_task_through_the_claim_code(bus):
    bus.tasks.add("later", priority=3, now=T0)
    bus.tasks.add("first", priority=1, title="Do it", now=T0)
    got = bus.tasks.claim_next("w1", 1000, now=T0)
    assert (got.task.task_id, got.claim.agent, got.claim.lease_until_ms) == ("first", "w1", T0 + 1000)
    assert bus.tasks.claim_next("w2", 1000, now=T0).task.task_id == "later"
    assert bus.tasks.claim_next("w3", 1000, now=T0) is None
    # The lease of w1 runs out: w3 takes it over, and the bus announces the takeover.
    again = bus.tasks.claim_next("w3", 1000, now=T0 + 1000)
    assert (again.task.task_id, again.claim.attempts) == ("first", 2)
    assert (got.fence, again.fence) == (1, 2)  # a new holder, a new fence
    assert "task_reclaimed" in log_types(bus, "first")


def test_tasks_claim_next_buries_a_task_out_of_attempts_and_takes_the_next(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", now=T0)
    assert bus.claims.claim("a", "w1", 100, max_attempts=1, now=T0)
    got = bus.tasks.claim_next("w2", 100, now=T0 + 100)
    assert got.task.task_id == "b"
    assert [d.task_id for d in bus.claims.dead()] == ["a"]
    assert "task_dead" in log_types(bus, "a")
    assert ids(bus.tasks.ready(now=T0 + 10_000)) == ["b"]  # a dead task is never ready again


# --- done and cancel ----------------------------------------------------------


def test_tasks_done_needs_the_holder_and_publishes_task_done(bus):
    bus.tasks.add("a", title="A", now=T0)
    bus.tasks.add("b", after=["a"], now=T0)
    with pytest.raises(NotTaskHolder) as nobody:
        bus.tasks.complete("a", "w1", now=T0)
    assert nobody.value.field == "agent" and "nobody holds it" in str(nobody.value)
    bus.tasks.claim_next("w1", now=T0)
    with pytest.raises(NotTaskHolder) as other:
        bus.tasks.complete("a", "w2", now=T0)
    assert "w1 holds it" in str(other.value)
    done = bus.tasks.complete("a", "w1", now=T0 + 5)
    assert (done.state, done.finished_by, done.finished_at_ms) == ("done", "w1", T0 + 5)
    assert bus.claims.list() == []  # its lease ended with it
    event = [m for m in bus.list_messages(0, 100) if m.type == "task_done"]
    assert [(m.from_agent, m.correlation_id) for m in event] == [("w1", "a")]
    assert event[0].payload["unblocked"] == ["b"] and event[0].payload["title"] == "A"
    with pytest.raises(TaskStateConflict) as twice:
        bus.tasks.complete("a", "w1", now=T0)
    assert "a is done" in str(twice.value)


def test_tasks_done_is_refused_while_the_task_waits_on_others(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", after=["a"], now=T0)
    assert bus.claims.claim("b", "w", now=T0)  # a plain claim can take a blocked task
    with pytest.raises(TaskStateConflict) as refused:
        bus.tasks.complete("b", "w", now=T0)
    assert "waiting on a" in str(refused.value)
    assert bus.tasks.find("b").state == "open"


def test_tasks_cancel_ends_the_lease_and_leaves_dependents_blocked(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", after=["a"], now=T0)
    bus.tasks.claim_next("w1", now=T0)
    cancelled = bus.tasks.cancel("a", reason="not needed", now=T0 + 1)
    assert cancelled.state == "cancelled" and bus.claims.list() == []
    assert bus.tasks.ready(now=T0 + 2) == [] and bus.tasks.find("b").waiting_on == 1
    [event] = [m for m in bus.list_messages(0, 100) if m.type == "task_cancelled"]
    assert event.payload == {"task": "a", "agent": "bus", "reason": "not needed",
                             "holder": "w1", "blocked": ["b"]}
    with pytest.raises(TaskStateConflict):
        bus.tasks.complete("a", "w1", now=T0 + 2)  # the task is no longer open
    counts = bus.tasks.counts(now=T0 + 2)
    assert (counts.ready, counts.blocked, counts.cancelled) == (0, 1, 1)


def test_tasks_done_and_cancelled_reach_the_export(bus, tmp_path):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", now=T0)
    bus.tasks.claim_next("w", now=T0)
    bus.tasks.complete("a", "w", now=T0)
    bus.tasks.cancel("b", "lead", now=T0)
    out = tmp_path / "bus.jsonl"
    bus.export_jsonl(out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["type"], r["from"], r["correlation_id"]) for r in lines
            if r["type"].startswith("task_")] == [("task_done", "w", "a"),
                                                   ("task_cancelled", "lead", "b")]


def test_tasks_detail_names_neighbours_holder_and_events(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", after=["a"], title="B", now=T0)
    bus.tasks.add("c", after=["b"], now=T0)
    bus.tasks.claim_next("w", 5000, now=T0)
    detail = bus.tasks.detail("b", now=T0 + 1)
    assert ids(detail.dependencies) == ["a"] and ids(detail.dependents) == ["c"]
    assert detail.holder is None and not detail.ready
    held = bus.tasks.detail("a", now=T0 + 1).to_json_dict()
    assert (held["holder"], held["lease_until_ms"], held["ready"]) == ("w", T0 + 5000, False)
    bus.tasks.complete("a", "w", now=T0 + 2)
    shown = bus.tasks.detail("a", now=T0 + 3).to_json_dict()
    assert [e["type"] for e in shown["events"]] == ["task_done"]
    assert shown["dependents"] == [{"task": "b", "title": "B", "state": "open"}]
    with pytest.raises(UnknownTask):
        bus.tasks.detail("zzz")


def test_tasks_list_by_state(bus):
    for name in "abc":
        bus.tasks.add(name, now=T0)
    bus.tasks.claim_next("w", now=T0)
    bus.tasks.complete("a", "w", now=T0)
    bus.tasks.cancel("c", now=T0)
    assert [(t.task_id, t.state) for t in bus.tasks.list()] == [
        ("a", "done"), ("b", "open"), ("c", "cancelled")]
    assert ids(bus.tasks.list("open")) == ["b"]
    with pytest.raises(ValidationFailed) as refused:
        bus.tasks.list("finished")
    assert refused.value.field == "state" and "open, done, cancelled" in str(refused.value)


def test_tasks_the_ready_query_reads_the_ready_index_in_order(bus):
    from bus.coordination import tasks
    plan = " ".join(row[3] for row in bus.conn.execute(
        "EXPLAIN QUERY PLAN " + tasks._READY_SQL, {"now": T0, "limit": 1}))
    assert "USING INDEX idx_tasks_ready" in plan and "TEMP B-TREE" not in plan


# --- properties on random graphs ------------------------------------------------


class ReferenceGraph:
    """The model: plain Python, computed apart from the bus's counters and indexes."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.priority: dict[str, int] = {}
        self.after: dict[str, set[str]] = {}
        self.state: dict[str, str] = {}
        self.lease: dict[str, tuple[str, int]] = {}  # task -> (holder, lease until)
        self.fence: dict[str, int] = {}  # task -> its last fence: one more at each new holder

    def ready(self, now: int) -> list[str]:
        found = [t for t in self.order if self.state[t] == "open"
                 and all(self.state[d] == "done" for d in self.after[t])
                 and not (t in self.lease and self.lease[t][1] > now)]
        return sorted(found, key=lambda t: (self.priority[t], self.order.index(t)))

    def reaches(self, start: str, goal: str) -> bool:
        """Does `start` depend on `goal`, directly or through others?"""
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(self.after[node])
        return False


class GraphMachine(RuleBasedStateMachine):
    """Random graphs built and worked on through the Bus; `ready` must equal the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.bus = Bus.open(Path(self.dir.name) / "bus.db")
        self.model = ReferenceGraph()
        self.now = T0

    def teardown(self) -> None:
        self.bus.close()
        self.dir.cleanup()

    def _task(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.model.order))

    @rule(priority=st.integers(0, 4), data=st.data())
    def add(self, priority: int, data: st.DataObject) -> None:
        name = f"t{len(self.model.order)}"
        after = data.draw(st.lists(st.sampled_from(self.model.order), max_size=4, unique=True)) \
            if self.model.order else []
        self.bus.tasks.add(name, after=after, priority=priority, now=self.now)
        self.model.order.append(name)
        self.model.priority[name], self.model.after[name] = priority, set(after)
        self.model.state[name] = "open"

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    def depend(self, data: st.DataObject) -> None:
        task, dependency = self._task(data), self._task(data)
        closes = self.model.reaches(dependency, task)
        if self.model.state[task] != "open":
            with pytest.raises(TaskStateConflict):
                self.bus.tasks.add_dependencies(task, [dependency])
            return
        if closes:
            with pytest.raises(TaskCycle) as refused:
                self.bus.tasks.add_dependencies(task, [dependency])
            cycle = refused.value.cycle
            assert cycle[0] == cycle[-1] == task and cycle[1] == dependency
            assert all(b in self.model.after[a] for a, b in zip(cycle[1:], cycle[2:]))
            return
        self.bus.tasks.add_dependencies(task, [dependency])
        self.model.after[task].add(dependency)

    @precondition(lambda self: self.model.order)
    @rule(data=st.data(), agent=st.sampled_from(["w1", "w2"]), lease=st.integers(1, 3000))
    def claim_next(self, data: st.DataObject, agent: str, lease: int) -> None:
        expected = self.model.ready(self.now)
        got = self.bus.tasks.claim_next(agent, lease, max_attempts=1_000_000, now=self.now)
        assert (got.task.task_id if got else None) == (expected[0] if expected else None)
        if got:
            task = got.task.task_id
            self.model.lease[task] = (agent, self.now + lease)
            self.model.fence[task] = self.model.fence.get(task, 0) + 1  # ready: no live lease
            assert got.fence == self.model.fence[task]

    def _finishable(self) -> list[str]:
        """Open tasks waiting on nothing, whose lease changed holder at least once."""
        return sorted(t for t, f in self.model.fence.items() if f > 1
                      and self.model.state[t] == "open"
                      and all(self.model.state[d] == "done" for d in self.model.after[t]))

    @precondition(lambda self: self._finishable())
    @rule(data=st.data())
    def complete_with_a_stale_fence(self, data: st.DataObject) -> None:
        task = data.draw(st.sampled_from(self._finishable()))
        stale = data.draw(st.integers(1, self.model.fence[task] - 1))
        agent = self.model.lease[task][0] if task in self.model.lease else "w1"
        with pytest.raises(StaleFence):
            self.bus.tasks.complete(task, agent, fence=stale, now=self.now)

    @precondition(lambda self: self.model.lease)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        task = data.draw(st.sampled_from(sorted(self.model.lease)))
        holder, _ = self.model.lease[task]
        waits = any(self.model.state[d] != "done" for d in self.model.after[task])
        if self.model.state[task] != "open" or waits:
            with pytest.raises(TaskStateConflict):
                self.bus.tasks.complete(task, holder, now=self.now)
            return
        self.bus.tasks.complete(task, holder, fence=self.model.fence[task], now=self.now)
        self.model.state[task] = "done"
        del self.model.lease[task]

    @precondition(lambda self: self.model.order)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task = self._task(data)
        if self.model.state[task] != "open":
            with pytest.raises(TaskStateConflict):
                self.bus.tasks.cancel(task, now=self.now)
            return
        self.bus.tasks.cancel(task, now=self.now)
        self.model.state[task] = "cancelled"
        self.model.lease.pop(task, None)

    @rule(ms=st.integers(1, 2000))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def ready_matches_the_reference(self) -> None:
        assert ids(self.bus.tasks.ready(now=self.now)) == self.model.ready(self.now)
        counts = self.bus.tasks.counts(now=self.now)
        assert counts.ready == len(self.model.ready(self.now))
        blocked = [t for t in self.model.order if self.model.state[t] == "open"
                   and any(self.model.state[d] != "done" for d in self.model.after[t])]
        assert counts.blocked == len(blocked)


GraphMachine.TestCase.settings = scaled_settings(max_examples=60, stateful_step_count=30)
test_tasks_ready_equals_the_reference_on_random_graphs = GraphMachine.TestCase


# --- real processes --------------------------------------------------------------


def test_tasks_sixteen_processes_claiming_next_get_every_task_once(tmp_path, python_env, db_path):
    with Bus.open(db_path) as bus:
        for n in range(200):
            bus.tasks.add(f"task-{n:03d}", priority=n % 5)
    started = Children(python_env, tmp_path / "stderr", PROGRAM)
    barrier = Barrier()
    try:
        agents = [started.start(f"agent-{n}", str(db_path), "--agent", f"agent-{n}",
                                "--go-fd", str(barrier.read_fd), pass_fds=(barrier.read_fd,))
                  for n in range(16)]
        barrier.release(agents, STARTUP_TIMEOUT)
        taken = {agent.name: json.loads(agent.read_line(RUN_TIMEOUT)) for agent in agents}
        for agent in agents:
            agent.wait_ok(RUN_TIMEOUT)
    finally:
        barrier.close()
        started.cleanup()
    every = [task for got in taken.values() for task in got]
    assert sorted(every) == [f"task-{n:03d}" for n in range(200)]  # each once, none lost
    with Bus.open(db_path) as bus:
        holders = {c.task_id: c.agent for c in bus.claims.list()}
    assert all(holders[task] == agent for agent, got in taken.items() for task in got)


def test_tasks_done_with_a_stale_fence_changes_nothing(bus):
    bus.tasks.add("a", now=T0)
    bus.tasks.add("b", after=["a"], now=T0)
    paused = bus.tasks.claim_next("w1", 1000, now=T0)
    taken = bus.tasks.claim_next("w2", 1000, now=T0 + 1000)  # w1's lease ran out meanwhile
    with pytest.raises(StaleFence) as stale:
        bus.tasks.complete("a", "w1", fence=paused.fence, now=T0 + 1001)
    assert (stale.value.field, stale.value.current) == ("fence", taken.fence)
    with pytest.raises(StaleFence):  # the new holder with the old fence: refused too
        bus.tasks.complete("a", "w2", fence=paused.fence, now=T0 + 1001)
    assert bus.tasks.find("a").state == "open" and bus.tasks.find("b").waiting_on == 1
    assert "task_done" not in log_types(bus, "a")
    bus.tasks.complete("a", "w2", fence=taken.fence, now=T0 + 1002)
    [event] = [m for m in bus.list_messages(0, 100) if m.type == "task_done"]
    assert (event.from_agent, event.payload["fence"]) == ("w2", taken.fence)
