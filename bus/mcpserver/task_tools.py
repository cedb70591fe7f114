"""Tools over tasks: the graph (add, ready, claim the next, done) and the leases on them."""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal
from typing import Optional

from pydantic import Field

from bus.mcpserver.kinds import ADDS
from bus.mcpserver.kinds import DISCARDS
from bus.mcpserver.kinds import READS
from bus.mcpserver.kinds import SETS
from bus.mcpserver.log_tools import Fence
from bus.mcpserver.log_tools import LeaseMs
from bus.mcpserver.log_tools import Task
from bus.mcpserver.session import AgentSession
from bus.coordination.tasks import PRIORITY_DEFAULT
from bus.coordination.tasks import PRIORITY_HIGHEST
from bus.coordination.tasks import PRIORITY_LOWEST
from bus.coordination.tasks import STATES
from bus.coordination.tasks import TITLE_MAX

Priority = Annotated[int, Field(ge=PRIORITY_HIGHEST, le=PRIORITY_LOWEST, description=(
    "0 is the most urgent (listed and claimed first), 4 the least."))]
After = Annotated[list[str], Field(description=(
    "Ids of the tasks this one waits on; each must exist. It is ready once all are done."))]


class TaskTools:
    """The task graph, each operation as the session's agent."""

    def __init__(self, session: AgentSession) -> None:
        self.bus = session.bus
        self.agent = session.agent

    def task_add(
        self,
        task: Task,
        title: Annotated[Optional[str], Field(max_length=TITLE_MAX, description=(
            "What the task is, for people and agents."))] = None,
        after: Optional[After] = None,
        priority: Priority = PRIORITY_DEFAULT,
    ) -> dict[str, Any]:
        """Add a task to the graph. An unknown dependency is refused; nothing is added."""
        return self.bus.tasks.add(task, title, after=after or (), priority=priority).to_json_dict()

    def task_depend(self, task: Task, after: After) -> dict[str, Any]:
        """Make an open task wait on more tasks (refused if that closes a cycle).

        The refusal names the cycle, and then nothing is added.
        """
        return {"task": task, "added": self.bus.tasks.add_dependencies(task, after)}

    def task_ready(self, limit: Annotated[int, Field(ge=1, le=1000, description=(
            "The most tasks to return."))] = 20) -> dict[str, Any]:
        """Tasks you could take now (open, dependencies done, no lease), most urgent first."""
        return {"tasks": [t.to_json_dict() for t in self.bus.tasks.ready(limit)]}

    def task_list(self, state: Annotated[Optional[Literal[STATES]], Field(description=(
            "Only tasks in this state; omit for all."))] = None) -> dict[str, Any]:
        """Every task of the graph (or those in one state), oldest first."""
        return {"tasks": [t.to_json_dict() for t in self.bus.tasks.list(state)]}

    def task_show(self, task: Task) -> dict[str, Any]:
        """One task: state, dependencies, dependents, holder, fence and its newest events."""
        return self.bus.tasks.detail(task).to_json_dict()

    def task_claim_next(self, lease_ms: LeaseMs = 60_000) -> dict[str, Any]:
        """Claim the most urgent ready task; returns it with its fence, for task_done.

        `claimed` false: nothing is ready.
        """
        claimed = self.bus.tasks.claim_next(self.agent, lease_ms)
        if claimed is None:
            return {"claimed": False, "task": None}
        return {"claimed": True, **claimed.to_json_dict()}

    def task_done(self, task: Task, fence: Annotated[Optional[int], Field(ge=1, description=(
            "From task_claim_next: refused once another agent took the task over."
    ))] = None) -> dict[str, Any]:
        """Mark a task you hold done; the tasks waiting on it may become ready.

        Its lease ends, and a `task_done` message tells everyone.
        """
        return self.bus.tasks.complete(task, self.agent, fence=fence).to_json_dict()

    def task_cancel(self, task: Task, reason: Annotated[Optional[str], Field(
            max_length=TITLE_MAX, description="Why, for the log.")] = None) -> dict[str, Any]:
        """Cancel an open task. Tasks waiting on it stay blocked (cancelled is not done)."""
        return self.bus.tasks.cancel(task, self.agent, reason).to_json_dict()

    def claim(self, task: Task, lease_ms: LeaseMs = 60_000) -> dict[str, Any]:
        """Take the lease on a task so no other agent works on it.

        `granted` false means another agent holds it (see `claim`: its agent and lease end)
        or the task is dead (ran out of attempts). Claiming a task you hold extends it.
        `fence` is your lease's fence: pass it to renew, release and publish about the task.
        """
        result = self.bus.claims.try_claim(task, self.agent, lease_ms)
        return {"task": task, "granted": result.granted, "fence": result.fence,
                "claim": result.claim.to_json_dict() if result.claim else None,
                "dead": result.dead.to_json_dict() if result.dead else None}

    def renew(self, task: Task, lease_ms: Optional[LeaseMs] = None,
              fence: Fence = None) -> dict[str, Any]:
        """Extend your lease on a task (by its own length unless `lease_ms` says).

        `renewed` false means the lease already ran out or another agent holds it:
        stop working on the task, or claim it again.
        """
        renewed = self.bus.claims.renew(task, self.agent, lease_ms, fence=fence)
        return {"task": task, "renewed": renewed}

    def release(self, task: Task, fence: Fence = None) -> dict[str, Any]:
        """Give a task back so another agent can claim it at once."""
        return {"task": task, "released": self.bus.claims.release(task, self.agent, fence=fence)}

    TOOLS = {"task_add": ADDS, "task_depend": SETS, "task_ready": READS, "task_list": READS,
             "task_show": READS, "task_claim_next": ADDS, "task_done": SETS,
             "task_cancel": DISCARDS, "claim": SETS, "renew": SETS, "release": SETS}
