"""Live file reservations in `bus status`, `bus top`'s tables and `bus serve`'s page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bus import Bus
from bus.coordination import heartbeats
from bus.coordination.heartbeats import Thresholds
from bus.views.render import status_lines
from bus.views.status import read_status
from bus.views.top import summary_lines
from bus.views.top import table_cells
from tests.views.test_views_serve import Server
from tests.views.test_views_serve import live_page

T0 = 1_800_000_000_000
HOUR = 3600 * 1000
CHROMIUM = shutil.which("chromium")


def reserved(db_path: Path) -> Path:
    with Bus.open(db_path) as bus:
        bus.reservations.reserve("agent-a", ["src/auth/**"], ttl_ms=2 * HOUR, reason="login rework",
                                 now=T0)
        bus.reservations.reserve("agent-b", ["/docs/**"], mode="shared", ttl_ms=HOUR, now=T0)
        heartbeats.beat(bus.conn, "agent-c", "working", None, None, now=T0)
        bus.reservations.reserve("agent-c", ["tests/**"], ttl_ms=24 * HOUR, now=T0)
    return db_path


def test_status_lists_live_reservations_only(db_path: Path) -> None:
    reserved(db_path)
    lines = status_lines(read_status(db_path, now=T0 + 1000))
    at = lines.index("reservations: 3 live (2 exclusive)")
    assert [line.split()[:4] for line in lines[at + 1:at + 5]] == [
        ["pattern", "holder", "mode", "left"],
        ["/docs/**", "agent-b", "shared", "60"],
        ["src/auth/**", "agent-a", "exclusive", "120"],
        ["tests/**", "agent-c", "exclusive", "24.0"]]
    # An hour on, the shared one has run out; agent-c went silent past `dead` long ago.
    later = read_status(db_path, now=T0 + HOUR)
    assert [(r.agent, r.pattern) for r in later.reservations] == [("agent-a", "src/auth/**")]
    assert "reservations: 1 live (1 exclusive)" in status_lines(later)
    dead = Thresholds.to_ms(Thresholds().dead)
    assert [r.agent for r in read_status(db_path, now=T0 + dead - 1).reservations] == [
        "agent-b", "agent-a", "agent-c"]


def test_status_without_reservations_says_none(db_path: Path) -> None:
    Bus.open(db_path).close()
    assert "reservations: none" in status_lines(read_status(db_path))


def test_top_has_a_reservations_table(db_path: Path) -> None:
    status = read_status(reserved(db_path), now=T0)
    assert table_cells(status)["reservations"] == [
        ("/docs/**", "agent-b", "shared", "60 min", "-"),
        ("src/auth/**", "agent-a", "exclusive", "2.0 h", "login rework"),
        ("tests/**", "agent-c", "exclusive", "24.0 h", "-")]
    assert "reservations: 3 live (2 exclusive)" in summary_lines(status, 0.0)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_shows_the_reservations(db_path: Path, python_env: dict[str, str]) -> None:
    with Bus.open(db_path) as bus:
        bus.reservations.reserve("agent-a", ["src/auth/**"], reason="login rework")
    server = Server(db_path, python_env)
    try:
        with live_page(server) as page:
            assert page.text_content("#reservations-live") == "1"
            cells = page.eval_on_selector_all("#reservations td",
                                              "tds => tds.map(t => t.textContent)")
            assert cells[:3] == ["src/auth/**", "agent-a", "exclusive"]
            assert cells[4] == "login rework"
    finally:
        server.stop()
