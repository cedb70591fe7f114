"""A receive's content pattern (a user's regular expression) never runs under the write lock."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from bus import Bus
from bus.channels.engine import Channels

PATTERN = r"(a+)+$"  # catastrophic backtracking against "aaa...a!"


def test_slow_content_filter_does_not_block_other_writers(db_path: Path, bus_command,
                                                          python_env, monkeypatch) -> None:
    """While the filter is stopped inside its first match, a publish from another process
    commits (with the filter under BEGIN IMMEDIATE it waited out busy_timeout: exit 75)."""
    inside, release = threading.Event(), threading.Event()
    real_load = Channels._load_content

    def held_load(self, payload, ref):  # the filter reads each content through this
        inside.set()
        release.wait(60)
        return real_load(self, payload, ref)

    with Bus.open(db_path) as setup:
        setup.channels.create_channel("room", "group", "owner")
        setup.channels.join_channel("room", "reader")
        # 27 a's take this regex about 20 s; 16 keep the test quick, the hold does the rest.
        setup.channels.send_message("room", "owner", "text", "a" * 16 + "!")
        setup.channels.send_message("room", "owner", "text", "aaaa")
    monkeypatch.setattr(Channels, "_load_content", held_load)
    results = []
    with Bus.open(db_path) as bus:
        receiver = threading.Thread(target=lambda: results.append(
            bus.channels.receive_messages("reader", {"content_pattern": PATTERN})))
        receiver.start()
        try:
            assert inside.wait(60)
            publish = subprocess.run(
                bus_command + ["--db", str(db_path), "publish", "--from", "w", "--type", "t"],
                env=python_env, capture_output=True, text=True, timeout=120)
        finally:
            release.set()
            receiver.join(120)
        assert publish.returncode == 0, publish.stderr
        [result] = results
        assert [m.content for m in result] == ["aaaa"]
        assert result.total_count == 1 and not result.has_more  # counted: "aaaa", handed out


def test_content_filter_pages_and_counts_like_before(db_path: Path) -> None:
    with Bus.open(db_path) as bus:
        ch = bus.channels
        ch.create_channel("room", "group", "owner")
        ch.join_channel("room", "reader")
        for n in range(7):
            ch.send_message("room", "owner", "text", f"{'hit' if n % 2 else 'miss'} {n}")
        first = ch.receive_messages("reader", {"content_pattern": "^hit", "limit": 2})
        assert [m.content for m in first] == ["hit 1", "hit 3"]
        assert first.has_more and first.total_count == 3
        rest = ch.receive_messages("reader", {"content_pattern": "^hit"})
        assert [m.content for m in rest] == ["hit 5"] and not rest.has_more
        assert [m.content for m in ch.receive_messages("reader")] == [
            "miss 0", "miss 2", "miss 4", "miss 6"]
