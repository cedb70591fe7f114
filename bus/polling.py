"""Waiting for new messages without spinning: multiplicative backoff to a cap.

The delay starts short so a consumer that is busy stays responsive, grows
while nothing arrives so an idle one costs little, and resets on work.
"""

from __future__ import annotations

import time
from typing import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Delays of initial, initial*factor, ... capped at `cap` seconds."""

    def __init__(self, initial: float = 0.01, factor: float = 1.5, cap: float = 0.5) -> None:
        self.initial = initial
        self.factor = factor
        self.cap = cap
        self._delay = initial

    def reset(self) -> None:
        self._delay = self.initial

    def next_delay(self) -> float:
        delay = self._delay
        self._delay = min(self._delay * self.factor, self.cap)
        return delay


def wait_until(fetch: Callable[[], T], timeout: float, backoff: Backoff | None = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Call `fetch` until it returns something truthy or `timeout` seconds pass.

    Returns the last result (falsy on timeout). `fetch` runs at least once.
    """
    backoff = backoff or Backoff()
    deadline = clock() + timeout
    while True:
        result = fetch()
        remaining = deadline - clock()
        if result or remaining <= 0:
            return result
        sleep(min(backoff.next_delay(), remaining))
