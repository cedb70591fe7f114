"""`--agent auto`: the worker whose worktree contains the directory (bus/log/agent_ids.py).

Workers are made by the real `worker spawn` command in a real git repository
(hermetic git, tests/support/procs_workers.py); the states the CLI cannot reach side by
side (two live workers on one worktree) are rows written with SQL into the
real `workers` table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus import Bus
from bus.storage.errors import AgentNotResolved
from bus.log.agent_ids import agent_for_directory
from tests.support.hook_harness import child_env
from tests.support.hook_harness import run
from tests.support.procs_workers import make_repo


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return child_env(tmp_path)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def spawn(db: Path, repo: Path, env: dict[str, str], worker: str, task: str) -> Path:
    """`worker spawn` as a person runs it; the worktree it created."""
    done = run("worker", ["--db", str(db), "spawn", "--task", task, "--worker", worker,
                          "--json"], env, repo)
    return Path(json.loads(done.stdout)["worktree"])


def insert_worker(bus: Bus, worker: str, state: str, worktree: Path) -> None:
    bus.conn.execute(
        "INSERT INTO workers (worker_id, task_id, state, repo, base, branch, worktree,"
        " created_at_ms, updated_at_ms) VALUES (?, ?, ?, '/r', 'main', ?, ?, 1, 1)",
        (worker, f"t-{worker}", state, f"{worker}/t", str(worktree)))


def test_identity_directory_inside_a_spawned_worktree_is_that_worker(tmp_path, repo, env):
    db = tmp_path / "state" / "bus.db"
    first = spawn(db, repo, env, "w1", "t1")
    second = spawn(db, repo, env, "w2", "t2")
    (second / "src" / "deep").mkdir(parents=True)
    with Bus.open(db, create=False) as bus:
        assert agent_for_directory(bus.conn, first) == "w1"
        assert agent_for_directory(bus.conn, second / "src" / "deep") == "w2"
        link = tmp_path / "link"
        link.symlink_to(second)
        assert agent_for_directory(bus.conn, link / "src") == "w2"


def test_identity_outside_every_worktree_names_the_directory_and_the_worktrees(
        tmp_path, repo, env):
    db = tmp_path / "state" / "bus.db"
    worktree = spawn(db, repo, env, "w1", "t1")
    with Bus.open(db, create=False) as bus:
        with pytest.raises(AgentNotResolved) as caught:
            agent_for_directory(bus.conn, repo)
    message = str(caught.value)
    assert str(repo.resolve()) in message
    assert f"w1 at {worktree.resolve()}" in message
    assert caught.value.field == "agent" and caught.value.candidates == []


def test_identity_bus_without_workers_says_so(bus, tmp_path):
    with pytest.raises(AgentNotResolved, match="the bus has no workers"):
        agent_for_directory(bus.conn, tmp_path)


def test_identity_a_live_worker_wins_over_a_finished_one_on_the_same_worktree(bus, tmp_path):
    insert_worker(bus, "old", "CANCELLED", tmp_path)
    insert_worker(bus, "new", "WORKING", tmp_path)
    assert agent_for_directory(bus.conn, tmp_path) == "new"


def test_identity_a_finished_worker_alone_is_still_found(bus, tmp_path):
    insert_worker(bus, "done", "IN_REVIEW", tmp_path / "a")
    insert_worker(bus, "gone", "CANCELLED", tmp_path / "b")
    assert agent_for_directory(bus.conn, tmp_path / "b") == "gone"


def test_identity_the_innermost_worktree_decides(bus, tmp_path):
    insert_worker(bus, "outer", "WORKING", tmp_path)
    insert_worker(bus, "inner", "WORKING", tmp_path / "nested")
    assert agent_for_directory(bus.conn, tmp_path / "nested" / "x") == "inner"
    assert agent_for_directory(bus.conn, tmp_path / "other") == "outer"


def test_identity_two_live_workers_on_one_worktree_are_ambiguous(bus, tmp_path):
    insert_worker(bus, "a", "WORKING", tmp_path)
    insert_worker(bus, "b", "ASSIGNED", tmp_path)
    with pytest.raises(AgentNotResolved) as caught:
        agent_for_directory(bus.conn, tmp_path)
    assert sorted(caught.value.candidates) == ["a", "b"]
    assert "a (WORKING)" in str(caught.value) and "b (ASSIGNED)" in str(caught.value)


def test_identity_a_sibling_with_a_common_prefix_is_not_inside(bus, tmp_path):
    insert_worker(bus, "w1", "WORKING", tmp_path / "w1")
    with pytest.raises(AgentNotResolved):
        agent_for_directory(bus.conn, tmp_path / "w10")


def test_identity_bus_mcp_agent_auto_acts_as_the_worker_of_its_worktree(tmp_path, repo, env):
    pytest.importorskip("mcp")
    db = tmp_path / "state" / "bus.db"
    worktree = spawn(db, repo, env, "w1", "t1")
    done = run("bus", ["--db", str(db), "mcp", "--agent", "auto", "--call", "publish",
                       "--args", '{"type": "note"}'], env, worktree)
    seq = json.loads(done.stdout)["seq"]
    with Bus.open(db, create=False) as bus:
        sent = [m for m in bus.list_messages(limit=1000) if m.seq == seq]
    assert [m.from_agent for m in sent] == ["w1"]


def test_identity_bus_mcp_agent_auto_outside_a_worktree_is_a_usage_error(tmp_path, repo, env):
    pytest.importorskip("mcp")
    db = tmp_path / "state" / "bus.db"
    spawn(db, repo, env, "w1", "t1")
    done = run("bus", ["--db", str(db), "mcp", "--agent", "auto", "--list"], env, repo,
               check=False)
    assert done.returncode == 2, done.stderr
    stderr = done.stderr.decode()
    assert "Invalid value for '--agent': auto found no worker whose worktree contains" in stderr
    assert "Traceback" not in stderr
