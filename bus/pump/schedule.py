"""Fair scheduling: which listeners get the pump's free handler slots.

The pump's global limit (`max_in_flight`) is shared by every listener. Handed
out in organism.yaml order, the first listener with a backlog took every
slot that came free and the others waited until it ran dry. Here the free
slots are shared out in turns: the least recently served listener asks
first, each asks for an equal share, and what a listener with too little
waiting leaves goes round again to those that had more.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable
from typing import Sequence
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Slots:
    """What the next claim may take: `free` global slots, and per listener its own free
    slots (each at most `free`; together they may be more)."""

    free: int
    listeners: dict[str, int]


class FairShare:
    """Least recently served first: the order listeners claim in, remembered across steps."""

    def __init__(self) -> None:
        self._served: dict[str, int] = {}  # listener -> the turn it last got units
        self._turn = 0

    def order(self, names: Sequence[str]) -> list[str]:
        """`names` least recently served first (never served first of all, in file order)."""
        return sorted(names, key=lambda name: self._served.get(name, 0))

    def share(self, slots: Slots, claim: Callable[[str, int], list[T]]) -> tuple[list[T], bool]:
        """Claim up to `slots` with `claim(listener, n)`, in equal shares, in turns.

        One claim per listener while each has at least its share waiting;
        only slots a listener left (it had less waiting) go round again, to
        those that got fewest. Returns the units and whether the limits may
        have left units behind: a listener got all it asked for, or was
        asked nothing for want of slots.
        """
        free, left = slots.free, dict(slots.listeners)
        hungry = self.order([name for name, n in left.items() if n > 0])
        got = dict.fromkeys(hungry, 0)
        units: list[T] = []
        full = False
        while free > 0 and hungry:
            plan = _plan(free, left, got, hungry)
            again = []
            for name in hungry:
                asked = plan[name]
                if asked == 0:  # the slots ran out before its turn: the next round, if any
                    full = True
                    again.append(name)
                    continue
                claimed = claim(name, asked)
                units += claimed
                free -= len(claimed)
                left[name] -= len(claimed)
                got[name] += len(claimed)
                if claimed:
                    self._turn += 1
                    self._served[name] = self._turn
                if len(claimed) == asked:  # it may have more waiting
                    full = True
                    if left[name] > 0:
                        again.append(name)
            hungry = again  # a round ends with fewer free slots or fewer listeners
        return units, full


def _plan(free: int, left: dict[str, int], got: dict[str, int],
          turns: list[str]) -> dict[str, int]:
    """How many of `free` slots each listener in `turns` asks for: one at a time to the
    one that got fewest so far (ties: first in turn), up to what it may still take."""
    if sum(left[name] for name in turns) <= free:  # the global limit does not bind
        return {name: left[name] for name in turns}
    plan = dict.fromkeys(turns, 0)
    heap = [(got[name], turn, name) for turn, name in enumerate(turns)]
    heapq.heapify(heap)
    while free > 0 and heap:
        level, turn, name = heapq.heappop(heap)
        plan[name] += 1
        free -= 1
        if plan[name] < left[name]:
            heapq.heappush(heap, (level + 1, turn, name))
    return plan
