"""The `worker` command: drive an agent's lifecycle from the shell.

    worker spawn --task T      ASSIGNED   branch <worker>/<T> in its own worktree
    worker start W             WORKING    takes the task's lease
    worker done W              IN_REVIEW  the branch head is recorded
    worker approve W           APPROVED   (or: worker reject W --reason R -> WORKING)
    worker merge W             COMPLETED  merged into the base branch
    worker rework W            WORKING    back from review or APPROVED (a conflict, a moved branch)
    worker cleanup --finished             remove finished workers' worktrees (--branches too)

Every transition is one transaction with its state_change message. Exit
codes as for `bus`: 0 ok, 1 error (`Error: ...`), 2 usage, 75 busy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bus import __version__
from bus.harness import git_exclude
from bus.cli.context import DEFAULT_DB
from bus.cli.context import BusContext
from bus.cli.context import BusGroup
from bus.cli.context import json_option
from bus.cli.flags import pass_context_of
from bus.cli.layout import add_db_after_command
from bus.cli.output import echo_json
from bus.cli.output import shown_path
from bus.cli.output import echo_listing
from bus.coordination.heartbeats import STATUSES
from bus.coordination.heartbeats import STOPPED
from workers import git
from workers.lifecycle import DEFAULT_LEASE_MS
from workers.lifecycle import Cleaned
from workers.lifecycle import Workers
from workers.registry import Worker

worker_argument = click.argument("worker")
lease_option = click.option("--lease-ms", default=DEFAULT_LEASE_MS, show_default=True,
                            type=click.IntRange(1), help="Lease on the task; renew by heartbeat.")


class WorkerContext(BusContext):
    def workers(self, create: bool = False) -> Workers:
        return Workers(self.open(create=create))


pass_workers = pass_context_of(WorkerContext)


@click.group(cls=BusGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="BUS_DB", default=DEFAULT_DB, show_default=True,
              type=click.Path(dir_okay=False), help="Bus database file (env: BUS_DB).")
@click.option("--durability", envvar="BUS_DURABILITY", default="normal", show_default=True,
              type=click.Choice(["normal", "full"]), help="As for `bus`.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output and JSON errors, as if --json followed the command.")
@click.version_option(__version__, "--version", prog_name="worker")
@click.pass_context
def main(ctx: click.Context, db: str, durability: str, as_json: bool) -> None:
    """Worker lifecycle: each worker on its own git branch and worktree.

    \b
    Example:
      worker spawn --task fix-login --worker w1
      worker start w1
      (work and commit in the worktree)
      worker done w1 --message "login fixed"
      worker approve w1
      worker merge w1
    """
    ctx.obj = WorkerContext(ctx, db, durability, as_json=as_json)


@main.command()
@click.option("--task", required=True, help="Task id (becomes part of the branch name).")
@click.option("--worker", "worker_id", help="Worker id (default: generated, w-xxxxxx).")
@click.option("--repo", type=click.Path(file_okay=False), help="Git repository (default: here).")
@click.option("--base", help="Branch to start from and merge into (default: the current one).")
@json_option
@pass_workers
def spawn(obj: WorkerContext, task: str, worker_id: str | None, repo: str | None,
          base: str | None, as_json: bool) -> None:
    """Create a worker with its branch <worker>/<task> and worktree; publish task_assign.

    Example: worker spawn --task fix-login --worker w1 --base main
    """
    root = git.repo_root(repo or ".")  # before the bus: outside a repository no file is made
    workers = obj.workers(create=True)
    excluding = workers.unignored_state_dir(root)  # spawn writes it, once it succeeded
    w = workers.spawn(task, worker_id, repo, base)
    exclude = str(git_exclude.exclude_path(root)) if excluding else None
    if as_json:
        echo_json({**w.to_json_dict(), "excluded_in": exclude})
        return
    if exclude:
        click.echo(f"added {excluding.strip('/')}/ to {shown_path(exclude)}"
                   " so git status ignores it")
    click.echo(f"spawned {w.worker} for {w.task} on branch {w.branch}"
               f" from {w.base}; worktree {w.worktree}")


@main.command()
@worker_argument
@lease_option
@json_option
@pass_workers
def start(obj: WorkerContext, worker: str, lease_ms: int, as_json: bool) -> None:
    """ASSIGNED -> WORKING: take the task's lease (exactly one worker can).

    Example: worker start w1
    """
    _report(obj.workers().start(worker, lease_ms), as_json)


@main.command()
@worker_argument
@click.option("--status", default="working", show_default=True,
              type=click.Choice([s for s in STATUSES if s != STOPPED]))
@click.option("--progress", type=float, help="Fraction done, from 0 to 1.")
@lease_option
@json_option
@pass_workers
def heartbeat(obj: WorkerContext, worker: str, status: str, progress: float | None,
              lease_ms: int, as_json: bool) -> None:
    """One heartbeat, and a lease renewal while WORKING.

    Example: worker heartbeat w1 --progress 0.5
    """
    w = obj.workers().heartbeat(worker, status, progress, lease_ms)
    lease = "lease on its task renewed" if w.state == "WORKING" else "no lease yet (not started)"
    _report(w, as_json, f"{worker} beat ({status}); {lease}")


@main.command(context_settings={"ignore_unknown_options": True})
@worker_argument
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(0.01),
              help="Seconds between heartbeats (and lease renewals).")
@lease_option
@json_option
@pass_workers
def run(obj: WorkerContext, worker: str, command: tuple[str, ...], interval: float,
        lease_ms: int, as_json: bool) -> None:
    """Run a command in the worktree, beating meanwhile; then done (exit 0) or fail.

    Example: worker run w1 -- make test
    """
    w, code = obj.workers().run(worker, list(command), interval, lease_ms)
    _report(w, as_json, f"{worker}: command exited {code}; now {w.state}")
    if code:
        obj.ctx.exit(code if 0 < code < 256 else 1)


@main.command()
@worker_argument
@click.option("--message", "-m", help="What was done, for the reviewer.")
@click.option("--allow-empty", is_flag=True, help="Accept a branch with no commit beyond its base.")
@click.option("--fence", type=click.IntRange(1),
              help="The fence of the worker's task claim (bus claims); refused (exit 1) once"
                   " another agent took the task over.")
@json_option
@pass_workers
def done(obj: WorkerContext, worker: str, message: str | None, allow_empty: bool,
         fence: int | None, as_json: bool) -> None:
    """WORKING -> IN_REVIEW: record the branch head (commit your work first).

    Example: worker done w1 --message "login fixed" --fence 2
    """
    w = obj.workers().done(worker, message, allow_empty, fence=fence)
    _report(w, as_json, f"{worker} is IN_REVIEW at {w.head_commit[:12]} on {w.branch}")


@main.command()
@worker_argument
@json_option
@pass_workers
def approve(obj: WorkerContext, worker: str, as_json: bool) -> None:
    """IN_REVIEW -> APPROVED.

    Example: worker approve w1
    """
    _report(obj.workers().approve(worker), as_json)


@main.command()
@worker_argument
@click.option("--reason", required=True, help="What must change.")
@lease_option
@json_option
@pass_workers
def reject(obj: WorkerContext, worker: str, reason: str, lease_ms: int, as_json: bool) -> None:
    """IN_REVIEW -> WORKING, with the reason; the worker takes its lease again.

    Example: worker reject w1 --reason "add a test"
    """
    _report(obj.workers().reject(worker, reason, lease_ms), as_json)


@main.command()
@worker_argument
@click.option("--reason", help="Why, for the record.")
@lease_option
@json_option
@pass_workers
def rework(obj: WorkerContext, worker: str, reason: str | None, lease_ms: int,
           as_json: bool) -> None:
    """IN_REVIEW or APPROVED -> WORKING on the same branch and worktree.

    For a merge that conflicts or a branch that moved after review: resolve
    on the branch, then done, approve and merge again.

    Example: worker rework w1 --reason "conflicts with main"
    """
    _report(obj.workers().rework(worker, reason, lease_ms), as_json)


@main.command()
@click.argument("worker", required=False)
@click.option("--finished", is_flag=True, help="Every COMPLETED, CANCELLED and FAILED worker.")
@click.option("--branches", is_flag=True, help="Also delete branches merged into their base.")
@click.option("--force", is_flag=True, help="Discard uncommitted changes in the worktrees.")
@json_option
@pass_workers
def cleanup(obj: WorkerContext, worker: str | None, finished: bool, branches: bool, force: bool,
            as_json: bool) -> None:
    """Remove the worktrees of finished workers (one, or all with --finished).

    Example: worker cleanup --finished --branches
    """
    if (worker is None) == (not finished):
        raise click.UsageError("name a WORKER or pass --finished (not both)")
    cleaned = obj.workers().cleanup(worker, branches=branches, force=force)
    if as_json:
        for item in cleaned:
            echo_json(item.to_json_dict())
        return
    for item in cleaned:
        click.echo(_cleaned_line(item))
    if not cleaned:
        click.echo("no finished workers")


@main.command()
@worker_argument
@json_option
@pass_workers
def merge(obj: WorkerContext, worker: str, as_json: bool) -> None:
    """APPROVED -> COMPLETED: merge into the base branch and remove the worktree.

    On a conflict nothing changes and the conflicting files are listed; nor
    when the worker changed while git ran (a cancel meanwhile wins).

    Example: worker merge w1
    """
    w = obj.workers().merge(worker)
    _report(w, as_json, f"merged {w.branch} into {w.base} at {w.merge_commit[:12]};"
                        f" {worker} is COMPLETED")


@main.command()
@worker_argument
@click.option("--reason", help="Why, for the record.")
@json_option
@pass_workers
def cancel(obj: WorkerContext, worker: str, reason: str | None, as_json: bool) -> None:
    """Cancel a worker (any unfinished state); the claim is released, the branch kept.

    Example: worker cancel w1 --reason "no longer needed"
    """
    _report(obj.workers().cancel(worker, reason), as_json)


@main.command()
@worker_argument
@click.option("--reason", required=True, help="What went wrong.")
@json_option
@pass_workers
def fail(obj: WorkerContext, worker: str, reason: str, as_json: bool) -> None:
    """Mark a worker FAILED (any unfinished state); the claim is released, the branch kept.

    Example: worker fail w1 --reason "tests do not pass"
    """
    _report(obj.workers().fail(worker, reason), as_json)


@main.command()
@click.argument("worker", required=False)
@json_option
@pass_workers
def status(obj: WorkerContext, worker: str | None, as_json: bool) -> None:
    """Show workers: state, task, branch, heartbeat age and liveness.

    Example: worker status --json
    """
    found = obj.workers().status(worker)
    echo_listing(found, as_json, "no workers yet; create one with worker spawn --task T",
                 ["worker", "task", "state", "branch", "heartbeat", "liveness"],
                 lambda s: (s.worker.worker, s.worker.task, s.worker.state, s.worker.branch,
                            "-" if s.heartbeat_age_s is None else f"{s.heartbeat_age_s:.0f}s ago",
                            s.liveness or "-"))


def _cleaned_line(item: Cleaned) -> str:
    done = [f"removed worktree {shown_path(item.worktree)}" if item.worktree
            else "no worktree left"]
    if item.branch:
        done.append(f"deleted branch {item.branch} (already in its base)")
    if item.kept_branch:
        done.append(f"kept branch {item.kept_branch} (not merged)")
    return f"{item.worker} ({item.state}): {'; '.join(done)}"


def _report(w: Worker, as_json: bool, text: str | None = None) -> None:
    if as_json:
        echo_json(w.to_json_dict())
    else:
        click.echo(text or f"{w.worker} is {w.state} ({w.task} on {w.branch})")


add_db_after_command(main)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
