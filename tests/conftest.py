"""Shared fixtures: every test gets its own bus file under tmp_path."""

from __future__ import annotations

import inspect
import os
import sys
import time
import types
from pathlib import Path
from typing import Iterator

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
# `make check`'s profile (--hypothesis-profile=check): the same properties on fewer
# examples for the inner loop; `make test` and CI run the full count.
settings.register_profile("check", parent=settings.get_profile("agentbus"), max_examples=20,
                          stateful_step_count=20)
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


# The heavy tier: what `make check` leaves out (`pytest -m "not heavy"`) and `make test` runs.
# A test is heavy when it reaches one of these, seen at collection from the modules its
# module and fixtures take names from, the fixtures it requests and the names its code
# (and its fixtures' code) uses. Nobody marks a test by hand, so a new test that starts
# Spark or Chromium joins the heavy tier the day it is written.
HEAVY_SIGNS = {
    "Spark": ("pyspark", "tests.support.history_support"),
    "Chromium (Playwright)": ("playwright",),
    "the agents' real clients (npm)": ("tests.support.real_clients",),
    # the journeys' fixtures build the wheel; "wheel" alone is `pip wheel`'s argument
    "a wheel build": ("tests.journeys", "wheel"),
    "a real replication engine": ("tests.support.nats_servers",
                                  "bus.replica.binary.locate_litestream"),
}


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The names and string constants of a function's code, nested functions included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield from _code_names(const)


def _origin(value: object) -> str | None:
    """Where a module-level name comes from: `pyspark.sql` for a module, `a.b.f` for a function."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    return module if isinstance(module, str) else None


def _ours(value: object) -> list[types.FunctionType]:
    """The functions of the tests' own code behind a name: a function, or a class's methods."""
    if isinstance(value, type):
        candidates = list(vars(value).values())
    else:
        candidates = [value]
    found = []
    for candidate in candidates:
        candidate = inspect.unwrap(getattr(candidate, "__func__", candidate))
        if (isinstance(candidate, types.FunctionType)
                and candidate.__module__.partition(".")[0] == "tests"):
            found.append(candidate)
    return found


def _reach(item: pytest.Function) -> set[str]:
    """Every name a test reaches at collection: see HEAVY_SIGNS. The code followed is the
    test's, its fixtures' and that of the tests' own helpers they call, transitively."""
    todo = _ours(item.function)
    for defs in item._fixtureinfo.name2fixturedefs.values():
        todo.extend(func for fixture in defs for func in _ours(fixture.func))
    reach = set(item.fixturenames)
    reach.update(filter(None, map(_origin, vars(item.module).values())))
    seen: set[types.FunctionType] = set()
    while todo:
        function = todo.pop()
        if function in seen:
            continue
        seen.add(function)
        reach.add(_origin(function) or "")
        names = set(_code_names(function.__code__))
        reach.update(names)
        for name in names & function.__globals__.keys():
            value = function.__globals__[name]
            reach.add(_origin(value) or "")
            todo.extend(_ours(value))
    return reach


def heavy_needs(item: pytest.Function) -> list[str]:
    """What of HEAVY_SIGNS a test needs ([] for the fast tier)."""
    reach = _reach(item)
    needs = [need for need, signs in HEAVY_SIGNS.items()
             if any(name == sign or name.startswith(sign + ".")
                    for name in reach for sign in signs)]
    if item.get_closest_marker("real_clients") and "the agents' real clients (npm)" not in needs:
        needs.append("the agents' real clients (npm)")
    return needs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and (needs := heavy_needs(item)):
            item.add_marker(pytest.mark.heavy(", ".join(needs)))


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A parameter read from the clock (`time.time()` in a list of bad `now`s) is named for
    what it is, not for its digits: `make check`'s worker processes (pytest-xdist) collect
    apart and must find the same test ids."""
    is_number = isinstance(val, (int, float)) and not isinstance(val, bool)
    if is_number and abs(val - time.time()) < 3600:
        return f"clock-seconds-{type(val).__name__}"
    return None
