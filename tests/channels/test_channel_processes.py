"""The message engine across real OS processes on one bus file.

4 senders and 4 receivers share a pubsub channel whose subscriptions overlap;
afterwards every expected (message, recipient) pair must have been delivered
and acknowledged once. A receiver SIGKILLed before acknowledging gets its
message again once the ack timeout has passed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from bus import Bus
from bus.channels import Channels
from bus.channels.topics import matches
from tests.conftest import ManualClock
from tests.support.children import Children

PROGRAM = Path(__file__).resolve().parent.parent / "support" / "procs_channels.py"
SENDERS = 4
EVENTS_PER_SENDER = 150
REPEAT_EVERY = 10  # every 10th event is sent twice with the same correlation id
SUBSCRIPTIONS = {  # overlapping on purpose: r0 and r3 both match every build.*.ok
    "r0": ["build.#"],
    "r1": ["build.*.ok", "*.web.*"],
    "r2": ["deploy.#", "deploy.web.done"],
    "r3": ["#", "build.web.ok"],
}

pytestmark = pytest.mark.slow


@pytest.fixture
def children(python_env: dict[str, str], tmp_path: Path):
    started = Children(python_env, tmp_path / "stderr", PROGRAM)
    yield started
    started.cleanup()


def start_all(children: Children, db: Path, roles: list[tuple[str, list[str]]]) -> list:
    """Start every child on one barrier pipe; release them together once all are ready."""
    go_read, go_write = os.pipe()
    try:
        started = [children.start(name, role_argv[0], "--db", str(db), "--go-fd", str(go_read),
                                  *role_argv[1:], pass_fds=(go_read,))
                   for name, role_argv in roles]
    finally:
        os.close(go_read)
    for child in started:
        assert child.read_line(60) == "ready", child.describe()
    os.close(go_write)
    return started


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_four_senders_four_receivers_every_pair_acknowledged_once(
        children: Children, db_path: Path, tmp_path: Path, mode: str) -> None:
    with Bus.open(db_path) as bus:
        bus.channels.create_channel("ps", "pubsub", "owner", delivery_mode=mode)
        for s in range(SENDERS):
            bus.channels.join_channel("ps", f"s{s}")
        for agent, patterns in SUBSCRIPTIONS.items():
            for pattern in patterns:
                bus.channels.subscribe("ps", agent, pattern)
    done_file = tmp_path / "senders-done"
    roles = [(f"s{s}", ["sender", "--agent", f"s{s}", "--count", str(EVENTS_PER_SENDER),
                        "--repeat-every", str(REPEAT_EVERY)]) for s in range(SENDERS)]
    roles += [(agent, ["receiver", "--agent", agent, "--done-file", str(done_file)])
              for agent in SUBSCRIPTIONS]
    started = start_all(children, db_path, roles)
    senders, receivers = started[:SENDERS], started[SENDERS:]
    for child in senders:
        assert child.read_line(120) == "done", child.describe()
        child.wait_ok(30)
    done_file.touch()
    acked = {}
    for agent, child in zip(SUBSCRIPTIONS, receivers):
        acked[agent] = json.loads(child.read_line(120))
        child.wait_ok(30)

    with Bus.open(db_path) as bus:
        sent = {seq: (corr, topic) for seq, corr, topic in bus.conn.execute(
            "SELECT cm.seq, m.correlation_id, cm.topic FROM channel_messages cm"
            " JOIN messages m ON m.seq = cm.seq")}
        statuses = dict(((seq, who), status) for seq, who, status in bus.conn.execute(
            "SELECT seq, recipient, status FROM deliveries"))
    repeats = SENDERS * len(range(0, EVENTS_PER_SENDER, REPEAT_EVERY))
    assert len(sent) == SENDERS * EVENTS_PER_SENDER + repeats
    for agent, patterns in SUBSCRIPTIONS.items():
        wanted = {seq for seq, (_corr, topic) in sent.items()
                  if any(matches(topic, p) for p in patterns)}
        got = [seq for seq, _corr, _attempt in acked[agent]]
        assert all(attempt == 1 for _seq, _corr, attempt in acked[agent])
        if mode == "exactly_once":
            # Each correlation id once: the repeat of a sender's retry was never delivered.
            corrs = [corr for _seq, corr, _attempt in acked[agent]]
            assert sorted(corrs) == sorted({sent[seq][0] for seq in wanted}), agent
            suppressed = wanted - set(got)
            assert len(suppressed) == len(wanted) - len(set(corrs))
            assert {statuses[(seq, agent)] for seq in suppressed} <= {"duplicate"}
        else:
            assert sorted(got) == sorted(wanted), agent  # repeats are messages of their own
        assert len(got) == len(set(got)), f"{agent} acknowledged a message twice"
        assert all(statuses[(seq, agent)] == "completed" for seq in got)
    assert set(statuses) == {(seq, agent) for agent, patterns in SUBSCRIPTIONS.items()
                             for seq, (_c, topic) in sent.items()
                             if any(matches(topic, p) for p in patterns)}


def test_receiver_killed_before_ack_gets_the_message_again_after_the_timeout(
        children: Children, db_path: Path, clock: ManualClock) -> None:
    # Every timer is a stored deadline read against a clock: the test owns the
    # clock (the grabber receives at a time it is given), so the machine's load
    # cannot run the ack timeout out a second time before the restart receives.
    handed_at = clock.now + 100
    with Bus.open(db_path) as bus:
        channels = Channels(bus, clock=clock)
        channels.create_channel("ps", "pubsub", "owner", ack_timeout=0.3, retry_backoff_ms=50)
        channels.subscribe("ps", "worker", "job.#")
        sent = channels.publish("ps", "owner", "job.build", {"task": "t1"})
    [grabber] = start_all(children, db_path, [
        ("grabber", ["grabber", "--agent", "worker", "--now-ms", str(handed_at)])])
    assert json.loads(grabber.read_line(60)) == [sent.seq]
    os.kill(grabber.pid, signal.SIGKILL)
    grabber.wait(30)
    with Bus.open(db_path) as bus:
        channels = Channels(bus, clock=clock)
        assert bus.conn.execute("SELECT delivered_at_ms FROM deliveries").get == handed_at
        visible_again = handed_at + 300 + 50  # the ack timeout, then the first backoff
        clock.now = visible_again - 1
        assert channels.receive_messages("worker").messages == []
        clock.now = visible_again
        got = channels.receive_messages("worker").messages
        assert [(m.seq, m.attempt, m.retry_count, m.content) for m in got] == [
            (sent.seq, 2, 1, {"task": "t1"})]
        channels.acknowledge_message(got[0], "worker", "completed")
        assert channels.deliveries(sent)[0].status == "completed"
