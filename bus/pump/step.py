"""A step of the pump on its database thread: commit, route, bury, claim.

One call to the pump's database thread (`Stepper.step`) commits the units
whose handlers finished, `commit_batch` per `BEGIN IMMEDIATE`, each
transaction one `Batch` (bus/pump/commit.py) that carries its units from
routing to commit; the step's last transaction also routes client
envelopes from the inbox, buries units out of attempts and claims as many
units as the concurrency limits allow. While inline listeners have
requests waiting, transactions of their own route and answer them first
(`_route_inline`). `Scan` remembers what the last look beyond the pump's
own work found, so a step that cannot find anything new takes no
transaction, or skips the look.

Everything here runs on the database thread; the loop (bus/pump/pump.py)
hands a step its finished units and free slots and starts the units it
claimed.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Mapping

import apsw

from bus.log import checkpoints
from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import now_ms
from bus.pump import meta
from bus.pump import threads
from bus.pump import work
from bus.pump.commit import Batch
from bus.pump.commit import Call
from bus.pump.commit import EncodedMemory
from bus.pump.commit import Finished
from bus.pump.envelopes import envelope_xml
from bus.pump.envelopes import huh_element
from bus.pump.inline import InlineRunner
from bus.pump.organism import META_ROOT_TAGS
from bus.pump.routing import Routes
from bus.pump.routing import RoutingTable
from bus.pump.schedule import FairShare
from bus.pump.schedule import Slots
from bus.pump.work import Unit
from bus.xml.envelope import read_envelope
from bus.xml.parser import parse

if TYPE_CHECKING:
    from bus.api import Bus

ROUTE_BATCH = 256  # inbox rows routed per step
ORPHAN_CHECK_MS = 1000
ENCODED_MAX = 4096  # envelopes the pump remembers having encoded (see checked_input)
_DATA_VERSION_SQL = "PRAGMA data_version"
# Where the checkpoint of the commit under way goes (Stepper._batch sets it).
_CHECKPOINT: ContextVar[str] = ContextVar("pump_checkpoint", default=checkpoints.HERE)


def checkpoint_place() -> str:
    """Where the checkpoint of the database thread's commit under way goes (see
    bus/pump/services.py); HERE outside the pump's batches."""
    return _CHECKPOINT.get()


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
class Step:
    """What a step did, for the loop."""

    claimed: list[tuple[Unit, Message]]
    routes: Routes  # the table the step routed and claimed with
    more: bool  # the inbox holds more than one step routes: step again at once
    pending: bool
    next_expiry: int | None
    alone: int | None = None  # a suspect unit claimed to run alone (`_claim_suspect`)


class Stepper:
    """The pump's database thread: boots the organism, then takes steps.

    `owner` is the pump's lease owner, `stats` the pump's (outcomes are
    counted here, once their transaction committed); `encoded` what its
    commits wrote for listeners, for `checked_input` on the loop's thread.
    See `Pump` for `lease_ms`, `commit_batch`, `before_commit` and `on_unit`.
    """

    def __init__(self, bus: Bus, table: RoutingTable, owner: str, stats: PumpStats, *,
                 lease_ms: int, commit_batch: int, idle_wake_s: float,
                 before_commit: Callable[[list[Finished]], None] | None = None,
                 on_unit: Callable[[Finished, str], None] | None = None) -> None:
        self.bus, self.table, self.owner, self.stats = bus, table, owner, stats
        self.name = table.organism.name
        self.lease_ms, self.commit_batch = lease_ms, commit_batch
        self.before_commit, self.on_unit = before_commit, on_unit
        self.scan = Scan(idle_wake_s)
        self.encoded = EncodedMemory(ENCODED_MAX)  # see _batch
        self._fair = FairShare()  # who gets free global slots first (_claim_fresh)
        self._inline = InlineRunner(0)  # set at boot: what waits in the inbox goes leased
        self._orphans_checked: tuple[Routes, int] | None = None

    def boot(self) -> bool:
        """Send <boot/> on the organism's first start; False on a restart."""
        with self.bus.write() as conn:
            root = threads.initialize_root(conn, self.name)
        with self._batch([], checkpoints.HERE) as batch:
            self._inline = InlineRunner(batch.last_inbox_seq())
            batch.record_capabilities()
            return batch.boot(root.uuid)

    @contextmanager
    def _batch(self, finished: list[Finished], checkpoint: str) -> Iterator[Batch]:
        """One write transaction of the pump and its batch: `finished` committed first
        (`Batch.commit`), then what the caller writes in it (routing, burying, claiming).

        The batch's units count once the transaction committed, and the envelopes it
        encoded for listeners need no pipeline run (`checked_input`). `checkpoint`:
        where the checkpoint of its commit goes (see bus/pump/services.py).
        """
        if finished and self.before_commit is not None:
            self.before_commit(finished)
        placed = _CHECKPOINT.set(checkpoint)
        try:
            with self.bus.write() as conn:
                # The table is read under the write lock: a client's send that follows an
                # OOB change is routed by the changed table (its inbox row commits after).
                batch = Batch(self.bus, conn, self.name, self.table.routes, now_ms())
                if finished:
                    batch.commit([(done, self.owner, None) for done in finished])
                yield batch
        finally:
            _CHECKPOINT.reset(placed)
        for done, outcome in batch.settled:  # counted (and reported) once committed
            self.stats.count(outcome)
            if self.on_unit is not None:
                self.on_unit(done, outcome)
        self.encoded.remember(batch.encoded)

    def step(self, finished: list[Finished], capacity: Slots, in_flight: Mapping[str, int],
             until_idle: bool = False) -> Step:
        """Commit `finished`, `commit_batch` units per transaction; the last
        transaction also routes, buries and claims up to `capacity`.

        `in_flight`: the units in flight beyond `finished`, per listener.
        A step that commits skips its scan when the scan could find nothing
        new (`Scan.due`): the reply it commits is not held up by the look
        (a lone request's round trip). Only a loop that runs `until_idle`
        with nothing else in flight must hear what is left from this step.
        """
        must_scan = until_idle and not any(in_flight.values())
        last = self._commit_all_but_the_last_batch(finished)
        inlined = self._route_inline()
        routes = self.table.routes
        if not last and self._quiet(routes):
            return Step([], routes, inlined >= ROUTE_BATCH, self.scan.pending,
                         self.scan.due_ms)
        if not last and 0 < inlined < ROUTE_BATCH:
            drained = self._drained(routes)
            if drained is not None:
                return drained
        with self._batch(last, checkpoints.LATER if last else checkpoints.HERE) as batch, \
                self.bus.read() as conn:  # the reads join the batch's write transaction
            routes = batch.routes
            scan = not last or must_scan or self.scan.due(conn, routes, batch.now)
            if not scan and self.scan.settled and not batch.made_units:
                # Nothing new since the last look, which left nothing to claim, and the
                # commit made no unit: the transaction commits `last` and nothing else.
                return Step([], routes, inlined >= ROUTE_BATCH, True, self.scan.due_ms)
            # With inline listeners, requests are answered in this transaction too:
            # `commit_batch` of them at most, as in _route_inline's.
            limit = self.commit_batch if routes.has_inline else ROUTE_BATCH
            full = scan and self._route_inbox(batch, limit) >= limit
            if scan:
                self._bury(batch)
            claimed, full_claim, alone = self._claim(batch, capacity, in_flight)
            if scan:
                pending, next_expiry = work.pending(conn, self.name, batch.now)
                self.scan.done(conn, routes, batch.now, pending, next_expiry, full)
            else:  # nothing new to find: what is left is asked at the next look
                pending, next_expiry = True, self.scan.due_ms
            self.scan.claimed(batch.now + self.lease_ms, claimed, full_claim, scan)
        return Step(claimed, routes, full or inlined >= ROUTE_BATCH, pending, next_expiry,
                    alone)

    def _quiet(self, routes: Routes) -> bool:
        """`Scan.quiet`, read in a transaction of its own: it sees the latest commit."""
        with self.bus.read() as conn:
            return self.scan.quiet(conn, routes, now_ms())

    def _commit_all_but_the_last_batch(self, finished: list[Finished]) -> list[Finished]:
        """Commit `finished` but its last `commit_batch` units, a transaction per batch;
        the last batch, which the step's own transaction commits."""
        size = self.commit_batch
        batches = [finished[first:first + size] for first in range(0, len(finished), size)]
        last = batches.pop() if batches else []
        for earlier in batches:  # more commits follow at once: checkpoints on the thread
            with self._batch(earlier, checkpoints.THREAD):
                pass
        return last

    def _route_inline(self) -> int:
        """While inline listeners have requests waiting: transactions that route
        `commit_batch` inbox rows each and answer the inline ones in them; how many.

        Up to ROUTE_BATCH rows, before the step's last transaction (which buries
        and claims): inline requests get commits of their own, as finished units do.
        """
        if not self.table.routes.has_inline:
            return 0
        with self.bus.read() as conn:
            if not work.inbox_waiting(conn, self.name):
                return 0
        routed = 0
        while routed < ROUTE_BATCH:
            with self._batch([], checkpoints.THREAD) as batch:  # more commits follow at once
                taken = self._route_inbox(batch, self.commit_batch)
            routed += taken
            if taken < self.commit_batch:
                break
        return routed

    def _drained(self, routes: Routes) -> Step | None:
        """After inline transactions emptied the inbox: the step, if it needs no scan
        transaction (nothing to claim or bury, the table the last scan saw), else None.

        One read instead of a write transaction after every inline request.
        """
        if routes is not self.scan.routes:
            return None
        with self.bus.read() as conn:
            ready, next_expiry = work.has_work(conn, self.name, now_ms())
        if ready:
            return None
        return Step([], routes, False, next_expiry is not None, next_expiry)

    def _route_inbox(self, batch: Batch, limit: int = ROUTE_BATCH) -> int:
        """Route up to `limit` inbox rows in `batch`: the leased calls are written together,
        at the end, then the units inline listeners handled meanwhile are committed."""
        inbound = batch.take_inbox(limit)
        found = batch.messages([item.seq for item in inbound])
        calls: list[Call] = []
        handled: list[tuple[Finished, str]] = []  # inline units, with their parent threads
        for item in inbound:
            message = found.get(item.seq)
            if message is None:
                continue
            if item.root_tag in META_ROOT_TAGS and item.to is None:
                self.stats.count(self._answer_meta(batch, message, item.root_tag))
            elif not batch.route(item.seq, message.id, message.from_agent, item.root_tag,
                                 item.to, message.correlation_id, calls=calls,
                                 inline=self._inline.runner(batch.routes, message, handled)):
                self.stats.count("no-route")  # the client got a <huh> from the pump
        batch.open_calls(calls)
        if handled:
            batch.commit([(done, None, parent) for done, parent in handled])
            if self.before_commit is not None:
                self.before_commit([done for done, _ in handled])
        return len(inbound)

    def _answer_meta(self, batch: Batch, message: Message, root_tag: str) -> str:
        """Answer a client's question about the organism itself, or refuse it (a <huh>)."""
        try:
            meta.check_allowed(self.table.organism.meta, root_tag, privileged=False)
            request = read_envelope(parse(envelope_xml(message))).payload
            answer, outcome = meta.answer_element(batch.routes.listeners, request), "meta"
        except ValidationFailed as exc:
            answer, outcome = huh_element("meta-denied", exc.reason), "huh"
        batch.reply_as_system(answer, message, "meta")
        return outcome

    def _bury(self, batch: Batch) -> None:
        dead = batch.bury_exhausted()
        batch.bury(dead, lambda unit: (
            f"dead-letter:the listener's handler was tried {_times(unit.attempts)} and never "
            "finished (the pump died or lost its lease each time); the request was dropped: "
            "send a smaller or different request"))
        self.stats.count("dead", len(dead))
        # Orphans are looked for when the table changed, and once a second (a unit
        # another pump held may expire later); the query reads every pending unit.
        if (batch.routes, batch.now // ORPHAN_CHECK_MS) == self._orphans_checked:
            return
        orphans = batch.bury_orphans()
        self._orphans_checked = (batch.routes, batch.now // ORPHAN_CHECK_MS)
        self.stats.count("listener-removed", len(orphans))
        batch.bury(orphans, lambda unit: (
            "listener-removed:the listener was removed before it handled this; send it "
            "again to a listener that accepts it"))

    def _claim(self, batch: Batch, capacity: Slots, in_flight: Mapping[str, int]
               ) -> tuple[list[tuple[Unit, Message]], bool, int | None]:
        """Claim up to `capacity`, or one suspect unit alone (see `_claim_suspect`): the
        units, whether the limits may have left units behind (see Scan.claimed), and the
        suspect's id when one was claimed to run alone (the loop then gives no slots
        until it is done: Pump._capacity)."""
        if not capacity.listeners:
            return [], False, None
        suspect = batch.find_suspect(capacity.listeners)
        if suspect is not None:
            claimed = self._claim_suspect(batch, suspect, in_flight)
            return claimed, bool(claimed), claimed[0][0].id if claimed else None
        units, full = self._claim_fresh(batch, capacity, in_flight)
        return self._with_inputs(batch, units), full, None

    def _claim_suspect(self, batch: Batch, suspect: int,
                       in_flight: Mapping[str, int]) -> list[tuple[Unit, Message]]:
        """Retry a unit whose pump died with it in flight alone, once nothing else runs.

        Every unit in flight is charged an attempt when its pump dies. Run on
        its own, a unit that kills the pump again is charged alone and reaches
        max_attempts, while the units that were in flight beside it finish on
        their own retries (a poison message fails alone, without its neighbours).
        """
        if any(in_flight.values()):
            return []  # the running units finish first
        return self._with_inputs(batch, batch.lease([suspect], self.owner, self.lease_ms))

    def _claim_fresh(self, batch: Batch, capacity: Slots,
                     in_flight: Mapping[str, int]) -> tuple[list[Unit], bool]:
        """The global slots shared out in turns (FairShare), not first come in file order."""
        eligible = {}
        for name, slots in capacity.listeners.items():
            listener = batch.routes.listeners.get(name)
            if listener is None:  # removed since the capacity was counted
                continue
            # A busy listener claims when a quarter of its slots are free, not one
            # unit per step: one UPDATE and one input lookup serve many units.
            if in_flight.get(name) and slots < listener.spec.concurrency // 4:
                continue
            eligible[name] = slots
        return self._fair.share(Slots(capacity.free, eligible), lambda name, n: batch.claim(
            name, self.owner, self.lease_ms, n))

    def _with_inputs(self, batch: Batch, units: list[Unit]) -> list[tuple[Unit, Message]]:
        inputs = batch.messages([unit.input_seq for unit in units])
        return [(unit, inputs[unit.input_seq]) for unit in units if unit.input_seq in inputs]


class Scan:
    """When a step must look beyond its own work: the inbox, dead units, what is left.

    Only another connection's commit (`PRAGMA data_version`: a client's
    envelope, another pump's claim), a lease running out, a new routing table
    or a full inbox batch can give a scan something new to find. So a step
    that commits skips the scan when none of those happened (unless the loop
    runs until idle with nothing else in flight: it must hear what is left).
    When, on top of that, the last scan's claims were not cut short by the
    concurrency limits (the pump's own claim is no reason to look again), a
    step with nothing to commit is no transaction at all, and one that
    commits units that made no new ones commits them and nothing else: a
    lone request's reply is not held up by a look that could find nothing.
    """

    def __init__(self, idle_wake_s: float) -> None:
        self.idle_wake_ms = int(idle_wake_s * 1000)  # the pump looks again at least this often
        self.version: int | None = None
        self.routes: Routes | None = None
        self.due_ms: int | None = None  # a lease may run out from then on
        self.more = True  # the inbox had more than one step routes
        self.pending = True  # what the last scan said is left
        self.settled = False  # the last scan left nothing it could claim

    def _same(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        version = conn.execute(_DATA_VERSION_SQL).get
        same = version == self.version
        self.version = version
        return same and not self.more and routes is self.routes and (
            self.due_ms is None or now < self.due_ms)

    def due(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        """Whether this step must scan; reads `data_version` (inside the transaction)."""
        return not self._same(conn, routes, now)

    def quiet(self, conn: apsw.Connection, routes: Routes, now: int) -> bool:
        """Whether a step with nothing to commit would find nothing (read outside a
        transaction, so it sees the latest commit)."""
        return self.settled and self._same(conn, routes, now)

    def done(self, conn: apsw.Connection, routes: Routes, now: int, pending: bool,
             next_expiry: int | None, more: bool) -> None:
        self.version = conn.execute(_DATA_VERSION_SQL).get
        self.routes, self.pending, self.more = routes, pending, more
        self.due_ms = min(now + self.idle_wake_ms, next_expiry or now + 10 ** 9)

    def claimed(self, until: int, claimed: list, full: bool, scanned: bool) -> None:
        """After the claims: their leases, and whether the limits cut them short
        (`full`: a listener got all it asked for, or asked nothing for want of slots)."""
        if claimed:
            self.due_ms = until if self.due_ms is None else min(self.due_ms, until)
        # A claim that got fewer units than it asked for left none behind: only a
        # commit elsewhere, a lease running out or a new table can change that.
        # (A busy listener skipped by the quarter rule in _claim got none; its
        # running handlers bring the next step.)
        self.settled = scanned and not full
        if not scanned:
            self.pending = True
