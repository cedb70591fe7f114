"""Worker operations: each is one transition of the state machine.

A transition is ONE transaction: it re-reads the worker, checks the command
against the machine (workers/machine.py), does what must be atomic with it
(claiming or releasing the task), updates the row and publishes
`state_change` plus the command's own messages. Git work that a transition
depends on (a clean worktree, building the merge) happens just before it,
outside the transaction; work that follows from it (removing a merged
worktree) just after. `merge` re-checks in its transaction that the worker
is still as it was read (a compare-and-set) and moves the base branch there.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Union

import apsw

from bus.coordination import claims
from bus.harness import git_exclude
from bus.coordination import heartbeats
from bus.api import Bus
from bus.coordination.claims import Claim
from bus.coordination.claims import ClaimResult
from bus.storage.errors import BusError
from bus.storage.errors import TaskStateConflict
from bus.coordination.heartbeats import KEEP
from bus.coordination.heartbeats import STOPPED
from bus.coordination.heartbeats import Heartbeat
from bus.log.messages import now_ms
from bus.log.messages import validate_agent_id
from bus.log.messages import validate_text
from bus.coordination.tasks import OPEN
from bus.coordination.tasks import Task
from bus.coordination.reservations import PathsReserved
from workers import git
from workers import registry
from workers.machine import APPROVED
from workers.machine import ASSIGNED
from workers.machine import IN_REVIEW
from workers.machine import TERMINAL
from workers.machine import WORKING
from workers.machine import InvalidTransition
from workers.machine import next_state
from workers.registry import Worker

DEFAULT_LEASE_MS = 10 * 60 * 1000  # shell-driven agents renew with `worker heartbeat`
ORCHESTRATOR = "orchestrator"  # sender of task_assign and review_result
TASK_MAX = 200


# Messages a transition publishes after its state_change: (type, payload, to)
# from the worker, or (type, payload, to, sender); or a function of the
# updated worker that returns them.
Announcement = tuple  # (str, dict, Optional[str]) or (str, dict, Optional[str], str)
Announcements = Union[list[Announcement], Callable[[Worker], list[Announcement]]]


class BranchMoved(BusError):
    """The branch has commits that were not reviewed; merge refuses them."""

    error_code = "conflict"


class WorkerChanged(BusError):
    """The worker changed between a command's first read and its transaction."""

    error_code = "conflict"

    def __init__(self, command: str, before: Worker, after: Worker) -> None:
        changed = [f"state {before.state} -> {after.state}"] if before.state != after.state else []
        changed += [f"{field} {getattr(before, field)!r} -> {getattr(after, field)!r}"
                    for field in ("head_commit", "merge_commit", "note")
                    if getattr(before, field) != getattr(after, field)]
        what = ", ".join(changed) or f"updated again, still {after.state}"
        super().__init__(f"worker {after.worker} changed while `worker {command}` ran ({what});"
                         f" the {command} was refused and {after.base} is unchanged; see"
                         f" `worker status {after.worker}`")
        self.worker = after.worker
        self.before = before
        self.after = after


class ClaimRefused(BusError):
    """`start` could not take the task's lease: another worker holds it, or it is dead."""

    error_code = "conflict"


class TaskTaken(ClaimRefused):
    """Another live worker holds the task, or has it in review."""

    def __init__(self, task: str, rival: Worker) -> None:
        doing = "has it in review" if rival.state in (IN_REVIEW, APPROVED) else "holds it"
        super().__init__(f"task {task} is taken: worker {rival.worker} ({rival.state}) {doing};"
                         f" wait until it finishes, or `worker cancel {rival.worker}`")
        self.task = task
        self.rival = rival


class EmptyWork(BusError):
    """`done` on a branch with no commit beyond its base."""

    error_code = "conflict"

    def __init__(self, worker: Worker) -> None:
        super().__init__(f"{worker.branch} has no commit beyond {worker.base}; commit the work in"
                         f" {worker.worktree} first (git add, then git commit), or pass"
                         " allow_empty=True to review an empty branch")
        self.worker = worker.worker


@dataclass(frozen=True)
class Cleaned:
    """What `cleanup` removed for one finished worker."""

    worker: str
    state: str
    worktree: str | None      # removed worktree, None if there was none
    branch: str | None        # deleted branch, None if kept (or not asked)
    kept_branch: str | None   # a branch kept because it is not merged into its base

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkerStatus:
    worker: Worker
    heartbeat_age_s: float | None
    liveness: str | None

    def to_json_dict(self) -> dict[str, Any]:
        return {**self.worker.to_json_dict(), "heartbeat_age_s": self.heartbeat_age_s,
                "liveness": self.liveness}


class Workers:
    """The worker lifecycle on an open bus."""

    def __init__(self, bus: Bus, worktrees: Path | None = None) -> None:
        self.bus = bus
        state_dir = Path(bus.path).absolute().parent
        self.worktrees = worktrees or state_dir / "worktrees"
        self.mirrors = state_dir / "workers"

    # --- reading ----------------------------------------------------------

    def get(self, worker: str) -> Worker:
        with self.bus.read() as conn:
            return registry.get(conn, worker)

    def _all(self) -> list[Worker]:
        with self.bus.read() as conn:
            return registry.list_workers(conn)

    def status(self, worker: str | None = None) -> list[WorkerStatus]:
        """Workers with their last heartbeat's age and, while unfinished, their liveness."""
        found = [self.get(worker)] if worker else self._all()
        beats = {b.agent: b for b in self.bus.heartbeats.liveness()}
        return [WorkerStatus(w, beats[w.worker].age_s if w.worker in beats else None,
                             beats[w.worker].state
                             if w.worker in beats and w.state not in TERMINAL else None)
                for w in found]

    def diff(self, worker: str) -> tuple[Worker, list[str], str]:
        """The worker's branch against its base: (worker, `--stat` lines, patch)."""
        found = self.get(worker)
        stat, patch = git.diff_against_base(Path(found.repo), found.base, found.branch)
        return found, stat, patch

    # --- transitions ------------------------------------------------------

    def spawn(self, task: str, worker: str | None = None, repo: str | os.PathLike[str] | None = None,
              base: str | None = None) -> Worker:
        """Create a worker for `task` on a new branch `<worker>/<task>` in its own worktree."""
        task = validate_text(task, "task", TASK_MAX)
        worker = validate_agent_id(worker, "worker") if worker is not None else _new_worker_id()
        with self.bus.read() as conn:
            taken = registry.exists(conn, worker)
        if taken:
            raise registry.WorkerExists(worker)
        root = git.repo_root(repo if repo is not None else Path.cwd())
        git.require_commits(root)
        base = base or git.current_branch(root)
        branch = f"{worker}/{task}"
        git.check_branch_name(root, branch)
        self._refuse_rival(task, worker)
        registered = self._registered_task(task)
        worktree = self.worktrees / worker
        git.add_worktree(root, worktree, branch, base)
        at = now_ms()
        created = Worker(worker, task, ASSIGNED, str(root), base, branch, str(worktree),
                         None, None, None, at, at)
        try:
            with self.bus.write() as conn:
                registry.insert(conn, created)
                self.bus.publish(worker, "state_change",
                                 {"from": None, "to": ASSIGNED, "command": "spawn"},
                                 correlation_id=task)
                self.bus.publish(ORCHESTRATOR, "task_assign",
                                 {"task": task, "branch": branch, "base": base,
                                  "worktree": str(worktree), **_title_of(registered)},
                                 to=worker, correlation_id=task)
        except BaseException:
            _undo_spawn(root, worktree, branch)
            raise
        registry.write_mirror(self.mirrors, created)
        self.ignore_state_dir(root)
        return created

    def unignored_state_dir(self, repo: Path) -> str | None:
        """The exclude pattern (`/.worker-state/`) the state directory needs in `repo`:
        None when it is outside the repository or git ignores it already."""
        return git_exclude.pattern_needed(self.worktrees.parent, repo)

    def ignore_state_dir(self, repo: Path) -> Path | None:
        """Add the state directory to `repo`'s `.git/info/exclude` if git does not ignore
        it yet (so `git status` stays clean); the file written, or None. `spawn` calls it."""
        pattern = self.unignored_state_dir(repo)
        return git_exclude.exclude(Path(repo).resolve(), pattern) if pattern else None

    def start(self, worker: str, lease_ms: int = DEFAULT_LEASE_MS) -> Worker:
        """ASSIGNED -> WORKING, taking the task's lease in the same transaction."""
        return self._transition(worker, "start", within=lambda w: self._claim(w, lease_ms),
                                announce=self._resumed)

    def done(self, worker: str, message: str | None = None, allow_empty: bool = False, *,
             fence: int | None = None) -> Worker:
        """WORKING -> IN_REVIEW: record the branch head.

        Refuses a dirty worktree, and (unless `allow_empty`) a branch with no
        commit beyond its base (EmptyWork). With `fence` (the one its task's
        claim gave), StaleFence unless it is still the task's current fence,
        checked in the transaction of the change: a worker paused past its
        lease while another agent took the task cannot hand in its work.
        A branch that changes paths another live agent holds exclusively is
        refused too (PathsReserved, as the git hook).
        """
        current = self._expect(worker, "done")
        git.require_clean(Path(current.worktree))
        if not allow_empty and git.commits_beyond(Path(current.worktree), current.base) == 0:
            raise EmptyWork(current)
        head = git.head_commit(Path(current.worktree))
        self._refuse_reserved(current, Path(current.worktree), head)
        details = {"branch": current.branch, "commit": head, "message": message}
        return self._transition(
            worker, "done", head_commit=head, note=message,
            within=lambda w: self._stop(w, fence=fence),
            announce=[("task_done", details, None), ("review_request", details, None)])

    def approve(self, worker: str) -> Worker:
        return self._transition(worker, "approve", announce=[
            ("review_result", {"approved": True}, worker, ORCHESTRATOR)])

    def reject(self, worker: str, reason: str, lease_ms: int = DEFAULT_LEASE_MS) -> Worker:
        """IN_REVIEW -> WORKING with the reviewer's reason; the worker takes its lease again."""
        reason = validate_text(reason, "reason", 2000)
        return self._transition(
            worker, "reject", note=reason, within=lambda w: self._back_to_work(w, lease_ms),
            announce=lambda w: [("review_result", {"approved": False, "reason": reason},
                                 worker, ORCHESTRATOR), *self._resumed(w)])

    def rework(self, worker: str, reason: str | None = None,
               lease_ms: int = DEFAULT_LEASE_MS) -> Worker:
        """IN_REVIEW or APPROVED -> WORKING on the same branch and worktree.

        The way out when the work cannot merge as reviewed (a conflict with
        the base, a branch that moved): resolve on the branch, then done,
        review and merge again. The worker takes its lease again.
        """
        reason = validate_text(reason, "reason", 2000, optional=True)
        return self._transition(worker, "rework", note=reason,
                                within=lambda w: self._back_to_work(w, lease_ms),
                                announce=self._resumed)

    def merge(self, worker: str) -> Worker:
        """APPROVED -> COMPLETED: merge the branch into its base, then remove the worktree.

        No bus lock is held while git works (a merge and its hooks may take
        minutes; other writers would get BusBusy after 5 s):

        1. the worker is read; a branch that moved since review is refused (BranchMoved),
           and one that changes paths another live agent holds exclusively (PathsReserved);
        2. the merge is built in a scratch worktree (`git.prepare_merge`), hooks
           and all, with the base branch left where it was; on a conflict it is
           aborted and git.MergeConflict names the files;
        3. one short write transaction compares and sets: the worker must be
           exactly as read in 1, or WorkerChanged names what changed (a cancel,
           fail or rework meanwhile, or another `merge` that won). It records
           COMPLETED and publishes task_merged, and as its last step moves the
           base branch to the merge (`git.advance_base`, a compare-and-set on
           the ref as well), so only COMMIT follows.

        The base therefore moves only for a merge the bus records: a refused
        one leaves nothing but an unreferenced commit for git's gc, and should
        the COMMIT itself fail after the move, the base is moved back.
        """
        current = self._expect(worker, "merge")
        repo = Path(current.repo)
        _require_reviewed_head(current)
        self._refuse_reserved(current, repo, current.head_commit)
        scratch = self.worktrees / f".merge-{worker}-{os.urandom(4).hex()}"  # one per attempt
        try:
            try:
                # The reviewed commit, by its id: a push to the branch from now on changes nothing.
                merged = git.prepare_merge(repo, current.branch, current.base, scratch,
                                           commit=current.head_commit)
            except git.MergeConflict as exc:
                raise git.MergeConflict(exc.branch, exc.base, exc.files,
                                        _rework_fix(current)) from None
            done = self._record_merge(current, merged)
        finally:
            git.remove_worktree(repo, scratch)  # its HEAD kept the merge from gc until now
        git.remove_worktree(repo, Path(current.worktree))
        return done

    def _record_merge(self, read: Worker, merged: git.MergeResult) -> Worker:
        """Step 3 of `merge`: the compare-and-set, the messages, then the base branch."""
        def release(w: Worker) -> dict[str, Any]:
            self._release(w)
            self._finish_registered(w)
            return {"merge_commit": merged.commit}

        moved = False
        try:
            with self.bus.write() as conn:
                merged_note = ("task_merged", {"branch": read.branch, "base": read.base,
                                               "commit": merged.commit,
                                               "fast_forward": merged.fast_forward}, None)
                new = self._apply(conn, read.worker, "merge", expected=read, within=release,
                                  announce=[merged_note])
                git.advance_base(Path(read.repo), merged)
                moved = True
        except BaseException:
            if moved:  # the COMMIT failed after the base moved: take the move back
                git.undo_advance(Path(read.repo), merged)
            raise
        registry.write_mirror(self.mirrors, new)
        return new

    def cancel(self, worker: str, reason: str | None = None) -> Worker:
        """Stop a worker for good; its claim is released, its branch and worktree kept
        (`cleanup` removes them)."""
        return self._transition(worker, "cancel", note=reason, within=self._stop)

    def fail(self, worker: str, reason: str) -> Worker:
        """Mark a worker failed; its claim is released, its branch and worktree kept
        (`cleanup` removes them)."""
        reason = validate_text(reason, "reason", 2000)
        return self._transition(worker, "fail", note=reason, within=self._stop,
                                announce=[("task_failed", {"reason": reason}, None)])

    def cleanup(self, worker: str | None = None, *, branches: bool = False,
                force: bool = False) -> list[Cleaned]:
        """Remove the worktrees of finished workers (`worker`, or all of them).

        With `branches`, also delete their branches that are merged into
        their base (unmerged ones are kept and reported). A worktree with
        uncommitted changes refuses the whole call (DirtyWorktree), changing
        nothing, unless `force`.
        """
        found = [self.get(worker)] if worker else [
            w for w in self._all() if w.state in TERMINAL]
        for w in found:
            next_state(w.worker, w.state, "cleanup")
        if not force:
            for w in found:
                _require_clean_for_cleanup(Path(w.worktree))
        return [self._clean(w, branches) for w in found]

    # --- in place ---------------------------------------------------------

    def heartbeat(self, worker: str, status: str = "working", progress: float | None = None,
                  lease_ms: int = DEFAULT_LEASE_MS) -> Worker:
        """One beat, and for a WORKING worker a lease renewal (or re-claim once expired).

        `progress` None keeps the progress the worker's last beat reported.
        """
        current = self._expect(worker, "heartbeat")
        self.bus.heartbeats.beat(worker, status, current.task,
                                 KEEP if progress is None else progress)
        if current.state == WORKING:
            self._keep_lease(current, lease_ms)
        return current

    def run(self, worker: str, argv: list[str], interval: float = 10.0,
            lease_ms: int = DEFAULT_LEASE_MS) -> tuple[Worker, int]:
        """Run `argv` in the worktree with beats and lease renewal going; then done or fail.

        Returns the worker after the transition and the command's exit code.
        """
        if not argv:
            raise BusError("worker run needs a command after --")
        current = self._expect(worker, "run")
        if current.state == ASSIGNED:
            current = self.start(worker, lease_ms)
        command = shlex.join(argv)
        outcome: int | str
        with Heartbeat(self.bus.path, worker, interval, status="working", task=current.task,
                       on_beat=lambda: self._keep_lease(current, lease_ms, only_while_working=True)):
            try:
                outcome = subprocess.run(argv, cwd=current.worktree).returncode
            except KeyboardInterrupt:
                outcome = "interrupted"
            except OSError as exc:
                outcome = f"could not start: {exc}"
        # The heartbeat has stopped: nothing renews or re-takes the lease after this.
        if outcome == "interrupted":
            self.fail(worker, f"`{command}` was interrupted")
            raise KeyboardInterrupt
        if isinstance(outcome, str):
            return self.fail(worker, f"`{command}` {outcome}"), 127
        if outcome == 0:
            return self.done(worker, f"`{command}` exited 0"), 0
        return self.fail(worker, f"`{command}` exited with {outcome}"), outcome

    # --- the mechanism ----------------------------------------------------

    def _expect(self, worker: str, command: str) -> Worker:
        """The worker, if `command` is allowed in its state (checked again in the transaction)."""
        current = self.get(worker)
        next_state(worker, current.state, command)
        return current

    def _transition(self, worker: str, command: str, *,
                    within: Callable[[Worker], dict[str, Any] | None] | None = None,
                    announce: Announcements = (), **changes: Any) -> Worker:
        with self.bus.write() as conn:
            new = self._apply(conn, worker, command, within=within, announce=announce,
                              **changes)
        registry.write_mirror(self.mirrors, new)
        return new

    def _apply(self, conn: apsw.Connection, worker: str, command: str, *, expected: Worker | None = None,
               within: Callable[[Worker], dict[str, Any] | None] | None = None,
               announce: Announcements = (), **changes: Any) -> Worker:
        """The body of a transition, inside the caller's write transaction on `conn`.

        With `expected`, a compare-and-set: WorkerChanged unless the row is
        still exactly `expected` (as read before the transaction began).
        """
        current = registry.get(conn, worker)
        if expected is not None and current != expected:
            raise WorkerChanged(command, expected, current)
        to = next_state(worker, current.state, command)
        # First in the log; `within` may publish too (task_claim), all in one commit.
        self.bus.publish(worker, "state_change",
                         {"from": current.state, "to": to, "command": command},
                         correlation_id=current.task)
        if within is not None:
            changes.update(within(current) or {})
        new = replace(current, state=to, updated_at_ms=now_ms(), **changes)
        registry.update(conn, current, new)
        for type_, payload, to_agent, *sender in (
                announce(new) if callable(announce) else announce):
            self.bus.publish(sender[0] if sender else worker, type_,
                             {"worker": worker, **payload},
                             to=to_agent, correlation_id=current.task)
        return new

    def _refuse_reserved(self, worker: Worker, where: Path, ref: str) -> None:
        """PathsReserved when `ref` changes (since its base) paths that live agents other
        than the worker hold exclusively (`bus reserve`); the message is the hook's."""
        paths = git.changed_paths(where, worker.base, ref)
        held = self.bus.reservations.check_paths(worker.worker, paths) if paths else []
        if held:
            raise PathsReserved(held)

    def _release(self, worker: Worker, fence: int | None = None) -> None:
        self.bus.claims.release(worker.task, worker.worker, fence=fence)

    def _registered_task(self, task: str) -> Task | None:
        """The task graph's task of this id, if one is registered; one that is done or
        cancelled already is refused (TaskStateConflict): there is nothing left to do."""
        registered = self.bus.tasks.find(task)
        if registered is not None and registered.state != OPEN:
            raise TaskStateConflict(task, registered.state, "worker spawn",
                                    "add a new task (`bus task add`) for more work")
        return registered

    def _finish_registered(self, worker: Worker) -> None:
        """A merged worker's task, when the task graph has it, is done (`task_done`), and the
        tasks waiting on it may become ready. One still waiting on others stays open."""
        registered = self.bus.tasks.find(worker.task)
        if registered is not None and registered.state == OPEN and not registered.waiting_on:
            self.bus.tasks.complete(worker.task, worker.worker, require_claim=False)

    def _stop(self, worker: Worker, fence: int | None = None) -> None:
        """Leaving for review or for good: release the task (StaleFence, before
        anything changes, when `fence` is given and no longer current); a worker
        that was WORKING announces agent_stopped. Every stop leaves a last beat
        saying `stopped`, so `bus alive` tells a finished agent from a dead one."""
        self._release(worker, fence)
        if worker.state == WORKING:
            self.bus.publish(worker.worker, "agent_stopped",
                             {"worker": worker.worker, "task": worker.task},
                             correlation_id=worker.task)
        with self.bus.write() as conn:
            heartbeats.beat(conn, worker.worker, STOPPED, worker.task, None,
                            payloads=self.bus.payloads)

    @staticmethod
    def _resumed(worker: Worker) -> list[Announcement]:
        """What a worker entering WORKING announces (the lifecycle's vocabulary)."""
        return [("agent_started", {"task": worker.task, "branch": worker.branch,
                                   "worktree": worker.worktree}, None)]

    def _take(self, worker: Worker, lease_ms: int) -> Claim:
        """The task's lease for `worker`, unless another worker has the task."""
        self._refuse_rival(worker.task, worker.worker)
        result = self.bus.claims.try_claim(worker.task, worker.worker, lease_ms)
        if not result.granted:
            raise _refusal(worker.task, result)
        return result.claim

    def _claim(self, worker: Worker, lease_ms: int) -> None:
        """Take the task's lease for a worker entering WORKING and publish task_claim."""
        claim = self._take(worker, lease_ms)
        self.bus.publish(worker.worker, "task_claim", {
            "worker": worker.worker, "task": worker.task, "attempt": claim.attempts,
            "fence": claim.fence, "lease_until_ms": claim.lease_until_ms},
            correlation_id=worker.task)

    def _back_to_work(self, worker: Worker, lease_ms: int) -> None:
        """Reject and rework: the task's lease again, and a `working` beat in place of the
        `stopped` one `done` left. Otherwise every view would show a WORKING worker as
        stopped, never as dead however long its agent stays away; this beat decays
        like any other (a forgotten agent stays forgotten)."""
        self._claim(worker, lease_ms)
        with self.bus.write() as conn:
            if heartbeats.has_beaten(conn, worker.worker):
                heartbeats.beat(conn, worker.worker, "working", worker.task, None,
                                payloads=self.bus.payloads)

    def _refuse_rival(self, task: str, worker: str) -> None:
        """TaskTaken if another worker has `task` in review, or is WORKING on it
        with a lease that has not run out (one whose lease ran out can be taken over)."""
        with self.bus.read() as conn:
            held = claims.get(conn, task)
            others = registry.others_on_task(conn, task, worker)
        holder = held.agent if held is not None and not held.expired(now_ms()) else None
        for other in others:
            if other.state in (IN_REVIEW, APPROVED) or (other.state == WORKING
                                                         and other.worker == holder):
                raise TaskTaken(task, other)

    def _clean(self, worker: Worker, branches: bool) -> Cleaned:
        repo, worktree = Path(worker.repo), Path(worker.worktree)
        removed = str(worktree) if worktree.exists() else None
        git.remove_worktree(repo, worktree)
        deleted = kept = None
        if branches and git.branch_exists(repo, worker.branch):
            if git.is_merged(repo, worker.branch, worker.base):
                git.delete_branch(repo, worker.branch)
                deleted = worker.branch
            else:
                kept = worker.branch
        return Cleaned(worker.worker, worker.state, removed, deleted, kept)

    def _keep_lease(self, worker: Worker, lease_ms: int, only_while_working: bool = False) -> None:
        """Renew the lease, or take it again once expired (if nobody else has).

        From `run`'s heartbeat thread only while the worker is still WORKING:
        a fail or cancel meanwhile released the task, and it must stay released.
        """
        if self.bus.claims.renew(worker.task, worker.worker, lease_ms):
            return
        with self.bus.write():  # the state check and the claim, together
            if only_while_working and self.get(worker.worker).state != WORKING:
                return
            self._take(worker, lease_ms)


def _refusal(task: str, result: ClaimResult) -> ClaimRefused:
    if result.dead is not None:
        return ClaimRefused(f"task {task} is dead ({result.dead.reason}); see bus claims --dead")
    return ClaimRefused(f"task {task} is held by {result.claim.agent} until its lease ends;"
                        " try again later")


def _require_reviewed_head(worker: Worker) -> None:
    """BranchMoved unless the branch is still at the commit that was reviewed."""
    now_at = git.head_commit(Path(worker.repo), worker.branch)
    if now_at != worker.head_commit:
        raise BranchMoved(f"{worker.branch} moved since it was reviewed (reviewed"
                          f" {worker.head_commit[:12]}, now {now_at[:12]}); run `worker"
                          f" rework {worker.worker}`, then done, approve and merge again")


def _rework_fix(worker: Worker) -> str:
    return (f"run `worker rework {worker.worker}`, resolve on {worker.branch} in"
            f" {worker.worktree} (git merge {worker.base}, fix the files, commit),"
            " then done, approve and merge again")


def _require_clean_for_cleanup(worktree: Path) -> None:
    if worktree.exists():
        changes = git.uncommitted_changes(worktree)
        if changes:
            raise git.DirtyWorktree(worktree, changes, "commit them on the branch first, or"
                                    " pass --force to discard them")


def _title_of(task: Task | None) -> dict[str, str]:
    """What task_assign says of a registered task: its title, when it has one."""
    return {"title": task.title} if task is not None and task.title else {}


def _new_worker_id() -> str:
    return "w-" + os.urandom(3).hex()


def _undo_spawn(repo: Path, worktree: Path, branch: str) -> None:
    """Take back the branch and worktree of a spawn whose transaction failed."""
    try:
        git.remove_worktree(repo, worktree)
        git.git("branch", "-D", branch, cwd=repo, check=False)
    except git.GitError:
        pass  # the original error matters more


__all__ = ["BranchMoved", "ClaimRefused", "Cleaned", "EmptyWork", "InvalidTransition", "TaskTaken",
           "WorkerChanged", "Workers", "WorkerStatus", "DEFAULT_LEASE_MS"]
