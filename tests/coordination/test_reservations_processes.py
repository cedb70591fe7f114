"""Reservations from racing processes: every write is one BEGIN IMMEDIATE transaction, so
of several agents reserving overlapping patterns at once exactly one wins."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bus import Bus
from tests.support.children import Barrier
from tests.support.children import Child
from tests.support.procs_reservations import PROGRAM

RACERS = 8
TIMEOUT = 120.0  # seconds: a loaded machine; nothing asserts on time


@pytest.mark.slow
def test_racing_exclusive_reservations_exactly_one_wins(db_path: Path, tmp_path: Path,
                                                        python_env: dict[str, str]) -> None:
    Bus.open(db_path).close()
    barrier = Barrier()
    children = []
    try:
        for n in range(RACERS):
            # Each wants a different pattern, but every two of them overlap.
            pattern = ["src/**", "src/auth/**", "*.py", "src/auth/login.py"][n % 4]
            children.append(Child(f"r{n}", PROGRAM, [
                str(barrier.read_fd), "--db", str(db_path), "reserve", "--agent", f"agent-{n}",
                pattern, "--json"], dict(python_env, PYTHONUNBUFFERED="1"),
                tmp_path / f"r{n}.txt", pass_fds=(barrier.read_fd,)))
        barrier.release(children, TIMEOUT)
    finally:
        barrier.close()
    outcomes = {}
    for child in children:
        try:
            code = child.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not finish: {child.describe()}") from None
        outcomes[child.name] = (code, json.loads(child.read_line(TIMEOUT)))
    winners = [name for name, (code, out) in outcomes.items() if code == 0]
    assert len(winners) == 1, outcomes
    winner = f"agent-{winners[0][1:]}"
    for code, out in outcomes.values():
        assert out["granted"] is (code == 0)
        if code:
            assert {c["holder"] for c in out["conflicts"]} == {winner}
    with Bus.open(db_path) as bus:
        assert [r.agent for r in bus.reservations.list()] == [winner]
