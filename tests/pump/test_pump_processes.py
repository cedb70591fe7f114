"""The pump across real processes: SIGKILL between handlers and commit, then resume.

Every input must end with exactly one committed reply set (or a dead letter
and a <huh> for its sender): nothing lost, nothing duplicated, whatever the
kills interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bus import Bus
from bus.storage.db import write_transaction
from bus.pump import client
from bus.pump import work
from bus.pump.envelopes import derived_id
from bus.views.status import read_status
from tests.support.children import Children
from tests.support.cli_helpers import run

PROGRAM = Path(__file__).resolve().parent.parent / "support" / "procs_pump.py"
INPUTS = 24
KILLS = 4

pytestmark = pytest.mark.slow

ORGANISM = """\
name: org
listeners:
  - name: slow
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:slow_echo
    concurrency: 3
    max_attempts: 50
  - name: poison
    root_tag: poison
    payload: tests.support.pump_tools:Poison
    handler: tests.support.pump_tools:poison
    max_attempts: 2
"""


@pytest.fixture
def children(python_env: dict[str, str], tmp_path: Path):
    env = dict(python_env, PUMP_TOOLS_LOG=str(tmp_path / "calls.log"))
    started = Children(env, tmp_path / "stderr", PROGRAM)
    yield started
    started.cleanup()


@pytest.fixture
def organism(tmp_path: Path) -> Path:
    path = tmp_path / "organism.yaml"
    path.write_text(ORGANISM)
    return path


def pump(children: Children, name: str, db: Path, organism: Path, *extra: str):
    child = children.start(name, "--db", str(db), "--organism", str(organism), *extra)
    assert child.read_line(60) == "ready", child.describe()
    return child


def calls(tmp_path: Path) -> Counter:
    log = tmp_path / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[1] for line in lines)


def test_sigkill_between_handlers_and_commit_loses_and_duplicates_nothing(
        children, db_path, tmp_path, organism):
    with Bus.open(db_path) as bus:
        sent = [client.send(bus, "org", f"<echo><text>n{i}</text><count>{1 + i % 3}</count>"
                                        "</echo>") for i in range(INPUTS)]
    for round_ in range(KILLS):
        child = pump(children, f"killed-{round_}", db_path, organism, "--block-at", "2")
        line = child.read_line(60)
        assert line.startswith("committing "), child.describe()
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    last = pump(children, "last", db_path, organism)
    stats = json.loads(last.read_line(120))
    last.wait_ok(30)
    assert "dead" not in stats["outcomes"]
    with Bus.open(db_path) as bus:
        retries = 0
        for i, one in enumerate(sent):
            unit, = work.units_for_input(bus.conn, one.seq)
            status = bus.conn.execute("SELECT status FROM pump_work WHERE id = ?",
                                      (unit.id,)).get
            got = client.replies(bus, one)
            assert status == "done"
            assert [r.message.id for r in got] == [derived_id(one.id, "slow", k)
                                                   for k in range(1 + i % 3)]
            assert [r.payload_xml for r in got] == [
                f"<result><source>{k}</source><text>n{i}</text></result>"
                for k in range(1 + i % 3)]
            retries += unit.attempts - 1
        replies = bus.conn.execute("SELECT count(*) FROM messages WHERE from_agent = 'slow'").get
        assert replies == sum(1 + i % 3 for i in range(INPUTS))
    # Every kill interrupted claimed work that had to be taken again: at least one
    # attempt more per kill (a unit interrupted by two kills counts twice), and
    # some handlers ran more than once.
    handled = calls(tmp_path)
    assert retries >= KILLS and sum(handled.values()) > INPUTS
    assert set(handled) == {one.id for one in sent}


def test_an_input_that_kills_the_pump_every_time_becomes_a_dead_letter(
        children, db_path, tmp_path, organism):
    with Bus.open(db_path) as bus:
        sent = client.send(bus, "org", "<poison><text>boom</text></poison>", client="alice")
    for attempt in range(2):
        child = pump(children, f"victim-{attempt}", db_path, organism)
        assert child.wait(60) == -signal.SIGKILL, child.describe()
    last = pump(children, "last", db_path, organism)
    stats = json.loads(last.read_line(60))
    last.wait_ok(30)
    assert stats["outcomes"] == {"dead": 1}
    assert calls(tmp_path) == Counter({sent.id: 2})
    with Bus.open(db_path) as bus:
        got, = client.replies(bus, sent)
        assert (got.sender, got.to, got.root_tag) == ("poison", "alice", "huh")
        assert 'code="dead-letter"' in got.payload_xml
        unit, = work.units_for_input(bus.conn, sent.seq)
        assert bus.conn.execute("SELECT status, outcome FROM pump_work WHERE id = ?",
                                (unit.id,)).fetchone() == ("dead", "dead")
        dead, = work.dead_units(bus.conn, "org")
        assert (dead.id, dead.input_seq, dead.input_id, dead.sender, dead.listener,
                dead.attempts, dead.outcome) == (unit.id, sent.seq, sent.id, "alice", "poison",
                                                 2, "dead")
    listed = run(["pump", "dead", str(organism), "--json"], db_path)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == dead.to_json_dict()
    table = run(["pump", "dead", str(organism)], db_path).stdout.splitlines()
    assert table[0].split() == ["unit", "input", "sender", "listener", "attempts", "outcome",
                                "finished_at"]
    assert table[1].split()[:6] == [str(unit.id), str(sent.seq), "alice", "poison", "2", "dead"]


POISON_BESIDE = """\
name: org
listeners:
  - name: slow
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:slow_echo
    concurrency: 4
    max_attempts: 2
  - name: poison
    root_tag: poison
    payload: tests.support.pump_tools:Poison
    handler: tests.support.pump_tools:poison
    max_attempts: 3
"""


def test_a_poison_unit_is_dead_lettered_alone_and_its_neighbours_are_answered(
        children, db_path, tmp_path):
    """Two pumps, restarted whenever the poison kills one: the innocent requests in flight
    beside it are charged once, then retried one at a time, so with max_attempts 2 every
    one of them is answered; only the poison (max_attempts 3) is dead-lettered."""
    organism = tmp_path / "poison.yaml"
    organism.write_text(POISON_BESIDE)
    with Bus.open(db_path) as bus:
        innocents = [client.send(bus, "org", f"<echo><text>i{i}</text><count>1</count></echo>")
                     for i in range(6)]
        bad = client.send(bus, "org", "<poison><text>boom</text></poison>", client="alice")
        innocents += [client.send(bus, "org", f"<echo><text>j{i}</text><count>1</count></echo>")
                      for i in range(6)]
    live = [pump(children, f"pump-{n}", db_path, organism) for n in range(2)]
    started, kills = 2, 0
    while live:
        child = live.pop(0)
        code = child.wait(120)
        if code == -signal.SIGKILL:
            kills += 1
            assert kills <= 3, "the poison killed more pumps than its max_attempts"
            live.append(pump(children, f"pump-{started}", db_path, organism))
            started += 1
        else:
            assert code == 0, child.describe()
    assert kills == 3
    with Bus.open(db_path) as bus:
        for one in innocents:
            unit, = work.units_for_input(bus.conn, one.seq)
            assert bus.conn.execute("SELECT status FROM pump_work WHERE id = ?",
                                    (unit.id,)).get == "done"
            assert unit.attempts <= 2
            got, = client.replies(bus, one)
            assert got.root_tag == "result"
        dead, = work.dead_units(bus.conn, "org")
        assert (dead.input_seq, dead.listener, dead.attempts) == (bad.seq, "poison", 3)
        got, = client.replies(bus, bad)
        assert 'code="dead-letter"' in got.payload_xml
    assert calls(tmp_path)[bad.id] == 3


INLINE = """\
name: org
listeners:
  - name: echo
    root_tag: echo
    payload: tests.support.pump_tools:Echo
    handler: tests.support.pump_tools:echo_inline
    inline: true
    max_attempts: 2
"""


def inline_pump(children: Children, db_path: Path, organism: Path, *extra: str):
    """A serving pump with inline listeners, booted: it has answered a first request
    (which waited for it, so it went the leased way)."""
    with Bus.open(db_path) as bus:
        first = client.send(bus, "org", "<echo><text>boot</text><count>0</count></echo>")
    child = pump(children, "inline", db_path, organism, "--serve", *extra)
    with Bus.open(db_path) as bus:
        while not bus.conn.execute("SELECT status = 'done' FROM pump_work WHERE input_seq = ?",
                                   (first.seq,)).get:
            bus.wait_for_change(1.0)
    return child


def test_sigkill_inside_an_inline_transaction_loses_and_duplicates_nothing(
        children, db_path, tmp_path):
    """The kill comes before the commit of the inline transaction that handled all eight
    requests: everything it did is rolled back, and the next pump (for which they were
    waiting, so it leases them) answers each exactly once."""
    organism = tmp_path / "inline.yaml"
    organism.write_text(INLINE)
    child = inline_pump(children, db_path, organism, "--block-at", "2")  # 1: the first request
    with Bus.open(db_path) as bus, write_transaction(bus.conn):
        sent = [client.send(bus, "org", f"<echo><text>n{i}</text><count>{1 + i % 3}</count>"
                                        "</echo>") for i in range(8)]
    assert child.read_line(60) == "committing 8", child.describe()
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    last = pump(children, "last", db_path, organism)
    assert json.loads(last.read_line(60))["outcomes"] == {"replied": 8}
    last.wait_ok(30)
    with Bus.open(db_path) as bus:
        for i, one in enumerate(sent):
            assert [unit.attempts for unit in work.units_for_input(bus.conn, one.seq)] == [1]
            assert [r.message.id for r in client.replies(bus, one)] == [
                derived_id(one.id, "echo", k) for k in range(1 + i % 3)]
    handled = calls(tmp_path)  # in the killed transaction, then in the last pump
    assert [handled[one.id] for one in sent] == [2] * 8


def test_an_inline_request_that_kills_the_pump_becomes_a_dead_letter(
        children, db_path, tmp_path):
    """Killed inline, nothing counted the attempt; the next pumps lease it (it waited for
    them), count its attempts and bury it after max_attempts."""
    organism = tmp_path / "inline.yaml"
    organism.write_text(INLINE)
    child = inline_pump(children, db_path, organism)
    with Bus.open(db_path) as bus:
        bad = client.send(bus, "org", "<echo><text>boom</text><mode>kill</mode></echo>")
    assert child.wait(60) == -signal.SIGKILL, child.describe()
    for attempt in range(2):
        victim = pump(children, f"victim-{attempt}", db_path, organism)
        assert victim.wait(60) == -signal.SIGKILL, victim.describe()
    last = pump(children, "last", db_path, organism)
    assert json.loads(last.read_line(60))["outcomes"] == {"dead": 1}
    last.wait_ok(30)
    assert calls(tmp_path)[bad.id] == 3
    with Bus.open(db_path) as bus:
        got, = client.replies(bus, bad)
        assert got.root_tag == "huh" and 'code="dead-letter"' in got.payload_xml


# --- how a pump ends, as the views see it ------------------------------------------------

PUMP_AGENT = "pump:org"


def pump_beat(db_path: Path) -> tuple[str, str] | None:
    """The pump's (status, liveness state) as `bus status` reads them, or None before it beat."""
    found = [a for a in read_status(db_path).agents if a.agent == PUMP_AGENT]
    return (found[0].status, found[0].state) if found else None


def wait_for_beat(db_path: Path, expected: tuple[str, str]) -> None:
    deadline = time.monotonic() + 60
    with Bus.open(db_path) as bus:
        while pump_beat(db_path) != expected:
            assert time.monotonic() < deadline, f"the pump never beat {expected}"
            bus.wait_for_change(0.5)


def bus_pump_run(db_path: Path, organism: Path, env: dict[str, str],
                 *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(db_path), "pump",
                             "run", str(organism), "--no-oob", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_pump_stopped_by_a_signal_beats_stopped_last(db_path, organism, python_env, sig):
    Bus.open(db_path).close()
    proc = bus_pump_run(db_path, organism, python_env)
    try:
        wait_for_beat(db_path, ("working", "alive"))
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert pump_beat(db_path) == ("stopped", "stopped")
    # Long after: still stopped, where a last `working` beat would read dead.
    dead_by_now = read_status(db_path, now=int(time.time() * 1000) + 3_600_000)
    assert [(a.agent, a.state) for a in dead_by_now.agents] == [(PUMP_AGENT, "stopped")]


def test_a_pump_run_until_idle_beats_stopped_last(db_path, organism, python_env):
    with Bus.open(db_path) as bus:
        client.send(bus, "org", "<echo><text>hi</text><count>1</count></echo>")
    proc = bus_pump_run(db_path, organism, python_env, "--until-idle")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out == "pump org: booted; 1 replied\n"
    assert pump_beat(db_path) == ("stopped", "stopped")
    shown = run(["status"], db_path)
    assert shown.exit_code == 0, shown.stderr
    assert "agents: 1 stopped" in shown.stdout.splitlines()


def test_a_killed_pump_keeps_its_working_beat(db_path, organism, python_env):
    """Only a clean stop says stopped: a pump killed with SIGKILL looks dead in time."""
    Bus.open(db_path).close()
    proc = bus_pump_run(db_path, organism, python_env)
    wait_for_beat(db_path, ("working", "alive"))
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    later = read_status(db_path, now=int(time.time() * 1000) + 3_600_000)
    assert [(a.agent, a.status, a.state) for a in later.agents] == [
        (PUMP_AGENT, "working", "dead")]
