"""File reservations on the Bus (bus/coordination/reservations.py): conflicts, all or nothing, and the
three ways a reservation ends (TTL, a dead heartbeat, a finished worker), with the bus's
`now` stepped instead of sleeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus import Bus
from bus.coordination import heartbeats
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import Thresholds
from bus.coordination.reservations import NotReserved
from bus.coordination.reservations import PathsReserved
from bus.coordination.reservations import ReservationConflict
from workers import registry
from workers.machine import TERMINAL
from workers.machine import WORKING
from workers.registry import Worker

T0 = 1_800_000_000_000
HOUR = 3600 * 1000
DEAD_MS = Thresholds.to_ms(Thresholds().dead)


@pytest.fixture
def bus(db_path: Path):
    with Bus.open(db_path) as opened:
        yield opened


def patterns_of(found) -> list[tuple[str, str]]:
    return [(r.agent, r.pattern) for r in found]


def test_reserve_conflict_names_pattern_holder_mode_and_expiry(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/auth/**"], ttl_ms=HOUR, reason="login rework", now=T0)
    with pytest.raises(ReservationConflict) as caught:
        bus.reservations.reserve("agent-b", ["docs/**", "src/auth/login.py"], now=T0 + 1)
    [conflict] = caught.value.conflicts
    assert (conflict.pattern, conflict.held.agent, conflict.held.pattern, conflict.held.mode,
            conflict.held.expires_at_ms) == ("src/auth/login.py", "agent-a", "src/auth/**",
                                             "exclusive", T0 + HOUR)
    assert conflict.example_path == "src/auth/login.py"
    text = str(caught.value)
    assert "agent-a holds src/auth/** (exclusive) until 2027-01-15T09:00:00.000Z" in text
    assert "login rework" in text
    # All or nothing: docs/** did not conflict, and was not reserved either.
    assert patterns_of(bus.reservations.list(now=T0 + 2)) == [("agent-a", "src/auth/**")]


def test_reserve_conflict_names_an_example_path_that_reads_as_a_file(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["/docs/"], now=T0)
    with pytest.raises(ReservationConflict) as caught:
        bus.reservations.reserve("agent-b", ["docs/*.md", "src/[!a]*.py"], now=T0 + 1)
    assert [c.example_path for c in caught.value.conflicts] == ["docs/a.md"]
    assert "(both match docs/a.md)" in str(caught.value)


@pytest.mark.parametrize("mine, theirs, conflict", [
    (("src/auth/**", "exclusive"), ("docs/**", "exclusive"), False),
    (("src/auth/**", "shared"), ("src/auth/login.py", "shared"), False),
    (("src/auth/**", "shared"), ("src/auth/login.py", "exclusive"), True),
    (("src/auth/**", "exclusive"), ("src/auth/login.py", "shared"), True),
    (("*.md", "exclusive"), ("docs/guide/intro.md", "exclusive"), True),
    (("/*.md", "exclusive"), ("docs/guide/intro.md", "exclusive"), False),
])
def test_reserve_conflicts_when_a_path_matches_both_and_one_is_exclusive(
        bus: Bus, mine: tuple[str, str], theirs: tuple[str, str], conflict: bool) -> None:
    bus.reservations.reserve("agent-a", [mine[0]], mode=mine[1], now=T0)
    if conflict:
        with pytest.raises(ReservationConflict):
            bus.reservations.reserve("agent-b", [theirs[0]], mode=theirs[1], now=T0)
    else:
        bus.reservations.reserve("agent-b", [theirs[0]], mode=theirs[1], now=T0)
        assert len(bus.reservations.list(now=T0)) == 2


def test_reserve_own_patterns_never_conflict_and_reserving_again_renews(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/**"], now=T0, ttl_ms=1000)
    bus.reservations.reserve("agent-a", ["src/a.py"], now=T0)
    [renewed] = bus.reservations.reserve("agent-a", ["src/**"], mode="shared", ttl_ms=HOUR,
                                         now=T0 + 500)
    assert (renewed.mode, renewed.expires_at_ms) == ("shared", T0 + 500 + HOUR)
    assert patterns_of(bus.reservations.list(now=T0 + 2000)) == [("agent-a", "src/**"),
                                                                  ("agent-a", "src/a.py")]


def test_reservation_ends_when_its_ttl_runs_out(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/**"], ttl_ms=1000, now=T0)
    assert patterns_of(bus.reservations.list(now=T0 + 999)) == [("agent-a", "src/**")]
    assert bus.reservations.check_paths("agent-b", ["src/x.py"], now=T0 + 999) != []
    assert bus.reservations.list(now=T0 + 1000) == []
    assert bus.reservations.check_paths("agent-b", ["src/x.py"], now=T0 + 1000) == []
    # no conflict with the ended one
    bus.reservations.reserve("agent-b", ["src/x.py"], now=T0 + 1000)


def test_reservation_ends_when_its_holder_turns_dead_and_stays_ended(bus: Bus) -> None:
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0)
    bus.reservations.reserve("agent-a", ["src/**"], ttl_ms=24 * HOUR, now=T0)
    assert len(bus.reservations.list(now=T0 + DEAD_MS - 1)) == 1
    assert bus.reservations.list(now=T0 + DEAD_MS) == []
    # Its next beat does not bring it back, though no write swept it meanwhile.
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0 + DEAD_MS + 10)
    assert bus.reservations.list(now=T0 + DEAD_MS + 20) == []


def test_reserve_refuses_a_holder_whose_reservation_would_end_at_once(bus: Bus,
                                                                      tmp_path: Path) -> None:
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0)
    with pytest.raises(ValidationFailed) as caught:
        bus.reservations.reserve("agent-a", ["src/**"], now=T0 + DEAD_MS)
    assert caught.value.field == "agent"
    assert "agent-a has not beaten for 300 s (dead)" in str(caught.value)
    assert "bus heartbeat --agent agent-a" in str(caught.value)
    done = Worker("w1", "t1", "COMPLETED", str(tmp_path), "main", "w1/t1", str(tmp_path / "wt"),
                  None, None, None, T0, T0)
    registry.insert(bus.conn, done)
    with pytest.raises(ValidationFailed, match="worker w1 is COMPLETED"):
        bus.reservations.reserve("w1", ["src/**"], now=T0)
    assert bus.conn.execute("SELECT count(*) FROM file_reservations").get == 0


def test_reservation_of_an_agent_that_stopped_cleanly_lives_on(bus: Bus) -> None:
    """`worker done` leaves a `stopped` beat: the work is in review, its files still held."""
    heartbeats.beat(bus.conn, "agent-a", "stopped", None, None, now=T0)
    bus.reservations.reserve("agent-a", ["src/**"], ttl_ms=24 * HOUR, now=T0)
    assert len(bus.reservations.list(now=T0 + 10 * DEAD_MS)) == 1


def test_reservation_of_an_agent_with_live_beats_lives(bus: Bus) -> None:
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0)
    bus.reservations.reserve("agent-a", ["src/**"], ttl_ms=24 * HOUR, now=T0)
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0 + DEAD_MS - 1)
    assert len(bus.reservations.list(now=T0 + 2 * DEAD_MS - 2)) == 1


def test_reservation_ends_when_its_holders_worker_finishes(bus: Bus, tmp_path: Path) -> None:
    working = Worker("w1", "t1", WORKING, str(tmp_path), "main", "w1/t1", str(tmp_path / "wt"),
                     None, None, None, T0, T0)
    registry.insert(bus.conn, working)
    bus.reservations.reserve("w1", ["src/**"], ttl_ms=24 * HOUR, now=T0)
    assert len(bus.reservations.list(now=T0 + 1)) == 1
    for state in sorted(TERMINAL):
        registry.update(bus.conn, working, Worker(**{**working.to_json_dict(), "state": state}))
        assert bus.reservations.list(now=T0 + 1) == [], state
        assert bus.reservations.check_paths(None, ["src/a.py"], now=T0 + 1) == []
        bus.conn.execute("UPDATE workers SET state = ? WHERE worker_id = 'w1'", (WORKING,))


def test_forgetting_an_agent_ends_its_reservations(bus: Bus) -> None:
    heartbeats.beat(bus.conn, "agent-a", "working", None, None, now=T0)
    bus.reservations.reserve("agent-a", ["src/**"], now=T0)
    bus.heartbeats.forget("agent-a")
    assert bus.reservations.list(now=T0) == []


def test_unreserve_some_or_all_and_refuses_a_pattern_not_held(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/**", "docs/**", "/README.md"], now=T0)
    bus.reservations.reserve("agent-b", ["tests/**"], now=T0)
    with pytest.raises(NotReserved) as caught:
        bus.reservations.unreserve("agent-a", ["src/**", "tests/**"], now=T0)
    assert "agent-a holds no reservation of tests/**" in str(caught.value)
    assert len(bus.reservations.list("agent-a", now=T0)) == 3  # nothing removed
    released = bus.reservations.unreserve("agent-a", ["src/**"], now=T0)
    assert patterns_of(released) == [("agent-a", "src/**")]
    assert sorted(patterns_of(bus.reservations.unreserve("agent-a", now=T0))) == [
        ("agent-a", "/README.md"), ("agent-a", "docs/**")]
    assert patterns_of(bus.reservations.list(now=T0)) == [("agent-b", "tests/**")]


def test_reservations_filter_by_agent_and_path(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/auth/**"], now=T0)
    bus.reservations.reserve("agent-b", ["src/*.py"], mode="shared", now=T0)
    bus.reservations.reserve("agent-c", ["src/*.py"], mode="shared", now=T0)
    assert patterns_of(bus.reservations.list(agent="agent-b", now=T0)) == [("agent-b", "src/*.py")]
    assert patterns_of(bus.reservations.list(path="src/auth/login.py", now=T0)) == [
        ("agent-a", "src/auth/**")]
    assert patterns_of(bus.reservations.list(path="./src/main.py", now=T0)) == [
        ("agent-b", "src/*.py"), ("agent-c", "src/*.py")]


def test_check_paths_names_exclusive_holders_other_than_the_agent(bus: Bus) -> None:
    bus.reservations.reserve("agent-a", ["src/auth/**"], now=T0)
    bus.reservations.reserve("agent-b", ["docs/**"], mode="shared", now=T0)
    held = bus.reservations.check_paths("agent-b", ["src/auth/login.py", "docs/x.md", "README.md"],
                                        now=T0)
    assert [(h.path, h.held.agent) for h in held] == [("src/auth/login.py", "agent-a")]
    assert bus.reservations.check_paths("agent-a", ["src/auth/login.py"], now=T0) == []
    text = str(PathsReserved(held))
    assert text.startswith("the change touches 1 path(s) another agent holds exclusively:\n"
                           "  src/auth/login.py: agent-a holds src/auth/** (exclusive) until")
    assert "bus unreserve --agent agent-a" in text


@pytest.mark.parametrize("call, field", [
    (lambda b: b.reservations.reserve("agent-a", []), "patterns"),
    (lambda b: b.reservations.reserve("agent-a", "src/**"), "patterns"),
    (lambda b: b.reservations.reserve("agent-a", ["!src"]), "patterns"),
    (lambda b: b.reservations.reserve("agent-a", ["src/**"], mode="mine"), "mode"),
    (lambda b: b.reservations.reserve("agent-a", ["src/**"], ttl_ms=0), "ttl"),
    (lambda b: b.reservations.reserve("", ["src/**"]), "agent"),
    (lambda b: b.reservations.check_paths("agent-a", ["/etc/passwd"]), "paths"),
    (lambda b: b.reservations.list(path="../x"), "path"),
])
def test_reservation_calls_refuse_bad_arguments_naming_the_field(bus: Bus, call, field) -> None:
    with pytest.raises(ValidationFailed) as caught:
        call(bus)
    assert caught.value.field == field
    assert bus.reservations.list() == []
