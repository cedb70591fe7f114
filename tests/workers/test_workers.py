"""The worker lifecycle at library level: workers/machine.py, git.py, registry.py, lifecycle.py.

Every test builds a real git repository under tmp_path (tests/support/procs_workers.py
has the git helpers) and a real bus file. The bus database is beside the
repository (tmp_path/bus.db), so worktrees live in tmp_path/worktrees/<worker>
and mirrors in tmp_path/workers/<worker>.json; one test puts the database in
a gitignored `.worker-state/` inside the repository instead. git runs with a
HOME and global config of its own under tmp_path (see `hermetic_git`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.log.messages import now_ms
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import head
from tests.support.procs_workers import make_repo
from tests.support.properties import scaled_settings
from tests.support.waiting import wait_until
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from tests.support.procs_workers import tree_files
from tests.support.procs_workers import worktree_paths
from workers import machine
from workers.git import DirtyWorktree
from workers.git import GitError
from workers.git import MergeConflict
from workers.lifecycle import BranchMoved
from workers.lifecycle import ClaimRefused
from workers.lifecycle import EmptyWork
from workers.lifecycle import TaskTaken
from workers.lifecycle import WorkerChanged
from workers.lifecycle import Workers
from workers.machine import COMMANDS
from workers.machine import IN_PLACE
from workers.machine import STATES
from workers.machine import TRANSITIONS
from workers.machine import InvalidTransition
from workers.machine import allowed_commands
from workers.machine import next_state
from workers.registry import UnknownWorker
from workers.registry import Worker
from workers.registry import WorkerExists

# The machine, written out by hand: an oracle independent of allowed_commands().
EXPECTED_ALLOWED = {
    "ASSIGNED": ["start", "cancel", "fail", "heartbeat", "run"],
    "WORKING": ["done", "cancel", "fail", "heartbeat", "run"],
    "IN_REVIEW": ["approve", "reject", "rework", "cancel", "fail"],
    "APPROVED": ["rework", "merge", "cancel", "fail"],
    "COMPLETED": ["cleanup"],
    "CANCELLED": ["cleanup"],
    "FAILED": ["cleanup"],
}
# How to reach each state from a fresh spawn.
PATH_TO = {
    "ASSIGNED": [],
    "WORKING": ["start"],
    "IN_REVIEW": ["start", "done"],
    "APPROVED": ["start", "done", "approve"],
    "COMPLETED": ["start", "done", "approve", "merge"],
    "CANCELLED": ["cancel"],
    "FAILED": ["fail"],
}


# --- fixtures and helpers -------------------------------------------------------------------------




def all_messages(bus: Bus) -> list:
    return bus.list_messages(limit=10_000)


def summary(message) -> tuple:
    return (message.from_agent, message.to_agent, message.type, message.correlation_id,
            message.payload)


def state_changes(bus: Bus, worker: str) -> list[dict]:
    return [m.payload for m in all_messages(bus)
            if m.type == "state_change" and m.from_agent == worker]


def claim_of(bus: Bus, task: str):
    return next((c for c in bus.claims.list() if c.task_id == task), None)


def mirror_path(ws: Workers, worker: str) -> Path:
    return ws.mirrors / f"{worker}.json"


def read_mirror(ws: Workers, worker: str) -> dict:
    return json.loads(mirror_path(ws, worker).read_text())


def assert_mirror_matches(ws: Workers, worker: str) -> None:
    assert read_mirror(ws, worker) == ws.get(worker).to_json_dict()
    assert sorted(os.listdir(ws.mirrors)) == sorted(
        f"{s.worker.worker}.json" for s in ws.status()), "temp or stray files in the mirrors dir"


def snapshot(ws: Workers, worker: str, repo: Path, full: bool = True) -> dict:
    """Everything a refused command must leave as it was (`full=False`: git refs only)."""
    bus = ws.bus
    found = {
        "row": ws.get(worker),
        "messages": [m.seq for m in all_messages(bus)],
        "mirror": mirror_path(ws, worker).read_bytes(),
        "mirrors_dir": sorted(os.listdir(ws.mirrors)),
        "claims": bus.claims.list(),
        "beats": sorted((b.agent, b.ts_ms, b.status, b.task, b.progress)
                        for b in bus.heartbeats.liveness()),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
    }
    if full:
        found["worktrees"] = worktree_paths(repo)
        found["status"] = git(repo, "status", "--porcelain")
    return found


def wait_for_lease_end(bus: Bus, task: str) -> None:
    """Wait until the wall clock is past the task's lease (a condition, with a deadline)."""
    until = claim_of(bus, task).lease_until_ms
    wait_until(lambda: now_ms() > until, f"the lease on {task} to run out")


def drive(ws: Workers, worker: str, commands: list[str]) -> Worker:
    """Apply the happy-path `commands` to `worker` (committing a file before `done`)."""
    current = ws.get(worker)
    for command in commands:
        if command == "done":
            commit_file(current.worktree, f"{worker}.txt", f"work of {worker}\n")
        current = call(ws, command, worker)
    return current


def call(ws: Workers, command: str, worker: str, argv: list[str] | None = None):
    """Invoke one machine command with valid arguments."""
    if command == "run":
        return ws.run(worker, argv or [sys.executable, "-c", "pass"], interval=0.05)[0]
    return {
        "start": lambda: ws.start(worker),
        "done": lambda: ws.done(worker, "done by test"),
        "approve": lambda: ws.approve(worker),
        "reject": lambda: ws.reject(worker, "needs more"),
        "rework": lambda: ws.rework(worker, "conflicts"),
        "cleanup": lambda: ws.cleanup(worker),
        "merge": lambda: ws.merge(worker),
        "cancel": lambda: ws.cancel(worker, "not needed"),
        "fail": lambda: ws.fail(worker, "it broke"),
        "heartbeat": lambda: ws.heartbeat(worker),
    }[command]()


def test_call_covers_every_machine_command() -> None:
    # A command added to the machine must be added to `call` (and so to the tables below).
    assert set(COMMANDS) == {"start", "done", "approve", "reject", "rework", "merge", "cancel",
                             "fail", "heartbeat", "run", "cleanup"}


# --- the machine as data --------------------------------------------------------------------------


def test_machine_allowed_commands_match_the_documented_diagram() -> None:
    assert STATES == ("ASSIGNED", "WORKING", "IN_REVIEW", "APPROVED", "COMPLETED",
                      "CANCELLED", "FAILED")
    assert {state: allowed_commands(state) for state in STATES} == EXPECTED_ALLOWED
    assert machine.TERMINAL == {"COMPLETED", "CANCELLED", "FAILED"}


def test_machine_next_state_follows_transitions_and_in_place() -> None:
    for state in STATES:
        for command in COMMANDS:
            if (state, command) in TRANSITIONS:
                assert next_state("w", state, command) == TRANSITIONS[(state, command)]
            elif state in IN_PLACE.get(command, ()):
                assert next_state("w", state, command) == state
            else:
                with pytest.raises(InvalidTransition) as raised:
                    next_state("w", state, command)
                assert (raised.value.worker, raised.value.state, raised.value.command) == (
                    "w", state, command)


def test_machine_invalid_transition_message_terminal_offers_cleanup() -> None:
    assert str(InvalidTransition("w9", "FAILED", "start")) == (
        "worker w9 is FAILED; allowed: cleanup")
    assert str(InvalidTransition("w9", "IN_REVIEW", "merge")) == (
        "worker w9 is IN_REVIEW; allowed: approve, reject, rework, cancel, fail")


# --- spawn ----------------------------------------------------------------------------------------


def test_spawn_creates_branch_worktree_row_mirror_and_messages(ws: Workers, bus: Bus,
                                                               repo: Path, tmp_path: Path) -> None:
    base_head = head(repo)
    w = ws.spawn("t1", "w1", repo, "main")
    worktree = tmp_path / "worktrees" / "w1"
    assert w == Worker("w1", "t1", "ASSIGNED", str(repo.resolve()), "main", "w1/t1",
                       str(worktree), None, None, None, w.created_at_ms, w.created_at_ms)
    assert ws.get("w1") == w
    assert head(repo, "refs/heads/w1/t1") == base_head
    assert worktree.is_dir()
    assert git(worktree, "symbolic-ref", "--short", "HEAD") == "w1/t1"
    assert str(worktree.resolve()) in worktree_paths(repo)
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"  # the main repo is untouched
    assert [summary(m) for m in all_messages(bus)] == [
        ("w1", None, "state_change", "t1", {"from": None, "to": "ASSIGNED", "command": "spawn"}),
        ("orchestrator", "w1", "task_assign", "t1",
         {"task": "t1", "branch": "w1/t1", "base": "main", "worktree": str(worktree)}),
    ]
    assert bus.claims.list() == []
    assert mirror_path(ws, "w1") == tmp_path / "workers" / "w1.json"
    assert_mirror_matches(ws, "w1")


def test_spawn_base_defaults_to_current_branch(ws: Workers, repo: Path) -> None:
    git(repo, "switch", "-q", "-c", "develop")
    commit_file(repo, "dev.txt", "dev\n")
    w = ws.spawn("t1", "w1", repo)
    assert w.base == "develop"
    assert head(repo, "refs/heads/w1/t1") == head(repo, "develop")


def test_spawn_repo_defaults_to_current_directory(ws: Workers, repo: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    w = ws.spawn("t1", "w1")
    assert w.repo == str(repo.resolve())


def test_spawn_without_worker_id_generates_one(ws: Workers, repo: Path) -> None:
    w = ws.spawn("t1", repo=repo)
    assert w.worker.startswith("w-") and len(w.worker) == 8
    int(w.worker[2:], 16)
    assert w.branch == f"{w.worker}/t1"
    assert Path(w.worktree).is_dir()


def nothing_spawned(ws: Workers, bus: Bus, repo: Path, tmp_path: Path, branches=("main",)) -> None:
    assert ws.status() == []
    assert bus.message_count() == 0
    assert git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split() == list(
        branches)
    assert worktree_paths(repo) == [str(repo.resolve())]
    assert not (tmp_path / "workers").exists() or os.listdir(tmp_path / "workers") == []


@pytest.mark.parametrize("task", ["a..b", "has space", "t~1", "t^2", "t:x", "t.lock", "t/",
                                  "@{x}", "x\ty"])
def test_spawn_task_making_invalid_branch_name_is_refused(ws: Workers, bus: Bus, repo: Path,
                                                          tmp_path: Path, task: str) -> None:
    with pytest.raises(GitError) as raised:
        ws.spawn(task, "w1", repo)
    assert str(raised.value).startswith(f"{'w1/' + task!r} is not a valid branch name")
    nothing_spawned(ws, bus, repo, tmp_path)
    assert not (tmp_path / "worktrees" / "w1").exists()


@pytest.mark.parametrize("worker", ["has space", "w/1", "", "w1\n"])
def test_spawn_invalid_worker_id_is_refused(ws: Workers, bus: Bus, repo: Path, tmp_path: Path,
                                            worker: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        ws.spawn("t1", worker, repo)
    assert "worker" in str(raised.value)
    nothing_spawned(ws, bus, repo, tmp_path)


def test_spawn_worker_id_that_exists_is_refused(ws: Workers, bus: Bus, repo: Path) -> None:
    first = ws.spawn("t1", "w1", repo)
    before = snapshot(ws, "w1", repo)
    with pytest.raises(WorkerExists) as raised:
        ws.spawn("t2", "w1", repo)
    assert str(raised.value) == "worker 'w1' exists already; choose another --worker id"
    assert snapshot(ws, "w1", repo) == before
    assert ws.get("w1") == first


def test_spawn_not_a_git_repository_is_refused(ws: Workers, bus: Bus, repo: Path,
                                               tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", plain)
    assert str(raised.value) == (
        f"{plain} is not inside a git repository; pass --repo or run git init")
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", tmp_path / "missing")
    assert "is not a directory" in str(raised.value)
    nothing_spawned(ws, bus, repo, tmp_path)


def test_spawn_missing_base_branch_is_refused(ws: Workers, bus: Bus, repo: Path,
                                              tmp_path: Path) -> None:
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", repo, "nope")
    assert str(raised.value) == f"base branch 'nope' does not exist in {repo.resolve()}"
    nothing_spawned(ws, bus, repo, tmp_path)


def test_spawn_detached_head_without_base_is_refused(ws: Workers, bus: Bus, repo: Path,
                                                     tmp_path: Path) -> None:
    git(repo, "switch", "-q", "--detach")
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", repo)
    assert "detached HEAD; pass --base" in str(raised.value)
    nothing_spawned(ws, bus, repo, tmp_path)
    assert ws.spawn("t1", "w1", repo, "main").base == "main"


def test_spawn_existing_branch_or_worktree_path_is_refused(ws: Workers, bus: Bus, repo: Path,
                                                           tmp_path: Path) -> None:
    git(repo, "branch", "w1/t1")
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", repo)
    assert "branch 'w1/t1' already exists" in str(raised.value)
    nothing_spawned(ws, bus, repo, tmp_path, branches=("main", "w1/t1"))
    (tmp_path / "worktrees" / "w2").mkdir(parents=True)
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w2", repo)
    assert f"{tmp_path / 'worktrees' / 'w2'} already exists" in str(raised.value)
    nothing_spawned(ws, bus, repo, tmp_path, branches=("main", "w1/t1"))


def test_get_unknown_worker_is_refused(ws: Workers, repo: Path) -> None:
    for action in (lambda: ws.get("x"), lambda: ws.start("x"), lambda: ws.status("x"),
                   lambda: ws.merge("x"), lambda: ws.heartbeat("x")):
        with pytest.raises(UnknownWorker) as raised:
            action()
        assert str(raised.value) == "no worker 'x'; `worker status` lists them"


# --- the happy path -------------------------------------------------------------------------------


def test_lifecycle_spawn_to_fast_forward_merge(ws: Workers, bus: Bus, repo: Path,
                                               tmp_path: Path) -> None:
    ws.spawn("t1", "w1", repo, "main")
    worktree = tmp_path / "worktrees" / "w1"

    started = ws.start("w1")
    assert started.state == "WORKING"
    claim = claim_of(bus, "t1")
    assert (claim.agent, claim.attempts) == ("w1", 1)
    assert state_changes(bus, "w1")[-1] == {"from": "ASSIGNED", "to": "WORKING", "command": "start"}
    assert_mirror_matches(ws, "w1")

    commit = commit_file(worktree, "feature.txt", "feature\n")
    seen = bus.last_seq()
    done = ws.done("w1", "feature done")
    assert (done.state, done.head_commit, done.note) == ("IN_REVIEW", commit, "feature done")
    assert head(repo, "refs/heads/w1/t1") == commit
    assert claim_of(bus, "t1") is None
    details = {"worker": "w1", "branch": "w1/t1", "commit": commit, "message": "feature done"}
    assert [summary(m) for m in bus.list_messages(after=seen)] == [
        ("w1", None, "state_change", "t1", {"from": "WORKING", "to": "IN_REVIEW",
                                            "command": "done"}),
        ("w1", None, "agent_stopped", "t1", {"worker": "w1", "task": "t1"}),
        ("w1", None, "task_done", "t1", details),
        ("w1", None, "review_request", "t1", details),
    ]
    assert_mirror_matches(ws, "w1")

    seen = bus.last_seq()
    approved = ws.approve("w1")
    assert approved.state == "APPROVED"
    assert [summary(m) for m in bus.list_messages(after=seen)] == [
        ("w1", None, "state_change", "t1", {"from": "IN_REVIEW", "to": "APPROVED",
                                            "command": "approve"}),
        ("orchestrator", "w1", "review_result", "t1", {"worker": "w1", "approved": True}),
    ]
    assert_mirror_matches(ws, "w1")

    seen = bus.last_seq()
    merged = ws.merge("w1")
    assert (merged.state, merged.merge_commit, merged.head_commit) == ("COMPLETED", commit, commit)
    assert head(repo, "main") == commit  # fast-forward: base head is the branch head
    assert (repo / "feature.txt").read_text() == "feature\n"  # main is checked out in repo
    assert git(repo, "status", "--porcelain") == ""
    assert not worktree.exists()
    assert worktree_paths(repo) == [str(repo.resolve())]
    assert "[w1/t1]" not in git(repo, "worktree", "list")  # not "w1": pytest-xdist's gw1 is in tmp_path
    assert head(repo, "refs/heads/w1/t1") == commit  # the branch is kept
    assert [summary(m) for m in bus.list_messages(after=seen)] == [
        ("w1", None, "state_change", "t1", {"from": "APPROVED", "to": "COMPLETED",
                                            "command": "merge"}),
        ("w1", None, "task_merged", "t1", {"worker": "w1", "branch": "w1/t1", "base": "main",
                                           "commit": commit, "fast_forward": True}),
    ]
    assert claim_of(bus, "t1") is None
    assert bus.claims.claim("t1", "someone-else", 1000)  # the task is free
    assert_mirror_matches(ws, "w1")
    assert [m.type for m in all_messages(bus)] == [
        "state_change", "task_assign", "state_change", "task_claim", "agent_started",
        "state_change", "agent_stopped", "task_done", "review_request", "state_change",
        "review_result", "state_change", "task_merged"]


def test_lifecycle_with_bus_inside_gitignored_worker_state(repo: Path) -> None:
    (repo / ".gitignore").write_text(".worker-state/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore state")
    state = repo / ".worker-state"
    with Bus.open(state / "bus.db") as bus:
        ws = Workers(bus)
        w = ws.spawn("t1", "w1", repo)
        assert w.worktree == str(state / "worktrees" / "w1")
        assert git(repo, "status", "--porcelain") == ""  # the nested worktree is ignored
        ws.start("w1")
        commit = commit_file(w.worktree, "feature.txt", "feature\n")
        ws.done("w1")
        ws.approve("w1")
        merged = ws.merge("w1")
        assert merged.state == "COMPLETED"
        assert head(repo, "main") == commit == merged.merge_commit
        assert (repo / "feature.txt").read_text() == "feature\n"
        assert git(repo, "status", "--porcelain") == ""
        assert not Path(w.worktree).exists()
        assert worktree_paths(repo) == [str(repo.resolve())]
        assert json.loads((state / "workers" / "w1.json").read_text()) == merged.to_json_dict()
        assert sorted(os.listdir(state / "workers")) == ["w1.json"]


def test_merge_non_fast_forward_makes_merge_commit(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    branch_head = commit_file(w.worktree, "feature.txt", "feature\n")
    main_head = commit_file(repo, "main.txt", "main\n")  # main moves on after the spawn
    ws.done("w1")
    ws.approve("w1")
    merged = ws.merge("w1")
    assert merged.state == "COMPLETED"
    new_head = head(repo, "main")
    assert merged.merge_commit == new_head
    assert new_head not in (main_head, branch_head)
    assert git(repo, "rev-list", "--parents", "-n", "1", "main").split() == [
        new_head, main_head, branch_head]
    assert git(repo, "log", "-1", "--format=%s", "main") == "Merge w1/t1 into main"
    assert (repo / "feature.txt").read_text() == "feature\n"
    assert (repo / "main.txt").read_text() == "main\n"
    assert git(repo, "status", "--porcelain") == ""
    assert [m.payload for m in all_messages(bus) if m.type == "task_merged"] == [
        {"worker": "w1", "branch": "w1/t1", "base": "main", "commit": new_head,
         "fast_forward": False}]
    assert not Path(w.worktree).exists()
    assert head(repo, "refs/heads/w1/t1") == branch_head


def test_merge_base_not_checked_out_uses_temporary_worktree(ws: Workers, bus: Bus, repo: Path,
                                                            tmp_path: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    branch_head = commit_file(w.worktree, "feature.txt", "feature\n")
    main_head = commit_file(repo, "main.txt", "main\n")
    git(repo, "switch", "-q", "-c", "other", "HEAD~1")  # main is now checked out nowhere
    commit_file(repo, "other.txt", "other\n")
    (repo / "scratch.txt").write_text("untracked, left alone\n")
    other_head = head(repo)
    files_before = tree_files(repo)
    status_before = git(repo, "status", "--porcelain")
    ws.done("w1")
    ws.approve("w1")
    merged = ws.merge("w1")
    assert merged.state == "COMPLETED"
    new_head = head(repo, "main")
    assert merged.merge_commit == new_head
    assert git(repo, "rev-list", "--parents", "-n", "1", "main").split() == [
        new_head, main_head, branch_head]
    assert set(git(repo, "ls-tree", "--name-only", "main").split()) == {
        "README.md", "feature.txt", "main.txt"}
    # The main repository: same branch, same commit, same files, same status.
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "other"
    assert head(repo) == other_head
    assert tree_files(repo) == files_before
    assert git(repo, "status", "--porcelain") == status_before
    # The temporary worktree and the worker's are both gone, for git too.
    assert not Path(w.worktree).exists()
    assert sorted(os.listdir(tmp_path / "worktrees")) == []
    assert worktree_paths(repo) == [str(repo.resolve())]
    admin = repo / ".git" / "worktrees"
    assert not admin.exists() or os.listdir(admin) == []


def test_merge_fast_forward_when_base_not_checked_out(ws: Workers, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    git(repo, "switch", "-q", "-c", "other")
    ws.start("w1")
    commit = commit_file(w.worktree, "feature.txt", "feature\n")
    ws.done("w1")
    ws.approve("w1")
    assert ws.merge("w1").merge_commit == commit == head(repo, "main")
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "other"
    assert not (repo / "feature.txt").exists()
    assert worktree_paths(repo) == [str(repo.resolve())]


def test_merge_frees_the_task_even_if_the_worker_claimed_it_again(ws: Workers, bus: Bus,
                                                                  repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done", "approve"])
    assert bus.claims.claim("t1", "w1", 60_000)  # e.g. the agent ran `bus claim` itself meanwhile
    assert ws.merge("w1").state == "COMPLETED"
    assert claim_of(bus, "t1") is None
    assert not Path(w.worktree).exists()


def test_merge_untracked_file_in_base_worktree_does_not_block(ws: Workers, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit = commit_file(w.worktree, "feature.txt", "feature\n")
    ws.done("w1")
    ws.approve("w1")
    (repo / "notes.txt").write_text("mine\n")
    assert ws.merge("w1").merge_commit == commit == head(repo, "main")
    assert (repo / "notes.txt").read_text() == "mine\n"
    assert git(repo, "status", "--porcelain") == "?? notes.txt"


# --- reject and redo ------------------------------------------------------------------------------


def test_reject_then_redo_records_new_head_and_merges(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    first = commit_file(w.worktree, "feature.txt", "v1\n")
    assert ws.done("w1", "first try").head_commit == first
    assert claim_of(bus, "t1") is None

    seen = bus.last_seq()
    rejected = ws.reject("w1", "add a test")
    assert (rejected.state, rejected.note, rejected.head_commit) == ("WORKING", "add a test", first)
    assert [summary(m) for m in bus.list_messages(after=seen)] == [
        ("w1", None, "state_change", "t1", {"from": "IN_REVIEW", "to": "WORKING",
                                            "command": "reject"}),
        ("w1", None, "task_claim", "t1", {"worker": "w1", "task": "t1", "attempt": 1,
                                          "fence": 2,  # a new lease after the release
                                          "lease_until_ms": claim_of(bus, "t1").lease_until_ms}),
        ("orchestrator", "w1", "review_result", "t1",
         {"worker": "w1", "approved": False, "reason": "add a test"}),
        ("w1", None, "agent_started", "t1", {"worker": "w1", "task": "t1", "branch": "w1/t1",
                                             "worktree": w.worktree}),
    ]
    assert claim_of(bus, "t1").agent == "w1"  # the claim is taken again
    assert_mirror_matches(ws, "w1")

    second = commit_file(w.worktree, "test_feature.txt", "assert True\n")
    redone = ws.done("w1", "with a test")
    assert redone.head_commit == second != first
    assert [m.payload["commit"] for m in all_messages(bus) if m.type == "review_request"] == [
        first, second]
    ws.approve("w1")
    merged = ws.merge("w1")
    assert merged.merge_commit == second == head(repo, "main")
    assert (repo / "test_feature.txt").exists() and (repo / "feature.txt").exists()
    assert [(c["from"], c["to"]) for c in state_changes(bus, "w1")] == [
        (None, "ASSIGNED"), ("ASSIGNED", "WORKING"), ("WORKING", "IN_REVIEW"),
        ("IN_REVIEW", "WORKING"), ("WORKING", "IN_REVIEW"), ("IN_REVIEW", "APPROVED"),
        ("APPROVED", "COMPLETED")]


def test_reject_refused_while_another_worker_holds_the_task(ws: Workers, bus: Bus,
                                                            repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done"])
    assert bus.claims.claim("t1", "w2", 60_000)  # the task was released by w1's done
    before = snapshot(ws, "w1", repo)
    with pytest.raises(ClaimRefused) as raised:
        ws.reject("w1", "again")
    assert str(raised.value) == "task t1 is held by w2 until its lease ends; try again later"
    assert snapshot(ws, "w1", repo) == before
    assert ws.get("w1").state == "IN_REVIEW"


# --- merge conflicts and a dirty base -------------------------------------------------------------


def conflicting_approved_worker(ws: Workers, repo: Path) -> Worker:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(w.worktree, "README.md", "branch side\n")
    commit_file(repo, "README.md", "main side\n")
    commit_file(repo, "other.txt", "unrelated\n")
    ws.done("w1")
    return ws.approve("w1")


def test_merge_conflict_leaves_everything_unchanged(ws: Workers, bus: Bus, repo: Path) -> None:
    w = conflicting_approved_worker(ws, repo)
    (repo / "untracked.txt").write_text("keep me\n")
    before = snapshot(ws, "w1", repo)
    files = tree_files(repo)
    main_head = head(repo, "main")
    with pytest.raises(MergeConflict) as raised:
        ws.merge("w1")
    assert raised.value.files == ["README.md"]
    assert "conflicts in: README.md" in str(raised.value)
    assert "the merge was aborted and nothing changed" in str(raised.value)
    assert snapshot(ws, "w1", repo) == before
    assert ws.get("w1").state == "APPROVED"
    assert head(repo, "main") == main_head
    assert tree_files(repo) == files
    assert (repo / "README.md").read_text() == "main side\n"
    assert git(repo, "status", "--porcelain") == "?? untracked.txt"
    git_dir = repo / git(repo, "rev-parse", "--git-dir")
    assert not (git_dir / "MERGE_HEAD").exists()
    assert not (git_dir / "MERGE_MSG").exists()
    assert Path(w.worktree).is_dir()
    assert [m.type for m in all_messages(bus)].count("task_merged") == 0


def test_merge_conflict_in_temporary_worktree_leaves_nothing_behind(ws: Workers, bus: Bus,
                                                                    repo: Path,
                                                                    tmp_path: Path) -> None:
    w = conflicting_approved_worker(ws, repo)
    git(repo, "switch", "-q", "-c", "other")
    before = snapshot(ws, "w1", repo)
    main_head = head(repo, "main")
    with pytest.raises(MergeConflict) as raised:
        ws.merge("w1")
    assert raised.value.files == ["README.md"]
    assert snapshot(ws, "w1", repo) == before
    assert head(repo, "main") == main_head
    assert sorted(os.listdir(tmp_path / "worktrees")) == ["w1"]  # no scratch worktree left
    assert worktree_paths(repo) == [str(repo.resolve()), str(Path(w.worktree).resolve())]
    assert ws.get("w1").state == "APPROVED"


@pytest.mark.parametrize("how", ["modified", "staged", "deleted"])
def test_merge_refused_when_base_worktree_has_uncommitted_change(ws: Workers, bus: Bus,
                                                                 repo: Path, how: str) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(w.worktree, "feature.txt", "feature\n")
    ws.done("w1")
    ws.approve("w1")
    if how == "deleted":
        (repo / "README.md").unlink()
    else:
        (repo / "README.md").write_text("edited, not committed\n")
        if how == "staged":
            git(repo, "add", "README.md")
    before = snapshot(ws, "w1", repo)
    files = tree_files(repo)
    with pytest.raises(DirtyWorktree) as raised:
        ws.merge("w1")
    assert str(raised.value) == (f"{repo.resolve()} has uncommitted changes (README.md);"
                                 " commit or stash them first")
    assert snapshot(ws, "w1", repo) == before
    assert tree_files(repo) == files
    assert ws.get("w1").state == "APPROVED"
    assert not (repo / "feature.txt").exists()


def test_merge_blocked_by_untracked_file_in_the_way_changes_nothing(ws: Workers,
                                                                    repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(w.worktree, "feature.txt", "feature\n")
    ws.done("w1")
    ws.approve("w1")
    (repo / "feature.txt").write_text("someone's own file\n")
    before = snapshot(ws, "w1", repo)
    with pytest.raises(GitError) as raised:
        ws.merge("w1")
    assert "would be overwritten by merge" in str(raised.value)
    assert snapshot(ws, "w1", repo) == before
    assert (repo / "feature.txt").read_text() == "someone's own file\n"


# --- done with a dirty worktree -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["untracked", "modified", "staged"])
def test_done_refused_with_uncommitted_changes(ws: Workers, bus: Bus, repo: Path, how: str) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    worktree = Path(w.worktree)
    name = "new.txt" if how == "untracked" else "README.md"
    (worktree / name).write_text("not committed\n")
    if how == "staged":
        git(worktree, "add", name)
    before = snapshot(ws, "w1", repo)
    with pytest.raises(DirtyWorktree) as raised:
        ws.done("w1")
    assert raised.value.changes == [name]
    assert str(raised.value) == (f"{worktree} has uncommitted changes ({name});"
                                 " commit or stash them first")
    assert snapshot(ws, "w1", repo) == before
    assert claim_of(bus, "t1").agent == "w1"


def test_done_ignores_gitignored_files(ws: Workers, repo: Path) -> None:
    commit_file(repo, ".gitignore", "*.log\n")
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    (Path(w.worktree) / "build.log").write_text("noise\n")
    assert ws.done("w1", allow_empty=True).state == "IN_REVIEW"


# --- every transition from every state ------------------------------------------------------------


@pytest.mark.parametrize("state", STATES)
def test_transition_invalid_from_every_state_changes_nothing(ws: Workers, repo: Path,
                                                             tmp_path: Path, state: str) -> None:
    ws.spawn("t1", "w1", repo)
    assert drive(ws, "w1", PATH_TO[state]).state == state
    marker = tmp_path / "ran"
    invalid = [c for c in COMMANDS if c not in allowed_commands(state)]
    assert invalid == [c for c in COMMANDS if c not in EXPECTED_ALLOWED[state]]
    allowed = ", ".join(allowed_commands(state))
    for command in invalid:
        before = snapshot(ws, "w1", repo)
        with pytest.raises(InvalidTransition) as raised:
            call(ws, command, "w1",
                 argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
        assert str(raised.value) == f"worker w1 is {state}; allowed: {allowed}", command
        assert (raised.value.worker, raised.value.state, raised.value.command) == (
            "w1", state, command)
        assert snapshot(ws, "w1", repo) == before, command
        assert not marker.exists(), "run started its command in a state that forbids it"


ALLOWED_PAIRS = [(state, command) for state in STATES for command in allowed_commands(state)]


@pytest.mark.parametrize("state,command", ALLOWED_PAIRS,
                         ids=[f"{s}-{c}" for s, c in ALLOWED_PAIRS])
def test_transition_allowed_from_every_state_reaches_machine_state(
        ws: Workers, bus: Bus, repo: Path, tmp_path: Path, state: str, command: str) -> None:
    ws.spawn("t1", "w1", repo)
    current = drive(ws, "w1", PATH_TO[state])
    changes_before = state_changes(bus, "w1")
    if command in ("done", "run"):
        commit_file(current.worktree, "more.txt", "more\n")
    if command == "run":
        # The command itself reports the state it runs in; run then does `done` (exit 0).
        seen = tmp_path / "seen.txt"
        probe = ("import sys; from bus import Bus; from workers.registry import get\n"
                 "with Bus.open(sys.argv[1], create=False) as b:\n"
                 "    open(sys.argv[2], 'w').write(get(b.conn, 'w1').state)\n")
        result = call(ws, "run", "w1", argv=[sys.executable, "-c", probe, str(bus.path), str(seen)])
        assert seen.read_text() == next_state("w1", "WORKING", "run") == "WORKING"
        assert result.state == ws.get("w1").state == "IN_REVIEW"
        expected_changes = (["start"] if state == "ASSIGNED" else []) + ["done"]
    else:
        result = call(ws, command, "w1")
        result = ws.get("w1") if command == "cleanup" else result
        expected = TRANSITIONS.get((state, command))
        if expected is None:
            assert state in IN_PLACE[command]
            expected = state
        assert result.state == ws.get("w1").state == expected == next_state("w1", state, command)
        expected_changes = [] if command in IN_PLACE else [command]
    new_changes = state_changes(bus, "w1")[len(changes_before):]
    assert [c["command"] for c in new_changes] == expected_changes
    assert_mirror_matches(ws, "w1")


# --- cancel and fail ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["cancel", "fail"])
@pytest.mark.parametrize("state", machine.ACTIVE)
def test_cancel_and_fail_release_claim_and_keep_branch(ws: Workers, bus: Bus, repo: Path,
                                                       state: str, command: str) -> None:
    ws.spawn("t1", "w1", repo)
    current = drive(ws, "w1", PATH_TO[state])
    branch_head = head(repo, "refs/heads/w1/t1")
    assert (claim_of(bus, "t1") is not None) == (state == "WORKING")
    seen = bus.last_seq()
    if command == "cancel":
        ended = ws.cancel("w1", "not needed")
        target, extra = "CANCELLED", []
    else:
        ended = ws.fail("w1", "it broke")
        target = "FAILED"
        extra = [("w1", None, "task_failed", "t1", {"worker": "w1", "reason": "it broke"})]
    reason = "not needed" if command == "cancel" else "it broke"
    assert (ended.state, ended.note) == (target, reason)
    assert ws.get("w1") == ended
    assert claim_of(bus, "t1") is None
    assert head(repo, "refs/heads/w1/t1") == branch_head
    stopped = [("w1", None, "agent_stopped", "t1", {"worker": "w1", "task": "t1"})]
    assert [summary(m) for m in bus.list_messages(after=seen)] == [
        ("w1", None, "state_change", "t1", {"from": state, "to": target, "command": command}),
        *(stopped if state == "WORKING" else []), *extra]
    [beat] = bus.heartbeats.liveness()
    assert (beat.agent, beat.state, beat.status) == ("w1", "stopped", "stopped")
    assert_mirror_matches(ws, "w1")


def test_cancel_does_not_release_another_workers_claim(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done"])
    assert bus.claims.claim("t1", "w2", 60_000)
    ws.cancel("w1")
    assert claim_of(bus, "t1").agent == "w2"


def test_cancel_without_reason_clears_note(ws: Workers, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done"])
    assert ws.cancel("w1").note is None


# --- start and claims -----------------------------------------------------------------------------


def test_start_refused_when_another_worker_holds_the_task(ws: Workers, bus: Bus,
                                                          repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.spawn("t1", "w2", repo)
    ws.start("w1")
    before = snapshot(ws, "w2", repo)
    with pytest.raises(TaskTaken) as raised:
        ws.start("w2")
    assert str(raised.value) == ("task t1 is taken: worker w1 (WORKING) holds it; wait until it"
                                 " finishes, or `worker cancel w1`")
    assert snapshot(ws, "w2", repo) == before
    assert ws.get("w2").state == "ASSIGNED"


def test_start_takes_over_an_expired_lease(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.spawn("t1", "w2", repo)
    ws.start("w1", lease_ms=1)
    wait_for_lease_end(bus, "t1")
    assert ws.start("w2").state == "WORKING"
    claim = claim_of(bus, "t1")
    assert (claim.agent, claim.attempts) == ("w2", 2)


def test_start_refused_when_task_is_dead(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    for n in range(5):  # five leases that ran out: the task is dead
        assert bus.claims.claim("t1", f"crasher-{n}", 1, now=1_700_000_000_000 + n * 10)
    assert not bus.claims.try_claim("t1", "x", 1, now=1_700_000_001_000).granted
    before = snapshot(ws, "w1", repo)
    with pytest.raises(ClaimRefused) as raised:
        ws.start("w1")
    assert str(raised.value).startswith("task t1 is dead (")
    assert snapshot(ws, "w1", repo) == before


# --- heartbeat ------------------------------------------------------------------------------------


def test_heartbeat_assigned_beats_without_claiming(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    before = snapshot(ws, "w1", repo)
    assert ws.heartbeat("w1", "idle", 0.25) == before["row"]
    [beat] = bus.heartbeats.liveness()
    assert (beat.agent, beat.status, beat.task, beat.progress, beat.state) == (
        "w1", "idle", "t1", 0.25, "alive")
    assert bus.claims.list() == []
    after = snapshot(ws, "w1", repo)
    assert {k: v for k, v in after.items() if k not in ("beats", "messages")} == {
        k: v for k, v in before.items() if k not in ("beats", "messages")}
    assert [summary(m) for m in bus.list_messages(after=before["messages"][-1])] == [
        ("w1", None, "task_progress", "t1", {"task": "t1", "progress": 0.25})]


def test_heartbeat_renews_the_lease(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1", lease_ms=60_000)
    first = claim_of(bus, "t1")
    ws.heartbeat("w1", progress=0.5, lease_ms=120_000)
    renewed = claim_of(bus, "t1")
    assert renewed.lease_until_ms >= first.lease_until_ms + 60_000
    assert (renewed.agent, renewed.lease_ms, renewed.attempts, renewed.claimed_at_ms) == (
        "w1", 120_000, 1, first.claimed_at_ms)
    [beat] = bus.heartbeats.liveness()
    assert (beat.agent, beat.status, beat.task, beat.progress) == ("w1", "working", "t1", 0.5)
    wait_until(lambda: now_ms() > renewed.lease_until_ms - 120_000, "the clock to move")
    ws.heartbeat("w1", lease_ms=120_000)
    assert claim_of(bus, "t1").lease_until_ms > renewed.lease_until_ms
    assert ws.get("w1").state == "WORKING"
    assert [c["command"] for c in state_changes(bus, "w1")] == ["spawn", "start"]


def test_heartbeat_reclaims_an_expired_lease_when_free(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1", lease_ms=1)
    wait_for_lease_end(bus, "t1")
    ws.heartbeat("w1", lease_ms=60_000)
    claim = claim_of(bus, "t1")
    assert (claim.agent, claim.attempts, claim.lease_ms) == ("w1", 2, 60_000)
    assert claim.lease_until_ms > now_ms()


def test_heartbeat_refused_when_another_agent_took_the_expired_lease(ws: Workers, bus: Bus,
                                                                     repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1", lease_ms=1)
    wait_for_lease_end(bus, "t1")
    assert bus.claims.claim("t1", "intruder", 60_000)
    with pytest.raises(ClaimRefused) as raised:
        ws.heartbeat("w1")
    assert str(raised.value) == "task t1 is held by intruder until its lease ends; try again later"
    assert claim_of(bus, "t1").agent == "intruder"
    assert ws.get("w1").state == "WORKING"


def test_heartbeat_refused_outside_assigned_and_working(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done"])
    with pytest.raises(InvalidTransition) as raised:
        ws.heartbeat("w1")
    assert str(raised.value) == ("worker w1 is IN_REVIEW; allowed: approve, reject, rework,"
                                 " cancel, fail")
    assert [(b.agent, b.status) for b in bus.heartbeats.liveness()] == [("w1", "stopped")]


# --- run (library) --------------------------------------------------------------------------------


def test_run_keeps_beating_and_renewing_while_the_command_runs(ws: Workers, bus: Bus, repo: Path,
                                                               tmp_path: Path) -> None:
    ws.spawn("t1", "w1", repo)
    # The command waits (with a deadline) until it sees 3 renewals of the lease.
    probe = (
        "import sys, time\n"
        "from bus import Bus\n"
        "seen = set(); deadline = time.monotonic() + 20\n"
        "with Bus.open(sys.argv[1], create=False) as b:\n"
        "    while len(seen) < 3:\n"
        "        assert time.monotonic() < deadline, seen\n"
        "        c = [c for c in b.claims.list() if c.task_id == 't1']\n"
        "        if c and c[0].agent == 'w1': seen.add(c[0].lease_until_ms)\n"
        "        time.sleep(0.005)\n"
        "open('result.txt', 'w').write('done')\n"
        "import subprocess; subprocess.run(['git', 'add', 'result.txt'], check=True)\n"
        "subprocess.run(['git', 'commit', '-qm', 'result'], check=True)\n"
    )
    worker, code = ws.run("w1", [sys.executable, "-c", probe, str(bus.path)], interval=0.02,
                          lease_ms=30_000)
    assert (worker.state, code) == ("IN_REVIEW", 0)
    assert worker.note.endswith("` exited 0")
    [beat] = bus.heartbeats.liveness()  # done's last beat, after the beating thread's
    assert (beat.agent, beat.status, beat.task, beat.state) == ("w1", "stopped", "t1", "stopped")
    assert claim_of(bus, "t1") is None  # done released it


def test_run_without_command_is_refused(ws: Workers, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    with pytest.raises(BusError) as raised:
        ws.run("w1", [])
    assert "needs a command" in str(raised.value)
    assert ws.get("w1").state == "ASSIGNED"


# --- races between run / merge and a cancel from elsewhere ---------------------------------------
# Regression tests for two bugs in workers/lifecycle.py as committed: run's heartbeat thread took
# back the task a fail/cancel had released, and merge changed git before its transaction.


def test_run_cancelled_meanwhile_does_not_take_the_task_back(ws: Workers, bus: Bus,
                                                             repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.spawn("t1", "w2", repo)
    # The command cancels its own worker (as another shell would), then waits for two more beats.
    command = (
        "import sys, time\n"
        "from bus import Bus\n"
        "from workers.lifecycle import Workers\n"
        "with Bus.open(sys.argv[1], create=False) as b:\n"
        "    Workers(b).cancel('w1', 'cancelled meanwhile')\n"
        "    seen, deadline = set(), time.monotonic() + 20\n"
        "    while len(seen) < 3:\n"
        "        assert time.monotonic() < deadline, seen\n"
        "        seen |= {x.ts_ms for x in b.heartbeats.liveness() if x.agent == 'w1'}\n"
        "        time.sleep(0.005)\n"
    )
    with pytest.raises(InvalidTransition) as raised:
        ws.run("w1", [sys.executable, "-c", command, str(bus.path)], interval=0.02)
    assert raised.value.state == "CANCELLED"
    assert ws.get("w1").state == "CANCELLED"
    assert claim_of(bus, "t1") is None  # the beats after the cancel did not take it back
    assert ws.start("w2").state == "WORKING"


def test_run_command_that_cannot_start_leaves_the_task_free(ws: Workers, bus: Bus, repo: Path,
                                                            tmp_path: Path) -> None:
    # A race with the heartbeat thread's first beat: lost in ~20% of rounds by the old code.
    held = []
    for n in range(25):
        ws.spawn(f"t{n}", f"w{n}", repo)
        worker, code = ws.run(f"w{n}", [str(tmp_path / "no-such-command")], interval=10)
        assert (worker.state, code) == ("FAILED", 127)
        if claim_of(bus, f"t{n}") is not None:
            held.append(f"t{n}")
    assert held == [], f"{len(held)} of 25 FAILED workers still hold their task"


def test_merge_racing_cancel_is_refused_and_leaves_the_base_alone(ws: Workers, bus: Bus,
                                                                   repo: Path,
                                                                   tmp_path: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done", "approve"])
    base_before = head(repo, "main")
    # A real git hook plays the other shell: it cancels the worker mid-merge. The merge holds
    # no bus lock while git runs, so the cancel goes through, and the merge's compare-and-set
    # then refuses to record a merge of a worker that is no longer APPROVED.
    hook = repo / ".git" / "hooks" / "post-merge"
    status = tmp_path / "cancel-status"
    hook.write_text(f"#!/bin/sh\n{sys.executable} -m workers.cli --db {bus.path} cancel w1"
                    f" --reason 'changed my mind'\necho $? > {status}\n")
    hook.chmod(0o755)
    with pytest.raises(WorkerChanged) as raised:
        ws.merge("w1")
    assert str(raised.value) == (
        "worker w1 changed while `worker merge` ran (state APPROVED -> CANCELLED, note"
        " 'done by test' -> 'changed my mind'); the merge was refused and main is unchanged;"
        " see `worker status w1`")
    assert status.read_text() == "0\n"  # the cancel was not kept waiting
    assert ws.get("w1").state == "CANCELLED"
    assert head(repo, "main") == base_before
    assert git(repo, "status", "--porcelain") == ""
    assert [m.type for m in all_messages(bus)].count("task_merged") == 0
    assert state_changes(bus, "w1")[-1] == {"from": "APPROVED", "to": "CANCELLED",
                                            "command": "cancel"}
    assert Path(w.worktree).is_dir()  # cancel keeps the worktree for cleanup
    assert worktree_paths(repo) == [str(repo.resolve()), str(Path(w.worktree).resolve())]


def test_merge_refuses_commits_added_after_review(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    drive(ws, "w1", ["start", "done", "approve"])
    base_before = head(repo, "main")
    commit_file(w.worktree, "late.txt", "not reviewed\n")
    with pytest.raises(BranchMoved, match="moved since it was reviewed"):
        ws.merge("w1")
    assert ws.get("w1").state == "APPROVED"
    assert head(repo, "main") == base_before


# --- mirror and status ----------------------------------------------------------------------------


def test_mirror_rewritten_after_each_transition(ws: Workers, bus: Bus, repo: Path,
                                                tmp_path: Path) -> None:
    mirrors = tmp_path / "workers"
    w = ws.spawn("t1", "w1", repo)
    ws.spawn("t2", "w2", repo)
    snapshots = [mirror_path(ws, "w1").read_bytes()]
    for command in ["start", "done", "reject", "done", "approve", "merge"]:
        if command == "done":
            commit_file(w.worktree, f"f{len(snapshots)}.txt", "x\n")
        call(ws, command, "w1")
        text = mirror_path(ws, "w1").read_bytes()
        assert text not in snapshots  # rewritten
        snapshots.append(text)
        mirror = json.loads(text)
        row = ws.get("w1").to_json_dict()
        assert mirror == row
        [status] = [s.to_json_dict() for s in ws.status("w1")]
        assert {k: v for k, v in status.items()
                if k not in ("heartbeat_age_s", "liveness")} == mirror
        assert sorted(os.listdir(mirrors)) == ["w1.json", "w2.json"]
    assert list(json.loads(snapshots[-1])) == [
        "worker", "task", "state", "repo", "base", "branch", "worktree", "head_commit",
        "merge_commit", "note", "created_at_ms", "updated_at_ms"]


def test_status_lists_workers_with_heartbeat_age_and_liveness(ws: Workers, bus: Bus,
                                                              repo: Path) -> None:
    assert ws.status() == []
    ws.spawn("t1", "w1", repo)
    ws.spawn("t2", "w2", repo)
    ws.heartbeat("w2")
    first, second = ws.status()
    assert (first.worker.worker, first.heartbeat_age_s, first.liveness) == ("w1", None, None)
    assert (second.worker.worker, second.liveness) == ("w2", "alive")
    assert 0 <= second.heartbeat_age_s < 30
    assert [s.worker.worker for s in ws.status("w2")] == ["w2"]
    assert first.to_json_dict() == {**ws.get("w1").to_json_dict(), "heartbeat_age_s": None,
                                    "liveness": None}


# --- random command sequences (Hypothesis) --------------------------------------------------------

_examples = iter(range(10**9))
TRUE = shutil.which("true") or "true"
FALSE = shutil.which("false") or "false"


@scaled_settings(max_examples=25)
@given(data=st.data())
def test_workers_random_commands_never_leave_the_machine(tmp_path: Path, data) -> None:
    root = tmp_path / f"example-{next(_examples)}"
    repo = make_repo(root / "repo")
    with Bus.open(root / "state" / "bus.db") as bus:
        ws = Workers(bus)
        w = ws.spawn("t1", "w1", repo)
        expected_changes = 1
        for _ in range(data.draw(st.integers(1, 12), label="steps")):
            state = ws.get("w1").state
            # Mostly a command that moves on (or stays) in this state, else any command at
            # all: mostly refused ones, and cancel / fail now and then.
            onward = [c for c in allowed_commands(state) if c not in ("cancel", "fail")]
            anything = st.sampled_from(COMMANDS)
            command = data.draw(st.sampled_from(onward) | st.sampled_from(onward) | anything
                                if onward else anything, label="command")
            extra = data.draw(st.sampled_from(["commit", "nothing", "untracked"]), label="extra")
            worktree = Path(w.worktree)
            dirty = None
            # Work is committed only before a `done` that is allowed: a commit after review
            # (then a refused `done`) would make the next `merge` refuse with BranchMoved.
            finishing = command in ("done", "run") and command in allowed_commands(state)
            if finishing and worktree.is_dir():
                if extra == "commit":
                    commit_file(worktree, f"f{next(_examples)}.txt", "x\n")
                elif extra == "untracked":
                    dirty = worktree / "scratch.txt"
                    dirty.write_text("not committed\n")
            argv = [TRUE] if extra != "untracked" else [FALSE]
            empty = finishing and argv == [TRUE] and git(
                worktree, "rev-list", "--count", "main..HEAD") == "0"
            before = snapshot(ws, "w1", repo, full=False)
            if command not in allowed_commands(state):
                with pytest.raises(InvalidTransition) as raised:
                    call(ws, command, "w1", argv=argv)
                assert (raised.value.state, raised.value.command) == (state, command)
                assert snapshot(ws, "w1", repo, full=False) == before
            elif dirty is not None and command == "done":
                with pytest.raises(DirtyWorktree):
                    call(ws, command, "w1", argv=argv)
                assert snapshot(ws, "w1", repo, full=False) == before
            elif empty and command == "done":
                with pytest.raises(EmptyWork):
                    call(ws, command, "w1", argv=argv)
                assert snapshot(ws, "w1", repo, full=False) == before
            elif empty:  # run: the command succeeded with nothing to review; still WORKING
                with pytest.raises(EmptyWork):
                    call(ws, command, "w1", argv=argv)
                assert ws.get("w1").state == "WORKING"
                expected_changes += state == "ASSIGNED"
            else:
                call(ws, command, "w1", argv=argv)
                after = ws.get("w1").state
                if command == "run":
                    assert after == ("IN_REVIEW" if argv == [TRUE] else "FAILED")
                    expected_changes += 2 if state == "ASSIGNED" else 1
                else:
                    assert after == next_state("w1", state, command)
                    expected_changes += command not in IN_PLACE
            if dirty is not None and dirty.exists():
                dirty.unlink()
            assert_mirror_matches(ws, "w1")

        changes = state_changes(bus, "w1")
        assert len(changes) == expected_changes
        assert changes[0] == {"from": None, "to": "ASSIGNED", "command": "spawn"}
        replayed = "ASSIGNED"
        for change in changes[1:]:
            assert change["from"] == replayed
            replayed = TRANSITIONS[(replayed, change["command"])]
            assert change["to"] == replayed
        assert replayed == ws.get("w1").state
        event(f"ended {replayed}")  # see --hypothesis-show-statistics


def test_a_worker_is_at_work_in_sql_exactly_when_the_machine_says_it_is_not_terminal(tmp_path):
    """worker_table.AT_WORK_SQL (reservations, the registry) agrees with machine.TERMINAL."""
    from bus.coordination.worker_table import AT_WORK_SQL
    from workers import registry
    from workers.registry import Worker

    with Bus.open(tmp_path / "bus.db") as bus:
        for state in STATES:
            registry.insert(bus.conn, Worker(f"w-{state}", "t", state, "/r", "main", "b", "/wt",
                                             None, None, None, 1, 1))
        at_work = {worker for (worker,) in bus.conn.execute(
            f"SELECT worker_id FROM workers WHERE {AT_WORK_SQL}")}
    assert at_work == {f"w-{state}" for state in STATES if state not in machine.TERMINAL}
    assert machine.TERMINAL == {"COMPLETED", "CANCELLED", "FAILED"}
