"""File reservations meet git: the pre-commit hook of `bus hooks install` in a real
repository with two agents, and `worker done` / `worker merge` refusing the same changes
with the same message."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bus import Bus
from bus.coordination.reservations import PathsReserved
from tests.support.cli_helpers import run
from tests.support.procs_workers import commit_file
from tests.support.procs_workers import git
from tests.support.procs_workers import head
from tests.support.worker_fixtures import hermetic_git  # noqa: F401 - autouse fixture
from tests.support.worker_fixtures import repo  # noqa: F401 - fixture
from tests.support.worker_fixtures import ws  # noqa: F401 - fixture
from workers.lifecycle import Workers

HOLDER_LINE = re.compile(r"  src/auth/login\.py: agent-a holds src/auth/\*\* \(exclusive\) until"
                         r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z: login rework")


@pytest.fixture
def bus(db_path: Path):
    with Bus.open(db_path) as opened:
        yield opened


def install(db_path: Path, repo: Path, *extra: str):
    result = run(["hooks", "install", "--repo", str(repo), *extra], db_path)
    assert result.exit_code == 0, result.output
    return result


def try_commit(where: Path, name: str, agent: str | None) -> subprocess.CompletedProcess[str]:
    """Write and stage `name`, then `git commit` through the hooks, as `agent`."""
    (where / name).parent.mkdir(parents=True, exist_ok=True)
    (where / name).write_text(f"{name} by {agent}\n")
    git(where, "add", name)
    env = {k: v for k, v in os.environ.items() if k not in ("BUS_AGENT", "BUS_DB")}
    if agent is not None:
        env["BUS_AGENT"] = agent
    return subprocess.run(["git", "-C", str(where), "commit", "-q", "-m", f"{agent}: {name}"],
                          capture_output=True, text=True, env=env)


def test_hook_refuses_a_commit_on_paths_another_live_agent_holds(
        bus: Bus, db_path: Path, repo: Path) -> None:
    install(db_path, repo)
    bus.reservations.reserve("agent-a", ["src/auth/**"], reason="login rework")
    before = head(repo)
    refused = try_commit(repo, "src/auth/login.py", "agent-b")
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        "Error: the change touches 1 path(s) another agent holds exclusively:\n")
    assert HOLDER_LINE.search(refused.stderr), refused.stderr
    assert "bus unreserve --agent agent-a" in refused.stderr
    assert head(repo) == before  # no commit was made
    git(repo, "reset", "-q", "HEAD", "src/auth/login.py")
    assert try_commit(repo, "docs/guide.md", "agent-b").returncode == 0  # not reserved
    assert try_commit(repo, "src/auth/login.py", "agent-a").returncode == 0  # the holder's own
    # Once the holder lets go, agent-b may commit there too.
    bus.reservations.unreserve("agent-a")
    assert try_commit(repo, "src/auth/other.py", "agent-b").returncode == 0


def test_hook_counts_every_holder_for_a_committer_the_bus_does_not_know(
        bus: Bus, db_path: Path, repo: Path) -> None:
    install(db_path, repo)
    bus.reservations.reserve("agent-a", ["src/auth/**"], reason="login rework")
    refused = try_commit(repo, "src/auth/login.py", None)
    assert refused.returncode == 1 and HOLDER_LINE.search(refused.stderr)
    git(repo, "reset", "-q", "HEAD", "src/auth/login.py")
    bus.reservations.reserve("agent-b", ["docs/**"], mode="shared")  # shared holds nobody out
    assert try_commit(repo, "docs/x.md", None).returncode == 0


def test_hook_knows_a_worker_by_its_worktree(bus: Bus, db_path: Path, repo: Path,
                                             ws: Workers) -> None:
    install(db_path, repo)
    worker = ws.spawn("t1", "w1", repo)
    bus.reservations.reserve("w1", ["src/**"])
    bus.reservations.reserve("agent-a", ["docs/**"])
    worktree = Path(worker.worktree)
    assert try_commit(worktree, "src/app.py", None).returncode == 0  # w1's own
    refused = try_commit(worktree, "docs/x.md", None)
    assert refused.returncode == 1 and "docs/x.md: agent-a holds docs/**" in refused.stderr
    git(worktree, "reset", "-q", "HEAD", "docs/x.md")
    assert try_commit(repo, "src/main.py", None).returncode == 1  # outside w1's worktree


def test_hook_install_keeps_the_hook_there_and_is_idempotent(
        bus: Bus, db_path: Path, repo: Path) -> None:
    hooks = repo / ".git" / "hooks"
    mine = "#!/bin/sh\necho ran >> \"$(git rev-parse --git-dir)/mine.log\"\n"
    (hooks / "pre-commit").write_text(mine)
    (hooks / "pre-commit").chmod(0o755)
    first = install(db_path, repo)
    assert f"the hook that was there runs first: {hooks / 'pre-commit.before-agentbus'}" \
        in first.output
    written = (hooks / "pre-commit").read_text()
    second = install(db_path, repo, "--json")
    assert '"updated":true' in second.output
    assert (hooks / "pre-commit").read_text() == written
    assert (hooks / "pre-commit.before-agentbus").read_text() == mine
    assert try_commit(repo, "a.txt", "agent-b").returncode == 0
    assert (repo / ".git" / "mine.log").read_text() == "ran\n"  # once: not chained twice
    # The kept hook still decides: when it fails, the commit is refused.
    (hooks / "pre-commit.before-agentbus").write_text("#!/bin/sh\necho no >&2\nexit 3\n")
    refused = try_commit(repo, "b.txt", "agent-b")
    assert refused.returncode != 0 and "no" in refused.stderr


def test_hook_install_outside_a_repository_names_the_flag(db_path: Path, tmp_path: Path) -> None:
    result = run(["hooks", "install", "--repo", str(tmp_path)], db_path)
    assert result.exit_code == 2
    assert "Invalid value for '--repo'" in result.stderr


def test_worker_done_and_merge_refuse_what_the_hook_refuses(
        bus: Bus, db_path: Path, repo: Path, ws: Workers) -> None:
    worker = ws.spawn("t1", "w1", repo)
    ws.start("w1")
    commit_file(worker.worktree, "src/auth/login.py", "w1's fix\n")
    bus.reservations.reserve("agent-a", ["src/auth/**"], reason="login rework")
    with pytest.raises(PathsReserved) as caught:
        ws.done("w1")
    assert HOLDER_LINE.search(str(caught.value))
    cli = subprocess.run([sys.executable, "-m", "workers.cli", "--db", str(db_path), "done",
                          "w1"], capture_output=True, text=True)
    assert cli.returncode == 1 and cli.stderr == f"Error: {caught.value}\n"
    # The hook says the same of the same change.
    install(db_path, repo)
    (Path(worker.worktree) / "src/auth/login.py").write_text("more\n")
    git(worker.worktree, "add", "-A")
    hooked = try_commit(Path(worker.worktree), "src/auth/login.py", None)
    assert hooked.stderr == f"Error: {caught.value}\n"
    git(worker.worktree, "reset", "-q", "--hard", "HEAD")
    assert ws.get("w1").state == "WORKING"
    bus.reservations.unreserve("agent-a")
    ws.done("w1")
    ws.approve("w1")
    bus.reservations.reserve("agent-a", ["src/**"])
    with pytest.raises(PathsReserved):
        ws.merge("w1")
    assert ws.get("w1").state == "APPROVED"
    bus.reservations.unreserve("agent-a")
    assert ws.merge("w1").state == "COMPLETED"


def test_hook_with_no_bus_file_lets_the_commit_through_and_says_so(
        db_path: Path, repo: Path, tmp_path: Path) -> None:
    install(db_path, repo)  # the bus file is never created
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    env = {k: v for k, v in os.environ.items() if k not in ("BUS_AGENT", "BUS_DB")}
    done = subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "a"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0
    assert done.stderr == f"agentbus pre-commit: no bus at {db_path}; nothing is reserved\n"


def test_hook_install_follows_core_hooks_path(bus: Bus, db_path: Path, repo: Path) -> None:
    git(repo, "config", "core.hooksPath", ".githooks")
    result = install(db_path, repo)
    assert result.output.startswith(f"installed {repo / '.githooks' / 'pre-commit'}")
    bus.reservations.reserve("agent-a", ["src/**"])
    assert try_commit(repo, "src/a.py", "agent-b").returncode == 1
