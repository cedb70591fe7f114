"""The two tiers: `make check` runs `pytest -m "not heavy and not slow"`, `make test` everything.

tests/conftest.py marks a test `heavy` from what it reaches (Spark, Chromium, the agents'
real clients, a wheel build, a real Litestream or nats-server). These tests hold its
marks against the folders and tests known to need those, by collecting the suite in a
pytest of its own: nothing heavy slips into the fast tier, and nothing else is left out
of it.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT

# Every test in these needs Spark, a wheel, a real engine or a real client.
ALL_HEAVY = ["tests/history", "tests/journeys", "tests/replication",
             "tests/harness/test_real_clients.py", "tests/harness/test_real_codex_hooks.py",
             "tests/harness/test_real_hooks.py", "tests/harness/test_real_idle_wake.py"]
# Parts whose tests use none of them.
NONE_HEAVY = ["tests/storage", "tests/log", "tests/coordination", "tests/channels", "tests/xml",
              "tests/pump", "tests/cli", "tests/workers", "tests/blobs"]


def tiers() -> tuple[set[str], set[str]]:
    """(fast, heavy): the ids of each tier, from one collection of the whole suite."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "tests.support.tier_report"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, set[str]] = {"fast": set(), "heavy": set()}
    for line in done.stdout.splitlines():
        if line.startswith("tier: "):
            tier, test = line.removeprefix("tier: ").split(" ", 1)
            found[tier].add(test)
    return found["fast"], found["heavy"]


def under(ids: set[str], folders: list[str]) -> set[str]:
    return {test for test in ids if test.startswith(tuple(folders))}


def test_tiers_hold_what_each_part_needs() -> None:
    """Both tiers from one collection of the suite (it takes seconds), held against the
    parts."""
    fast, heavy = tiers()
    everything = fast | heavy
    # Spark, wheels, engines and real clients stay out of the fast tier.
    assert under(fast, ALL_HEAVY) == set()
    assert len(under(heavy, ALL_HEAVY)) > 100
    # Chromium is heavy; the HTTP tests of the same parts are not.
    assert "tests/views/test_views_serve.py::test_serve_page_in_chromium" in heavy
    assert "tests/mcp/test_remote.py::test_serve_page_with_a_token_in_chromium" in heavy
    assert {test for test in under(fast, ["tests/views", "tests/mcp"]) if "chromium" in test} \
        == set()
    assert "tests/views/test_views_serve.py::test_serve_status_plotly_and_events" in fast
    # Every other part keeps all of its tests in the fast tier.
    assert under(heavy, NONE_HEAVY) == set()
    assert under(everything, NONE_HEAVY)
