"""An idle Claude Code session wakes when a message comes: the real binary, in tmux.

An interactive session (the pinned native binary, tests/support/real_clients.py's
InteractiveClaude) runs with the hooks `bus hook install claude` writes,
pointed at the scripted model. Nobody types: the session is idle from its
start, its SessionStart waiter (`bus hook claude --rewake`) waiting. A `bus
publish` from another process must start a turn whose model request carries
the message; the turn's Stop arms the next waiter, and a second message wakes
the session again. This version has an inbox socket, which the waiter posts
to once the session has a transcript to confirm the post by (after its first
turn); with --no-inbox, or before that, it exits 2 with the messages instead. Timings are
scripts/bench_hooks.py's; here every wait is a condition with a deadline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bus import Bus
from tests.support.hook_harness import has_inotify_fd
from tests.support.model_api import ScriptedModel
from tests.support.real_clients import ClaudeCode
from tests.support.real_clients import InteractiveClaude
from tests.support.real_clients import client_bus  # noqa: F401 - fixture
from tests.support.real_clients import scripted_model  # noqa: F401 - fixture
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_clients

START_S = 90.0  # the session's start, its hooks' and their waiter's, on a loaded machine
WAKE_S = 30.0  # a wake and the model request after it, with room for a loaded machine


def rewake_waiters(db: Path) -> list[int]:
    """The pids of `bus ... --rewake` processes on `db` that are waiting (have their watcher)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--rewake" in argv and str(db).encode() in argv and has_inotify_fd(int(name)):
            found.append(int(name))
    return found


def waiters_without_inbox(settings: Path) -> None:
    """The installed waiters with --no-inbox: stderr and exit 2, the hook's own way."""
    data = json.loads(settings.read_text())
    for entries in data["hooks"].values():
        for entry in entries:
            for hook in entry["hooks"]:
                if "--rewake" in hook["command"]:
                    hook["command"] += " --no-inbox"
    settings.write_text(json.dumps(data))


@pytest.fixture
def interactive(tmp_path: Path, scripted_model: ScriptedModel, client_bus: Path):
    claude = ClaudeCode(tmp_path, scripted_model, client_bus, agent="ann")
    claude.install_hooks("--agent", "ann")
    session = InteractiveClaude(claude, scripted_model, tmp_path)
    yield session
    session.close()


@pytest.mark.parametrize("route", ["inbox", "stderr"])
def test_idle_claude_code_session_wakes_on_publish_and_is_rearmed(
        interactive: InteractiveClaude, scripted_model: ScriptedModel, client_bus: Path,
        route: str) -> None:
    """By the session's inbox socket (this version has one), and by the hook's exit 2."""
    if route == "stderr":
        waiters_without_inbox(interactive.claude.cwd / ".claude" / "settings.json")
    interactive.start()
    wait_until(lambda: rewake_waiters(client_bus), "the SessionStart waiter waits", START_S)
    [first_waiter] = rewake_waiters(client_bus)
    assert scripted_model.agent_requests() == []  # idle: nobody has asked anything

    with Bus.open(client_bus) as bus:
        one = bus.publish("bob", "note", "wake one", to="ann").seq
    first = scripted_model.wait_for_text("wake one", 0, WAKE_S)
    # A session nobody has spoken to has no transcript yet to confirm a post by: the first
    # wake is the hook's exit 2 on either route.
    assert "Woken by the agent bus." in first.text()

    # The turn's Stop armed a new waiter: a second message wakes the idle session again.
    wait_until(lambda: [p for p in rewake_waiters(client_bus) if p != first_waiter],
               "the Stop waiter waits", START_S)
    since = len(scripted_model.requests)
    with Bus.open(client_bus) as bus:
        two = bus.publish("bob", "note", "wake two", to="ann").seq
    second = scripted_model.wait_for_text("wake two", since, WAKE_S)
    assert "wake one" not in second.text().split("wake two")[-1]  # not shown a second time
    with Bus.open(client_bus) as bus:
        assert bus.poll("ann") == []  # both acked
        vias = [bus.receipt(seq).delivery.via for seq in (one, two)]
    assert vias == ["hook:rewake", "claude:inbox" if route == "inbox" else "hook:rewake"]
    if route == "stderr":
        interactive.terminal.wait_for(lambda screen: "agentbus: new messages" in screen,
                                      "the wake's line in the terminal")
