"""The process loop: poll an agent's messages, handle each, ack after success.

    from bus import Bus, process_loop

    with Bus.open(".worker-state/bus.db") as bus:
        process_loop(bus, "worker-1", handle)   # runs until stopped; see Consumer

The loop is the at-least-once contract written once, so each agent need not
write it again:

- Messages come in seq order (`Bus.poll`); each is acked right after its
  handler returns, so a crash (even `kill -9`) mid-handler loses nothing:
  the message is handed out again after a restart. The price is the
  at-least-once one: a handler that did its work and died before the ack
  runs again, so handlers should be idempotent (a message's `id` is a good
  key for that).
- A handler that raises stops the batch: the failed message is not acked,
  nor anything after it, and comes back first in the next round (the order
  a consumer sees never skips a message). The exception is logged (logger
  `bus.log.consumer`), counted in the `LoopStats` that `run` returns, and the
  loop waits before it tries again: `retry_delay`, doubling on each failure
  in a row up to `max_retry_delay`, back to the start once a message
  succeeds (a message that fails for ever would otherwise spin a core).
  That is what Celery, RQ or huey workers do with a failing task: the worker
  survives it. A handler that must give up on a message for good acks it by
  returning normally (after publishing a dead letter of its own, say).
  BaseExceptions that are not Exceptions (KeyboardInterrupt, SystemExit)
  are not failures of a message: they end the loop and propagate, the
  message unacked.
- With nothing waiting it blocks on the bus's commit signal
  (`Bus.wait_for_change`, bus/log/wake.py), not a timer, so a message another
  process publishes is handled as soon as it commits.
- `Consumer.stop()` ends it from a signal handler or another thread: it
  sets a flag and writes a byte to a pipe that interrupts the wait (the
  self-pipe trick); the message being handled finishes and is acked, the
  rest wait for the next run.

Errors of the bus itself (BusBusy after the busy timeout, a closed bus)
propagate from `run`: they are not a message's failure. Nothing is lost by
it; what was not acked is handed out again.
"""

from __future__ import annotations

import logging
import os
import select
import weakref
from dataclasses import dataclass
from typing import Callable
from typing import Protocol

from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import validate_agent_id
from bus.log.messages import validate_positive_int

log = logging.getLogger("bus.log.consumer")

BATCH_LIMIT = 100  # messages one poll hands out
IDLE_WAIT_S = 60.0  # the longest wait on the commit signal before looking anyway
RETRY_DELAY_S = 0.1  # before a failed message is tried again; doubles on each failure in a row
MAX_RETRY_DELAY_S = 30.0

Handler = Callable[[Message], object]


class ConsumingBus(Protocol):
    """What the loop needs of a bus (a `Bus` is one)."""

    def poll(self, agent: str, limit: int = BATCH_LIMIT) -> list[Message]: ...

    def ack(self, agent: str, seq: int) -> int: ...

    def wait_for_change(self, timeout: float, interrupt: int | None = None) -> bool: ...


@dataclass(frozen=True)
class Batch:
    """What one `Consumer.process_batch()` did."""

    handled: int  # messages whose handler returned, each acked
    acked_to: int | None  # the cursor after the last ack; None when nothing was acked
    failed: Message | None = None  # the message whose handler raised: not acked
    error: Exception | None = None  # what it raised


@dataclass
class LoopStats:
    """What a `Consumer.run()` (or `process_loop`) did, returned when it ends."""

    handled: int = 0  # messages handled and acked
    failures: int = 0  # handler calls that raised (the same message may count again)
    acked_to: int | None = None  # the cursor after the last ack of this run
    last_error: Exception | None = None
    last_failed: Message | None = None

    def add(self, batch: Batch) -> None:
        self.handled += batch.handled
        if batch.acked_to is not None:
            self.acked_to = batch.acked_to
        if batch.error is not None:
            self.failures += 1
            self.last_error, self.last_failed = batch.error, batch.failed


class Consumer:
    """Runs `handler` on each message for `agent`, acking after each success.

    `limit` is the most messages one poll hands out. `retry_delay` and
    `max_retry_delay` (seconds) space the retries of a failing message;
    `idle_wait` is the longest wait on the commit signal before it polls
    anyway (a safety net: a commit ends the wait at once). The loop runs on
    the calling thread, on that thread's connection. Close the consumer (or
    use it in a `with` block) to free its wake-up pipe. A stopped consumer
    stays stopped: `run` returns at once.

        consumer = Consumer(bus, "worker-1", handle)
        signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
        with consumer:
            stats = consumer.run()   # until SIGTERM
    """

    def __init__(self, bus: ConsumingBus, agent: str, handler: Handler, *,
                 limit: int = BATCH_LIMIT, retry_delay: float = RETRY_DELAY_S,
                 max_retry_delay: float = MAX_RETRY_DELAY_S,
                 idle_wait: float = IDLE_WAIT_S) -> None:
        if not callable(handler):
            raise ValidationFailed("handler", f"must be callable with a Message, got {handler!r}")
        self.bus = bus
        self.agent = validate_agent_id(agent)
        self.handler = handler
        self.limit = validate_positive_int(limit, "limit")
        self.retry_delay = _seconds(retry_delay, "retry_delay")
        self.max_retry_delay = max(self.retry_delay, _seconds(max_retry_delay, "max_retry_delay"))
        self.idle_wait = _seconds(idle_wait, "idle_wait")
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()  # not inherited by children (PEP 446)
        os.set_blocking(self._wake_w, False)  # stop() must never block, in a signal handler least
        self._close_pipe = weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)

    # --- stopping ---------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to end after the message it is handling; safe in a signal handler.

        Only a flag and one byte to a pipe: no lock, no I/O on the bus.
        """
        self._stopping = True
        if not self._close_pipe.alive:
            return  # closed: no loop to wake, and the fd number may be another file's now
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass  # a full pipe already wakes the loop

    @property
    def stopping(self) -> bool:
        return self._stopping

    def close(self) -> None:
        """Free the wake-up pipe. Calling it twice is harmless."""
        self._stopping = True
        self._close_pipe()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the loop ---------------------------------------------------------

    def process_batch(self, limit: int | None = None) -> Batch:
        """One round: poll, then handle and ack each message until the first failure.

        Returns at once with what it did; never waits. A failure is logged
        and reported in the Batch, not raised; the failed message and those
        after it are not acked, so the next poll hands them out again.
        """
        handled, acked_to = 0, None
        for message in self.bus.poll(self.agent, limit or self.limit):
            if self._stopping:
                break  # the rest are not handled, so not acked: the next run has them
            try:
                self.handler(message)
            except Exception as error:  # noqa: BLE001 - any failure of a handler is the message's
                log.error("%s: handler failed on seq %d (id %s, type %s); not acked, it will be"
                          " handed out again", self.agent, message.seq, message.id,
                          message.type, exc_info=error)
                return Batch(handled, acked_to, message, error)
            # Acked at once, not at the batch's end: a crash now repeats one message, not a batch.
            acked_to = self.bus.ack(self.agent, message.seq)
            handled += 1
        return Batch(handled, acked_to)

    def run(self, *, until_idle: bool = False, max_messages: int | None = None) -> LoopStats:
        """Process messages until stopped; return what was done.

        `until_idle`: return instead of waiting, once nothing is waiting or a
        handler failed (for scripts and cron jobs; the failed message waits
        for the next run). `max_messages`: return after that many handled.
        Otherwise it runs until `stop()`, waiting on the commit signal when
        nothing is waiting and backing off after a failure.
        """
        if max_messages is not None:
            validate_positive_int(max_messages, "max_messages")
        stats = LoopStats()
        delay = self.retry_delay
        while not self._stopping:
            room = self.limit if max_messages is None else min(self.limit,
                                                                max_messages - stats.handled)
            if room <= 0:
                break
            batch = self.process_batch(room)
            stats.add(batch)
            if batch.handled:
                delay = self.retry_delay  # progress: the next failure is a new one
            if batch.error is not None:
                if until_idle:
                    break
                self._sleep(delay)
                delay = min(delay * 2, self.max_retry_delay)
            elif batch.handled == 0:
                if until_idle:
                    break
                # A commit since the last wait (or the first wait on this thread) ends it at
                # once, so a message published between the poll and here is not missed.
                self.bus.wait_for_change(self.idle_wait, self._wake_r)
        return stats

    def _sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if `stop()` is called (it writes to the pipe)."""
        select.select([self._wake_r], [], [], seconds)


def process_loop(bus: ConsumingBus, agent: str, handler: Handler, *,
                 limit: int = BATCH_LIMIT, until_idle: bool = False,
                 max_messages: int | None = None, retry_delay: float = RETRY_DELAY_S,
                 max_retry_delay: float = MAX_RETRY_DELAY_S) -> LoopStats:
    """Handle `agent`'s messages in seq order, acking each after its handler returns.

    A handler that raises stops the batch: that message is not acked and is
    handed out again first, after a back-off (`retry_delay` doubling up to
    `max_retry_delay`); the exception is logged and counted, not raised.
    With nothing waiting it sleeps on the bus's commit signal. It returns
    when `until_idle` and nothing is waiting (or a handler failed), or after
    `max_messages` handled; to stop a loop that runs for ever from a signal
    handler or another thread, use `Consumer` and its `stop()`.

        def handle(message):
            print(message.seq, message.type, message.payload)

        stats = process_loop(bus, "worker-1", handle, until_idle=True)
        print(stats.handled, stats.failures)
    """
    with Consumer(bus, agent, handler, limit=limit, retry_delay=retry_delay,
                  max_retry_delay=max_retry_delay) as consumer:
        return consumer.run(until_idle=until_idle, max_messages=max_messages)


def _seconds(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < float("inf"):
        raise ValidationFailed(field, f"must be seconds >= 0, got {value!r}")
    return float(value)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
