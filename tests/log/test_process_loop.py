"""The process loop (bus/log/consumer.py): poll, handle, ack after success, stop the batch at
the first failure, wait on the commit signal; at-least-once across `kill -9`."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus import Consumer
from bus import Message
from bus import ValidationFailed
from bus import process_loop
from tests.support.children import SHORT_TIMEOUT
from tests.support.children import Children
from tests.conftest import REPO_ROOT
from tests.support.properties import scaled_settings

CONSUMER = Path(__file__).parent.parent / "support" / "procs_consumer.py"
PUBLISHER = Path(__file__).parent.parent / "support" / "procs_wake.py"


class Boom(Exception):
    pass


def publish(bus: Bus, agent: str, count: int) -> list[int]:
    return [bus.publish("planner", "task", {"n": n}, to=agent).seq for n in range(count)]


class Recorder:
    """A handler that records each call and fails on the calls whose number is in `fail_calls`."""

    def __init__(self, bus: Bus, agent: str, fail_calls: set[int] = frozenset()) -> None:
        self.bus, self.agent, self.fail_calls = bus, agent, fail_calls
        self.calls: list[int] = []
        self.cursor_at_call: list[int] = []

    def __call__(self, message: Message) -> None:
        self.calls.append(message.seq)
        self.cursor_at_call.append(self.bus.cursor(self.agent))
        if len(self.calls) in self.fail_calls:
            raise Boom(f"call {len(self.calls)} on seq {message.seq}")


# --- in one process -----------------------------------------------------------------------


def test_process_loop_handles_in_seq_order_and_acks_each_before_the_next(bus):
    seqs = publish(bus, "worker-1", 3)
    handler = Recorder(bus, "worker-1")

    stats = process_loop(bus, "worker-1", handler, until_idle=True)

    assert handler.calls == seqs
    # Each message was acked before the next one's handler ran, not at the batch's end.
    assert handler.cursor_at_call == [0, seqs[0], seqs[1]]
    assert (stats.handled, stats.failures, stats.acked_to) == (3, 0, seqs[-1])
    assert bus.cursor("worker-1") == seqs[-1]
    assert bus.poll("worker-1") == []


def test_process_loop_failure_acks_up_to_the_last_success_and_redelivers_the_failed(bus):
    seqs = publish(bus, "worker-1", 5)
    handler = Recorder(bus, "worker-1", fail_calls={3})

    first = process_loop(bus, "worker-1", handler, until_idle=True)

    assert handler.calls == seqs[:3]  # the batch stopped at the failure: 4 and 5 not tried
    assert (first.handled, first.failures, first.acked_to) == (2, 1, seqs[1])
    assert isinstance(first.last_error, Boom) and first.last_failed.seq == seqs[2]
    assert bus.cursor("worker-1") == seqs[1]
    assert [m.seq for m in bus.poll("worker-1")] == seqs[2:]  # the failed one comes back first

    second = process_loop(bus, "worker-1", handler, until_idle=True)

    assert handler.calls == seqs[:3] + seqs[2:]
    assert (second.handled, second.failures) == (3, 0)
    assert bus.cursor("worker-1") == seqs[-1]


def test_consumer_process_batch_reports_the_failed_message_and_its_error(bus):
    seqs = publish(bus, "worker-1", 4)
    with Consumer(bus, "worker-1", Recorder(bus, "worker-1", fail_calls={2})) as consumer:
        batch = consumer.process_batch()
        assert (batch.handled, batch.acked_to, batch.failed.seq) == (1, seqs[0], seqs[1])
        assert isinstance(batch.error, Boom)
        retried = consumer.process_batch(limit=2)
        assert (retried.handled, retried.acked_to, retried.failed) == (2, seqs[2], None)


def test_process_loop_logs_the_failure_with_the_message_and_the_traceback(bus, caplog):
    [seq] = publish(bus, "worker-1", 1)
    caplog.set_level(logging.ERROR, logger="bus.log.consumer")

    process_loop(bus, "worker-1", Recorder(bus, "worker-1", fail_calls={1}), until_idle=True)

    [record] = caplog.records
    assert record.name == "bus.log.consumer"
    assert f"handler failed on seq {seq}" in record.getMessage()
    assert "not acked" in record.getMessage()
    assert record.exc_info[0] is Boom


def test_consumer_backs_off_doubling_after_failures_and_resets_after_a_success(bus):
    seqs = publish(bus, "worker-1", 2)
    # Calls: seq1 fails, fails, succeeds; seq2 fails, succeeds.
    handler = Recorder(bus, "worker-1", fail_calls={1, 2, 4})
    with Consumer(bus, "worker-1", handler, retry_delay=0.5, max_retry_delay=0.75) as consumer:
        slept: list[float] = []
        consumer._sleep = slept.append  # the clock of the back-off, injected
        stats = consumer.run(max_messages=2)

    assert handler.calls == [seqs[0], seqs[0], seqs[0], seqs[1], seqs[1]]
    assert slept == [0.5, 0.75, 0.5]  # doubled up to the cap, back to the start after a success
    assert (stats.handled, stats.failures) == (2, 3)


def test_process_loop_max_messages_handles_that_many_and_leaves_the_rest(bus):
    seqs = publish(bus, "worker-1", 5)
    handler = Recorder(bus, "worker-1")

    stats = process_loop(bus, "worker-1", handler, limit=2, max_messages=3)

    assert handler.calls == seqs[:3]
    assert stats.handled == 3 and bus.cursor("worker-1") == seqs[2]


def test_consumer_stop_inside_a_handler_finishes_that_message_and_leaves_the_rest(bus):
    seqs = publish(bus, "worker-1", 4)
    calls = []

    def handle(message: Message) -> None:
        calls.append(message.seq)
        if message.seq == seqs[1]:
            consumer.stop()

    with Consumer(bus, "worker-1", handle) as consumer:
        stats = consumer.run()
        assert consumer.run().handled == 0  # a stopped consumer stays stopped

    assert calls == seqs[:2] and stats.handled == 2
    assert bus.cursor("worker-1") == seqs[1]  # the message it was handling is acked


def test_process_loop_a_base_exception_propagates_and_leaves_its_message_unacked(bus):
    seqs = publish(bus, "worker-1", 3)

    def handle(message: Message) -> None:
        if message.seq == seqs[1]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        process_loop(bus, "worker-1", handle)
    assert bus.cursor("worker-1") == seqs[0]


class AnnouncedWaits:
    """The bus, setting `waiting` when the loop blocks on the commit signal."""

    def __init__(self, bus: Bus) -> None:
        self.bus, self.poll, self.ack = bus, bus.poll, bus.ack
        self.waiting = threading.Event()

    def wait_for_change(self, timeout: float, interrupt: int | None = None) -> bool:
        self.waiting.set()
        return self.bus.wait_for_change(timeout, interrupt)


def test_consumer_stop_from_another_thread_ends_its_wait_on_the_commit_signal(bus):
    watched = AnnouncedWaits(bus)
    consumer = Consumer(watched, "worker-1", lambda message: None, idle_wait=3600)
    results = []
    thread = threading.Thread(target=lambda: results.append(consumer.run()), daemon=True)
    thread.start()
    assert watched.waiting.wait(SHORT_TIMEOUT), "the loop never waited on the commit signal"

    consumer.stop()

    thread.join(SHORT_TIMEOUT)  # an hour's idle_wait: only the stop can end it in time
    assert not thread.is_alive(), "stop() did not end the wait"
    assert results[0].handled == 0
    consumer.close()
    consumer.stop()  # after close: nothing to wake, no error


def test_consumer_stop_ends_the_back_off_after_a_failure(bus):
    [seq] = publish(bus, "worker-1", 1)
    failed = threading.Event()

    def handle(message: Message) -> None:
        failed.set()
        raise Boom(message.seq)

    consumer = Consumer(bus, "worker-1", handle, retry_delay=3600)
    results = []
    thread = threading.Thread(target=lambda: results.append(consumer.run()), daemon=True)
    thread.start()
    assert failed.wait(SHORT_TIMEOUT), "the handler never ran"

    consumer.stop()

    thread.join(SHORT_TIMEOUT)  # an hour's back-off: only the stop can end it in time
    assert not thread.is_alive(), "stop() did not end the back-off"
    assert (results[0].failures, results[0].last_failed.seq) == (1, seq)
    assert bus.cursor("worker-1") == 0
    consumer.close()


@pytest.mark.parametrize("field, kwargs", [
    ("limit", {"limit": 0}),
    ("retry_delay", {"retry_delay": -1}),
    ("idle_wait", {"idle_wait": float("nan")}),
])
def test_consumer_refuses_bad_settings_naming_the_field(bus, field, kwargs):
    with pytest.raises(ValidationFailed) as raised:
        Consumer(bus, "worker-1", print, **kwargs)
    assert raised.value.field == field


def test_consumer_refuses_a_bad_agent_a_handler_that_is_not_callable_and_max_messages(bus):
    with pytest.raises(ValidationFailed) as raised:
        Consumer(bus, "no spaces", print)
    assert raised.value.field == "agent"
    with pytest.raises(ValidationFailed) as raised:
        Consumer(bus, "worker-1", "print")
    assert raised.value.field == "handler"
    with Consumer(bus, "worker-1", print) as consumer, \
            pytest.raises(ValidationFailed) as raised:
        consumer.run(max_messages=0)
    assert raised.value.field == "max_messages"


# --- a property against a model -----------------------------------------------------------

_agents = iter(range(10**9))


@scaled_settings(max_examples=60)
@given(count=st.integers(0, 12), outcomes=st.lists(st.booleans(), max_size=40),
       rounds=st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=1, max_size=30))
def test_process_loop_matches_the_model_for_any_successes_and_failures(bus, count, outcomes,
                                                                       rounds):
    """Each round is `run(until_idle=True)` (None) or `process_batch(limit)`; each handler
    call takes the next outcome (True: success; once they run out, successes)."""
    agent = f"agent-{next(_agents)}"
    seqs = publish(bus, agent, count)
    pending_outcomes = list(outcomes)
    calls = []

    def handle(message: Message) -> None:
        calls.append(message.seq)
        if pending_outcomes and not pending_outcomes.pop(0):
            raise Boom(message.seq)

    model = Model(seqs, list(outcomes))
    with Consumer(bus, agent, handle) as consumer:
        for limit in rounds:
            if limit is None:
                stats = consumer.run(until_idle=True)
                handled, failed = stats.handled, stats.last_failed
            else:
                batch = consumer.process_batch(limit)
                handled, failed = batch.handled, batch.failed
            expected_handled, expected_failed = model.round(limit)
            assert (handled, failed and failed.seq) == (expected_handled, expected_failed)
            assert calls == model.calls
            assert bus.cursor(agent) == model.cursor
            assert [m.seq for m in bus.poll(agent)] == seqs[model.position:]


class Model:
    """Where the consumer should be: the position in `seqs` of the first message not acked."""

    def __init__(self, seqs: list[int], outcomes: list[bool]) -> None:
        self.seqs, self.outcomes = seqs, outcomes
        self.position = 0
        self.calls: list[int] = []

    @property
    def cursor(self) -> int:
        return self.seqs[self.position - 1] if self.position else 0

    def round(self, limit: int | None) -> tuple[int, int | None]:
        """Handled count and the failed seq (or None) of one round."""
        handled = 0
        while self.position < len(self.seqs) and (limit is None or handled < limit):
            seq = self.seqs[self.position]
            self.calls.append(seq)
            if self.outcomes and not self.outcomes.pop(0):
                return handled, seq  # the batch stops; the failed message stays unacked
            self.position += 1
            handled += 1
        return handled, None


# --- real processes -----------------------------------------------------------------------


@pytest.fixture
def children(python_env, tmp_path):
    started = Children(python_env, tmp_path / "logs", CONSUMER)
    yield started
    started.cleanup()


def read_until(child, wanted: str) -> list[str]:
    """Lines up to and including `wanted`; AssertionError if it does not come in time."""
    lines = []
    while (line := child.read_line(SHORT_TIMEOUT)) != wanted:
        lines.append(line)
    return lines + [line]


@pytest.mark.slow
def test_process_loop_killed_mid_handler_handles_that_message_again_after_restart(
        db_path, children):
    with Bus.open(db_path) as bus:
        seqs = publish(bus, "worker-1", 5)
    first = children.start("first", str(db_path), "worker-1", "--hang-at", str(seqs[2]))

    before = read_until(first, f"handling {seqs[2]}")
    first.kill()  # kill -9 inside the handler of the third message

    assert before == ["ready"] + [f"{word} {seq}" for seq in seqs[:2]
                                  for word in ("handling", "handled")] + [f"handling {seqs[2]}"]
    with Bus.open(db_path) as bus:
        assert bus.cursor("worker-1") == seqs[1]  # acked up to the last success
    second = children.start("second", str(db_path), "worker-1")
    after = read_until(second, "waiting")  # all handled: it waits for more
    second.proc.terminate()
    assert second.read_line(SHORT_TIMEOUT) == "stopped 3"
    second.wait_ok(SHORT_TIMEOUT)

    # At least once: the interrupted message again, then the rest; nothing acked comes back.
    assert after == ["ready"] + [f"{word} {seq}" for seq in seqs[2:]
                                 for word in ("handling", "handled")] + ["waiting"]
    with Bus.open(db_path) as bus:
        assert bus.cursor("worker-1") == seqs[-1]
        assert bus.poll("worker-1") == []


@pytest.mark.slow
def test_process_loop_wakes_for_a_message_another_process_publishes(db_path, children):
    Bus.open(db_path).close()
    consumer = children.start("consumer", str(db_path), "worker-1")
    publisher = children.start("publisher", "publisher", str(db_path), program=PUBLISHER)
    assert publisher.read_line(SHORT_TIMEOUT) == "ready"

    for _ in range(3):
        read_until(consumer, "waiting")  # blocked on the commit signal, for up to an hour
        publisher.proc.stdin.write(b"publish\n")
        publisher.proc.stdin.flush()
        [seq] = re.fullmatch(r"published (\d+)", publisher.read_line(SHORT_TIMEOUT)).groups()
        # Only the wake can end an hour's wait within the deadline: no fixed sleep, no timer.
        assert consumer.read_line(SHORT_TIMEOUT) == f"handling {seq}"
        assert consumer.read_line(SHORT_TIMEOUT) == f"handled {seq}"

    publisher.proc.stdin.write(b"quit\n")
    publisher.proc.stdin.flush()
    publisher.wait_ok(SHORT_TIMEOUT)
    read_until(consumer, "waiting")
    consumer.proc.terminate()  # SIGTERM: the handler only calls stop(), which ends the wait
    assert consumer.read_line(SHORT_TIMEOUT) == "stopped 3"
    consumer.wait_ok(SHORT_TIMEOUT)


# --- the README's example -----------------------------------------------------------------


def test_readme_process_loop_example_runs_and_prints_what_it_says(tmp_path, python_env):
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)
    [example] = [block for block in blocks if "process_loop(" in block]
    shown = [line.split("# prints ", 1)[1] for line in example.splitlines()
             if "# prints " in line]

    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=python_env,
                          capture_output=True, text=True, timeout=SHORT_TIMEOUT)

    assert done.returncode == 0, done.stderr
    # The handler's line comes first in the file, second in the output: compare as sets of lines.
    assert shown and sorted(done.stdout.splitlines()) == sorted(shown)
