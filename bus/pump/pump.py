"""The durable message pump: claim work units, run pipelines and handlers, commit replies.

    with Bus.open("bus.db") as bus:
        pump = Pump(bus, load_organism("organism.yaml"))
        stats = pump.run(until_idle=True)        # or run() until pump.stop()

A step is one call to the pump's database thread: it commits the units
whose handlers finished, `commit_batch` per `BEGIN IMMEDIATE` (each unit in a
savepoint, only if its claim is still ours), and in its last transaction
also routes client envelopes from the inbox, buries units out of attempts
and claims as many units as the concurrency limits allow. The
pipeline and the handler run outside any transaction: pipelines on a
worker thread per listener, side by side (small inputs on the event loop's
thread: bus/pump/pipelines.py), async handlers on the loop, sync ones in a
thread pool, each with the listener's timeout. A heartbeat thread renews
the leases of running units (and beats for the pump), so a long handler
keeps its claim; a killed pump's units are claimed again once their leases
run out, and since reply ids derive from the input id, listener and index, a
retried commit cannot duplicate anything.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable

from bus import checkpoints
from bus.db import translate_busy
from bus.db import write_transaction
from bus.errors import BusError
from bus.errors import ValidationFailed
from bus.messages import Message
from bus.messages import new_message_id
from bus.messages import now_ms
from bus.pump import meta
from bus.pump import threads
from bus.pump import work
from bus.pump.commit import EncodedMemory
from bus.pump.commit import Finished
from bus.pump.commit import Writer
from bus.pump.envelopes import envelope_xml
from bus.pump.envelopes import huh_element
from bus.pump.handlers import Context
from bus.pump.handlers import HandlerFailed
from bus.pump.handlers import call_handler
from bus.pump.handlers import outputs_of
from bus.pump.inline import InlineRunner
from bus.pump.organism import META_ROOT_TAGS
from bus.pump.organism import Organism
from bus.pump.pipelines import Pipelines
from bus.pump.routing import Listener
from bus.pump.routing import Routes
from bus.pump.routing import RoutingTable
from bus.pump.scan import Scan
from bus.pump.schedule import FairShare
from bus.pump.schedule import Slots
from bus.pump.services import Services
from bus.pump.work import Unit
from bus.xml.envelope import read_envelope
from bus.xml.parser import parse

if TYPE_CHECKING:
    from bus.api import Bus

log = logging.getLogger("bus.pump")
DEFAULT_LEASE_MS = 30_000
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_COMMIT_BATCH = 64
ROUTE_BATCH = 256  # inbox rows routed per step
IDLE_WAKE_S = 1.0  # look again at least this often (expired leases, stop requests)
ORPHAN_CHECK_MS = 1000
ENCODED_MAX = 4096  # envelopes the pump remembers having encoded (see checked_input)


def _times(n: int) -> str:
    """`once` or `N times`, for people reading a dead letter's <huh>."""
    return "once" if n == 1 else f"{n} times"


@dataclass
class PumpStats:
    """What a run did; `outcomes` counts committed units by outcome (replied, huh, ...)."""

    outcomes: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    booted: bool = False

    def count(self, outcome: str, n: int = 1) -> None:
        if n:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    def to_json_dict(self) -> dict[str, Any]:
        return {"outcomes": dict(sorted(self.outcomes.items())), "steps": self.steps,
                "booted": self.booted}


@dataclass
class _Step:
    claimed: list[tuple[Unit, Message]]
    routes: Routes  # the table the step routed and claimed with
    more: bool  # the inbox holds more than one step routes: step again at once
    pending: bool
    next_expiry: int | None


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
        self.lease_ms, self.max_in_flight, self.commit_batch = lease_ms, max_in_flight, \
            commit_batch
        self.use_oob = oob
        self.before_commit = before_commit
        self.on_unit = on_unit
        self.stats = PumpStats()
        self._running: dict[int, Unit] = {}  # unit id -> unit, for lease renewal
        self._running_lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._alone: int | None = None  # the suspect unit running on its own (_claim_suspect)
        self._finished: list[Finished] = []
        self._orphans_checked: tuple[Routes, int] | None = None
        self._scan = Scan(IDLE_WAKE_S)
        self._fair = FairShare()  # who gets free global slots first (_claim_fresh)
        self._inline = InlineRunner(0)  # set at boot: what waits in the inbox goes leased
        self._encoded = EncodedMemory(ENCODED_MAX)  # see _after_commit
        self._pipelines = Pipelines()  # a worker thread per listener (bus/pump/pipelines.py)
        self._tasks: set[asyncio.Task] = set()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The idle database thread waits for commits and for this pipe: a byte in it
        # (a handler finished, stop()) ends the wait (see _idle).
        self._wake_r, self._wake_w = -1, -1
        self._sleeping = threading.Event()  # set while the database thread waits (_idle)
        self._until_idle = False
        self._wake_at_ms = 0  # when the idle wait ends anyway
        # Where the checkpoint of the step's next commit goes (see bus/pump/services.py).
        self._checkpoint = checkpoints.HERE

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
        self.stats.booted = await self._db(self._boot)
        woke: _Step | None = None
        while True:
            step = woke if woke is not None else await self._next_step()
            self.stats.steps += 1
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
                                  self._capacity(), sum(self._in_flight.values()) > 0)

    async def _next_step(self) -> _Step:
        # Every finished unit goes in one call to the database thread, which
        # commits them `commit_batch` per transaction: one hop, not one per commit.
        # Their wakes are stale now: left in the pipe, they would end the next idle
        # wait at once, for a step with nothing to do.
        self._poked()
        batch, self._finished = self._finished, []
        for done in batch:  # its slots are free for the claims after its commit
            self._settle(done.unit)
        busy = sum(self._in_flight.values()) > 0  # units beyond this batch
        step = await self._db(self._step, batch, self._capacity(), busy)
        with self._running_lock:  # committed (or lost, or failed: retried after its lease)
            for done in batch:
                self._running.pop(done.unit.id, None)
        return step

    def _timeout(self, next_expiry: int | None) -> float:
        """How long the pump may wait for something to happen: IDLE_WAKE_S at most."""
        if next_expiry is None:
            return IDLE_WAKE_S
        return min(IDLE_WAKE_S, max(0.001, (next_expiry - now_ms()) / 1000 + 0.001))

    def _idle(self, timeout: float, capacity: Slots, busy: bool) -> _Step | None:
        """On the database thread, with nothing to do: wait for a commit worth a step and
        take that step at once, or for a wake (a handler finished, stop()): then None.

        The thread that saw the commit is the one that steps: a client's request
        is answered (inline) or claimed with no hop between threads.
        """
        self._wake_at_ms = now_ms() + int(timeout * 1000)
        if self._wait_for_work(time.monotonic() + timeout):
            return self._step([], capacity, busy)
        return None

    def _wait_for_work(self, deadline: float) -> bool:
        """True once another connection's commit left work, False on a wake or at `deadline`."""
        self._sleeping.set()
        try:
            while not self._poked() and deadline > time.monotonic():
                if self.bus.wait_for_change(deadline - time.monotonic(), self._wake_r) \
                        and self._worth_a_step():
                    return True
        except BusError as exc:  # busy or closed: the loop looks again
            log.warning("pump idle wait: %s", exc)
        finally:
            self._sleeping.clear()
        return False

    def _worth_a_step(self) -> bool:
        """After another connection's commit: whether it left the pump something to do.

        The inbox holds something, a unit can be claimed, the routing table
        changed, or a lease (another pump's claim) runs out before the pump
        would look anyway (its scan then learns when). Finished handlers and
        `stop()` wake it themselves. Running until idle, any commit may be
        another pump's last: look again.
        """
        if self._until_idle or self.table.routes is not self._scan.routes:
            return True
        with translate_busy():
            ready, next_expiry = work.has_work(self.bus.conn, self.name, now_ms())
        return ready or (next_expiry is not None and next_expiry < self._wake_at_ms)

    async def _db(self, function: Callable[..., Any], *args: Any) -> Any:
        return await self._loop.run_in_executor(self._db_pool, function, *args)

    def _capacity(self) -> Slots:
        """Free handler slots, global and per listener, for the next claim (the claim
        shares the global ones out fairly: see bus/pump/schedule.py)."""
        free = self.max_in_flight - sum(self._in_flight.values())
        if self._stop.is_set() or free <= 0:
            return Slots(0, {})
        capacity = {}
        for name, listener in self.table.routes.listeners.items():
            slots = min(free, listener.spec.concurrency - self._in_flight.get(name, 0))
            if slots > 0:
                capacity[name] = slots
        return Slots(free, capacity)

    # --- the database thread ------------------------------------------------------------

    def _boot(self) -> bool:
        """Send <boot/> on the organism's first start; False on a restart."""
        conn = self.bus.conn
        root = threads.initialize_root(conn, self.name)
        with write_transaction(conn):
            self._inline = InlineRunner(work.last_inbox_seq(conn, self.name))
            return Writer(self.bus, conn, self.name, self.table.routes, now_ms()).boot(root.uuid)

    def _step(self, finished: list[Finished], capacity: Slots, busy: bool) -> _Step:
        """Commit `finished`, `commit_batch` units per transaction; the last
        transaction also routes, buries and claims up to `capacity`.

        `busy`: units beyond `finished` are in flight, so the loop does not ask
        what is left before they are back: a step that commits may skip its scan.
        """
        conn = self.bus.conn
        size = self.commit_batch
        self._checkpoint = checkpoints.THREAD  # more commits follow at once
        for first in range(0, len(finished) - size, size):  # all but the last transaction
            self._commit(finished[first:first + size])
        if len(finished) > size:
            finished = finished[(len(finished) - 1) // size * size:]
        self._checkpoint = checkpoints.LATER if finished else checkpoints.HERE
        if finished and self.before_commit is not None:
            self.before_commit(finished)
        inlined = self._route_inline()
        routes = self.table.routes
        if not finished and self._scan.quiet(conn, routes, now_ms()):
            return _Step([], routes, inlined >= ROUTE_BATCH, self._scan.pending,
                         self._scan.due_ms)
        if not finished and 0 < inlined < ROUTE_BATCH:
            drained = self._drained(routes)
            if drained is not None:
                return drained
        with write_transaction(conn):
            # The table is read under the write lock: a client's send that follows an
            # OOB change is routed by the changed table (its inbox row commits after).
            routes = self.table.routes
            writer = Writer(self.bus, conn, self.name, routes, now_ms())
            outcomes = writer.finish(finished, self.owner) if finished else []
            scan = not finished or not busy or self._scan.due(conn, routes, writer.now)
            # With inline listeners, requests are answered in this transaction too:
            # `commit_batch` of them at most, as in _route_inline's.
            limit = self.commit_batch if routes.has_inline else ROUTE_BATCH
            full = scan and self._route_inbox(writer, limit) >= limit
            if scan:
                self._bury(writer)
            claimed, full_claim = self._claim(writer, capacity)
            if scan:
                pending, next_expiry = work.pending(conn, self.name, writer.now)
                self._scan.done(conn, routes, writer.now, pending, next_expiry, full)
            else:  # units are in flight: what is left is asked once they are back
                pending, next_expiry = True, self._scan.due_ms
            self._scan.claimed(writer.now + self.lease_ms, claimed, full_claim, scan)
            self._before_inline_commit(writer)
        self._committed(finished, outcomes)
        self._after_commit(writer)
        return _Step(claimed, routes, full or inlined >= ROUTE_BATCH, pending, next_expiry)

    def _route_inline(self) -> int:
        """While inline listeners have requests waiting: transactions that route
        `commit_batch` inbox rows each and answer the inline ones in them; how many.

        Up to ROUTE_BATCH rows, before the step's last transaction (which buries
        and claims): inline requests get commits of their own, as finished units do.
        """
        conn = self.bus.conn
        if not self.table.routes.has_inline or not work.inbox_waiting(conn, self.name):
            return 0
        routed, where = 0, self._checkpoint
        self._checkpoint = checkpoints.THREAD  # more commits follow at once
        try:
            while routed < ROUTE_BATCH:
                with write_transaction(conn):
                    writer = Writer(self.bus, conn, self.name, self.table.routes, now_ms())
                    taken = self._route_inbox(writer, self.commit_batch)
                    self._before_inline_commit(writer)
                self._after_commit(writer)
                routed += taken
                if taken < self.commit_batch:
                    break
        finally:
            self._checkpoint = where
        return routed

    def _drained(self, routes: Routes) -> _Step | None:
        """After inline transactions emptied the inbox: the step, if it needs no scan
        transaction (nothing to claim or bury, the table the last scan saw), else None.

        One read instead of a write transaction after every inline request.
        """
        if routes is not self._scan.routes:
            return None
        ready, next_expiry = work.has_work(self.bus.conn, self.name, now_ms())
        if ready:
            return None
        return _Step([], routes, False, next_expiry is not None, next_expiry)

    def _before_inline_commit(self, writer: Writer) -> None:
        if writer.inlined and self.before_commit is not None:
            self.before_commit([done for done, _ in writer.inlined])

    def _after_commit(self, writer: Writer) -> None:
        """What `writer`'s transaction did, now that it committed: its inline units
        count, and the envelopes it encoded for listeners need no pipeline run."""
        self._committed([done for done, _ in writer.inlined],
                        [outcome for _, outcome in writer.inlined])
        self._encoded.remember(writer.encoded)

    def _commit(self, finished: list[Finished]) -> None:
        """A transaction that commits `finished` and does nothing else."""
        if self.before_commit is not None:
            self.before_commit(finished)
        conn = self.bus.conn
        with write_transaction(conn):
            writer = Writer(self.bus, conn, self.name, self.table.routes, now_ms())
            outcomes = writer.finish(finished, self.owner)
        self._committed(finished, outcomes)
        self._after_commit(writer)

    def _committed(self, finished: list[Finished], outcomes: list[str]) -> None:
        """Count (and report) units once their transaction committed, not before."""
        for done, outcome in zip(finished, outcomes):
            self.stats.count(outcome)
            if self.on_unit is not None:
                self.on_unit(done, outcome)

    def _route_inbox(self, writer: Writer, limit: int = ROUTE_BATCH) -> int:
        writer.calls = []  # the leased calls are written together, at the end
        inbound = work.take_inbox(writer.conn, self.name, limit)
        found = work.messages_by_seq(writer.conn, [item.seq for item in inbound],
                                     self.bus.blobs)
        for item in inbound:
            message = found.get(item.seq)
            if message is None:
                continue
            if item.root_tag in META_ROOT_TAGS and item.to is None:
                self.stats.count(self._answer_meta(writer, message, item.root_tag))
            elif not writer.route(item.seq, message.id, message.from_agent, item.root_tag,
                                  item.to, message.correlation_id,
                                  inline=self._inline.runner(writer, message)):
                self.stats.count("no-route")  # the client got a <huh> from the pump
        writer.finish_routing()
        return len(inbound)

    def _answer_meta(self, writer: Writer, message: Message, root_tag: str) -> str:
        """Answer a client's question about the organism itself, or refuse it (a <huh>)."""
        try:
            meta.check_allowed(self.organism.meta, root_tag, privileged=False)
            request = read_envelope(parse(envelope_xml(message))).payload
            answer, outcome = meta.answer_element(writer.routes.listeners, request), "meta"
        except ValidationFailed as exc:
            answer, outcome = huh_element("meta-denied", exc.reason), "huh"
        writer.reply_as_system(answer, message, "meta")
        return outcome

    def _bury(self, writer: Writer) -> None:
        dead = work.bury_exhausted(writer.conn, self.name, writer.now)
        writer.bury(dead, lambda unit: (
            f"dead-letter:the listener's handler was tried {_times(unit.attempts)} and never "
            "finished (the pump died or lost its lease each time); the request was dropped: "
            "send a smaller or different request"))
        self.stats.count("dead", len(dead))
        # Orphans are looked for when the table changed, and once a second (a unit
        # another pump held may expire later); the query reads every pending unit.
        if (writer.routes, writer.now // ORPHAN_CHECK_MS) == self._orphans_checked:
            return
        orphans = work.bury_orphans(writer.conn, self.name, writer.routes.listeners, writer.now)
        self._orphans_checked = (writer.routes, writer.now // ORPHAN_CHECK_MS)
        self.stats.count("listener-removed", len(orphans))
        writer.bury(orphans, lambda unit: (
            "listener-removed:the listener was removed before it handled this; send it "
            "again to a listener that accepts it"))

    def _claim(self, writer: Writer,
               capacity: Slots) -> tuple[list[tuple[Unit, Message]], bool]:
        """Claim up to `capacity`, or one suspect unit alone (see `_claim_suspect`); and
        whether the limits may have left units behind (see Scan.claimed)."""
        if self._alone is not None or not capacity.listeners:
            return [], False  # a suspect runs alone: nothing is claimed beside it
        suspect = work.find_suspect(writer.conn, self.name, capacity.listeners, writer.now)
        if suspect is not None:
            claimed = self._claim_suspect(writer, suspect)
            return claimed, bool(claimed)
        units, full = self._claim_fresh(writer, capacity)
        return self._with_inputs(writer, units), full

    def _claim_suspect(self, writer: Writer, suspect: int) -> list[tuple[Unit, Message]]:
        """Retry a unit whose pump died with it in flight alone, once nothing else runs.

        Every unit in flight is charged an attempt when its pump dies. Run on
        its own, a unit that kills the pump again is charged alone and reaches
        max_attempts, while the units that were in flight beside it finish on
        their own retries (seed 000's poison message, without its neighbours).
        """
        if any(self._in_flight.values()):
            return []  # the running units finish first
        claimed = self._with_inputs(writer, work.lease(writer.conn, [suspect], self.owner,
                                                       self.lease_ms, writer.now))
        self._alone = claimed[0][0].id if claimed else None
        return claimed

    def _claim_fresh(self, writer: Writer, capacity: Slots) -> tuple[list[Unit], bool]:
        """The global slots shared out in turns (FairShare), not first come in file order."""
        eligible = {}
        for name, slots in capacity.listeners.items():
            listener = writer.routes.listeners.get(name)
            if listener is None:  # removed since the capacity was counted
                continue
            # A busy listener claims when a quarter of its slots are free, not one
            # unit per step: one UPDATE and one input lookup serve many units.
            if self._in_flight.get(name) and slots < listener.spec.concurrency // 4:
                continue
            eligible[name] = slots
        return self._fair.share(Slots(capacity.free, eligible), lambda name, n: work.claim(
            writer.conn, self.name, name, self.owner, self.lease_ms, n, writer.now))

    def _with_inputs(self, writer: Writer, units: list[Unit]) -> list[tuple[Unit, Message]]:
        inputs = work.messages_by_seq(writer.conn, [u.input_seq for u in units], self.bus.blobs)
        return [(unit, inputs[unit.input_seq]) for unit in units if unit.input_seq in inputs]

    def _renew(self) -> None:
        """Extend the leases of running units (called from the heartbeat thread)."""
        with self._running_lock:
            ids = list(self._running)
        if ids:
            conn = self.bus.conn
            with write_transaction(conn):
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
                                              self._encoded.take(message.id))
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
