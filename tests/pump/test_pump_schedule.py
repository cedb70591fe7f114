"""Seed 000's fair scheduling and backpressure: the pump shares its global
slots among listeners in turns, and a client cannot flood an organism's queue."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.cli import main
from bus.storage.errors import Backpressure
from bus.storage.errors import OrganismInvalid
from bus.pump import Pump
from bus.pump import client
from bus.pump.organism import DEFAULT_MAX_PENDING
from bus.pump.organism import load_organism
from bus.pump.schedule import FairShare
from bus.pump.schedule import Slots
from tests.support import pump_tools

ADD = "root_tag: add\n    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add"


def two_calculators(directory: Path) -> Path:
    path = directory / "organism.yaml"
    path.write_text("name: org\nlisteners:\n"
                    f"  - name: first\n    {ADD}\n    concurrency: 4\n"
                    f"  - name: second\n    {ADD}\n    concurrency: 4\n")
    return path


def test_pump_free_global_slots_go_to_listeners_in_turns(bus: Bus, tmp_path: Path) -> None:
    """Both listeners have a backlog and together want more than max_in_flight: the
    second one, later in organism.yaml and sent to last, still starts units early."""
    organism = two_calculators(tmp_path)
    for listener in ("first", "second"):
        for i in range(12):
            client.send(bus, "org", f"<add><a>{i}</a><b>1</b></add>".encode(), to=listener)
    pump = Pump(bus, load_organism(organism), oob=False, max_in_flight=2)
    runner = threading.Thread(target=pump.run, kwargs={"until_idle": True})
    runner.start()
    runner.join(timeout=60)  # a deadline: the pump that starved `second` never went idle
    pump.stop()
    runner.join()
    started = [listener for listener, _, _ in pump_tools.CALLS]
    assert len(started) == 24
    first_eight = started[:8]
    assert first_eight.count("first") == first_eight.count("second") == 4, started


def test_fair_share_splits_free_slots_and_gives_the_rest_to_who_has_more() -> None:
    waiting = {"a": 10, "b": 1, "c": 10}
    fair = FairShare()

    def claim(name: str, n: int) -> list[str]:
        taken = min(n, waiting[name])
        waiting[name] -= taken
        return [name] * taken

    units, full = fair.share(Slots(6, {"a": 4, "b": 4, "c": 4}), claim)
    # Shares of 2; b had 1, so its other slot goes round again to a (first in turn).
    assert sorted(units) == ["a", "a", "a", "b", "c", "c"] and full
    # a round later a was served last: one free slot is offered to b (nothing left), then c.
    units, full = fair.share(Slots(1, {"a": 4, "b": 4, "c": 4}), claim)
    assert units == ["c"] and full


@given(free=st.integers(1, 40),
       wants=st.dictionaries(st.sampled_from("abcde"),
                             st.tuples(st.integers(1, 20), st.integers(0, 30)), min_size=1),
       rounds=st.integers(1, 3))
def test_fair_share_is_max_min_fair_and_within_the_limits(free, wants, rounds) -> None:
    """No listener gets more than its slots or its backlog, the global limit holds, and a
    listener that wanted more than it got got no fewer than any other, less one."""
    fair = FairShare()
    waiting = {name: backlog for name, (_, backlog) in wants.items()}

    def claim(name: str, n: int) -> list[str]:
        taken = min(n, waiting[name])
        waiting[name] -= taken
        return [name] * taken

    for _ in range(rounds):
        before = dict(waiting)
        units, _ = fair.share(Slots(free, {n: min(s, free) for n, (s, _) in wants.items()}),
                              claim)
        got = {name: units.count(name) for name in wants}
        takeable = sum(min(before[name], slots) for name, (slots, _) in wants.items())
        assert len(units) == min(free, takeable)  # no slot is left idle while work waits
        for name, (slots, _) in wants.items():
            assert got[name] <= min(slots, before[name])
            if got[name] < min(slots, before[name]):  # the global limit cut it short
                assert all(other <= got[name] + 1 for other in got.values()), (got, before)


def test_send_is_refused_while_max_pending_requests_wait(bus: Bus, tmp_path: Path) -> None:
    organism = two_calculators(tmp_path)
    for i in range(3):
        client.send(bus, "org", f"<add><a>{i}</a><b>1</b></add>".encode(), to="first",
                    max_pending=3)
    before = bus.conn.execute("SELECT count(*) FROM messages").get
    with pytest.raises(Backpressure) as refused:  # a BusBusy: exit 75, retry later
        client.send(bus, "org", b"<add><a>9</a><b>1</b></add>", to="first", max_pending=3)
    assert (refused.value.pending, refused.value.limit) == (3, 3)
    assert "max_pending" in str(refused.value)
    assert bus.conn.execute("SELECT count(*) FROM messages").get == before  # nothing written
    Pump(bus, load_organism(organism), oob=False).run(until_idle=True)  # the pump catches up
    client.send(bus, "org", b"<add><a>9</a><b>1</b></add>", to="first", max_pending=3)


def test_bus_pump_send_exits_75_when_the_organisms_queue_is_full(tmp_path: Path) -> None:
    organism = tmp_path / "organism.yaml"
    organism.write_text(f"name: org\nmax_pending: 2\nlisteners:\n  - name: first\n    {ADD}\n")
    argv = ["--db", str(tmp_path / "bus.db"), "pump", "send", str(organism),
            "<add><a>1</a><b>2</b></add>"]
    runner = CliRunner()
    env = {"BUS_DB": None, "BUS_DURABILITY": None}
    assert [runner.invoke(main, argv, env=env).exit_code for _ in range(2)] == [0, 0]
    full = runner.invoke(main, argv, env=env)
    assert full.exit_code == 75, full.output
    assert "organism 'org' has 2 requests and work units waiting, its max_pending is 2" \
        in full.output


def test_organism_max_pending_must_be_a_positive_integer(tmp_path: Path) -> None:
    organism = tmp_path / "organism.yaml"
    organism.write_text(f"name: org\nmax_pending: 0\nlisteners:\n  - name: first\n    {ADD}\n")
    with pytest.raises(OrganismInvalid, match="max_pending"):
        load_organism(organism)
    assert load_organism(two_calculators(tmp_path)).max_pending == DEFAULT_MAX_PENDING
