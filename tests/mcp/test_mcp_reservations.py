"""File reservations over MCP: two `bus mcp` servers (real child processes, the SDK's own
client), each acting as its agent; conflicts come back as data."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus import Bus
from tests.mcp.test_mcp import call
from tests.mcp.test_mcp import connected
from tests.mcp.test_mcp import refused


def test_mcp_two_agents_reserve_check_and_release(bus: Bus, db_path: Path) -> None:
    async def scenario():
        async with connected(db_path, "alice") as alice, connected(db_path, "bob") as bob:
            mine = await call(alice, "reserve", patterns=["src/auth/**"], reason="login")
            theirs = await call(bob, "reserve", patterns=["docs/**", "src/auth/login.py"])
            check = await call(bob, "reserve_check", paths=["src/auth/login.py", "README.md"])
            listed = await call(bob, "reservations", path="src/auth/x.py")
            bad = await refused(bob, "reserve", patterns=["!src"])
            released = await call(alice, "unreserve")
            after = await call(bob, "reserve", patterns=["src/auth/login.py"], exclusive=False)
            return mine, theirs, check, listed, bad, released, after

    mine, theirs, check, listed, bad, released, after = asyncio.run(scenario())
    assert mine["granted"] and mine["reservations"][0]["agent"] == "alice"
    assert theirs["granted"] is False
    assert [(c["pattern"], c["holder"], c["mode"]) for c in theirs["conflicts"]] == [
        ("src/auth/login.py", "alice", "exclusive")]
    assert check["ok"] is False
    assert [(h["path"], h["holder"]) for h in check["held"]] == [("src/auth/login.py", "alice")]
    assert [(r["agent"], r["pattern"]) for r in listed["reservations"]] == [
        ("alice", "src/auth/**")]
    assert "starts with '!'" in bad
    assert [r["pattern"] for r in released["released"]] == ["src/auth/**"]
    assert after["granted"] and after["reservations"][0]["mode"] == "shared"
    assert [(r.agent, r.pattern) for r in bus.reservations.list()] == [("bob", "src/auth/login.py")]
