"""The worker lifecycle as MCP tools and a resource, for the worker whose id is the agent.

`bus mcp` finds this group through the `agentbus.mcp_tools` entry point that
setup.cfg declares, so the server in `bus` never imports `workers`.
"""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import Field

from bus.coordination.heartbeats import STATUSES
from bus.coordination.heartbeats import STOPPED
from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.kinds import SETS
from bus.mcpserver.log_tools import Fence
from bus.mcpserver.log_tools import LeaseMs
from bus.mcpserver.session import AgentSession
from workers.lifecycle import DEFAULT_LEASE_MS
from workers.lifecycle import Workers

# `stopped` is the last beat the lifecycle itself writes (done, fail, cancel); a
# worker that beat it while WORKING would show as stopped to everyone. As `worker heartbeat`.
WorkerStatus = Literal[tuple(s for s in STATUSES if s != STOPPED)]
WorkerLease = Annotated[LeaseMs, Field(description=(
    "Lease on your task in milliseconds; worker_heartbeat renews it."))]


class WorkerTools:
    """The worker lifecycle for the worker whose id is the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.agent = session.agent
        self.workers = Workers(session.bus)

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
        fence: Fence = None,
    ) -> dict[str, Any]:
        """Hand your work in for review: WORKING -> IN_REVIEW at your branch's head.

        Commit everything in your worktree first; uncommitted changes are refused,
        and so is a branch without commits unless allow_empty is true.
        """
        return self.workers.done(self.agent, message, allow_empty, fence=fence).to_json_dict()

    def worker_heartbeat(
        self,
        progress: Annotated[Optional[float], Field(ge=0, le=1, description=(
            "Fraction done, 0 to 1."))] = None,
        status: Annotated[WorkerStatus, Field(description="What you are doing.")] = "working",
        lease_ms: WorkerLease = DEFAULT_LEASE_MS,
    ) -> dict[str, Any]:
        """Beat as your worker and renew your task's lease; call it at least every few minutes."""
        return self.workers.heartbeat(self.agent, status, progress, lease_ms).to_json_dict()

    def worker(self, worker: str) -> dict[str, Any]:
        """One worker's state, task, branch, worktree, heartbeat age and liveness."""
        return self.workers.status(worker)[0].to_json_dict()


    def worker_spawn(
        self,
        task: Annotated[str, Field(min_length=1, description=(
            "The task's id; the branch is <worker>/<task>."))],
        worker: Annotated[Optional[str], Field(description=(
            "The new worker's id (the agent that will work as it); omit for a generated one."
        ))] = None,
        base: Annotated[Optional[str], Field(description=(
            "Branch to start from and merge into; omit for the repository's current one."
        ))] = None,
    ) -> dict[str, Any]:
        """Create a worker for a task: a branch and its own worktree, in state ASSIGNED.

        The repository is the one the server runs in. Start an agent in the worktree it
        returns, with the worker's id as its agent name.
        """
        return self.workers.spawn(task, worker, None, base).to_json_dict()

    def worker_diff(
        self,
        worker: Annotated[Optional[str], Field(description=(
            "A worker id; omit for your own worker."))] = None,
        max_chars: Annotated[int, Field(ge=100, le=1_000_000, description=(
            "The longest patch to return; a longer one is cut (`truncated` says so)."
        ))] = 20_000,
    ) -> dict[str, Any]:
        """What a worker's branch changed since it left its base: the files, then the patch."""
        found, stat, patch = self.workers.diff(worker or self.agent)
        return {"worker": found.worker, "base": found.base, "branch": found.branch,
                "files": stat[:-1] if stat else [], "summary": stat[-1].strip() if stat else "",
                "patch": patch[:max_chars], "truncated": len(patch) > max_chars}

    TOOLS = {"worker_status": READS, "worker_start": ADDS, "worker_done": ADDS,
             "worker_heartbeat": SETS, "worker_spawn": ADDS, "worker_diff": READS}
    # URI -> method name: the resources this group serves.
    URIS = {"bus://workers/{worker}": "worker"}
