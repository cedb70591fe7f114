"""Waiting on a condition with a deadline (what a test that waits does; never a guessed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 60.0,
               interval: float = 0.005) -> T:
    """Call `condition` until it returns something true, and return that; fail naming
    `what` after `timeout` seconds (a deadline for a busy machine, not a measure)."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return found
