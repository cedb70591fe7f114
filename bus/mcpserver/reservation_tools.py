"""Tools over file reservations: reserve, list, release and check paths, as the session's agent."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Optional

from pydantic import Field

from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import DISCARDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.session import AgentSession
from bus.coordination.reservations import DEFAULT_TTL_MS
from bus.coordination.reservations import EXCLUSIVE
from bus.coordination.reservations import PATTERNS_MAX
from bus.coordination.reservations import SHARED
from bus.coordination.reservations import TTL_MAX_MS
from bus.coordination.reservations import ReservationConflict

Patterns = Annotated[list[str], Field(min_length=1, max_length=PATTERNS_MAX, description=(
    "Gitignore-style globs from the repository root: src/auth/**, src/*.py; one without a"
    " slash (*.md) matches at any depth."))]


class ReservationTools:
    """File reservations of the session's agent; conflicts come back as data, not errors."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def reserve(
        self,
        patterns: Patterns,
        exclusive: Annotated[bool, Field(description=(
            "false: shared, others may reserve overlapping patterns too."))] = True,
        ttl_seconds: Annotated[float, Field(gt=0, le=TTL_MAX_MS / 1000, description=(
            "How long it lasts (less if you die or your worker ends)."
        ))] = DEFAULT_TTL_MS / 1000,
        reason: Annotated[Optional[str], Field(description=(
            "What you are doing, for the other agents."))] = None,
    ) -> dict[str, Any]:
        """Reserve files before editing them, all or nothing.

        `granted` false: nothing reserved; `conflicts` names what is in the way.
        """
        try:
            made = self.bus.reservations.reserve(self.agent, patterns,
                                                 mode=EXCLUSIVE if exclusive else SHARED,
                                                 ttl_ms=max(1, round(ttl_seconds * 1000)),
                                                 reason=reason)
        except ReservationConflict as exc:
            return {"granted": False, "conflicts": [c.to_json_dict() for c in exc.conflicts]}
        return {"granted": True, "reservations": [r.to_json_dict() for r in made]}

    def reservations(
        self,
        holder: Annotated[Optional[str], Field(description=(
            "Only this agent's reservations; omit for everyone's."))] = None,
        path: Annotated[Optional[str], Field(description=(
            "Only reservations whose pattern matches this path (from the repository root)."))
        ] = None,
    ) -> dict[str, Any]:
        """The live file reservations (ended ones are gone), by pattern."""
        found = self.bus.reservations.list(holder, path)
        return {"reservations": [r.to_json_dict() for r in found]}

    def unreserve(self, patterns: Annotated[Optional[list[str]], Field(description=(
            "The patterns to release, as reserved; omit to release all of yours."))] = None,
    ) -> dict[str, Any]:
        """Release your file reservations when you are done with the files."""
        released = self.bus.reservations.unreserve(self.agent, patterns)
        return {"released": [r.to_json_dict() for r in released]}

    def reserve_check(self, paths: Annotated[list[str], Field(min_length=1, description=(
            "File paths from the repository root, e.g. the ones you are about to commit."))],
    ) -> dict[str, Any]:
        """Check paths before changing or committing them: who else holds them exclusively.

        {"ok": true} unless another live agent holds some of them exclusively;
        "held" names each such path with its holder and expiry.
        """
        held = self.bus.reservations.check_paths(self.agent, paths)
        return {"ok": not held, "held": [h.to_json_dict() for h in held]}

    TOOLS = {"reserve": ADDS, "reservations": READS, "unreserve": DISCARDS,
             "reserve_check": READS}
