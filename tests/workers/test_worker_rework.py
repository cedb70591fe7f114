"""No dead ends in the worker lifecycle (issue 15): rework after a conflict or a moved
branch, cleanup, empty work, rival workers, the exclude entry, seed 003's vocabulary,
stopped heartbeats and task_reclaimed after a SIGKILLed `worker run`.

Real git repositories and real bus files, as in tests/workers/test_workers.py; the SIGKILL
test runs `worker run` as its own process group and kills it with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus
from bus.log.messages import now_ms
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import head
from tests.support.procs_workers import make_repo
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from workers.cli import main as worker_main
from workers.git import DirtyWorktree
from workers.git import GitError
from workers.git import MergeConflict
from workers.lifecycle import BranchMoved
from workers.lifecycle import ClaimRefused
from workers.lifecycle import EmptyWork
from workers.lifecycle import TaskTaken
from workers.lifecycle import Workers
from workers.machine import InvalidTransition

WAIT_TIMEOUT = 20.0




def types_after(bus: Bus, seq: int) -> list[tuple[str, str]]:
    return [(m.from_agent, m.type) for m in bus.list_messages(after=seq, limit=10_000)]


def wait_until(condition, what: str) -> None:
    deadline = now_ms() + WAIT_TIMEOUT * 1000
    while not condition():
        assert now_ms() < deadline, f"timed out waiting for {what}"
        subprocess.run(["sleep", "0.01"])


def approved_with_conflict(ws: Workers, repo: Path, worker: str = "w1"):
    w = ws.spawn("t1", worker, repo)
    ws.start(worker)
    commit_file(w.worktree, "README.md", "branch side\n")
    commit_file(repo, "README.md", "main side\n")
    ws.done(worker)
    return ws.approve(worker)


# --- a way out of every state -----------------------------------------------------------


def test_rework_after_merge_conflict_then_resolve_done_approve_merge(ws: Workers, bus: Bus,
                                                                     repo: Path) -> None:
    w = approved_with_conflict(ws, repo)
    with pytest.raises(MergeConflict) as raised:
        ws.merge("w1")
    assert str(raised.value) == (
        f"merging w1/t1 into main conflicts in: README.md; the merge was aborted and nothing"
        f" changed; run `worker rework w1`, resolve on w1/t1 in {w.worktree} (git merge main,"
        f" fix the files, commit), then done, approve and merge again")
    seen = bus.last_seq()
    reworked = ws.rework("w1", "conflicts with main")
    assert (reworked.state, reworked.branch, reworked.worktree, reworked.note) == (
        "WORKING", w.branch, w.worktree, "conflicts with main")
    assert bus.claims.list()[0].agent == "w1"
    assert types_after(bus, seen) == [("w1", "state_change"), ("w1", "task_claim"),
                                      ("w1", "agent_started")]
    # resolve on the branch: merge main in, keep both sides
    merged = subprocess.run(["git", "-C", w.worktree, "merge", "-q", "main"], capture_output=True)
    assert merged.returncode != 0  # the same conflict, now in the worker's worktree
    commit_file(w.worktree, "README.md", "branch side\nmain side\n", "resolve")
    ws.done("w1", "resolved")
    ws.approve("w1")
    done = ws.merge("w1")
    assert done.state == "COMPLETED"
    assert (repo / "README.md").read_text() == "branch side\nmain side\n"
    assert head(repo, "main") == done.merge_commit


def test_rework_after_branch_moved_since_review(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    reviewed = commit_file(w.worktree, "a.txt", "a\n")
    ws.done("w1")
    ws.approve("w1")
    moved = commit_file(w.worktree, "b.txt", "b\n")  # after review
    with pytest.raises(BranchMoved) as raised:
        ws.merge("w1")
    assert str(raised.value) == (
        f"w1/t1 moved since it was reviewed (reviewed {reviewed[:12]}, now {moved[:12]});"
        " run `worker rework w1`, then done, approve and merge again")
    assert ws.get("w1").state == "APPROVED"
    assert ws.rework("w1").state == "WORKING"
    assert ws.done("w1").head_commit == moved
    ws.approve("w1")
    assert ws.merge("w1").merge_commit == moved == head(repo, "main")


def test_rework_refused_while_another_worker_holds_the_lease(ws: Workers, bus: Bus,
                                                             repo: Path) -> None:
    approved_with_conflict(ws, repo)
    assert bus.claims.claim("t1", "someone", 60_000)
    with pytest.raises(ClaimRefused) as raised:
        ws.rework("w1")
    assert str(raised.value) == "task t1 is held by someone until its lease ends; try again later"
    assert ws.get("w1").state == "APPROVED"


# --- cleanup ------------------------------------------------------------------------------


def test_cleanup_removes_finished_worktrees_and_merged_branches(ws: Workers, bus: Bus,
                                                                repo: Path) -> None:
    done = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(done.worktree, "a.txt", "a\n")
    ws.done("w1")
    ws.approve("w1")
    ws.merge("w1")
    cancelled = ws.spawn("t2", "w2", repo)
    ws.cancel("w2")
    failed = ws.spawn("t3", "w3", repo)
    ws.start("w3")
    commit_file(failed.worktree, "c.txt", "c\n")
    ws.fail("w3", "broke")
    ws.spawn("t4", "w4", repo)  # unfinished: left alone
    cleaned = ws.cleanup(branches=True)
    assert [(c.worker, c.state, c.worktree, c.branch, c.kept_branch) for c in cleaned] == [
        ("w1", "COMPLETED", None, "w1/t1", None),       # merge removed its worktree already
        ("w2", "CANCELLED", cancelled.worktree, "w2/t2", None),  # no commit: merged trivially
        ("w3", "FAILED", failed.worktree, None, "w3/t3"),        # unmerged work is kept
    ]
    assert not Path(cancelled.worktree).exists() and not Path(failed.worktree).exists()
    assert Path(ws.get("w4").worktree).is_dir()
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["main", "w3/t3", "w4/t4"]
    again = ws.cleanup()  # nothing left to remove; without --branches w3/t3 is not looked at
    assert [(c.worker, c.worktree, c.branch, c.kept_branch) for c in again] == [
        ("w1", None, None, None), ("w2", None, None, None), ("w3", None, None, None)]


def test_cleanup_refuses_a_dirty_worktree_unless_forced(ws: Workers, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.cancel("w1")
    (Path(w.worktree) / "notes.txt").write_text("not committed\n")
    with pytest.raises(DirtyWorktree) as raised:
        ws.cleanup("w1")
    assert str(raised.value) == (f"{w.worktree} has uncommitted changes (notes.txt); commit them"
                                 " on the branch first, or pass --force to discard them")
    assert (Path(w.worktree) / "notes.txt").exists()
    [cleaned] = ws.cleanup("w1", force=True)
    assert cleaned.worktree == w.worktree and not Path(w.worktree).exists()


def test_cleanup_of_an_unfinished_worker_is_refused(ws: Workers, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    with pytest.raises(InvalidTransition) as raised:
        ws.cleanup("w1")
    assert str(raised.value) == ("worker w1 is ASSIGNED; allowed: start, cancel, fail,"
                                 " heartbeat, run")
    assert Path(w.worktree).is_dir()


def test_cli_cleanup_says_what_it_removed(db_path: Path, bus: Bus, repo: Path) -> None:
    ws = Workers(bus)
    w = ws.spawn("t1", "w1", repo)
    ws.fail("w1", "broke")
    runner = CliRunner()
    usage = runner.invoke(worker_main, ["--db", str(db_path), "cleanup"])
    assert (usage.exit_code, usage.stderr.splitlines()[-1]) == (
        2, "Error: name a WORKER or pass --finished (not both)")
    result = runner.invoke(worker_main, ["--db", str(db_path), "cleanup", "--finished",
                                         "--branches"])
    assert (result.exit_code, result.stdout) == (
        0, f"w1 (FAILED): removed worktree {w.worktree};"
           " deleted branch w1/t1 (already in its base)\n")
    again = runner.invoke(worker_main, ["--db", str(db_path), "cleanup", "--finished"])
    assert again.stdout == "w1 (FAILED): no worktree left\n"


# --- done, spawn and start refusals -------------------------------------------------------


def test_done_refuses_a_branch_without_commits(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    seen = bus.last_seq()
    with pytest.raises(EmptyWork) as raised:
        ws.done("w1")
    assert str(raised.value) == (
        f"w1/t1 has no commit beyond main; commit the work in {w.worktree} first (git add,"
        " then git commit), or pass allow_empty=True to review an empty branch")
    assert ws.get("w1").state == "WORKING" and bus.last_seq() == seen
    assert ws.done("w1", allow_empty=True).head_commit == head(repo, "main")


def test_spawn_and_start_refuse_a_task_another_worker_holds_or_has_in_review(
        ws: Workers, bus: Bus, repo: Path) -> None:
    w1 = ws.spawn("t1", "w1", repo)
    ws.spawn("t1", "w2", repo)  # w1 only ASSIGNED: nobody holds t1 yet
    ws.start("w1")
    holds = ("task t1 is taken: worker w1 (WORKING) holds it; wait until it finishes,"
             " or `worker cancel w1`")
    for attempt in (lambda: ws.spawn("t1", "w3", repo), lambda: ws.start("w2")):
        with pytest.raises(TaskTaken) as raised:
            attempt()
        assert str(raised.value) == holds
    commit_file(w1.worktree, "a.txt", "a\n")
    ws.done("w1")  # the lease is released, but the task is in review
    with pytest.raises(TaskTaken) as raised:
        ws.start("w2")
    assert str(raised.value) == ("task t1 is taken: worker w1 (IN_REVIEW) has it in review;"
                                 " wait until it finishes, or `worker cancel w1`")
    assert not git(repo, "branch", "--list", "w3/t1")
    ws.cancel("w1")
    assert ws.start("w2").state == "WORKING"


def test_start_takes_over_from_a_worker_whose_lease_ran_out(ws: Workers, bus: Bus,
                                                            repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.start("w1", lease_ms=1)
    until = bus.claims.list()[0].lease_until_ms
    wait_until(lambda: now_ms() > until, "the lease to run out")
    ws.spawn("t1", "w2", repo)
    seen = bus.last_seq()
    ws.start("w2")
    reclaimed = [m for m in bus.list_messages(after=seen) if m.type == "task_reclaimed"]
    assert [(m.from_agent, m.payload) for m in reclaimed] == [
        ("bus", {"task": "t1", "previous_holder": "w1", "new_holder": "w2", "attempt": 2,
                 "fence": 2})]


def test_spawn_in_a_repository_without_commits_says_so(ws: Workers, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    with pytest.raises(GitError) as raised:
        ws.spawn("t1", "w1", empty)
    assert str(raised.value) == (f"{empty} has no commits yet; make a first commit"
                                 " (git commit --allow-empty -m initial) and spawn again")


def test_spawn_excludes_the_state_dir_once(repo: Path) -> None:
    db = repo / ".worker-state" / "bus.db"
    exclude = repo / ".git" / "info" / "exclude"
    before = exclude.read_text() if exclude.exists() else ""
    runner = CliRunner()
    first = runner.invoke(worker_main, ["--db", str(db), "spawn", "--task", "t1", "--worker",
                                        "w1", "--repo", str(repo)])
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines()[0] == (
        f"added .worker-state/ to {exclude} so git status ignores it")
    second = runner.invoke(worker_main, ["--db", str(db), "spawn", "--task", "t2", "--worker",
                                         "w2", "--repo", str(repo)])
    assert second.stdout.startswith("spawned w2")
    assert exclude.read_text() == before + ("" if before.endswith("\n") or not before
                                            else "\n") + "/.worker-state/\n"
    assert git(repo, "status", "--porcelain") == ""


def test_spawn_leaves_exclude_alone_when_gitignore_covers_the_state_dir(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {".gitignore": ".worker-state/\n"})
    exclude = repo / ".git" / "info" / "exclude"
    before = exclude.read_text() if exclude.exists() else None
    with Bus.open(repo / ".worker-state" / "bus.db") as bus:
        ws = Workers(bus)
        assert ws.ignore_state_dir(repo) is None
        ws.spawn("t1", "w1", repo)
    assert (exclude.read_text() if exclude.exists() else None) == before


def test_spawn_refused_writes_no_exclude_entry(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    exclude = repo / ".git" / "info" / "exclude"
    before = exclude.read_text() if exclude.exists() else None
    db = repo / ".worker-state" / "bus.db"
    result = CliRunner().invoke(worker_main, ["--db", str(db), "spawn", "--task", "t 1",
                                              "--repo", str(repo)])
    assert result.exit_code == 1 and "is not a valid branch name" in result.stderr
    assert (exclude.read_text() if exclude.exists() else None) == before


# --- seed 003's vocabulary and the last heartbeat ------------------------------------------


def test_vocabulary_each_message_once_at_its_moment(ws: Workers, bus: Bus, repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    seen = bus.last_seq()
    ws.start("w1")
    assert types_after(bus, seen) == [("w1", "state_change"), ("w1", "task_claim"),
                                      ("w1", "agent_started")]
    seen = bus.last_seq()
    ws.heartbeat("w1", progress=0.5)
    ws.heartbeat("w1", progress=0.5)   # unchanged: nothing more
    ws.heartbeat("w1", "blocked", 0.5)
    ws.heartbeat("w1", "blocked", 0.5)  # still blocked: nothing more
    ws.heartbeat("w1", "working", 0.75)
    assert [(m.type, m.payload) for m in bus.list_messages(after=seen)] == [
        ("task_progress", {"task": "t1", "progress": 0.5}),
        ("task_blocked", {"task": "t1"}),
        ("task_progress", {"task": "t1", "progress": 0.75})]
    commit_file(w.worktree, "a.txt", "a\n")
    seen = bus.last_seq()
    ws.done("w1")
    assert types_after(bus, seen) == [("w1", "state_change"), ("w1", "agent_stopped"),
                                      ("w1", "task_done"), ("w1", "review_request")]
    [beat] = bus.heartbeats.liveness()
    assert (beat.agent, beat.status, beat.state) == ("w1", "stopped", "stopped")
    assert bus.heartbeats.liveness(stopped=False) == []


def test_fail_and_cancel_leave_a_stopped_beat(ws: Workers, bus: Bus, repo: Path) -> None:
    ws.spawn("t1", "w1", repo)
    ws.spawn("t2", "w2", repo)
    ws.start("w1")
    ws.heartbeat("w2")
    ws.fail("w1", "broke")
    ws.cancel("w2")
    assert [(b.agent, b.status, b.state) for b in bus.heartbeats.liveness()] == [
        ("w1", "stopped", "stopped"), ("w2", "stopped", "stopped")]
    types = [m.type for m in bus.list_messages(limit=1000)]
    assert types.count("agent_started") == 1 and types.count("agent_stopped") == 1


@pytest.mark.parametrize("back", ["reject", "rework"])
def test_back_to_work_the_stopped_beat_gives_way_to_a_working_one(
        ws: Workers, bus: Bus, repo: Path, back: str) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    ws.heartbeat("w1", progress=0.5)
    commit_file(w.worktree, "a.txt", "a\n")
    ws.done("w1")
    seen = bus.last_seq()
    ws.reject("w1", "add a test") if back == "reject" else ws.rework("w1")
    [beat] = bus.heartbeats.liveness()
    assert (beat.agent, beat.status, beat.task, beat.state) == ("w1", "working", "t1", "alive")
    assert beat.progress is None  # the new stint has made no progress yet
    [status] = ws.status("w1")
    assert (status.worker.state, status.liveness) == ("WORKING", "alive")
    assert "task_progress" not in [m.type for m in bus.list_messages(after=seen)]


def test_back_to_work_leaves_a_forgotten_agent_forgotten(ws: Workers, bus: Bus,
                                                         repo: Path) -> None:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(w.worktree, "a.txt", "a\n")
    ws.done("w1")
    assert bus.heartbeats.forget("w1")
    ws.rework("w1")
    assert bus.heartbeats.liveness() == []


# --- a SIGKILLed `worker run` and the takeover ----------------------------------------------


def test_task_reclaimed_after_sigkilled_worker_run(db_path: Path, bus: Bus, repo: Path) -> None:
    ws = Workers(bus)
    ws.spawn("t1", "w1", repo)
    argv = [sys.executable, "-m", "workers.cli", "--db", str(db_path), "run", "w1",
            "--interval", "0.05", "--lease-ms", "1000", "--",
            sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: [c.agent for c in bus.claims.list()] == ["w1"]
                   and [b.agent for b in bus.heartbeats.liveness()] == ["w1"],
                   "w1 to hold t1 and beat")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with pytest.raises(TaskTaken):  # the lease has not run out yet
        ws.spawn("t1", "w2", repo)
    until = bus.claims.list()[0].lease_until_ms
    wait_until(lambda: now_ms() > until, "w1's lease to run out")
    ws.spawn("t1", "w2", repo)
    ws.start("w2")
    [reclaimed] = [m for m in bus.list_messages(limit=1000) if m.type == "task_reclaimed"]
    assert reclaimed.payload == {"task": "t1", "previous_holder": "w1", "new_holder": "w2",
                                 "attempt": 2, "fence": 2}
    # died beating
    assert [(b.agent, b.status) for b in bus.heartbeats.liveness()] == [("w1", "working")]
