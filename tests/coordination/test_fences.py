"""Fenced leases: each new holder of a task's lease gets a higher fence, and every
action passing an older fence (renew, release, publish, worker done) is refused
and changes nothing.

The library tests inject the clock (`now=`). A Hypothesis state machine checks
the fences against a model across claims, extensions, releases, expiries,
reaps and deaths. The paused-holder test runs real processes: a worker that
holds a task is stopped with SIGSTOP past its lease, another agent takes the
task, and once continued every one of its actions is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any
from typing import Callable

import pytest
from click.testing import CliRunner
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import rule

from bus import Bus
from bus import StaleFence
from bus import ValidationFailed
from bus.storage import schema
from bus.storage.db import write_transaction
from bus.coordination.heartbeats import Thresholds
from bus.log.messages import now_ms
from tests.support.children import Child
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import LATEST_VERSION
from tests.conftest import REPO_ROOT
from tests.support.waiting import wait_until
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from workers.cli import main as worker_main
from workers.lifecycle import Workers

T0 = 1_700_000_000_000
WAIT_S = 60.0  # deadline for a condition in the process test (the machine is shared)
HOLDER = Path(__file__).parent.parent / "support" / "procs_fences.py"


def everything(bus: Bus) -> tuple:
    """All a refused action could have changed."""
    tables = ("task_claims", "task_fences", "dead_claims", "messages", "workers", "heartbeats")
    return tuple(bus.conn.execute(f"SELECT * FROM {table}").fetchall() for table in tables)


def taken_over(bus: Bus, task: str = "t1", at: int = T0) -> tuple[int, int]:
    """alice holds `task` with fence 1 until `at` + 1000, bob takes it then: (1, 2)."""
    old = bus.claims.try_claim(task, "alice", 1_000, now=at).fence
    new = bus.claims.try_claim(task, "bob", 60_000, now=at + 1_000).fence
    return old, new


# --- which leases get a new fence ----------------------------------------------------------


def test_fence_starts_at_1_and_an_extension_keeps_it(bus: Bus) -> None:
    first = bus.claims.try_claim("t1", "alice", 1_000, now=T0)
    assert (first.granted, first.fence, first.claim.fence) == (True, 1, 1)
    again = bus.claims.try_claim("t1", "alice", 5_000, now=T0 + 999)
    assert again.fence == 1
    assert bus.claims.renew("t1", "alice", fence=1, now=T0 + 2_000)
    assert bus.claims.list()[0].fence == 1
    refused = bus.claims.try_claim("t1", "bob", now=T0 + 2_001)
    assert (refused.granted, refused.fence, refused.claim.fence) == (False, None, 1)


def test_each_new_holder_gets_the_next_fence_after_takeover_release_reap_and_expiry(
        bus: Bus) -> None:
    assert taken_over(bus) == (1, 2)
    assert bus.claims.release("t1", "bob", fence=2)
    assert bus.conn.execute("SELECT count(*) FROM task_claims").get == 0  # the row is gone
    assert bus.claims.try_claim("t1", "carol", 1_000, now=T0 + 2_000).fence == 3  # the fence is not
    # carol's own lease runs out and she claims again: a new lease, so a new fence
    assert bus.claims.try_claim("t1", "carol", 1_000, now=T0 + 3_000).fence == 4
    beat = bus.heartbeats.beat("dave")
    assert bus.claims.try_claim("t2", "dave", 600_000, now=beat).fence == 1
    assert [c.fence for c in bus.claims.reap(now=beat + 300_000)] == [1]
    assert bus.claims.try_claim("t2", "erin", now=beat + 300_000).fence == 2
    assert bus.conn.execute("SELECT * FROM task_fences ORDER BY task_id").fetchall() == [
        ("t1", 4), ("t2", 2)]


def test_a_dead_task_keeps_its_last_fence(bus: Bus) -> None:
    for n in range(2):
        taken = bus.claims.try_claim("t1", f"a{n}", 1_000, max_attempts=2, now=T0 + n * 1_000)
        assert taken.fence == n + 1
    assert bus.claims.try_claim("t1", "b", now=T0 + 2_000).just_died
    assert bus.conn.execute("SELECT fence FROM task_fences WHERE task_id = 't1'").get == 2
    with pytest.raises(StaleFence, match="the current fence of task t1 is 2 [(]nobody holds it"):
        bus.claims.release("t1", "a0", fence=1)


# --- refusals: renew, release, publish ------------------------------------------------------


def test_renew_with_a_stale_fence_is_refused_and_changes_nothing(bus: Bus) -> None:
    old, new = taken_over(bus)
    before = everything(bus)
    with pytest.raises(StaleFence) as refused:
        bus.claims.renew("t1", "alice", 60_000, fence=old, now=T0 + 1_001)
    error = refused.value
    assert (error.field, error.task, error.given, error.current) == ("fence", "t1", 1, 2)
    assert error.holder.agent == "bob"
    assert str(error).startswith("fence: 1 is stale: the current fence of task t1 is 2"
                                 " (held by bob until ")
    assert str(error).endswith("claim t1 again for a current fence")
    assert everything(bus) == before
    assert bus.claims.renew("t1", "bob", fence=new, now=T0 + 1_001)


def test_renew_without_a_fence_behaves_as_before(bus: Bus) -> None:
    taken_over(bus)
    # not the holder: False, no error
    assert bus.claims.renew("t1", "alice", now=T0 + 1_001) is False
    assert bus.claims.renew("t1", "bob", now=T0 + 1_001) is True


def test_release_with_a_stale_fence_is_refused_and_leaves_the_new_holder_alone(bus: Bus) -> None:
    old, new = taken_over(bus)
    before = everything(bus)
    with pytest.raises(StaleFence, match="1 is stale: the current fence of task t1 is 2"):
        bus.claims.release("t1", "alice", fence=old)
    assert everything(bus) == before
    # the new holder's fence is current; a fence that names no other holder still is not theirs
    assert bus.claims.release("t1", "alice", fence=new) is False
    assert bus.claims.release("t1", "bob", fence=new) is True


def test_a_fence_never_issued_is_refused(bus: Bus) -> None:
    bus.claims.try_claim("t1", "alice", now=T0)
    with pytest.raises(StaleFence, match="7 was never issued: the current fence of task t1 is 1"):
        bus.claims.renew("t1", "alice", fence=7, now=T0 + 1)
    with pytest.raises(StaleFence, match="1 was never issued: task t2 has never been claimed"):
        bus.claims.release("t2", "alice", fence=1)


@pytest.mark.parametrize("fence", [0, -1, True, 1.0, "1"])
def test_a_fence_that_is_no_fence_is_a_validation_error(bus: Bus, fence: object) -> None:
    bus.claims.try_claim("t1", "alice", now=T0)
    with pytest.raises(ValidationFailed) as refused:
        bus.claims.renew("t1", "alice", fence=fence, now=T0 + 1)
    assert refused.value.field == "fence"


def test_fence_stays_current_after_its_holder_released_until_the_next_claim(bus: Bus) -> None:
    fence = bus.claims.try_claim("t1", "alice", now=T0).fence
    bus.claims.release("t1", "alice", fence=fence)
    assert bus.publish("alice", "result", {"ok": True}, task="t1", fence=fence).seq
    bus.claims.try_claim("t1", "bob", now=T0 + 1)
    with pytest.raises(StaleFence):
        bus.publish("alice", "result", {"late": True}, task="t1", fence=fence)


def test_publish_with_a_stale_fence_writes_nothing_not_even_a_blob(bus: Bus, db_path: Path) -> None:
    old, new = taken_over(bus)
    before = everything(bus)
    large = {"log": "x" * 10_000}  # over the blob threshold: staged before the transaction
    for payload in ({"ok": True}, large):
        with pytest.raises(StaleFence, match="1 is stale: the current fence of task t1 is 2"):
            bus.publish("alice", "result", payload, task="t1", fence=old)
    assert everything(bus) == before
    blobs = db_path.parent / "blobs"
    assert not blobs.exists() or not [p for p in blobs.rglob("*") if p.is_file()]
    landed = bus.publish("bob", "result", large, task="t1", fence=new)
    [message] = [m for m in bus.list_messages() if m.seq == landed.seq]
    assert (message.from_agent, message.correlation_id, message.payload) == ("bob", "t1", large)


def test_publish_with_task_sets_the_correlation_id_and_checks_its_arguments(bus: Bus) -> None:
    sent = bus.publish("alice", "note", task="t9")  # no fence: no check, only the correlation
    assert bus.list_messages()[-1].correlation_id == "t9" and sent.seq
    with pytest.raises(ValidationFailed) as no_task:
        bus.publish("alice", "note", fence=1)
    assert no_task.value.field == "fence"
    with pytest.raises(ValidationFailed) as both:
        bus.publish("alice", "note", task="t1", correlation_id="other")
    assert both.value.field == "correlation_id"
    with pytest.raises(ValidationFailed) as empty:
        bus.publish("alice", "note", task="", fence=1)
    assert empty.value.field == "task"


def test_cli_publish_fence_without_task_is_a_usage_error(bus: Bus, db_path: Path) -> None:
    before = everything(bus)
    alone = run(["publish", "--from", "a", "--type", "r", "--fence", "1"], db_path)
    assert alone.exit_code == 2
    assert last_error(alone.stderr) == bad_value("--fence", "is the fence of a task: name the"
                                                            " task too")
    empty = run(["publish", "--from", "a", "--type", "r", "--task", "", "--fence", "1"], db_path)
    assert empty.exit_code == 2 and "Invalid value for '--task'" in empty.stderr
    assert everything(bus) == before


def test_a_fenced_publish_inside_a_callers_transaction_rolls_back_with_it(bus: Bus) -> None:
    old, _ = taken_over(bus)
    before = everything(bus)
    with pytest.raises(StaleFence):
        with write_transaction(bus.conn):
            bus.publish("alice", "before", {})
            bus.publish("alice", "result", {}, task="t1", fence=old)
    assert everything(bus) == before


# --- the command line -------------------------------------------------------------------


def test_cli_claim_json_gives_the_fence(bus: Bus, db_path: Path) -> None:
    first = json.loads(run(["claim", "--task", "t1", "--agent", "a", "--json"], db_path).stdout)
    assert (first["granted"], first["fence"], first["claim"]["fence"]) == (True, 1, 1)
    refused = run(["claim", "--task", "t1", "--agent", "b", "--json"], db_path)
    assert refused.exit_code == 1
    assert json.loads(refused.stdout)["fence"] is None


@pytest.mark.parametrize("args", [
    ["renew", "--task", "t1", "--agent", "alice", "--fence", "1"],
    ["release", "--task", "t1", "--agent", "alice", "--fence", "1"],
    ["publish", "--from", "alice", "--type", "result", "--task", "t1", "--fence", "1"],
])
def test_cli_stale_fence_exits_1_naming_the_flag_and_the_current_fence(
        bus: Bus, db_path: Path, args: list[str]) -> None:
    taken_over(bus, at=now_ms() - 1_000)
    before = everything(bus)
    text = run(args, db_path)
    assert (text.exit_code, text.stdout) == (1, "")
    assert text.stderr.startswith("Error: --fence 1 is stale: the current fence of task t1 is 2"
                                  " (held by bob until ")
    as_json = run([*args, "--json"], db_path)
    assert as_json.exit_code == 1
    error = json.loads(as_json.stderr)
    assert error["field"] == "--fence"
    assert error["error"] == text.stderr.removeprefix("Error: ").rstrip("\n")
    assert everything(bus) == before


def test_cli_current_fence_works_and_no_fence_is_as_before(bus: Bus, db_path: Path) -> None:
    taken_over(bus, at=now_ms() - 1_000)
    assert run(["renew", "--task", "t1", "--agent", "bob", "--fence", "2"], db_path).exit_code == 0
    sent = run(["publish", "--from", "bob", "--type", "result", "--task", "t1", "--fence", "2",
                "--json"], db_path)
    assert sent.exit_code == 0 and not json.loads(sent.stdout)["duplicate"]
    assert run(["renew", "--task", "t1", "--agent", "bob"], db_path).exit_code == 0
    assert run(["release", "--task", "t1", "--agent", "bob", "--fence", "2"],
               db_path).stdout == "bob released t1\n"


# --- worker done ---------------------------------------------------------------------------


def test_worker_done_with_a_stale_fence_is_refused_and_the_worker_keeps_working(
        ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1", lease_ms=1)
    fence = bus.claims.list()[0].fence
    until = bus.claims.list()[0].lease_until_ms
    wait_until(lambda: now_ms() > until, "w1's lease to run out")
    assert bus.claims.try_claim("t1", "bob").fence == fence + 1
    before = everything(bus)
    with pytest.raises(StaleFence, match=f"{fence} is stale: the current fence of task t1 is"
                                         f" {fence + 1} [(]held by bob"):
        ws.done("w1", allow_empty=True, fence=fence)
    assert everything(bus) == before
    assert ws.get("w1").state == "WORKING"

    refused = CliRunner().invoke(worker_main, ["--db", bus.path, "done", "w1", "--allow-empty",
                                               "--fence", str(fence), "--json"])
    assert refused.exit_code == 1
    assert json.loads(refused.stderr)["field"] == "--fence"
    assert everything(bus) == before


def test_worker_done_with_its_current_fence_hands_the_work_in(ws: Workers, bus: Bus,
                                                              repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1")
    fence = bus.claims.list()[0].fence
    assert ws.done("w1", allow_empty=True, fence=fence).state == "IN_REVIEW"
    assert bus.claims.list() == []


# --- MCP -------------------------------------------------------------------------------------


def test_mcp_claim_gives_the_fence_and_a_stale_one_is_refused(bus: Bus, db_path: Path) -> None:
    from tests.mcp.test_mcp import call
    from tests.mcp.test_mcp import connected
    from tests.mcp.test_mcp import refused

    async def scenario() -> tuple[Any, ...]:
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            mine = await call(alice, "claim", task="t1", lease_ms=1)
            until = mine["claim"]["lease_until_ms"]
            while now_ms() <= until:
                await asyncio.sleep(0.001)
            theirs = await call(bob, "claim", task="t1")
            renew = await refused(alice, "renew", task="t1", fence=mine["fence"])
            release = await refused(alice, "release", task="t1", fence=mine["fence"])
            publish = await refused(alice, "publish", type="result", task="t1",
                                    fence=mine["fence"])
            landed = await call(bob, "publish", type="result", task="t1", fence=theirs["fence"])
            return mine, theirs, renew, release, publish, landed

    mine, theirs, *errors, landed = asyncio.run(scenario())
    assert (mine["fence"], mine["claim"]["fence"], theirs["fence"]) == (1, 1, 2)
    for error in errors:
        assert "fence: 1 is stale: the current fence of task t1 is 2 (held by bob" in error
    assert [(m.from_agent, m.type) for m in bus.list_messages() if m.type == "result"] == [
        ("bob", "result")]
    assert landed["seq"]


def test_mcp_worker_done_with_a_stale_fence_is_refused(bus: Bus, db_path: Path,
                                                      repo: Path) -> None:
    from tests.mcp.test_mcp import call
    from tests.mcp.test_mcp import connected
    from tests.mcp.test_mcp import refused

    Workers(bus).spawn("t1", "w1", repo)

    async def scenario() -> tuple[Any, ...]:
        async with connected(db_path, "w1") as w1:
            await call(w1, "worker_start", lease_ms=1)
            mine = bus.claims.list()[0]
            while now_ms() <= mine.lease_until_ms:
                await asyncio.sleep(0.001)
            theirs = bus.claims.try_claim("t1", "bob")
            before = everything(bus)
            error = await refused(w1, "worker_done", allow_empty=True, fence=mine.fence)
            return mine, theirs, before, error

    mine, theirs, before, error = asyncio.run(scenario())
    assert theirs.fence == mine.fence + 1
    assert (f"fence: {mine.fence} is stale: the current fence of task t1 is {theirs.fence}"
            " (held by bob") in error
    assert everything(bus) == before
    assert Workers(bus).get("w1").state == "WORKING"


# --- property: fences against a model ------------------------------------------------------


class FenceMachine(RuleBasedStateMachine):
    """Claims, extensions, renewals, releases, expiries, reaps and deaths on a few
    tasks; a model says which fence each grant must carry: the holder's own
    while its lease runs, else one more than any the task ever had."""

    agents = st.sampled_from(["a", "b", "c"])
    tasks = st.sampled_from(["t1", "t2"])

    def __init__(self) -> None:
        super().__init__()
        self.bus: Bus | None = None
        self.issued: dict[str, list[int]] = {}   # task -> every fence granted to a new lease
        self.lease: dict[str, tuple[str, int, int]] = {}  # task -> (holder, until, fence)
        self.dead: set[str] = set()

    @initialize()
    def open_bus(self) -> None:
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.bus = Bus.open(Path(self.dir.name) / "bus.db")
        self.beat = self.bus.heartbeats.beat("c")  # c's only beat: reaps find it dead later on
        self.now = self.beat + 1

    def teardown(self) -> None:
        if self.bus is not None:
            self.bus.close()
            self.dir.cleanup()

    def last(self, task: str) -> int:
        return max(self.issued.get(task, [0]))

    @rule(task=tasks, agent=agents, lease=st.integers(1, 50), attempts=st.integers(3, 8))
    def claim(self, task: str, agent: str, lease: int, attempts: int) -> None:
        result = self.bus.claims.try_claim(task, agent, lease, max_attempts=attempts, now=self.now)
        held = self.lease.get(task)
        if result.dead is not None:
            event("a dead task")
            self.dead.add(task)
            self.lease.pop(task, None)
            assert not result.granted
            return
        if not result.granted:
            assert held is not None and held[0] != agent and held[1] > self.now
            assert result.claim.fence == held[2]
            return
        if held is not None and held[0] == agent and held[1] > self.now:
            assert result.fence == held[2], "an extension keeps its fence"
        else:
            assert result.fence == self.last(task) + 1, "a new lease: one more than any before"
            event("a new lease" if held is None else "a takeover or a claim after expiry")
            assert result.fence not in self.issued.get(task, [])
            self.issued.setdefault(task, []).append(result.fence)
        self.lease[task] = (agent, result.claim.lease_until_ms, result.fence)

    def passed_fence(self, task: str, stale: bool) -> int:
        """The task's current fence, or the one before it (0: there is none to pass)."""
        return max(self.last(task) - 1 if stale else self.last(task), 0)

    @staticmethod
    def refused(action: Callable[[], object], what: str) -> None:
        with pytest.raises(StaleFence):
            action()
        event(what)

    @rule(task=tasks, agent=agents, stale=st.booleans())
    def renew(self, task: str, agent: str, stale: bool) -> None:
        if not (fence := self.passed_fence(task, stale)):
            return
        if stale:
            return self.refused(
                lambda: self.bus.claims.renew(task, agent, fence=fence, now=self.now),
                "a stale renew refused")
        renewed = self.bus.claims.renew(task, agent, fence=fence, now=self.now)
        held = self.lease.get(task)
        assert renewed == (held is not None and held[0] == agent and held[1] > self.now)
        if renewed:
            until = {c.task_id: c.lease_until_ms for c in self.bus.claims.list()}[task]
            self.lease[task] = (agent, until, held[2])

    @rule(task=tasks, agent=agents, stale=st.booleans())
    def release(self, task: str, agent: str, stale: bool) -> None:
        if not (fence := self.passed_fence(task, stale)):
            return
        if stale:
            return self.refused(lambda: self.bus.claims.release(task, agent, fence=fence),
                                "a stale release refused")
        released = self.bus.claims.release(task, agent, fence=fence)
        held = self.lease.get(task)
        assert released == (held is not None and held[0] == agent)
        if released:
            del self.lease[task]

    @rule(ms=st.integers(1, 60))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule()
    def reap(self) -> None:
        reaped = self.bus.claims.reap(now=self.now, thresholds=Thresholds(0.001, 0.001, 0.001))
        for claim in reaped:
            event("a lease reaped")
            assert claim.agent == "c"
            holder, _, fence = self.lease[claim.task_id]
            self.lease[claim.task_id] = (holder, self.now, fence)

    @invariant()
    def fences_match_the_model(self) -> None:
        if self.bus is None:
            return
        rows = dict(self.bus.conn.execute("SELECT task_id, fence FROM task_fences").fetchall())
        assert rows == {task: self.last(task) for task in self.issued}
        for task, fences in self.issued.items():
            assert fences == list(range(1, len(fences) + 1)), "strictly increasing, no repeat"
        claims = {c.task_id: c.fence for c in self.bus.claims.list()}
        assert claims == {task: fence for task, (_, _, fence) in self.lease.items()}


test_fences_grow_with_each_new_holder_and_never_repeat = FenceMachine.TestCase


# --- real processes: the paused holder -------------------------------------------------------


def test_a_paused_holder_is_refused_everything_once_another_took_its_task(
        ws: Workers, bus: Bus, db_path: Path, repo: Path, tmp_path: Path) -> None:
    ws.spawn("t1", "w1", repo)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    holder = Child("holder", HOLDER, [str(db_path), "w1", "3000"], env, tmp_path / "holder.txt")
    try:
        claimed = json.loads(holder.read_line(WAIT_S))
        os.kill(holder.pid, signal.SIGSTOP)  # paused mid-work, its lease still running
        fence = claimed["fence"]
        wait_until(lambda: now_ms() > bus.claims.list()[0].lease_until_ms, "the lease to run out")

        taken = run(["claim", "--task", "t1", "--agent", "bob", "--json"], db_path)
        new_fence = json.loads(taken.stdout)["fence"]
        assert new_fence == fence + 1
        work = run(["publish", "--from", "bob", "--type", "result", "--task", "t1",
                    "--fence", str(new_fence), "--payload", '{"by": "bob"}'], db_path)
        assert work.exit_code == 0, work.stderr
        before = everything(bus)

        os.kill(holder.pid, signal.SIGCONT)
        report = json.loads(holder.read_line(WAIT_S))
        holder.wait_ok(WAIT_S)
    finally:
        if holder.proc.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
        holder.cleanup()

    current = f"the current fence of task t1 is {new_fence} (held by bob until "
    assert report["renew"].startswith(f"fence: {fence} is stale: {current}")
    for action in ("release", "publish", "done"):
        outcome = report[action]
        assert outcome["exit"] == 1, (action, outcome)
        assert outcome["error"]["field"] == "--fence", (action, outcome)
        assert outcome["error"]["error"].startswith(f"--fence {fence} is stale: {current}"), (
            action, outcome)
        assert outcome["stdout"] == "", (action, outcome)
    assert everything(bus) == before  # nothing the woken holder tried changed the file
    [claim] = bus.claims.list()
    assert (claim.agent, claim.fence) == ("bob", new_fence)
    results = [(m.from_agent, m.payload) for m in bus.list_messages() if m.type == "result"]
    assert results == [("bob", {"by": "bob"})]
    assert ws.get("w1").state == "WORKING"  # its work was not handed in
    assert not [m for m in bus.list_messages() if m.type in ("task_done", "review_request")]


def test_claims_made_before_the_keyed_table_survive_its_migration(
        db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose task_claims was a rowid table keeps every lease, fence and attempt
    when the table becomes WITHOUT ROWID, and its holders go on with their fences."""
    older = tmp_path / "migrations-v16"
    older.mkdir()
    for migration in schema.available_migrations()[:16]:
        shutil.copy(migration.path, older / migration.path.name)
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", older)
    t0 = 1_800_000_000_000
    with Bus.open(db_path) as bus:
        held = bus.claims.try_claim("held", "w1", lease_ms=60_000, now=t0)
        bus.claims.try_claim("taken", "w1", lease_ms=10, now=t0)
        taken = bus.claims.try_claim("taken", "w2", lease_ms=60_000, now=t0 + 1_000)
        before = bus.claims.list()
    monkeypatch.undo()
    with Bus.open(db_path) as bus:
        assert bus.schema_version() == LATEST_VERSION
        assert bus.claims.list() == before
        assert (held.fence, taken.fence) == (1, 2)
        keyed = bus.conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'task_claims'").get
        assert keyed.rstrip().endswith("WITHOUT ROWID")
        assert bus.claims.renew("taken", "w2", fence=2, now=t0 + 2_000)
        assert bus.claims.release("held", "w1", fence=1)
        assert bus.claims.try_claim("held", "w3", now=t0 + 3_000).fence == 2
