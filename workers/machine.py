"""The worker state machine, as data.

    ASSIGNED --start--> WORKING --done--> IN_REVIEW --approve--> APPROVED --merge--> COMPLETED
                           ^                  |                      |
                           +--reject/rework---+                      |
                           +----------------rework-------------------+
    cancel / fail: from any state that is not terminal, to CANCELLED / FAILED.

`rework` is the way back from review for anything the reviewer did not
cause: a merge that conflicts, a branch that moved after review. Every
state that is not terminal can reach COMPLETED, CANCELLED and FAILED.
`heartbeat` and `run` change nothing by themselves: heartbeat is allowed
while a worker is ASSIGNED or WORKING, run starts an ASSIGNED worker first;
`cleanup` removes what a finished worker left on disk.
"""

from __future__ import annotations

from bus.storage.errors import BusError
from bus.coordination.worker_table import TERMINAL_STATES

ASSIGNED = "ASSIGNED"
WORKING = "WORKING"
IN_REVIEW = "IN_REVIEW"
APPROVED = "APPROVED"
COMPLETED = "COMPLETED"
CANCELLED = "CANCELLED"
FAILED = "FAILED"

STATES = (ASSIGNED, WORKING, IN_REVIEW, APPROVED, COMPLETED, CANCELLED, FAILED)
TERMINAL = TERMINAL_STATES  # the bus defines them: its readers of the table need them too
ACTIVE = tuple(s for s in STATES if s not in TERMINAL)

# (state, command) -> next state. The whole machine; nothing else decides.
TRANSITIONS: dict[tuple[str, str], str] = {
    (ASSIGNED, "start"): WORKING,
    (WORKING, "done"): IN_REVIEW,
    (IN_REVIEW, "approve"): APPROVED,
    (IN_REVIEW, "reject"): WORKING,
    (IN_REVIEW, "rework"): WORKING,
    (APPROVED, "rework"): WORKING,
    (APPROVED, "merge"): COMPLETED,
    **{(state, "cancel"): CANCELLED for state in ACTIVE},
    **{(state, "fail"): FAILED for state in ACTIVE},
}
# Commands that keep the state: where each is allowed.
IN_PLACE: dict[str, frozenset[str]] = {
    "heartbeat": frozenset({ASSIGNED, WORKING}),
    "run": frozenset({ASSIGNED, WORKING}),
    "cleanup": TERMINAL,
}
COMMANDS = tuple(dict.fromkeys([c for _, c in TRANSITIONS] + list(IN_PLACE)))


class InvalidTransition(BusError):
    """A command that the worker's current state does not allow; nothing changed."""

    error_code = "conflict"

    def __init__(self, worker: str, state: str, command: str) -> None:
        allowed = ", ".join(allowed_commands(state))
        super().__init__(f"worker {worker} is {state}; allowed: {allowed}")
        self.worker = worker
        self.state = state
        self.command = command


def allowed_commands(state: str) -> list[str]:
    """Commands accepted in `state`, in the order of COMMANDS."""
    return [c for c in COMMANDS
            if (state, c) in TRANSITIONS or state in IN_PLACE.get(c, ())]


def next_state(worker: str, state: str, command: str) -> str:
    """The state `command` leads to from `state`; raises InvalidTransition."""
    if (state, command) in TRANSITIONS:
        return TRANSITIONS[(state, command)]
    if state in IN_PLACE.get(command, ()):
        return state
    raise InvalidTransition(worker, state, command)
