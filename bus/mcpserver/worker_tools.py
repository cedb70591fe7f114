"""Tools over the worker lifecycle, as the agent's own worker."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import Field

from bus.heartbeats import STATUSES
from bus.heartbeats import STOPPED
from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.kinds import SETS
from bus.mcpserver.log_tools import LeaseMs
from bus.mcpserver.session import AgentSession
from workers.lifecycle import DEFAULT_LEASE_MS

# `stopped` is the last beat the lifecycle itself writes (done, fail, cancel); a
# worker that beat it while WORKING would show as stopped to everyone. As `worker heartbeat`.
WorkerStatus = Literal[tuple(s for s in STATUSES if s != STOPPED)]
WorkerLease = Annotated[LeaseMs, Field(description=(
    "Lease on your task in milliseconds; worker_heartbeat renews it."))]


class WorkerTools:
    """The worker lifecycle for the worker whose id is the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent
        self.workers = session.workers

    def worker_status(self, worker: Annotated[Optional[str], Field(description=(
            "A worker id; omit for every worker."))] = None) -> dict[str, Any]:
        """Workers with their task, state, branch, worktree, last heartbeat and liveness."""
        return {"workers": [status.to_json_dict() for status in self.workers.status(worker)]}

    def worker_start(self, lease_ms: WorkerLease = DEFAULT_LEASE_MS) -> dict[str, Any]:
        """Start work as your worker: ASSIGNED -> WORKING, taking your task's lease.

        Your worker was spawned with your agent id (`worker spawn --worker ID`).
        """
        return self.workers.start(self.agent, lease_ms).to_json_dict()

    def worker_done(
        self,
        message: Annotated[Optional[str], Field(description=(
            "What you did, for the reviewer."))] = None,
        allow_empty: Annotated[bool, Field(description=(
            "Hand in a branch with no commit beyond its base (nothing to change)."))] = False,
    ) -> dict[str, Any]:
        """Hand your work in for review: WORKING -> IN_REVIEW at your branch's head.

        Commit everything in your worktree first; uncommitted changes are refused,
        and so is a branch without commits unless allow_empty is true.
        """
        return self.workers.done(self.agent, message, allow_empty).to_json_dict()

    def worker_heartbeat(
        self,
        progress: Annotated[Optional[float], Field(ge=0, le=1, description=(
            "Fraction done, 0 to 1."))] = None,
        status: Annotated[WorkerStatus, Field(description="What you are doing.")] = "working",
        lease_ms: WorkerLease = DEFAULT_LEASE_MS,
    ) -> dict[str, Any]:
        """Beat as your worker and renew your task's lease; call it at least every few minutes."""
        return self.workers.heartbeat(self.agent, status, progress, lease_ms).to_json_dict()

    TOOLS = {"worker_status": READS, "worker_start": ADDS, "worker_done": ADDS,
             "worker_heartbeat": SETS}
