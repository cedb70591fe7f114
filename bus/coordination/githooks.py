"""The git pre-commit hook that honours file reservations (`bus hooks install`).

The hook is a small shell script in the repository's hooks directory (`git
rev-parse --git-path hooks`, so `core.hooksPath` and worktrees are respected:
every worktree of the repository shares it). It runs the pre-commit hook that
was there before, kept beside it as `pre-commit.before-agentbus`, then
`python -m bus.cli hooks pre-commit`, which refuses the commit when a staged
path is held exclusively by another live agent.

Who commits, and on which bus:
- the bus file is `$BUS_DB` when set, else the file `bus hooks install` was given;
- the agent is `$BUS_AGENT` when set, else the bus worker whose worktree the
  commit is made in (the `worktree` column of `workers`); else nobody the bus
  knows, and every live exclusive reservation counts.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bus.storage.errors import BusError

MARKER = "# agentbus pre-commit hook"
CHAINED = "pre-commit.before-agentbus"  # the hook that was there before ours
HOOK = "pre-commit"

_SCRIPT = """#!/bin/sh
{marker}, written by `bus hooks install` (run it again to update).
# Refuses a commit that touches paths another live agent holds exclusively
# (bus reserve). The bus file: $BUS_DB, else the one below. The committing
# agent: $BUS_AGENT, else the bus worker whose worktree this is.
hooks=$(dirname "$0")
if [ -x "$hooks/{chained}" ]; then
    "$hooks/{chained}" "$@" || exit $?
fi
if [ -z "$BUS_DB" ]; then
    BUS_DB={db}
fi
export BUS_DB
python={python}
if [ ! -x "$python" ]; then
    echo "agentbus pre-commit hook: $python is gone; run bus hooks install again" >&2
    exit 1
fi
exec "$python" -m bus.cli hooks pre-commit
"""


class GitHookError(BusError):
    """A git command or the hooks directory failed; the message says which and how to fix."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Installed:
    hook: Path
    chained: Path | None  # the hook that was there before, now run first
    updated: bool         # ours was there already: rewritten in place

    def to_json_dict(self) -> dict[str, object]:
        return {"hook": str(self.hook), "chained": str(self.chained) if self.chained else None,
                "updated": self.updated}


def git_output(*args: str, cwd: Path | str, field: str | None = None) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise GitHookError("git is not installed (or not on PATH); install git first") from None
    if done.returncode != 0:
        raise GitHookError(f"`git {' '.join(args)}` in {cwd} failed: {done.stderr.strip()}"
                           " (is it a git repository? give one with --repo DIR)", field)
    return done.stdout


def hooks_dir(repo: Path | str) -> Path:
    """Where git looks for the hooks of `repo` (absolute)."""
    found = Path(git_output("rev-parse", "--git-path", "hooks", cwd=repo, field="repo").strip())
    return found if found.is_absolute() else (Path(repo) / found).resolve()


def install_pre_commit(repo: Path | str, db_path: str | os.PathLike[str],
                       python: str = sys.executable) -> Installed:
    """Write the pre-commit hook into `repo`'s hooks directory; idempotent.

    A pre-commit hook that is not ours is kept as `pre-commit.before-agentbus` and
    run first. GitHookError when both it and a foreign hook are there already.
    """
    directory = hooks_dir(repo)
    directory.mkdir(parents=True, exist_ok=True)
    hook, chained = directory / HOOK, directory / CHAINED
    ours = hook.exists() and MARKER in hook.read_text(errors="replace")
    if hook.exists() and not ours:
        if chained.exists():
            raise GitHookError(f"{hook} is not agentbus's and {chained} exists already;"
                               " merge them into one by hand, then run bus hooks install again")
        hook.rename(chained)
    script = _SCRIPT.format(marker=MARKER, chained=CHAINED, python=shlex.quote(python),
                            db=shlex.quote(str(Path(db_path).absolute())))
    temporary = directory / f".{HOOK}.agentbus-{os.getpid()}"
    temporary.write_text(script)
    temporary.chmod(0o755)
    temporary.replace(hook)
    return Installed(hook, chained if chained.exists() else None, ours)


def staged_paths(cwd: Path | str = ".") -> list[str]:
    """The paths a commit made now in `cwd` would touch (renames as both paths)."""
    out = git_output("diff", "--cached", "--name-only", "--no-renames", "-z", cwd=cwd)
    return [p for p in out.split("\0") if p]


def in_work_tree(cwd: Path | str = ".") -> bool:
    """Whether `cwd` is inside a git work tree (where git runs a pre-commit hook)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=cwd,
                              capture_output=True, text=True)
    except FileNotFoundError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def worktree_top(cwd: Path | str = ".") -> Path:
    return Path(git_output("rev-parse", "--show-toplevel", cwd=cwd).strip())
