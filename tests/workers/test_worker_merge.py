"""`worker merge` holds no bus lock while git works (issue 30).

The merge is built outside any transaction, then recorded by a compare-and-set
on the worker in one short transaction that also moves the base branch. Real
git hooks stand in for a slow merge and for the other shells racing it; the
merge, the publisher and the racing commands are real processes on one bus file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus import Bus
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import head
from tests.support.procs_workers import worktree_paths
from tests.support.waiting import wait_until
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from workers.git import GitError
from workers.lifecycle import WorkerChanged
from workers.lifecycle import Workers
from workers.registry import Worker

WAIT_TIMEOUT = 60.0  # seconds, for conditions on the wall clock (a busy machine)
# git exports these to its hooks; a hook that runs git on another repository drops them.
UNSET_GIT = "unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_PREFIX GIT_COMMON_DIR\n"

PUBLISH = """\
import sys
from bus import Bus
with Bus.open(sys.argv[1], create=False) as bus:
    print(bus.publish("p1", "note", {"n": 1}).seq)
"""


def approved(ws: Workers, repo: Path, main_moves: bool = False) -> Worker:
    w = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(w.worktree, "feature.txt", "feature\n")
    if main_moves:  # so the merge makes a merge commit
        commit_file(repo, "main.txt", "main\n")
    ws.done("w1", "ready")
    return ws.approve("w1")


def post_merge_hook(repo: Path, body: str) -> None:
    hook = repo / ".git" / "hooks" / "post-merge"
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(0o755)


def worker_cli(bus: Bus, *args: str) -> list[str]:
    return [sys.executable, "-m", "workers.cli", "--db", str(bus.path), *args]


def merged_messages(bus: Bus) -> list:
    return [m for m in bus.list_messages(limit=10_000) if m.type == "task_merged"]


def test_merge_slow_hook_does_not_block_a_publisher(ws: Workers, bus: Bus, repo: Path,
                                                    tmp_path: Path) -> None:
    w = approved(ws, repo, main_moves=True)
    in_hook, go = tmp_path / "in-hook", tmp_path / "go"
    # Slower than the bus's 5 s busy timeout, and it stays in the hook until the test has seen
    # the publish finish, so "the publish finished before the merge" holds on any machine.
    post_merge_hook(repo, f"touch {in_hook}\nsleep 8\n"
                          f"while [ ! -e {go} ]; do sleep 0.05; done\n")
    merger = subprocess.Popen(worker_cli(bus, "merge", "w1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_until(in_hook.exists, "the merge to reach its hook")
        published = subprocess.run([sys.executable, "-c", PUBLISH, str(bus.path)],
                                   capture_output=True, text=True, timeout=WAIT_TIMEOUT)
        assert (published.returncode, published.stderr) == (0, "")
        assert merger.poll() is None  # the merge is still in git while the publish is done
    finally:
        go.touch()
        out, err = merger.communicate(timeout=WAIT_TIMEOUT)
    assert (merger.returncode, err) == (0, "")
    done = ws.get("w1")
    assert out.startswith(f"merged w1/t1 into main at {done.merge_commit[:12]}")
    assert (done.state, head(repo, "main")) == ("COMPLETED", done.merge_commit)
    # The log agrees: the publish is in it before the merge's transition.
    completed = next(m.seq for m in bus.list_messages(limit=10_000)
                     if m.type == "state_change" and m.payload["to"] == "COMPLETED")
    assert int(published.stdout) < completed
    assert not Path(w.worktree).exists()
    assert worktree_paths(repo) == [str(repo.resolve())]


def test_merge_two_at_once_of_one_worker_exactly_one_wins(ws: Workers, bus: Bus, repo: Path,
                                                          tmp_path: Path) -> None:
    approved(ws, repo, main_moves=True)
    marker, status = tmp_path / "second-started", tmp_path / "second-status"
    # While the first merge is in its hook, a second `worker merge w1` runs to its end.
    post_merge_hook(repo, f"[ -e {marker} ] && exit 0\ntouch {marker}\n{UNSET_GIT}"
                          f"{' '.join(worker_cli(bus, 'merge', 'w1'))} >/dev/null\n"
                          f"echo $? > {status}\n")
    with pytest.raises(WorkerChanged) as raised:
        ws.merge("w1")
    done = ws.get("w1")
    assert status.read_text() == "0\n"  # the second merge won
    assert str(raised.value) == (
        f"worker w1 changed while `worker merge` ran (state APPROVED -> COMPLETED, merge_commit"
        f" None -> {done.merge_commit!r}); the merge was refused and main is unchanged; see"
        " `worker status w1`")
    assert (done.state, head(repo, "main")) == ("COMPLETED", done.merge_commit)
    assert [m.payload["commit"] for m in merged_messages(bus)] == [done.merge_commit]
    assert [m.payload["to"] for m in bus.list_messages(limit=10_000)
            if m.type == "state_change"].count("COMPLETED") == 1
    assert git(repo, "status", "--porcelain") == ""
    assert worktree_paths(repo) == [str(repo.resolve())]


@pytest.mark.parametrize("checked_out", [True, False])
def test_merge_refused_when_the_base_moves_meanwhile(ws: Workers, bus: Bus, repo: Path,
                                                     checked_out: bool) -> None:
    approved(ws, repo)
    base_before = head(repo, "main")
    if not checked_out:
        git(repo, "switch", "-q", "-c", "other")
    # Someone commits on main while the merge is in its hook: the merge must not undo that.
    post_merge_hook(repo, f"{UNSET_GIT}git -C {repo} commit -q --allow-empty -m meanwhile"
                          if checked_out else
                          f"{UNSET_GIT}git -C {repo} update-ref refs/heads/main"
                          f" $(git -C {repo} commit-tree -p main -m meanwhile main^{{tree}})\n")
    with pytest.raises(GitError) as raised:
        ws.merge("w1")
    moved_to = head(repo, "main")
    assert str(raised.value) == (f"main moved while the merge ran (from {base_before[:12]} to"
                                 f" {moved_to[:12]}); nothing was merged; run the merge again")
    assert git(repo, "log", "-1", "--format=%s", "main") == "meanwhile"
    assert ws.get("w1").state == "APPROVED"
    assert merged_messages(bus) == []
    assert len(worktree_paths(repo)) == 2  # the repository and w1's worktree, no scratch


def test_merge_takes_the_reviewed_commit_even_if_the_branch_moves_meanwhile(
        ws: Workers, bus: Bus, repo: Path) -> None:
    w = approved(ws, repo)
    reviewed = w.head_commit
    post_merge_hook(repo, f"{UNSET_GIT}git -C {w.worktree} commit -q --allow-empty -m late\n")
    done = ws.merge("w1")
    assert (done.state, done.merge_commit, head(repo, "main")) == ("COMPLETED", reviewed, reviewed)
    assert git(repo, "log", "-1", "--format=%s", "w1/t1") == "late"  # made, and not merged
    assert [m.payload["commit"] for m in merged_messages(bus)] == [reviewed]
