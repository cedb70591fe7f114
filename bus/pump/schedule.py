"""Fair scheduling (seed 000): which listeners get the pump's free handler slots.

The pump's global limit (`max_in_flight`) is shared by every listener. Handed
out in organism.yaml order, the first listener with a backlog took every
slot that came free and the others waited until it ran dry. Here the free
slots are shared out in turns: the least recently served listener asks
first, each asks for an equal share, and what a listener with too little
waiting leaves goes round again to those that had more.
"""

from __future__ import annotations

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

        Returns the units and whether any listener got all it asked for last
        (so it may have more waiting: the limits, not its backlog, stopped it).
        """
        free, left = slots.free, dict(slots.listeners)
        hungry = self.order([name for name, n in left.items() if n > 0])
        units: list[T] = []
        full = False
        while free > 0 and hungry:
            share = -(-free // len(hungry))  # rounded up: the first in turn get the odd slots
            still = []
            for name in hungry:
                asked = min(left[name], share, free)
                if asked <= 0:  # the global slots ran out before its turn
                    full = True
                    continue
                got = claim(name, asked)
                units += got
                free -= len(got)
                left[name] -= len(got)
                if got:
                    self._turn += 1
                    self._served[name] = self._turn
                if len(got) < asked:  # it has nothing more waiting
                    continue
                full = True
                if left[name] > 0:
                    still.append(name)
            hungry = still
        return units, full
