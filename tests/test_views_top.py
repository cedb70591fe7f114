"""`bus top` in a real terminal: tmux runs it, other processes write, capture-pane reads it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from bus import Bus
from bus.views.top import Throughput
from tests.broken_files import break_the_file

TMUX = shutil.which("tmux")
SCREEN_TIMEOUT_S = 30.0  # how long a condition may take to show on a loaded machine

needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make test installs it)")


class Terminal:
    """A tmux server of its own (no user config) with one window running a command."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        # The pid too: tmp_path's name repeats in every pytest run, and two runs at
        # once (other checkouts on the machine) would share, and kill, one server.
        self.base = [TMUX, "-L", f"bustop-{os.getpid()}-{tmp_path.name}", "-f", "/dev/null"]
        self.env = env

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "top", "-x", "140", "-y", "45",
                  f"{command}; echo EXITED-$?; sleep 600")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def joined(self) -> str:
        """The screen with wrapped lines joined (a long error is one line again)."""
        return self.tmux("capture-pane", "-p", "-J", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, shown: Callable[[str], bool], what: str) -> str:
        """The screen once `shown(screen)` holds; fails, printing it, after the timeout."""
        deadline = time.monotonic() + SCREEN_TIMEOUT_S
        while True:
            screen = self.screen()
            if shown(screen):
                return screen
            assert time.monotonic() < deadline, f"never saw {what}; the screen:\n{screen}"
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, env=self.env)

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True,
                              env=self.env, check=True)


@pytest.fixture
def terminal(tmp_path: Path, python_env: dict[str, str]):
    term = Terminal(tmp_path, python_env)
    yield term
    term.close()


def bus_in_shell(db: Path) -> str:
    return f"{sys.executable} -m bus.cli --db {db}"


@needs_tmux
@pytest.mark.slow
@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_top_shows_a_beating_agent_updates_on_publish_and_quits(
        terminal: Terminal, db_path: Path, python_env: dict[str, str], quit_key: str) -> None:
    Bus.open(db_path).close()
    terminal.start(f"{bus_in_shell(db_path)} top")
    terminal.wait_for(lambda s: "log: 0 messages" in s and "agents: none" in s, "the first status")
    other = [sys.executable, "-m", "bus.cli", "--db", str(db_path)]
    subprocess.run([*other, "heartbeat", "--agent", "w1", "--status", "working", "--task", "t7"],
                   env=python_env, check=True, capture_output=True)
    screen = terminal.wait_for(lambda s: "agents: 1 alive" in s, "the agent that beat")
    assert any(line.split()[:2] == ["w1", "alive"] and line.split()[-2:] == ["working", "t7"]
               for line in screen.splitlines())
    for _ in range(3):
        subprocess.run([*other, "publish", "--from", "p", "--type", "t"], env=python_env,
                       check=True, capture_output=True)
    terminal.wait_for(lambda s: "log: 3 messages, last seq 3" in s, "the published messages")
    for task in (["a"], ["b", "--after", "a"]):
        subprocess.run([*other, "task", "add", *task], env=python_env, check=True,
                       capture_output=True)
    terminal.wait_for(lambda s: "tasks: 1 ready, 1 blocked, 0 held, 0 done, 0 cancelled" in s,
                      "the task graph's counts")
    terminal.keys(quit_key)
    terminal.wait_for(lambda s: "EXITED-0" in s, "bus top exiting with status 0")


@needs_tmux
@pytest.mark.slow
def test_top_shows_an_agent_that_stops_and_goes_on(terminal: Terminal, db_path: Path) -> None:
    """`worker done`, `fail` and `cancel` leave a `stopped` beat while top runs."""
    with Bus.open(db_path) as bus:
        bus.heartbeat("w1", "working", "t1")
        terminal.start(f"{bus_in_shell(db_path)} top")
        terminal.wait_for(lambda s: "agents: 1 alive" in s, "the working agent")
        bus.heartbeat("w1", "stopped", "t1")
        screen = terminal.wait_for(lambda s: "agents: 1 stopped" in s, "the agent stopped")
        assert any(line.split()[:2] == ["w1", "stopped"] for line in screen.splitlines())
        bus.publish("p", "t")  # still reading: the next commit shows
        terminal.wait_for(lambda s: "log: 1 messages" in s, "the message after the stop")
    terminal.keys("q")
    terminal.wait_for(lambda s: "EXITED-0" in s, "bus top exiting with status 0")


@needs_tmux
@pytest.mark.slow
def test_top_shows_each_claim_with_its_fence(terminal: Terminal, db_path: Path) -> None:
    with Bus.open(db_path) as bus:
        assert bus.try_claim("t1", "w1", 60_000).fence == 1
        terminal.start(f"{bus_in_shell(db_path)} top")
        terminal.wait_for(lambda s: "claims: 1 held" in s, "the claim")
        assert bus.release("t1", "w1", fence=1)
        assert bus.try_claim("t1", "w2", 60_000).fence == 2  # a new holder: the next fence
        screen = terminal.wait_for(lambda s: any(line.split()[:3] == ["t1", "w2", "2"]
                                                 for line in s.splitlines()), "w2's fence")
        assert any(line.split()[:3] == ["task", "holder", "fence"] for line in screen.splitlines())
    terminal.keys("q")
    terminal.wait_for(lambda s: "EXITED-0" in s, "bus top exiting with status 0")


@needs_tmux
def test_top_on_a_missing_file_is_an_error_before_drawing(
        terminal: Terminal, tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    terminal.start(f"{bus_in_shell(missing)} top")
    screen = terminal.wait_for(lambda s: "EXITED-" in s, "bus top exiting")
    assert "Error: no bus database at" in screen and "EXITED-1" in screen
    assert not missing.exists()


@needs_tmux
@pytest.mark.slow
@pytest.mark.parametrize("how", ["overwritten", "replaced", "removed"])
def test_top_exits_1_with_the_error_when_the_file_breaks_while_it_runs(
        terminal: Terminal, db_path: Path, tmp_path: Path, how: str) -> None:
    with Bus.open(db_path) as bus:
        bus.publish("p", "t")
    terminal.start(f"{bus_in_shell(db_path)} top")
    terminal.wait_for(lambda s: "log: 1 messages" in s, "the first status")
    expected = break_the_file(db_path, how, tmp_path)
    terminal.wait_for(lambda s: "EXITED-" in s, "bus top exiting")
    screen = terminal.joined()
    assert "EXITED-1" in screen and "Traceback" not in screen, screen
    [error] = [line for line in screen.splitlines() if line.startswith("Error: ")]
    assert re.search(expected, error) and str(db_path) in error, error


def test_throughput_is_messages_per_second_over_the_window() -> None:
    rate = Throughput()
    assert rate.add(100.0, 10) == 0.0
    assert rate.add(102.0, 30) == 10.0
    assert rate.add(104.0, 40) == 7.5
    assert rate.add(106.0, 50) == 40 / 6
    # Samples leave the window: the rate runs from the newest one at least 5 s old.
    assert rate.add(110.0, 50) == (50 - 40) / 6
    assert rate.add(120.0, 50) == 0.0
