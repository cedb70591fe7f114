"""Every view renders every state the bus can reach: a Hypothesis state machine.

The rules are real operations on a real bus file: publish and ack, heartbeats in
every status (`stopped` too) and forget, claims with renewals, releases, expiries
and reaping, worker transitions on a real git repository, a channel with
deliveries, acks and dead letters, a pump run until idle, call threads, the
export. The clock is injected (`now`) wherever the bus takes one, and stepped by
a rule. After every step each view renders the status: `bus status` (text and
--json), `bus consumers`, `bus consumer info`, the tables and summary of `bus top`,
and the snapshot `bus serve` sends its page. None may raise, and the numbers must
add up, with each other and with a model of what the rules did.
"""

from __future__ import annotations

import asyncio

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import orjson
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule
from hypothesis.stateful import run_state_machine_as_test
from starlette.applications import Starlette

from bus import Bus
from bus.channels.engine import Channels
from bus.storage.db import connect
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import LIVENESS_STATES
from bus.coordination.heartbeats import STATUSES
from bus.coordination.heartbeats import AgentHoldsClaims
from bus.coordination.heartbeats import Thresholds
from bus.coordination.heartbeats import beat
from bus.log.messages import now_ms
from bus.pump import Pump
from bus.pump import client
from bus.pump.organism import parse_organism
from bus.pump.threads import ThreadRegistry
from bus.coordination.reservations import ReservationConflict
from bus.views.render import status_lines
from bus.views.routes import routes as console_routes
from bus.views.serve import snapshot
from bus.views.status import EXPORTER
from bus.views.status import Status
from bus.views.status import read_status
from bus.views.details import task_rows
from bus.views.top import TABLES
from bus.views.top import Opened
from bus.views.top import detail_lines
from bus.views.top import summary_lines
from bus.views.top import table_cells
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import run
from tests.support.procs_workers import make_repo
from tests.support.properties import scaled_settings
from tests.support.worker_fixtures import isolate_git
from workers import machine
from workers.lifecycle import Workers

AGENTS = ("a1", "a2", "a3")
GRAPH_TASKS = ("g1", "g2", "g3")  # the task graph's, claimed by GRAPH_AGENT only
GRAPH_AGENT = "g-agent"
TASKS = ("t1", "t2", "t3")
WORKERS = {"w1": "job1", "w2": "job2"}  # worker -> its task
WORKER_COMMANDS = ("start", "done", "approve", "reject", "rework", "merge", "cancel", "fail")
ONWARD = "onward"  # the command that moves a worker on towards COMPLETED
ONWARD_BY_STATE = {machine.ASSIGNED: "start", machine.WORKING: "done",
                   machine.IN_REVIEW: "approve", machine.APPROVED: "merge"}
CHANNEL = "jobs"
OWNER = "boss"
MEMBERS = ("a1", "a2")  # a3 is not one: what it sends is refused
ACK_TIMEOUT_MS = 1000
MAX_ATTEMPTS = 2
ORGANISM = """\
name: org
listeners:
  - name: echo
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:echo
    max_attempts: 1
"""
SECONDS = st.sampled_from([0.5, 2, 31, 70, 101, 301, 3600])
RESERVE_PATTERNS = ("src/**", "src/a.py", "*.md", "/docs/", "src/[ab]*")
DEAD_MS = Thresholds.to_ms(Thresholds().dead)


def asgi_get(app: Starlette, path: str) -> tuple[int, str]:
    """GET `path` from the ASGI `app` in this process: (status, body)."""
    target, _, query = path.partition("?")
    scope = {"type": "http", "method": "GET", "path": target, "raw_path": target.encode(),
             "query_string": query.encode(), "headers": [], "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": "",
             "http_version": "1.1", "asgi": {"version": "3.0"}}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body.decode()


class ViewsGame(RuleBasedStateMachine):
    """Real operations on one bus; after each, every view renders and the counts add up."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="views-game-"))
        self.path = self.root / "state" / "bus.db"
        self.bus = Bus.open(self.path)
        self.now = now_ms()
        self.channels = Channels(self.bus, clock=lambda: self.now)
        self.repo: Path | None = None
        self.ws: Workers | None = None
        # The model: what the rules did, as the views must show it.
        self.beats: dict[str, tuple[int, str]] = {}  # agent -> (ts, status)
        self.claims: dict[str, tuple[str, int]] = {}  # task -> (holder, lease end)
        self.dead_claims = 0
        self.cursors: dict[str, int] = {}
        self.exported: int | None = None
        self.workers: dict[str, str] = {}  # worker -> state
        self.stopped_workers: set[str] = set()  # whose last beat says stopped
        self.reworking: set[str] = set()  # sent back to WORKING after done: they beat working
        self.channels.create_channel(CHANNEL, "group", OWNER, max_retries=0,
                                     ack_timeout=ACK_TIMEOUT_MS / 1000)
        for member in MEMBERS:
            self.channels.join_channel(CHANNEL, member)
        self.members = {OWNER, *MEMBERS}
        self.deliveries: dict[tuple[int, str], tuple[str, int | None]] = {}  # -> (state, deadline)
        self.pump_ran = False
        self.closed_threads: set[str] = set()
        self.open_threads: set[str] = set()

    def teardown(self) -> None:
        self.bus.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- the log ------------------------------------------------------------------------

    @rule(sender=st.sampled_from(AGENTS + (OWNER,)), to=st.sampled_from(AGENTS + (None,)))
    def publish(self, sender: str, to: str | None) -> None:
        self.bus.publish(sender, "note", {"n": 1}, to=to)

    @precondition(lambda self: self.bus.last_seq() > 0)
    @rule(agent=st.sampled_from(AGENTS), back=st.integers(0, 4))
    def ack(self, agent: str, back: int) -> None:
        seq = max(1, self.bus.last_seq() - back)
        self.cursors[agent] = max(self.cursors.get(agent, 0), seq)  # forward only
        # include_own: the cursor lands on `seq` itself, not past the agent's own broadcasts
        # after it (that rule has its own model in test_bus_stateful.py).
        assert self.bus.ack(agent, seq, include_own=True) == self.cursors[agent]

    @rule(agent=st.sampled_from(AGENTS))
    def delete_cursor(self, agent: str) -> None:
        try:
            self.bus.delete_cursor(agent)
        except BusError:
            assert agent not in self.cursors
        else:
            del self.cursors[agent]

    @rule()
    def export(self) -> None:
        self.bus.export_jsonl()
        self.exported = self.bus.last_seq()

    # --- heartbeats and claims -------------------------------------------------------

    @rule(seconds=SECONDS)
    def time_passes(self, seconds: float) -> None:
        self.now += int(seconds * 1000)

    @rule(agent=st.sampled_from(AGENTS), status=st.sampled_from(STATUSES),
          task=st.sampled_from(TASKS + (None,)),
          progress=st.sampled_from([None, 0.0, 0.5, 1.0]))
    def heartbeat(self, agent: str, status: str, task: str | None,
                  progress: float | None) -> None:
        beat(self.bus.conn, agent, status, task, progress, now=self.now)
        self.beats[agent] = (self.now, status)

    @rule(agent=st.sampled_from(AGENTS))
    def forget(self, agent: str) -> None:
        holds = any(holder == agent for holder, _ in self.claims.values())
        try:
            assert self.bus.heartbeats.forget(agent) == (agent in self.beats)
        except AgentHoldsClaims:
            assert holds
        else:
            assert not holds
            self.beats.pop(agent, None)

    @rule(op=st.sampled_from(["claim", "claim", "renew", "release"]),
          task=st.sampled_from(TASKS), agent=st.sampled_from(AGENTS),
          lease_s=st.sampled_from([None, 1, 8, 600]))
    def lease(self, op: str, task: str, agent: str, lease_s: int | None) -> None:
        lease = None if lease_s is None else lease_s * 1000
        if op == "claim":
            result = self.bus.claims.try_claim(task, agent, lease or 60_000,
                                               max_attempts=MAX_ATTEMPTS, now=self.now)
            if result.granted:
                self.claims[task] = (agent, self.now + (lease or 60_000))
            if result.just_died:
                self.dead_claims += 1
                self.claims.pop(task, None)
        elif op == "renew":
            if self.bus.claims.renew(task, agent, lease, now=self.now):
                holder, until = self.claims[task]
                assert holder == agent and until > self.now
                own = next(c for c in self.bus.claims.list() if c.task_id == task)
                self.claims[task] = (agent, self.now + (lease or own.lease_ms))
        elif self.bus.claims.release(task, agent):
            assert self.claims.pop(task)[0] == agent

    @rule(op=st.sampled_from(("claim-next", "claim-next", "done", "done", "cancel")),
          task=st.sampled_from(GRAPH_TASKS))
    def task_graph(self, op: str, task: str) -> None:
        """Build the graph the first time (g2 waits on g1, g3 on both); then claim-next,
        done or cancel (a refusal, such as finishing a task not held, is part of the game)."""
        if self.bus.tasks.find("g1") is None:
            for graph_task, after in zip(GRAPH_TASKS, ((), ("g1",), ("g1", "g2"))):
                self.bus.tasks.add(graph_task, after=after, now=self.now)
            return
        try:
            if op == "claim-next":
                self.bus.tasks.claim_next(GRAPH_AGENT, now=self.now)
            elif op == "done":
                self.bus.tasks.complete(task, GRAPH_AGENT, now=self.now)
            else:
                self.bus.tasks.cancel(task, GRAPH_AGENT, now=self.now)
        except BusError:
            pass

    @rule()
    def reap(self) -> None:
        for reaped in self.bus.claims.reap(now=self.now):
            if reaped.task_id in self.claims:
                self.claims[reaped.task_id] = (reaped.agent, self.now)

    @rule(agent=st.sampled_from(AGENTS + tuple(sorted(WORKERS))),
          patterns=st.lists(st.sampled_from(RESERVE_PATTERNS), min_size=1, max_size=2),
          shared=st.booleans(), ttl_s=st.sampled_from([1, 60, 7200]), release=st.booleans())
    def reserve(self, agent: str, patterns: list[str], shared: bool, ttl_s: int,
                release: bool) -> None:
        if release:
            self.bus.reservations.unreserve(agent, now=self.now)
            return
        try:
            self.bus.reservations.reserve(agent, patterns, mode="shared" if shared else "exclusive",
                                          ttl_ms=ttl_s * 1000, now=self.now)
        except ReservationConflict as exc:
            assert all(c.held.agent != agent for c in exc.conflicts)
        except ValidationFailed as exc:  # a holder whose reservation would end at once
            assert exc.field == "agent"
            beat_ts, beat_status = self.beats.get(agent, (self.now, "idle"))
            assert self.workers.get(agent) in machine.TERMINAL or agent in WORKERS or (
                beat_status != "stopped" and self.now - beat_ts >= DEAD_MS)

    # --- workers -----------------------------------------------------------------------

    @rule(worker=st.sampled_from(sorted(WORKERS)),
          command=st.sampled_from((ONWARD,) * 4 + WORKER_COMMANDS))
    def worker(self, worker: str, command: str) -> None:
        """Spawn the workers the first time; then one command, mostly one that moves on
        (start, done, approve, merge), sometimes any (a refusal is part of the game)."""
        if self.ws is None:
            self.repo = make_repo(self.root / "repo")
            self.ws = Workers(self.bus)
            for name, task in WORKERS.items():
                self.ws.spawn(task, name, self.repo)
                self.workers[name] = machine.ASSIGNED
            return
        before = self.workers[worker]
        command = ONWARD_BY_STATE.get(before, "start") if command == ONWARD else command
        call = {"start": lambda: self.ws.start(worker),
                "done": lambda: self.ws.done(worker, "done", allow_empty=True),
                "approve": lambda: self.ws.approve(worker),
                "reject": lambda: self.ws.reject(worker, "again"),
                "rework": lambda: self.ws.rework(worker, "again"),
                "merge": lambda: self.ws.merge(worker),
                "cancel": lambda: self.ws.cancel(worker, "stop"),
                "fail": lambda: self.ws.fail(worker, "broke")}[command]
        try:
            call()
        except BusError:
            assert (before, command) not in machine.TRANSITIONS or command == "merge"
            return
        self.workers[worker] = machine.TRANSITIONS[(before, command)]
        if command in ("done", "cancel", "fail"):
            self.stopped_workers.add(worker)
            self.reworking.discard(worker)
        elif command in ("reject", "rework"):
            self.stopped_workers.discard(worker)
            self.reworking.add(worker)

    # --- a channel: deliveries, acks, dead letters ------------------------------------------

    @rule(sender=st.sampled_from(AGENTS + (OWNER,)))
    def send(self, sender: str) -> None:
        try:
            sent = self.channels.send_message(CHANNEL, sender, "text", "do it")
        except BusError:  # only members send (a3 never joined)
            assert sender not in self.members
            return
        for recipient in self.members - {sender}:  # a group: everyone else
            # The ack timer starts at send: unreceived, it dies all the same.
            self.deliveries[(sent.seq, recipient)] = ("pending", self.now + ACK_TIMEOUT_MS)

    @rule(agent=st.sampled_from(AGENTS + (OWNER,)))
    def receive(self, agent: str) -> None:
        got = self.channels.receive_messages(agent).messages
        self._tick()  # receive runs the timers first
        waiting = sorted(seq for (seq, to), (state, _) in self.deliveries.items()
                         if to == agent and state == "pending")
        assert sorted(m.seq for m in got) == waiting
        for seq in waiting:
            self.deliveries[(seq, agent)] = ("handed", self.now + ACK_TIMEOUT_MS)

    @precondition(lambda self: any(s == "handed" for s, _ in self.deliveries.values()))
    @rule(pick=st.integers(0, 7), status=st.sampled_from(["completed", "failed", "in_progress"]))
    def acknowledge(self, pick: int, status: str) -> None:
        handed = sorted(k for k, (s, _) in self.deliveries.items() if s == "handed")
        seq, agent = handed[pick % len(handed)]
        self.channels.acknowledge_message(seq, agent, status)
        self.deliveries[(seq, agent)] = (("handed", self.now + ACK_TIMEOUT_MS)
                                         if status == "in_progress" else ("done", None))

    def _tick(self) -> int:
        """The model's timers: a delivery, handed out or not, past its deadline dies
        (no retries)."""
        due = [k for k, (s, deadline) in self.deliveries.items()
               if s in ("pending", "handed") and deadline <= self.now]
        for key in due:
            self.deliveries[key] = ("dead", None)
        return len(due)

    # --- the pump and its threads ------------------------------------------------------------

    @rule(mode=st.sampled_from(["ok", "raise"]))
    def pump_until_idle(self, mode: str) -> None:
        client.send(self.bus, "org", f"<echo><text>x</text><count>1</count><mode>{mode}</mode>"
                                     "</echo>")
        Pump(self.bus, parse_organism(ORGANISM), oob=False).run(until_idle=True)
        self.pump_ran = True  # a handler that raises is answered with a <huh>: no dead unit

    @rule(leaf=st.sampled_from(["add", "mul", "div"]), close=st.booleans())
    def thread(self, leaf: str, close: bool) -> None:
        registry = ThreadRegistry(self.bus, "org")
        try:
            found = registry.get_or_create(["org", "calc", leaf], now=self.now)
        except BusError:  # several open conversations share the path: told apart by UUID
            return
        if close:
            registry.close(found.uuid, now=self.now)
            self.open_threads.discard(found.uuid)
            self.closed_threads.add(found.uuid)
        else:
            self.open_threads.add(found.uuid)

    # --- every view, after every step ------------------------------------------------------

    @invariant()
    def every_view_renders_and_adds_up(self) -> None:
        status = read_status(self.path, now=self.now)
        self.check_agents(status)
        self.check_claims(status)
        self.check_consumers(status)
        assert status.workers == dict(Counter(self.workers.values()))
        assert {w.worker: w.state for w in status.worker_list} == self.workers
        self.check_channel(status)
        self.check_reservations(status)
        assert status.pump.organisms == ["org"] * self.pump_ran
        # Each run went until idle, and only a pump killed mid-unit leaves a dead one.
        assert status.pump.queued == status.pump.in_flight == status.pump.dead == 0
        self.check_text_and_json(status)
        self.check_top(status)
        self.check_serve()
        self.check_console(status)
        self.check_cli(status)

    def check_agents(self, status: Status) -> None:
        assert sum(status.agents_by_state.values()) == len(status.agents)
        assert set(status.agents_by_state) == set(LIVENESS_STATES)
        shown = {a.agent: a for a in status.agents}
        assert len(shown) == len(status.agents)
        for agent, (ts, beat_status) in self.beats.items():
            assert (shown[agent].status, shown[agent].state) == (
                beat_status, expected_state(self.now - ts, beat_status))
        assert not set(AGENTS) - set(self.beats) & set(shown)  # forgotten, or never beat
        for worker in self.stopped_workers:  # done, cancel and fail beat `stopped`
            assert (shown[worker].status, shown[worker].state) == ("stopped", "stopped")
        for worker in self.reworking:  # reject and rework replace the stopped beat
            assert shown[worker].status == "working"
        assert not set(WORKERS) - self.stopped_workers - self.reworking & set(shown)
        if self.pump_ran:
            assert shown["pump:org"].state == "stopped"

    def check_claims(self, status: Status) -> None:
        c = status.claims
        assert c.held + c.expired == len(c.claims)
        assert 0 <= c.expiring_soon <= c.held and 0 <= c.taken_over <= len(c.claims)
        assert c.expired == sum(claim.lease_until_ms <= self.now for claim in c.claims)
        assert c.dead == self.dead_claims
        assert {claim.task_id: (claim.agent, claim.lease_until_ms) for claim in c.claims
                if claim.task_id in TASKS} == self.claims

    def check_consumers(self, status: Status) -> None:
        last = status.log.last_seq
        assert last == self.bus.last_seq()
        for consumer in status.consumers:
            assert 0 <= consumer.pending <= consumer.lag == last - consumer.cursor
        agents = {c.agent: c.cursor for c in status.consumers if c.kind == "agent"}
        assert agents == self.cursors
        exporters = [c for c in status.consumers if c.kind == "exporter"]
        assert [c.agent for c in exporters] == [EXPORTER] * (self.exported is not None)
        if self.exported is not None:
            assert status.export.last_seq == exporters[0].cursor == self.exported
            assert status.export.lag == last - self.exported

    def check_channel(self, status: Status) -> None:
        states = Counter(state for state, _ in self.deliveries.values())
        # The first dead letter's notice creates the bus's own channel, _system.
        assert [c.name for c in status.channels] == ["_system"] * bool(states["dead"]) + [CHANNEL]
        channel = status.channels[-1]
        assert (channel.name, channel.open_deliveries, channel.awaiting_ack,
                channel.dead_letters) == (CHANNEL, states["pending"] + states["handed"],
                                          states["handed"], states["dead"])

    def check_reservations(self, status: Status) -> None:
        """What the views show is what the bus calls live: unexpired, of holders not dead
        and whose worker has not finished; and no two of them conflict."""
        shown = status.reservations
        assert shown == self.bus.reservations.list(now=self.now)
        for r in shown:
            assert r.expires_at_ms > self.now
            beat_ts, beat_status = self.beats.get(r.agent, (self.now, "idle"))
            assert beat_status == "stopped" or self.now - beat_ts < DEAD_MS
            assert self.workers.get(r.agent) not in machine.TERMINAL
        for a in shown:
            for b in shown:
                if a.agent != b.agent and (a.exclusive or b.exclusive):
                    assert a.glob.overlap(b.glob) is None, (a, b)

    def check_text_and_json(self, status: Status) -> None:
        lines = status_lines(status)
        agents_line = next(line for line in lines if line.startswith("agents: "))
        for state, n in status.agents_by_state.items():
            assert (f"{n} {state}" in agents_line) == (n > 0)
        shown = json.loads(orjson.dumps(status.to_json_dict()))
        assert shown["agents_by_state"] == status.agents_by_state
        assert len(shown["agents"]) == len(status.agents)

    def check_top(self, status: Status) -> None:
        summary = summary_lines(status, 0.0)
        assert f"last seq {status.log.last_seq}" in summary
        cells = table_cells(status)
        assert list(cells) == [name for name, _columns, _rows in TABLES]
        assert [len(cells[name]) for name in cells] == [
            len(status.agents), len(status.consumers), len(status.claims.claims),
            len(status.worker_list), len(status.channels), len(status.reservations)]
        for name, columns, _rows in TABLES:
            assert all(len(row) == len(columns) for row in cells[name])
        conn = connect(self.path, readonly=True)
        try:
            with conn:
                cells["tasks"] = task_rows(conn, status)
                # Each row opens: the details of every state reached are read and rendered.
                opened = {name: [detail_lines(conn, status, Opened(name, row[0], row))
                                 for row in rows] for name, rows in cells.items()}
        finally:
            conn.close()
        states = Counter(row[1] for row in cells["tasks"])
        t = status.tasks
        assert (states["ready"], states["blocked"], states["held"], states["done"],
                states["cancelled"]) == (t.ready, t.blocked, t.held, t.done, t.cancelled)
        for name, lines in opened.items():
            assert all(lines[i][0].split()[1] == cells[name][i][0] for i in range(len(lines)))

    def check_serve(self) -> None:
        conn = connect(self.path, readonly=True)
        try:
            sent = orjson.loads(snapshot(conn, str(self.path), "normal"))
        finally:
            conn.close()
        shown, charts = sent["status"], sent["charts"]
        assert set(charts["lag"]) == {c["agent"] for c in shown["consumers"]}
        assert sum(n["held"] for n in charts["claims"].values()) == len(shown["claims"]["claims"])
        trees = charts["threads"]
        assert set(trees["parents"]) <= set(trees["ids"]) | {""}
        labels = dict(zip(trees["ids"], trees["labels"]))
        assert all(labels[uuid].endswith("(closed)") for uuid in self.closed_threads)
        assert all(not labels[uuid].endswith("(closed)") for uuid in self.open_threads)
        assert {s["worker"] for s in charts["swimlane"]} == set(self.workers)

    def check_console(self, status: Status) -> None:
        """Every page of the console answers 200 for every thing the status names."""
        app = Starlette(routes=console_routes(str(self.path)))
        newest = [f"/messages/{status.log.last_seq}"] if status.log.messages else []
        things = (["/messages", "/messages?since=1h", *newest, "/agents", "/workers", "/tasks",
                   "/claims", "/reservations", "/channels", "/dead-letters", "/pump"]
                  + [f"/agents/{a.agent}" for a in status.agents]
                  + [f"/workers/{w.worker}" for w in status.worker_list]
                  + [f"/channels/{c.name}" for c in status.channels]
                  + [f"/tasks/{c.task_id}" for c in status.claims.claims])
        for path in things:
            code, body = asgi_get(app, path)
            assert code == 200, (path, body[:2000])

    def check_cli(self, status: Status) -> None:
        text = run(["status"], self.path)
        assert text.exit_code == 0, text.stderr
        as_json = run(["status", "--json"], self.path)
        assert as_json.exit_code == 0, as_json.stderr
        assert json.loads(as_json.stdout)["log"] == json.loads(
            orjson.dumps(status.to_json_dict()))["log"]
        listed = run(["consumers", "--json"], self.path)
        assert listed.exit_code == 0, listed.stderr
        assert [c["agent"] for c in json_lines(listed.stdout)] == [
            c.agent for c in status.consumers]
        assert run(["consumers"], self.path).exit_code == 0
        for consumer in status.consumers:
            one = run(["consumer", "info", consumer.agent], self.path)
            assert one.exit_code == 0, one.stderr
            assert one.stdout.startswith(f"consumer {consumer.agent} ({consumer.kind})\n")


def expected_state(age_ms: int, beat_status: str) -> str:
    """Liveness with the default thresholds (30 s warn, 100 s stale, 5 min dead)."""
    if beat_status == "stopped":
        return "stopped"
    age_ms = max(0, age_ms)
    return ("dead" if age_ms >= 300_000 else "stale" if age_ms >= 100_000
            else "warn" if age_ms >= 30_000 else "alive")


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    isolate_git(tmp_path, monkeypatch)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the examples' directories, under tmp_path
    tempfile.tempdir = None
    yield
    tempfile.tempdir = None


def test_views_stateful_every_view_renders_every_reachable_state() -> None:
    run_state_machine_as_test(ViewsGame, settings=scaled_settings(max_examples=25,
                                                           stateful_step_count=40))


# The states a random run may miss, reached on purpose, each checked by every view:
# a worker through to COMPLETED and one cancelled, a claim taken over and one dead,
# agents alive, warn, stale, dead and stopped, dead letters, a pump that stopped.
TOUR = [
    ("worker", {"worker": "w1", "command": ONWARD}),  # spawns both
    *[("worker", {"worker": "w1", "command": ONWARD})] * 4,  # start, done, approve, merge
    ("worker", {"worker": "w2", "command": ONWARD}),
    ("worker", {"worker": "w2", "command": "cancel"}),
    ("heartbeat", {"agent": "a1", "status": "working", "task": "t1", "progress": 0.5}),
    ("heartbeat", {"agent": "a2", "status": "blocked", "task": None, "progress": None}),
    ("lease", {"op": "claim", "task": "t1", "agent": "a1", "lease_s": 1}),
    ("lease", {"op": "claim", "task": "t2", "agent": "a2", "lease_s": 600}),
    ("publish", {"sender": OWNER, "to": "a1"}),
    ("publish", {"sender": OWNER, "to": None}),
    ("ack", {"agent": "a1", "back": 1}),
    ("send", {"sender": OWNER}),
    ("receive", {"agent": "a1"}),
    ("receive", {"agent": "a2"}),  # a2's timer runs from the send: it answers in time
    ("acknowledge", {"pick": 1, "status": "completed"}),
    ("time_passes", {"seconds": 31}),  # a1, a2 warn; t1 expired; a1's delivery overdue
    ("receive", {"agent": "a1"}),  # the timers run: a dead letter
    ("send", {"sender": OWNER}),
    ("receive", {"agent": "a2"}),
    ("acknowledge", {"pick": 0, "status": "in_progress"}),
    ("lease", {"op": "claim", "task": "t1", "agent": "a3", "lease_s": 1}),  # taken over
    ("heartbeat", {"agent": "a3", "status": "stopped", "task": "t1", "progress": None}),
    ("time_passes", {"seconds": 70}),  # a1, a2 stale
    ("lease", {"op": "claim", "task": "t1", "agent": "a1", "lease_s": 8}),  # out of attempts
    ("time_passes", {"seconds": 301}),  # a1, a2 dead
    ("reap", {}),
    ("heartbeat", {"agent": "a1", "status": "idle", "task": None, "progress": None}),
    ("forget", {"agent": "a2"}),  # refused: it holds t2
    ("lease", {"op": "release", "task": "t2", "agent": "a2", "lease_s": None}),
    ("forget", {"agent": "a2"}),
    ("export", {}),
    ("pump_until_idle", {"mode": "ok"}),
    ("pump_until_idle", {"mode": "raise"}),
    ("thread", {"leaf": "add", "close": False}),
    ("thread", {"leaf": "mul", "close": True}),
    ("delete_cursor", {"agent": "a1"}),
]


def test_views_render_a_tour_of_the_hard_to_reach_states() -> None:
    game = ViewsGame()
    try:
        game.every_view_renders_and_adds_up()
        for rule_name, arguments in TOUR:
            getattr(game, rule_name)(**arguments)
            game.every_view_renders_and_adds_up()
        status = read_status(game.path, now=game.now)
        assert game.workers == {"w1": machine.COMPLETED, "w2": machine.CANCELLED}
        assert status.claims.dead == 1 and status.channels[-1].dead_letters == 1
        assert {a.agent: a.state for a in status.agents} == {
            "a1": "alive", "a3": "stopped", "w1": "stopped", "w2": "stopped",
            "pump:org": "stopped"}
        assert status.agents_by_state == {"alive": 1, "warn": 0, "stale": 0, "dead": 0,
                                          "stopped": 4}
    finally:
        game.teardown()
