"""The message pump: organism.yaml, handlers, the durable pump, OOB control.

    from bus.pump import Pump, Reply, Context, FinalAnswer, send, wait_replies

`bus.pump.organism` loads and checks organism.yaml; `bus.pump.pump` runs it
on a bus (`Pump`); `bus.pump.handlers` is the handler contract (`Reply`,
`Context`, `FinalAnswer`); `bus.pump.client` sends requests in and waits
for replies; `bus.pump.oob` signs, verifies and serves privileged control
requests. The thread registry the pump records conversations in is
`bus.pump.threads`.
"""

from __future__ import annotations

from bus.pump.client import send
from bus.pump.client import wait_replies
from bus.pump.handlers import Context
from bus.pump.handlers import FinalAnswer
from bus.pump.handlers import Reply
from bus.pump.pump import Pump

__all__ = ["Context", "FinalAnswer", "Pump", "Reply", "send", "wait_replies"]
