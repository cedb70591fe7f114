"""Shared fixtures: every test gets its own bus file under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings

from bus import Bus
from bus.storage.schema import available_migrations

# SQLite commit times vary with the machine's load: no per-example deadline.
# No example database either, so nothing is written to the working directory.
settings.register_profile(
    "agentbus", deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.load_profile("agentbus")

REPO_ROOT = Path(__file__).resolve().parent.parent
LATEST_VERSION = len(available_migrations())
MIGRATION_NAMES = [f"{m.version:04d}_{m.name}" for m in available_migrations()]


class ManualClock:
    """An injected clock in epoch milliseconds that a test steps by hand (`clock.now += 500`)."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now



@pytest.fixture(autouse=True)
def fresh_pump_calls():
    """The handlers of tests/support/pump_tools.py record their calls in CALLS: every test
    starts and ends with none (only where a test module imported them)."""
    tools = sys.modules.get("tests.support.pump_tools")
    if tools is not None:
        tools.CALLS.clear()
    yield
    tools = sys.modules.get("tests.support.pump_tools")
    if tools is not None:
        tools.CALLS.clear()

@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "bus.db"


@pytest.fixture
def bus(db_path: Path):
    opened = Bus.open(db_path)
    yield opened
    opened.close()


@pytest.fixture
def python_env() -> dict[str, str]:
    """Environment for child Python processes that import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("BUS_DB", None)
    return env


@pytest.fixture
def bus_command() -> list[str]:
    """argv prefix that runs the `bus` CLI in a real subprocess."""
    return [sys.executable, "-m", "bus.cli"]
