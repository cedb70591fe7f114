"""The two tiers: `make check` runs `pytest -m "not heavy"`, `make test` everything.

tests/conftest.py marks a test `heavy` from what it reaches (Spark, Chromium, the agents'
real clients, a wheel build, a real Litestream or nats-server). These tests hold its
marks against the folders and tests known to need those, by collecting them in a pytest
of its own: nothing heavy slips into the fast tier, and nothing else is left out of it.
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


def collected(*args: str) -> list[str]:
    """The ids pytest collects with these arguments (collection only, no test runs)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: everything deselected
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_tiers_fast_tier_leaves_out_spark_wheels_engines_and_real_clients() -> None:
    assert collected("-m", "not heavy", *ALL_HEAVY) == []
    assert len(collected("-m", "heavy", *ALL_HEAVY)) > 100


def test_tiers_chromium_tests_are_heavy_and_the_http_ones_are_not() -> None:
    heavy = collected("-m", "heavy", "tests/views", "tests/mcp")
    assert "tests/views/test_views_serve.py::test_serve_page_in_chromium" in heavy
    assert "tests/mcp/test_remote.py::test_serve_page_with_a_token_in_chromium" in heavy
    fast = collected("-m", "not heavy", "tests/views", "tests/mcp")
    assert [test for test in fast if "chromium" in test] == []
    assert "tests/views/test_views_serve.py::test_serve_status_plotly_and_events" in fast


def test_tiers_fast_tier_keeps_every_other_part() -> None:
    assert collected("-m", "heavy", *NONE_HEAVY) == []
