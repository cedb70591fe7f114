"""The `worker` command line: outputs, errors and exit codes, and real processes.

Most tests drive `workers.cli.main` in-process through click's CliRunner.
Real processes (`python -m workers.cli`) run where the process matters:
`worker run` (its command, its exit code, a SIGKILL of its whole process
group), two `worker start` released together by a barrier
(tests/support/procs_workers.py, on top of tests/support/procs_coordination.py), and a PATH
without git. Waits are on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus
from bus.coordination import heartbeats
from bus.log.messages import now_ms
from tests.support.procs_coordination import Barrier
from tests.support.procs_workers import WorkerChild
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import head
from tests.support.procs_workers import GIT_REPO_VARIABLES
from tests.support.procs_workers import hermetic_git_env
from tests.support.procs_workers import make_repo
from tests.support.procs_workers import worktree_paths
from tests.support.waiting import wait_until
from tests.support.worker_fixtures import isolate_git
from workers.cli import main
from workers.lifecycle import Workers
from workers.registry import get as get_row

STARTUP_TIMEOUT = 60.0  # for a child process to import everything and say "ready"
RUN_TIMEOUT = 60.0  # for a `worker` process to finish
RACE_ROUNDS = 4
SUBCOMMANDS = ["spawn", "start", "heartbeat", "run", "done", "approve", "reject", "rework",
               "merge", "cancel", "fail", "cleanup", "status"]


# --- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git in this process (CliRunner) sees no user config and writes nothing outside tmp_path."""
    isolate_git(tmp_path, monkeypatch)


@pytest.fixture
def env(tmp_path: Path, python_env: dict[str, str]) -> dict[str, str]:
    """Environment of child processes: this checkout importable, git hermetic."""
    full = dict(python_env, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    full.pop("BUS_DURABILITY", None)
    for name in GIT_REPO_VARIABLES:
        full.pop(name, None)
    full.update(hermetic_git_env(tmp_path))
    return full


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "bus.db"


@pytest.fixture
def children(tmp_path: Path):
    started: list[WorkerChild] = []
    yield started
    for child in started:
        child.cleanup()


def run(args: list[str], db: Path | str | None = None, *, env: dict | None = None):
    """Invoke `worker` in-process; BUS_DB / BUS_DURABILITY from the caller's shell are hidden."""
    full_env = {"BUS_DB": None, "BUS_DURABILITY": None, **(env or {})}
    argv = (["--db", str(db)] if db is not None else []) + args
    return CliRunner().invoke(main, argv, env=full_env, catch_exceptions=False)


def ok(args: list[str], db: Path | None = None) -> str:
    result = run(args, db)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    return result.stdout


def error(args: list[str], db: Path | None = None, code: int = 1) -> str:
    result = run(args, db)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    return result.stderr


def worker_argv(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "workers.cli", "--db", str(db), *args]


def run_process(argv: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          stdin=subprocess.DEVNULL, **kwargs)


def row(db: Path, worker: str) -> dict:
    with Bus.open(db, create=False) as bus:
        return get_row(bus.conn, worker).to_json_dict()


def state_changes(db: Path, worker: str) -> list[dict]:
    with Bus.open(db, create=False) as bus:
        return [m.payload for m in bus.list_messages(limit=10_000)
                if m.type == "state_change" and m.from_agent == worker]


def claim_of(bus: Bus, task: str):
    return next((c for c in bus.claims.list() if c.task_id == task), None)


def spawn(db: Path, repo: Path, task: str, worker: str) -> dict:
    ok(["spawn", "--task", task, "--worker", worker, "--repo", str(repo)], db)
    return row(db, worker)


# --- the lifecycle, human output ------------------------------------------------------------------


def test_cli_done_names_the_flag_for_an_empty_branch(db: Path, repo: Path) -> None:
    ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db)
    ok(["start", "w1"], db)
    refused = run(["done", "w1"], db)
    assert refused.exit_code == 1
    assert refused.stderr.endswith("or pass --allow-empty to review an empty branch\n")
    assert ok(["done", "w1", "--allow-empty"], db).startswith("w1 is IN_REVIEW at ")


def test_cli_lifecycle_prints_each_step(db: Path, repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "worktrees" / "w1"
    assert ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db) == (
        f"spawned w1 for t1 on branch w1/t1 from main; worktree {worktree}\n")
    assert ok(["start", "w1"], db) == "w1 is WORKING (t1 on w1/t1)\n"
    assert ok(["heartbeat", "w1", "--progress", "0.5"], db) == (
        "w1 beat (working); lease on its task renewed\n")
    first = commit_file(worktree, "feature.txt", "v1\n")
    assert ok(["done", "w1", "-m", "first"], db) == f"w1 is IN_REVIEW at {first[:12]} on w1/t1\n"
    assert ok(["reject", "w1", "--reason", "add a test"], db) == "w1 is WORKING (t1 on w1/t1)\n"
    assert row(db, "w1")["note"] == "add a test"
    second = commit_file(worktree, "test_feature.txt", "ok\n")
    assert ok(["done", "w1"], db) == f"w1 is IN_REVIEW at {second[:12]} on w1/t1\n"
    assert ok(["approve", "w1"], db) == "w1 is APPROVED (t1 on w1/t1)\n"
    assert ok(["merge", "w1"], db) == (
        f"merged w1/t1 into main at {second[:12]}; w1 is COMPLETED\n")
    assert head(repo, "main") == second
    assert not worktree.exists()
    assert worktree_paths(repo) == [str(repo.resolve())]
    assert [c["command"] for c in state_changes(db, "w1")] == [
        "spawn", "start", "done", "reject", "done", "approve", "merge"]


def test_cli_defaults_to_worker_state_in_current_repository(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit_file(repo, ".gitignore", ".worker-state/\n")
    monkeypatch.chdir(repo)
    state = repo / ".worker-state"
    assert ok(["spawn", "--task", "t1", "--worker", "w1"]) == (
        f"spawned w1 for t1 on branch w1/t1 from main; worktree {state / 'worktrees' / 'w1'}\n")
    assert (state / "bus.db").is_file()
    assert git(repo, "status", "--porcelain") == ""
    ok(["start", "w1"])
    commit = commit_file(state / "worktrees" / "w1", "feature.txt", "x\n")
    ok(["done", "w1"])
    ok(["approve", "w1"])
    ok(["merge", "w1"])
    assert head(repo, "main") == commit
    assert (repo / "feature.txt").exists()
    assert git(repo, "status", "--porcelain") == ""
    mirror = json.loads((state / "workers" / "w1.json").read_text())
    [status] = [json.loads(line) for line in ok(["status", "--json"]).splitlines()]
    assert {k: v for k, v in status.items() if k not in ("heartbeat_age_s", "liveness")} == mirror
    assert mirror["state"] == "COMPLETED"


def test_cli_cancel_and_fail_print_state(db: Path, repo: Path) -> None:
    spawn(db, repo, "t1", "w1")
    spawn(db, repo, "t2", "w2")
    ok(["start", "w1"], db)
    assert ok(["cancel", "w1", "--reason", "no longer needed"], db) == (
        "w1 is CANCELLED (t1 on w1/t1)\n")
    assert ok(["fail", "w2", "--reason", "tests do not pass"], db) == "w2 is FAILED (t2 on w2/t2)\n"
    assert (row(db, "w1")["note"], row(db, "w2")["note"]) == ("no longer needed",
                                                              "tests do not pass")
    with Bus.open(db) as bus:
        assert bus.claims.list() == []
    assert git(repo, "branch", "--list", "w1/t1", "w2/t2", "--format=%(refname:short)").split() == [
        "w1/t1", "w2/t2"]


# --- --json ---------------------------------------------------------------------------------------


def test_cli_json_on_every_command_prints_the_worker(db: Path, repo: Path, tmp_path: Path) -> None:
    def as_json(*args: str) -> dict:
        out = ok([args[0], "--json", *args[1:]], db)  # before any `--` of run
        assert out.count("\n") == 1
        return json.loads(out)

    assert as_json("spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)) == {
        **row(db, "w1"), "excluded_in": None}  # the bus is outside the repository
    commit_file(row(db, "w1")["worktree"], "work.txt", "work\n")  # so `done` has a commit
    seen = {"spawn"}
    for args in (["start", "w1"], ["heartbeat", "w1"], ["done", "w1"],
                 ["reject", "w1", "--reason", "r"],
                 ["run", "w1", "--interval", "0.05", "--", "true"],
                 ["approve", "w1"], ["rework", "w1"], ["done", "w1"], ["approve", "w1"],
                 ["merge", "w1"]):
        printed = as_json(*args)
        assert printed == row(db, "w1"), args
        seen.add(args[0])
    spawn(db, repo, "t2", "w2")
    spawn(db, repo, "t3", "w3")
    assert as_json("cancel", "w2") == row(db, "w2")
    assert as_json("fail", "w3", "--reason", "r") == row(db, "w3")
    seen |= {"cancel", "fail"}
    cleaned = ok(["cleanup", "--json", "w3"], db)
    assert json.loads(cleaned) == {"worker": "w3", "state": "FAILED",
                                   "worktree": row(db, "w3")["worktree"], "branch": None,
                                   "kept_branch": None}
    seen.add("cleanup")
    assert seen == set(SUBCOMMANDS) - {"status"}
    assert row(db, "w1")["state"] == "COMPLETED"
    assert list(row(db, "w1")) == ["worker", "task", "state", "repo", "base", "branch", "worktree",
                                   "head_commit", "merge_commit", "note", "created_at_ms",
                                   "updated_at_ms"]


# --- status ---------------------------------------------------------------------------------------


def test_cli_status_when_empty_says_no_workers_yet(db: Path) -> None:
    Bus.open(db).close()
    assert ok(["status"], db) == "no workers yet; create one with worker spawn --task T\n"
    assert ok(["status", "--json"], db) == ""


def test_cli_status_table_and_json(db: Path, repo: Path) -> None:
    spawn(db, repo, "t1", "w1")
    spawn(db, repo, "task2", "w2")
    ok(["start", "w2"], db)
    beat_ms = now_ms() - 45_000  # a beat 45 s ago (the bus's own clock, injected)
    with Bus.open(db) as bus:
        heartbeats.beat(bus.conn, "w2", "working", "task2", None, now=beat_ms)

    def status_table(*args: str) -> tuple[str, set[str]]:
        """The table, and the ages it may show: the clock moves while the command runs."""
        before = now_ms()
        out = ok(["status", *args], db)
        return out, {f"{(t - beat_ms) / 1000:.0f}s ago" for t in (before, now_ms())}

    out, ages = status_table()
    assert out in {
        "worker  task   state     branch    heartbeat  liveness\n"
        "w1      t1     ASSIGNED  w1/t1     -          -\n"
        f"w2      task2  WORKING   w2/task2  {age}    warn\n" for age in ages}, out
    assert all(45 <= int(age.split("s")[0]) < 100 for age in ages)  # "warn" territory
    out, ages = status_table("w2")
    assert out in {
        "worker  task   state    branch    heartbeat  liveness\n"
        f"w2      task2  WORKING  w2/task2  {age}    warn\n" for age in ages}, out
    lines = [json.loads(line) for line in ok(["status", "--json"], db).splitlines()]
    assert [line["worker"] for line in lines] == ["w1", "w2"]
    assert lines[0] == {**row(db, "w1"), "heartbeat_age_s": None, "liveness": None}
    assert {k: v for k, v in lines[1].items() if k != "heartbeat_age_s"} == {
        **row(db, "w2"), "liveness": "warn"}
    assert 45 <= lines[1]["heartbeat_age_s"] < 100
    [one] = [json.loads(line) for line in ok(["status", "w1", "--json"], db).splitlines()]
    assert one == lines[0]


def test_cli_status_json_matches_mirror_after_each_transition(db: Path, repo: Path,
                                                              tmp_path: Path) -> None:
    mirrors = tmp_path / "workers"
    worktree = tmp_path / "worktrees" / "w1"
    steps = [["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], ["start", "w1"],
             ["done", "w1"], ["approve", "w1"], ["merge", "w1"]]
    previous = None
    for args in steps:
        if args[0] == "done":
            commit_file(worktree, "f.txt", "x\n")
        ok(args, db)
        text = (mirrors / "w1.json").read_text()
        assert text != previous
        previous = text
        [status] = [json.loads(line) for line in ok(["status", "w1", "--json"], db).splitlines()]
        assert {k: v for k, v in status.items() if k not in ("heartbeat_age_s", "liveness")} == (
            json.loads(text))
        assert os.listdir(mirrors) == ["w1.json"]


# --- errors ---------------------------------------------------------------------------------------

UNKNOWN_WORKER_COMMANDS = [
    ["start", "x"], ["heartbeat", "x"], ["run", "x", "--", "true"], ["done", "x"],
    ["approve", "x"], ["reject", "x", "--reason", "r"], ["merge", "x"], ["cancel", "x"],
    ["fail", "x", "--reason", "r"], ["status", "x"]]


@pytest.mark.parametrize("args", UNKNOWN_WORKER_COMMANDS,
                         ids=[a[0] for a in UNKNOWN_WORKER_COMMANDS])
def test_cli_unknown_worker_exits_1(db: Path, args: list[str]) -> None:
    Bus.open(db).close()
    assert error(args, db) == "Error: no worker 'x'; `worker status` lists them\n"


def test_cli_missing_database_exits_1_without_creating_it(tmp_path: Path) -> None:
    db = tmp_path / "nothing" / "bus.db"
    assert f"no bus database at {db}" in error(["start", "w1"], db)
    assert not db.exists()


def test_cli_spawn_existing_worker_id_exits_1(db: Path, repo: Path) -> None:
    spawn(db, repo, "t1", "w1")
    before = row(db, "w1")
    assert error(["spawn", "--task", "t2", "--worker", "w1", "--repo", str(repo)], db) == (
        "Error: worker 'w1' exists already; choose another --worker id\n")
    assert row(db, "w1") == before
    assert not git(repo, "branch", "--list", "w1/t2")


def test_cli_spawn_repo_that_is_not_git_exits_1(db: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert error(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(plain)], db) == (
        f"Error: {plain} is not inside a git repository; pass --repo or run git init\n")
    assert not (tmp_path / "worktrees").exists()


@pytest.mark.parametrize("task", ["a..b", "has space"])
def test_cli_spawn_task_making_invalid_branch_name_exits_1(db: Path, repo: Path, tmp_path: Path,
                                                           task: str) -> None:
    assert error(["spawn", "--task", task, "--worker", "w1", "--repo", str(repo)], db) == (
        f"Error: 'w1/{task}' is not a valid branch name; choose task and worker ids without"
        " spaces, '..', '~', '^', ':' or a trailing '.lock'\n")
    assert git(repo, "branch", "--format=%(refname:short)") == "main"
    assert not (tmp_path / "worktrees" / "w1").exists()
    assert ok(["status"], db).startswith("no workers yet")


def test_cli_spawn_missing_base_exits_1(db: Path, repo: Path) -> None:
    assert error(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo),
                  "--base", "nope"], db) == (
        f"Error: base branch 'nope' does not exist in {repo.resolve()}\n")


@pytest.mark.parametrize("how", ["untracked", "modified"])
def test_cli_done_with_uncommitted_changes_exits_1(db: Path, repo: Path, tmp_path: Path,
                                                   how: str) -> None:
    spawn(db, repo, "t1", "w1")
    ok(["start", "w1"], db)
    worktree = tmp_path / "worktrees" / "w1"
    name = "new.txt" if how == "untracked" else "README.md"
    (worktree / name).write_text("uncommitted\n")
    assert error(["done", "w1"], db) == (
        f"Error: {worktree} has uncommitted changes ({name}); commit or stash them first\n")
    assert row(db, "w1")["state"] == "WORKING"


def test_cli_invalid_transition_exits_1(db: Path, repo: Path) -> None:
    spawn(db, repo, "t1", "w1")
    assert error(["merge", "w1"], db) == (
        "Error: worker w1 is ASSIGNED; allowed: start, cancel, fail, heartbeat, run\n")
    ok(["cancel", "w1"], db)
    assert error(["start", "w1"], db) == (
        "Error: worker w1 is CANCELLED; allowed: cleanup\n")


def test_cli_merge_conflict_exits_1_naming_the_file(db: Path, repo: Path, tmp_path: Path) -> None:
    spawn(db, repo, "t1", "w1")
    ok(["start", "w1"], db)
    commit_file(tmp_path / "worktrees" / "w1", "README.md", "branch\n")
    main_head = commit_file(repo, "README.md", "main\n")
    ok(["done", "w1"], db)
    ok(["approve", "w1"], db)
    message = error(["merge", "w1"], db)
    assert message.startswith("Error: merging w1/t1 into main conflicts in: README.md;")
    assert head(repo, "main") == main_head
    assert git(repo, "status", "--porcelain") == ""
    assert row(db, "w1")["state"] == "APPROVED"


def test_cli_usage_errors_exit_2(db: Path, repo: Path) -> None:
    spawn(db, repo, "t1", "w1")
    assert "Missing option '--reason'" in error(["reject", "w1"], db, code=2)
    assert "Missing option '--reason'" in error(["fail", "w1"], db, code=2)
    assert "Missing option '--task'" in error(["spawn"], db, code=2)
    assert "Missing argument 'COMMAND...'" in error(["run", "w1"], db, code=2)
    assert row(db, "w1")["state"] == "ASSIGNED"


def test_cli_without_git_on_path_says_git_is_not_installed(db: Path, repo: Path, tmp_path: Path,
                                                           env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    ok(["start", "w1"], db)
    no_git = tmp_path / "bin-without-git"
    no_git.mkdir()
    bare = dict(env, PATH=str(no_git))
    expected = "Error: git is not installed or not on PATH; install git to use worker branches\n"
    for args in (["spawn", "--task", "t2", "--worker", "w2", "--repo", str(repo)], ["done", "w1"]):
        done = run_process(worker_argv(db, *args), bare)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", expected), args
    assert row(db, "w1")["state"] == "WORKING"
    assert ok(["status"], db).count("\n") == 2  # header and w1: no w2


def test_cli_help_of_every_subcommand_has_an_example() -> None:
    assert sorted(main.commands) == sorted(SUBCOMMANDS)
    for args in [[]] + [[name] for name in SUBCOMMANDS]:
        result = run([*args, "--help"])
        assert result.exit_code == 0, args
        assert "Example" in result.stdout, args
        assert result.stdout.startswith("Usage: "), args


# --- worker run (real processes) ------------------------------------------------------------------


def test_cli_run_exit_0_is_done(db: Path, repo: Path, env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")  # ASSIGNED: run starts it first
    command = ["sh", "-c", "echo feature > f.txt && git add f.txt && git commit -qm feature"]
    done = run_process(worker_argv(db, "run", "w1", "--interval", "0.05", "--", *command), env)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "w1: command exited 0; now IN_REVIEW\n", "")
    w = row(db, "w1")
    assert w["state"] == "IN_REVIEW"
    assert w["head_commit"] == head(repo, "refs/heads/w1/t1") != head(repo, "main")
    assert w["note"] == f"`{shlex.join(command)}` exited 0"
    assert [c["command"] for c in state_changes(db, "w1")] == ["spawn", "start", "done"]
    with Bus.open(db) as bus:
        assert bus.claims.list() == []
        [beat] = bus.heartbeats.liveness()
        assert (beat.agent, beat.task, beat.status) == ("w1", "t1", "stopped")


def test_cli_run_nonzero_exit_fails_with_that_code(db: Path, repo: Path,
                                                   env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    ok(["start", "w1"], db)
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    done = run_process(worker_argv(db, "run", "w1", "--interval", "0.05", "--", *command), env)
    assert (done.returncode, done.stdout, done.stderr) == (
        3, "w1: command exited 3; now FAILED\n", "")
    w = row(db, "w1")
    assert (w["state"], w["note"]) == ("FAILED", f"`{shlex.join(command)}` exited with 3")
    assert [c["command"] for c in state_changes(db, "w1")] == ["spawn", "start", "fail"]
    with Bus.open(db) as bus:
        assert bus.claims.list() == []
        assert [m.payload for m in bus.list_messages() if m.type == "task_failed"] == [
            {"worker": "w1", "reason": w["note"]}]


def test_cli_run_command_killed_by_signal_fails_with_exit_1(db: Path, repo: Path,
                                                            env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    command = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    done = run_process(worker_argv(db, "run", "w1", "--interval", "0.05", "--", *command), env)
    assert done.returncode == 1
    assert row(db, "w1")["note"] == f"`{shlex.join(command)}` exited with -15"


def test_cli_run_leaving_uncommitted_changes_stays_working(db: Path, repo: Path, tmp_path: Path,
                                                           env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    done = run_process(worker_argv(db, "run", "w1", "--interval", "0.05", "--", "sh", "-c",
                                   "echo x > left.txt"), env)
    worktree = tmp_path / "worktrees" / "w1"
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"Error: {worktree} has uncommitted changes (left.txt);"
               " commit or stash them first\n")
    assert row(db, "w1")["state"] == "WORKING"
    assert [c["command"] for c in state_changes(db, "w1")] == ["spawn", "start"]
    with Bus.open(db) as bus:
        assert claim_of(bus, "t1").agent == "w1"


def test_cli_run_missing_command_fails_with_127(db: Path, repo: Path, tmp_path: Path,
                                                env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    missing = str(tmp_path / "no-such-command")
    done = run_process(worker_argv(db, "run", "w1", "--", missing, "arg"), env)
    assert (done.returncode, done.stdout, done.stderr) == (
        127, "w1: command exited 127; now FAILED\n", "")
    w = row(db, "w1")
    assert w["state"] == "FAILED"
    assert w["note"].startswith(f"`{missing} arg` could not start: ")
    # Whether the task is free afterwards is a race (a library bug): see
    # tests/workers/test_workers.py::test_run_command_that_cannot_start_leaves_the_task_free.


def test_cli_run_refused_outside_assigned_and_working(db: Path, repo: Path, tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    ok(["start", "w1"], db)
    ok(["done", "w1", "--allow-empty"], db)
    marker = tmp_path / "ran"
    done = run_process(worker_argv(db, "run", "w1", "--", "touch", str(marker)), env)
    assert (done.returncode, done.stderr) == (
        1, "Error: worker w1 is IN_REVIEW; allowed: approve, reject, rework, cancel, fail\n")
    assert not marker.exists()


def restore_sigint() -> None:
    """Run in the child before exec: a SIGINT ignored by our parent must not stay ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_run_interrupted_fails_the_worker(db: Path, repo: Path, env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    # The command says when it runs (so run is waiting for it), then blocks.
    command = [sys.executable, "-c", "import sys; print('running', flush=True); sys.stdin.read()"]
    proc = subprocess.Popen(worker_argv(db, "run", "w1", "--interval", "0.05", "--", *command),
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=restore_sigint)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT)
        assert ready and proc.stdout.readline() == "running\n", proc.poll()
        with Bus.open(db) as bus:
            def beating() -> bool:
                assert proc.poll() is None, proc.communicate()
                return any(b.agent == "w1" for b in bus.heartbeats.liveness())

            wait_until(beating, "worker run to beat")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the CLI and its command together
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, err
    assert out == ""
    assert err.endswith("Aborted!\n"), err
    w = row(db, "w1")
    assert (w["state"], w["note"]) == ("FAILED", f"`{shlex.join(command)}` was interrupted")
    assert [c["command"] for c in state_changes(db, "w1")] == ["spawn", "start", "fail"]


def live_group_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def test_cli_run_killed_with_sigkill_leaves_claim_until_lease_end(db: Path, repo: Path,
                                                                  env: dict[str, str]) -> None:
    spawn(db, repo, "t1", "w1")
    proc = subprocess.Popen(
        worker_argv(db, "run", "w1", "--interval", "0.05", "--lease-ms", "3000", "--",
                    sys.executable, "-c", "import sys; sys.stdin.read()"),
        env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        with Bus.open(db) as bus:
            leases: set[int] = set()

            def running() -> bool:
                assert proc.poll() is None, proc.stderr.read()
                claim = claim_of(bus, "t1")
                if claim is not None and claim.agent == "w1":
                    leases.add(claim.lease_until_ms)
                beats = [b for b in bus.heartbeats.liveness() if b.agent == "w1"]
                return bool(beats) and len(leases) >= 3  # beating and renewing

            wait_until(running, "worker run to beat and renew its lease")
            assert get_row(bus.conn, "w1").state == "WORKING"
            os.killpg(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=RUN_TIMEOUT) == -signal.SIGKILL
            wait_until(lambda: not live_group_members(proc.pid), "the blocked command to die")

            [beat] = [b for b in bus.heartbeats.liveness() if b.agent == "w1"]
            claim = claim_of(bus, "t1")
            # Nothing beats or renews any more (20 intervals later).
            wait_until(lambda: now_ms() > beat.ts_ms + 1000, "the clock to move on")
            assert [b.ts_ms for b in bus.heartbeats.liveness() if b.agent == "w1"] == [beat.ts_ms]
            assert claim_of(bus, "t1") == claim

            last = beat.ts_ms
            [stale] = [b for b in bus.heartbeats.liveness(now=last + 100_000) if b.agent == "w1"]
            assert stale.state == "stale"
            [dead] = [b for b in bus.heartbeats.liveness(now=last + 300_000) if b.agent == "w1"]
            assert dead.state == "dead"

            assert (claim.agent, claim.lease_ms) == ("w1", 3000)
            refused = bus.claims.try_claim("t1", "heir", 60_000, now=claim.lease_until_ms - 1)
            assert not refused.granted and refused.claim.agent == "w1"
            assert get_row(bus.conn, "w1").state == "WORKING"  # nobody transitioned it
            assert [m.payload["command"] for m in bus.list_messages()
                    if m.type == "state_change"] == ["spawn", "start"]
            taken = bus.claims.try_claim("t1", "heir", 60_000, now=claim.lease_until_ms)
            assert taken.granted
            assert (taken.claim.agent, taken.claim.attempts) == ("heir", 2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdin.close()
        proc.stderr.close()


# --- two processes at once ------------------------------------------------------------------------


def race(children: list, tmp_path: Path, env: dict[str, str], db: Path,
         argvs: dict[str, list[str]]) -> dict[str, tuple[int, str, str]]:
    """Start one child per name running `worker <argv>`, release them together, collect
    (exit code, stdout after "ready", stderr)."""
    logs = tmp_path / "child-logs"
    logs.mkdir(exist_ok=True)
    barrier = Barrier()
    try:
        started = {}
        for name, argv in argvs.items():
            child = WorkerChild(name, ["cli", str(barrier.read_fd), "--db", str(db), *argv], env,
                                logs / f"{name}.txt", pass_fds=(barrier.read_fd,))
            children.append(child)
            started[name] = child
        barrier.release(list(started.values()), STARTUP_TIMEOUT)
    finally:
        barrier.close()
    results = {}
    for name, child in started.items():
        try:
            code = child.proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not finish: {child.describe()}") from None
        lines = []
        while (line := child.next_line(1.0)) is not None:
            lines.append(line + "\n")
        results[name] = (code, "".join(lines), child.stderr_text())
    return results


def test_cli_start_two_workers_for_one_task_exactly_one_wins(db: Path, repo: Path, tmp_path: Path,
                                                             env: dict[str, str], children) -> None:
    for n in range(RACE_ROUNDS):
        spawn(db, repo, f"t{n}", f"a{n}")
        spawn(db, repo, f"t{n}", f"b{n}")
    winners = []
    for n in range(RACE_ROUNDS):
        task, pair = f"t{n}", [f"a{n}", f"b{n}"]
        results = race(children, tmp_path, env, db, {w: ["start", w] for w in pair})
        assert sorted(code for code, _, _ in results.values()) == [0, 1], results
        [winner] = [w for w in pair if results[w][0] == 0]
        [loser] = [w for w in pair if w != winner]
        winners.append(winner)
        assert results[winner] == (0, f"{winner} is WORKING ({task} on {winner}/{task})\n", "")
        assert results[loser] == (
            1, "", f"Error: task {task} is taken: worker {winner} (WORKING) holds it; wait"
                   f" until it finishes, or `worker cancel {winner}`\n")
        assert row(db, winner)["state"] == "WORKING"
        assert row(db, loser)["state"] == "ASSIGNED"
        assert [c["command"] for c in state_changes(db, winner)] == ["spawn", "start"]
        assert [c["command"] for c in state_changes(db, loser)] == ["spawn"]
        with Bus.open(db) as bus:
            assert claim_of(bus, task).agent == winner
    print("winners:", winners)


def test_cli_start_same_worker_twice_exactly_one_succeeds(db: Path, repo: Path, tmp_path: Path,
                                                          env: dict[str, str], children) -> None:
    for n in range(RACE_ROUNDS):
        spawn(db, repo, f"t{n}", f"w{n}")
    for n in range(RACE_ROUNDS):
        worker, task = f"w{n}", f"t{n}"
        results = race(children, tmp_path, env, db,
                       {"first": ["start", worker], "second": ["start", worker]})
        assert sorted(code for code, _, _ in results.values()) == [0, 1], results
        [(_, won_out, won_err)] = [r for r in results.values() if r[0] == 0]
        [(_, lost_out, lost_err)] = [r for r in results.values() if r[0] == 1]
        assert (won_out, won_err) == (f"{worker} is WORKING ({task} on {worker}/{task})\n", "")
        assert (lost_out, lost_err) == (
            "", f"Error: worker {worker} is WORKING; allowed: done, cancel, fail, heartbeat, run\n")
        assert [c["command"] for c in state_changes(db, worker)] == ["spawn", "start"]
        with Bus.open(db) as bus:
            assert claim_of(bus, task).agent == worker


def test_cli_spawned_worker_id_is_generated(db: Path, repo: Path) -> None:
    out = ok(["spawn", "--task", "t1", "--repo", str(repo), "--json"], db)
    w = json.loads(out)
    assert re.fullmatch(r"w-[0-9a-f]{6}", w["worker"])
    assert w["branch"] == f"{w['worker']}/t1"
    with Bus.open(db) as bus:
        assert [s.worker.worker for s in Workers(bus).status()] == [w["worker"]]


def test_worker_heartbeat_without_progress_keeps_the_progress(db: Path, repo: Path) -> None:
    ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db)
    ok(["start", "w1"], db)
    ok(["heartbeat", "w1", "--progress", "0.5"], db)
    ok(["heartbeat", "w1"], db)
    with Bus.open(db) as bus:
        (beat,) = [b for b in bus.heartbeats.liveness() if b.agent == "w1"]
    assert (beat.task, beat.progress) == ("t1", 0.5)


@pytest.mark.parametrize("args", [["--json", "status"], ["status", "--json"]])
def test_worker_json_before_or_after_the_command(db: Path, repo: Path, args) -> None:
    ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db)
    (listed,) = [json.loads(line) for line in ok(args, db).splitlines()]
    assert (listed["worker"], listed["state"]) == ("w1", "ASSIGNED")


def test_worker_db_after_the_command(db: Path, repo: Path) -> None:
    ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db)
    result = run(["status", "--db", str(db)])  # without --db before: only the one after names it
    assert result.exit_code == 0 and result.stdout.startswith("worker  task")
    assert "w1" in result.stdout


@pytest.mark.parametrize("args", [["--json", "start", "nobody"], ["start", "nobody", "--json"]])
def test_worker_errors_as_json_with_json_anywhere(db: Path, repo: Path, args) -> None:
    ok(["spawn", "--task", "t1", "--worker", "w1", "--repo", str(repo)], db)
    assert json.loads(error(args, db)) == {
        "error": "no worker 'nobody'; `worker status` lists them", "field": None}
