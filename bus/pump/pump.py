"""The durable message pump: claim work units, run pipelines and handlers, commit replies.

    with Bus.open("bus.db") as bus:
        pump = Pump(bus, load_organism("organism.yaml"))
        stats = pump.run(until_idle=True)        # or run() until pump.stop()

The pump is two threads. Its database thread takes steps (bus/pump/step.py):
a step commits the units whose handlers finished, `commit_batch` per
`BEGIN IMMEDIATE` (each transaction one batch, bus/pump/commit.py), and in
its last transaction also routes client envelopes from the inbox, buries
units out of attempts and claims as many units as the concurrency limits
allow. The event loop, here, starts the units a step claimed and hands the
finished ones to the next step. The pipeline and the handler run outside
any transaction: pipelines on a worker thread per listener, side by side
(small inputs on the event loop's thread: bus/pump/pipelines.py), async
handlers on the loop, sync ones in a thread pool, each with the listener's
timeout. A heartbeat thread renews the leases of running units (and beats
for the pump), so a long handler keeps its claim; a killed pump's units are
claimed again once their leases run out, and since reply ids derive from the
input id, listener and index, a retried commit cannot duplicate anything.

With nothing to do, the database thread itself waits (`Pump._idle`): for
another connection's commit that left something to take (`Bus.wait_for_change`,
then `work.has_work`), which it steps on at once, without a hop to the loop;
for a wake from the loop (a handler finished, `stop()`) through a pipe; until
a lease it knows of runs out; or for `IDLE_WAKE_S`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable

from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from bus.pump import work
from bus.pump.commit import Finished
from bus.pump.envelopes import huh_element
from bus.pump.handlers import Context
from bus.pump.handlers import HandlerFailed
from bus.pump.handlers import call_handler
from bus.pump.handlers import outputs_of
from bus.pump.organism import Organism
from bus.pump.pipelines import Pipelines
from bus.pump.routing import Listener
from bus.pump.routing import RoutingTable
from bus.pump.schedule import Slots
from bus.pump.services import Services
from bus.pump.step import PumpStats
from bus.pump.step import Step
from bus.pump.step import Stepper
from bus.pump.work import Unit

if TYPE_CHECKING:
    from bus.api import Bus

log = logging.getLogger("bus.pump")
DEFAULT_LEASE_MS = 30_000
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_COMMIT_BATCH = 64
IDLE_WAKE_S = 1.0  # look again at least this often (expired leases, stop requests)


class Pump:
    """One running pump of one organism on one bus. Several may share the bus.

    `lease_ms` is how long a claim holds without renewal (renewed every third
    of it from claim to commit); `max_in_flight` the global limit on units
    between claim and commit (handler calls, and finished units waiting for
    their commit); each listener's `concurrency` limits its own;
    `commit_batch` how many finished units one transaction commits at most.
    `before_commit(finished)`, if given, runs on the database thread just
    before a commit (tests use it to kill the pump there); `on_unit(done,
    outcome)` after it, once per unit the commit settled (`bus pump run -v`).
    """

    def __init__(self, bus: Bus, organism: Organism, *, lease_ms: int = DEFAULT_LEASE_MS,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 commit_batch: int = DEFAULT_COMMIT_BATCH, oob: bool = True,
                 before_commit: Callable[[list[Finished]], None] | None = None,
                 on_unit: Callable[[Finished, str], None] | None = None) -> None:
        for name, value in (("lease_ms", lease_ms), ("max_in_flight", max_in_flight),
                            ("commit_batch", commit_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationFailed(name, f"must be an integer >= 1, got {value!r}")
        self.bus = bus
        self.table = RoutingTable(organism)
        self.name = organism.name
        self.owner = f"{organism.name}:{os.getpid()}:{new_message_id()[:8]}"
        self.lease_ms, self.max_in_flight = lease_ms, max_in_flight
        self.use_oob = oob
        self.stats = PumpStats()
        self.steps = Stepper(bus, self.table, self.owner, self.stats, lease_ms=lease_ms,
                             commit_batch=commit_batch, idle_wake_s=IDLE_WAKE_S,
                             before_commit=before_commit, on_unit=on_unit)
        self._running: dict[int, Unit] = {}  # unit id -> unit, for lease renewal
        self._running_lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._alone: int | None = None  # a suspect unit running on its own (Step.alone)
        # Units whose handlers are done, queued by their tasks for the next step's commit.
        self._finished: deque[Finished] = deque()
        self._pipelines = Pipelines()  # a worker thread per listener (bus/pump/pipelines.py)
        self._tasks: set[asyncio.Task] = set()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The idle database thread waits for commits and for this pipe: a byte in it
        # (a handler finished, stop()) ends the wait (see _idle).
        self._wake_r, self._wake_w = -1, -1
        self._sleeping = threading.Event()  # set while the database thread waits (_idle)
        self._until_idle = False

    @property
    def organism(self) -> Organism:
        """The organism as the pump runs it now (OOB commands change it)."""
        return self.table.organism

    # --- running ----------------------------------------------------------------------

    def run(self, until_idle: bool = False) -> PumpStats:
        """Run until `stop()` (or, with `until_idle`, until nothing is left to do)."""
        with ThreadPoolExecutor(1, thread_name_prefix="pump-db") as db, \
                ThreadPoolExecutor(max(4, min(self.max_in_flight, 64)),
                                   thread_name_prefix="pump-handler") as handlers:
            self._db_pool, self._handler_pool = db, handlers
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            try:
                with self._services():
                    self._until_idle = until_idle
                    asyncio.run(self._main(until_idle))
            finally:
                self._pipelines.close()
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r, self._wake_w = -1, -1
        return self.stats

    def stop(self) -> None:
        """Ask the pump to stop: no new claims; running handlers finish and commit.

        Safe from any thread and from a signal handler.
        """
        self._stop.set()
        self._poke()

    def _poke(self) -> None:
        """End the database thread's idle wait (from any thread or a signal handler)."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):  # full (a wake is pending anyway), or not running
            pass

    def _poked(self) -> bool:
        """Whether the pipe held a wake (drained)."""
        try:
            return bool(os.read(self._wake_r, 4096))
        except BlockingIOError:
            return False

    async def _main(self, until_idle: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self.stats.booted = await self._db(self.steps.boot)
        woke: Step | None = None
        while True:
            step = woke if woke is not None else await self._next_step()
            self.stats.steps += 1
            if step.alone is not None:
                self._alone = step.alone
            for unit, message in step.claimed:
                self._start(step.routes.listeners[unit.listener], unit, message)
            if step.claimed:  # a handler that never awaits is done after this turn
                await asyncio.sleep(0)
            if not self._tasks and not self._finished and (
                    self._stop.is_set() or (until_idle and not step.pending)):
                return
            # Claims need no second look: a listener that got fewer units than it
            # asked for has none left, one that got them all has no slot left; its
            # handlers wake the loop when they finish.
            woke = None
            if step.more or self._finished:
                continue
            woke = await self._db(self._idle, self._timeout(step.next_expiry),
                                  self._capacity(), dict(self._in_flight))

    async def _next_step(self) -> Step:
        # Every finished unit goes in one call to the database thread, which
        # commits them `commit_batch` per transaction: one hop, not one per commit.
        # Their wakes are stale now: left in the pipe, they would end the next idle
        # wait at once, for a step with nothing to do.
        self._poked()
        batch = [self._finished.popleft() for _ in range(len(self._finished))]
        for done in batch:  # its slots are free for the claims after its commit
            self._settle(done.unit)
        in_flight = dict(self._in_flight)  # units beyond this batch
        step = await self._db(self.steps.step, batch, self._capacity(), in_flight,
                              self._until_idle)
        with self._running_lock:  # committed (or lost, or failed: retried after its lease)
            for done in batch:
                self._running.pop(done.unit.id, None)
        return step

    def _timeout(self, next_expiry: int | None) -> float:
        """How long the pump may wait for something to happen: IDLE_WAKE_S at most."""
        if next_expiry is None:
            return IDLE_WAKE_S
        return min(IDLE_WAKE_S, max(0.001, (next_expiry - now_ms()) / 1000 + 0.001))

    def _idle(self, timeout: float, capacity: Slots,
              in_flight: dict[str, int]) -> Step | None:
        """On the database thread, with nothing to do: wait for a commit worth a step and
        take that step at once, or for a wake (a handler finished, stop()): then None.

        The thread that saw the commit is the one that steps: a client's request
        is answered (inline) or claimed with no hop between threads.
        """
        if self._wait_for_work(time.monotonic() + timeout, now_ms() + int(timeout * 1000)):
            return self.steps.step([], capacity, in_flight)
        return None

    def _wait_for_work(self, deadline: float, deadline_ms: int) -> bool:
        """True once another connection's commit left work, False on a wake or at `deadline`
        (`deadline_ms` on the bus's clock)."""
        self._sleeping.set()
        try:
            while not self._poked() and deadline > time.monotonic():
                if self.bus.wait_for_change(deadline - time.monotonic(), self._wake_r) \
                        and self._worth_a_step(deadline_ms):
                    return True
        except BusError as exc:  # busy or closed: the loop looks again
            log.warning("pump idle wait: %s", exc)
        finally:
            self._sleeping.clear()
        return False

    def _worth_a_step(self, deadline_ms: int) -> bool:
        """After another connection's commit: whether it left the pump something to do.

        The inbox holds something, a unit can be claimed, the routing table
        changed, or a lease (another pump's claim) runs out before the pump
        would look anyway at `deadline_ms` (its scan then learns when). Finished handlers and
        `stop()` wake it themselves. Running until idle, any commit may be
        another pump's last: look again.
        """
        if self._until_idle or self.table.routes is not self.steps.scan.routes:
            return True
        with self.bus.read() as conn:
            ready, next_expiry = work.has_work(conn, self.name, now_ms())
        return ready or (next_expiry is not None and next_expiry < deadline_ms)

    async def _db(self, function: Callable[..., Any], *args: Any) -> Any:
        return await self._loop.run_in_executor(self._db_pool, function, *args)

    def _capacity(self) -> Slots:
        """Free handler slots, global and per listener, for the next claim (the claim
        shares the global ones out fairly: see bus/pump/schedule.py). None at all while
        a suspect unit runs alone (see Stepper._claim_suspect)."""
        free = self.max_in_flight - sum(self._in_flight.values())
        if self._stop.is_set() or free <= 0 or self._alone is not None:
            return Slots(0, {})
        capacity = {}
        for name, listener in self.table.routes.listeners.items():
            slots = min(free, listener.spec.concurrency - self._in_flight.get(name, 0))
            if slots > 0:
                capacity[name] = slots
        return Slots(free, capacity)

    def _renew(self) -> None:
        """Extend the leases of running units (called from the heartbeat thread)."""
        with self._running_lock:
            ids = list(self._running)
        if ids:
            with self.bus.write() as conn:
                work.renew(conn, self.owner, ids, self.lease_ms, now_ms())

    # --- handlers -------------------------------------------------------------------------

    def _start(self, listener: Listener, unit: Unit, message: Message) -> None:
        """Run a claimed unit with the listener it was claimed for (even if removed since)."""
        self._in_flight[unit.listener] = self._in_flight.get(unit.listener, 0) + 1
        with self._running_lock:
            self._running[unit.id] = unit
        task = asyncio.get_running_loop().create_task(self._handle(unit, message, listener))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, unit: Unit, message: Message, listener: Listener) -> None:
        finished = None
        try:
            finished = await self._process(unit, message, listener)
        except Exception as exc:  # a pump bug: the unit is retried after its lease
            log.exception("unit %s of %s failed in the pump: %s", unit.id, unit.listener, exc)
        finally:
            if finished is None:
                self._release(unit)
        if finished is not None:  # it holds its slot and lease until its commit
            self._finished.append(finished)
        # One wake per batch: the loop that takes `_finished` is the thread that fills
        # it, so a non-empty list always had a wake written after its first unit.
        if finished is None or len(self._finished) == 1:
            self._poke()

    def _release(self, unit: Unit) -> None:
        self._settle(unit)
        with self._running_lock:
            self._running.pop(unit.id, None)

    def _settle(self, unit: Unit) -> None:
        """`unit` holds no handler slot any more (committed, or given up until its lease ends)."""
        self._in_flight[unit.listener] -= 1
        if unit.id == self._alone:
            self._alone = None

    async def _process(self, unit: Unit, message: Message, listener: Listener) -> Finished:
        """Pipeline, then handler: the unit's outputs or the `<huh>` for its sender."""
        checked = await self._pipelines.check(unit, message, listener,
                                              self.steps.encoded.take(message.id))
        if isinstance(checked, Finished):
            return checked
        spec = listener.spec
        ctx = Context(unit.thread, checked.sender, spec.name, message.id, unit.attempts,
                      self._loop.time() + spec.timeout_s, listener.tools, listener.model,
                      listener.system_prompt)
        try:
            replies = await call_handler(listener.handler, checked.payload, ctx,
                                         spec.timeout_s, self._handler_pool)
            outputs = outputs_of(replies, spec.peers, listener.visible)
        except HandlerFailed as exc:
            return Finished(unit, message, huh=huh_element(exc.code, exc.reason, "handler"))
        return Finished(unit, message, tuple(outputs))

    # --- side services ----------------------------------------------------------------------

    def _services(self) -> Services:
        return Services(self)
