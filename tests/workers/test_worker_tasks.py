"""The worker lifecycle with the task graph: spawn reads a registered task, merge marks it done."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus import Bus
from bus.storage.errors import TaskStateConflict
from tests.support.procs_workers import commit_file
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from workers.lifecycle import Workers


def test_worker_tasks_spawn_assigns_the_registered_title_and_merge_marks_it_done(
        ws: Workers, bus: Bus, repo: Path, tmp_path: Path) -> None:
    bus.tasks.add("login", title="Fix the login page")
    bus.tasks.add("release", after=["login"])
    ws.spawn("login", "w1", repo, "main")
    [assign] = [m for m in bus.list_messages(0, 100) if m.type == "task_assign"]
    assert assign.payload["title"] == "Fix the login page"
    ws.start("w1")
    assert bus.tasks.ready() == []  # the worker's lease holds it; release waits on it
    commit_file(tmp_path / "worktrees" / "w1", "login.txt", "fixed\n")
    ws.done("w1", "fixed")
    ws.approve("w1")
    ws.merge("w1")
    login = bus.tasks.find("login")
    assert (login.state, login.finished_by) == ("done", "w1")
    assert [t.task_id for t in bus.tasks.ready()] == ["release"]
    graph_done = [m for m in bus.list_messages(0, 100)
                  if m.type == "task_done" and "unblocked" in (m.payload or {})]
    assert [(m.from_agent, m.payload["unblocked"]) for m in graph_done] == [("w1", ["release"])]


def test_worker_tasks_an_unregistered_task_spawns_as_before(ws: Workers, bus: Bus,
                                                            repo: Path) -> None:
    ws.spawn("adhoc", "w1", repo, "main")
    [assign] = [m for m in bus.list_messages(0, 100) if m.type == "task_assign"]
    assert "title" not in assign.payload and bus.tasks.find("adhoc") is None


def test_worker_tasks_spawn_refuses_a_task_done_or_cancelled(ws: Workers, bus: Bus,
                                                            repo: Path) -> None:
    bus.tasks.add("old")
    bus.tasks.cancel("old")
    with pytest.raises(TaskStateConflict) as refused:
        ws.spawn("old", "w1", repo, "main")
    assert "old is cancelled" in str(refused.value) and "bus task add" in str(refused.value)
    assert ws.status() == []
