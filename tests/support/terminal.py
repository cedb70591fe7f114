"""A terminal for the tests of full-screen programs: tmux runs the program, capture-pane reads
its screen, send-keys types."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

TMUX = shutil.which("tmux")
SCREEN_TIMEOUT_S = 30.0  # how long a condition may take to show on a loaded machine

needs_tmux = pytest.mark.skipif(TMUX is None,
                                reason="tmux is not installed (make test installs it)")


class Terminal:
    """A tmux server of its own (no user config) with one window running a command."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        # The pid too: tmp_path's name repeats in every pytest run, and two runs at
        # once (other checkouts on the machine) would share, and kill, one server.
        self.base = [TMUX, "-L", f"bustop-{os.getpid()}-{tmp_path.name}", "-f", "/dev/null"]
        # Not COLUMNS and LINES (pytest-xdist's workers set 80x24): the program would
        # take them over the window's own size.
        self.env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}

    def start(self, command: str, size: tuple[int, int] = (140, 45)) -> None:
        self.tmux("new-session", "-d", "-s", "top", "-x", str(size[0]), "-y", str(size[1]),
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
