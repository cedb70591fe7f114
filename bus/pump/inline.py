"""Inline listeners: a fast plain `def` handler run inside the transaction that routes.

A listener with `inline: true` in organism.yaml skips the leased path. The
transaction that takes a client's envelope from the inbox also runs the
listener's pipeline and handler, on the pump's database thread, and writes
the replies: no work unit, no lease, no hop to another thread. A crash
before the commit rolls all of it back (the inbox row is back, no reply was
written) and the commit holds all of it, so each request is still answered
exactly once.

What the leased path gives that this one must keep:

- Poison inputs. A request whose handler kills the pump would kill every pump
  that took it inline, and no attempt would ever be counted. So a pump sends
  the inbox rows that were already there when it started down the leased path
  (`after`): one of them may have killed its predecessor, and a work unit
  counts attempts, runs a suspect alone and buries it after `max_attempts`.
  (Pumps that were already running when it arrived take it inline too: each
  of them may die of it once before a restarted one leases it.)
- Stuck handlers. Every write of the pump waits for an inline handler. One
  that overruns its `timeout` has its result dropped (its sender gets the
  `<huh code="timeout">` a leased handler's would) and its listener takes the
  leased path for the rest of the run (`demoted`).

Only client requests run inline. What the pump writes itself (a call to a
peer, an answer to a calling listener) becomes a work unit even for an
inline listener: two inline listeners calling each other would otherwise
grow one transaction without end.
"""

from __future__ import annotations

import logging
import time

from bus.log.messages import Message
from bus.log.messages import new_message_id
from bus.pump.commit import Finished
from bus.pump.commit import Inline
from bus.pump.commit import checked_input
from bus.pump.envelopes import huh_element
from bus.pump.handlers import Context
from bus.pump.handlers import HandlerFailed
from bus.pump.handlers import call_inline
from bus.pump.handlers import outputs_of
from bus.pump.routing import Listener
from bus.pump.routing import Routes
from bus.pump.work import Unit

log = logging.getLogger("bus.pump")
INLINE_UNIT_ID = 0  # an inline unit has no work row; `on_unit` sees this id


class InlineRunner:
    """Runs inline units for one pump; `after` is the last inbox seq it found at its start."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.demoted: set[str] = set()  # listeners that overran their timeout inline

    def runner(self, routes: Routes, message: Message,
               handled: list[tuple[Finished, str]]) -> Inline | None:
        """What runs a client's request to inline listeners in the routing transaction (for
        `Batch.route`): each unit it ran goes to `handled` with the thread its own is
        opened under, for the router to commit (`Batch.commit`)."""
        if not routes.has_inline:
            return None

        def inline(listener: Listener, parent: str) -> bool:
            if not self.takes(listener, message.seq):
                return False
            handled.append((self.handle(listener, message), parent))
            return True
        return inline

    def takes(self, listener: Listener, seq: int) -> bool:
        """Whether the request at `seq` to `listener` runs inline."""
        return listener.spec.inline and seq > self.after and listener.name not in self.demoted

    def handle(self, listener: Listener, message: Message) -> Finished:
        """Run the call now, on a new thread whose row is written with the results (closed
        if the handler only answered; its UUID is opaque to the handler until then)."""
        unit = Unit(INLINE_UNIT_ID, message.seq, listener.name, "call", new_message_id(), 1,
                    listener.spec.max_attempts)
        checked = checked_input(unit, message, listener)
        if isinstance(checked, Finished):
            return checked
        spec = listener.spec
        ctx = Context(unit.thread, checked.sender, spec.name, message.id, unit.attempts,
                      time.monotonic() + spec.timeout_s, listener.tools, listener.model,
                      listener.system_prompt)
        try:
            outputs = outputs_of(call_inline(listener.handler, checked.payload, ctx,
                                             spec.timeout_s), spec.peers, listener.visible)
        except HandlerFailed as exc:
            if exc.code == "timeout":
                self._demote(listener)
            return Finished(unit, message, huh=huh_element(exc.code, exc.reason, "handler"))
        return Finished(unit, message, tuple(outputs))

    def _demote(self, listener: Listener) -> None:
        log.warning("inline listener %s overran its timeout (%g s): it takes the leased "
                    "path until the pump restarts", listener.name, listener.spec.timeout_s)
        self.demoted.add(listener.name)
