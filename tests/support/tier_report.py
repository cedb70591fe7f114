"""A pytest plugin (`-p tests.support.tier_report`) that prints each collected test's
tier, `heavy <id>` or `fast <id>`: both tiers from one collection of the suite."""

from __future__ import annotations

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        tier = "heavy" if item.get_closest_marker("heavy") else "fast"
        print(f"tier: {tier} {item.nodeid}")
