"""A Hypothesis state machine over every worker command, with conflicting commits on the
base and on the branches: whatever happened, every worker can still be driven to
COMPLETED with the commands a person has (start, done, approve, merge, rework).

Real git repositories and real bus files; each example gets its own directory. The
rules run commands that may be refused (a refusal is fine); the teardown is the
property: a fixed recipe finishes every unfinished worker, and it must get all of
them to COMPLETED without cancel or fail.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import invariant
from hypothesis.stateful import rule
from hypothesis.stateful import run_state_machine_as_test

from bus import Bus
from bus.storage.errors import BusError
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import make_repo
from tests.support.properties import scaled_settings
from tests.support.worker_fixtures import isolate_git
from workers import machine
from workers.git import MergeConflict
from workers.lifecycle import BranchMoved
from workers.lifecycle import TaskTaken
from workers.lifecycle import Workers

WORKERS = ("w1", "w2", "w3")
TASKS = ("t1", "t2")
SHARED = "shared.txt"  # every side writes it: merges conflict
COMMIT = [sys.executable, "-c",
          "import subprocess, uuid; open('run.txt', 'w').write(uuid.uuid4().hex);"
          "subprocess.run(['git', 'add', 'run.txt'], check=True);"
          "subprocess.run(['git', 'commit', '-qm', 'run'], check=True)"]


def call(ws: Workers, command: str, worker: str) -> None:
    """One machine command with valid arguments; refusals (BusError) are part of the game."""
    actions = {
        "start": lambda: ws.start(worker),
        "done": lambda: ws.done(worker, "done"),
        "approve": lambda: ws.approve(worker),
        "reject": lambda: ws.reject(worker, "again"),
        "rework": lambda: ws.rework(worker, "conflict"),
        "merge": lambda: ws.merge(worker),
        "cancel": lambda: ws.cancel(worker, "stop"),
        "fail": lambda: ws.fail(worker, "broke"),
        "heartbeat": lambda: ws.heartbeat(worker, progress=0.5),
        "run": lambda: ws.run(worker, COMMIT, interval=0.05),
        "cleanup": lambda: ws.cleanup(worker, branches=True),
    }
    assert set(actions) == set(machine.COMMANDS)
    try:
        actions[command]()
    except BusError:
        pass


class WorkerGame(RuleBasedStateMachine):
    """Random commands and commits; the teardown proves no worker is stuck."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="worker-game-"))
        self.repo = make_repo(self.root / "repo", {SHARED: "base\n"})
        self.bus = Bus.open(self.root / "state" / "bus.db")
        self.ws = Workers(self.bus)
        self.spawned: dict[str, str] = {}
        self.edits = 0

    @rule(worker=st.sampled_from(WORKERS), task=st.sampled_from(TASKS))
    def spawn(self, worker: str, task: str) -> None:
        if worker in self.spawned:
            return
        try:
            self.ws.spawn(task, worker, self.repo)
            self.spawned[worker] = task
        except TaskTaken:
            pass

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def command(self, worker: str, data: st.DataObject) -> None:
        if worker not in self.spawned:
            return
        # Mostly a command that moves on in this state, sometimes any command at all.
        state = self.ws.get(worker).state
        onward = [c for c in machine.allowed_commands(state) if c not in ("cancel", "fail")]
        anything = st.sampled_from(machine.COMMANDS)
        choice = st.sampled_from(onward) | st.sampled_from(onward) | anything if onward \
            else anything
        call(self.ws, data.draw(choice, label="command"), worker)

    @rule(worker=st.sampled_from(WORKERS), shared=st.booleans())
    def commit_on_branch(self, worker: str, shared: bool) -> None:
        worktree = Path(self.ws.get(worker).worktree) if worker in self.spawned else None
        if worktree is not None and worktree.is_dir():
            self.edits += 1
            commit_file(worktree, SHARED if shared else f"{worker}.txt", f"{worker} {self.edits}\n")

    @rule()
    def commit_on_base(self) -> None:
        self.edits += 1
        commit_file(self.repo, SHARED, f"base {self.edits}\n")

    @invariant()
    def every_unfinished_worker_has_a_way_forward(self) -> None:
        for worker in self.spawned:
            state = self.ws.get(worker).state
            assert machine.allowed_commands(state), state
            if state not in machine.TERMINAL:
                assert _reaches(state, machine.COMPLETED), state

    def teardown(self) -> None:
        try:
            for worker in self.spawned:  # see --hypothesis-show-statistics
                event(f"before the recipe: {self.ws.get(worker).state}")
            finish_everyone(self.ws, list(self.spawned))
            for worker in self.spawned:
                assert self.ws.get(worker).state in machine.TERMINAL, worker
        finally:
            self.bus.close()
            shutil.rmtree(self.root, ignore_errors=True)


def _reaches(state: str, goal: str) -> bool:
    """True if the machine has a path of transitions from `state` to `goal`."""
    seen, todo = {state}, [state]
    while todo:
        current = todo.pop()
        for (source, _), target in machine.TRANSITIONS.items():
            if source == current and target not in seen:
                seen.add(target)
                todo.append(target)
    return goal in seen


def finish_everyone(ws: Workers, workers: list[str], rounds: int = 40) -> None:
    """Drive every unfinished worker to COMPLETED with what a person would do; a worker
    whose task another one has is retried once that one has moved on."""
    for _ in range(rounds):
        pending = [w for w in workers if ws.get(w).state not in machine.TERMINAL]
        if not pending:
            return
        for worker in pending:
            try:
                step_towards_completion(ws, worker)
            except TaskTaken:
                continue
    raise AssertionError({w: ws.get(w).state for w in workers})


def step_towards_completion(ws: Workers, worker: str) -> None:
    current = ws.get(worker)
    if current.state == machine.ASSIGNED:
        ws.start(worker)
    elif current.state == machine.WORKING:
        worktree = Path(current.worktree)
        # resolve what would conflict: take the base in, keeping the branch's side
        git(worktree, "merge", "-q", "-X", "ours", "--no-edit", current.base)
        if git(worktree, "rev-list", "--count", f"{current.base}..HEAD") == "0":
            commit_file(worktree, f"{worker}-final.txt", "final\n")
        ws.done(worker, "finished")
    elif current.state == machine.IN_REVIEW:
        ws.approve(worker)
    elif current.state == machine.APPROVED:
        try:
            ws.merge(worker)
        except (MergeConflict, BranchMoved) as exc:
            event(f"recipe: rework after {type(exc).__name__}")
            ws.rework(worker, "conflict")


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_git(tmp_path, monkeypatch)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the examples' directories, under tmp_path
    tempfile.tempdir = None
    yield
    tempfile.tempdir = None


def test_workers_stateful_every_state_leads_to_completed() -> None:
    run_state_machine_as_test(WorkerGame, settings=scaled_settings(max_examples=25,
                                                             stateful_step_count=30))
