"""The git side of branch-per-worker: branches, worktrees, merges.

Every call runs the `git` command (no library), with the repository given
explicitly (`git -C`), so nothing depends on the current directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bus.storage.errors import BusError


class GitError(BusError):
    """git is missing, the path is not a repository, or a git command failed."""

    error_code = "git"


class DirtyWorktree(GitError):
    """Uncommitted changes where a clean tree is needed."""

    def __init__(self, path: Path, changes: list[str],
                 fix: str = "commit or stash them first") -> None:
        shown = ", ".join(changes[:5]) + (" ..." if len(changes) > 5 else "")
        super().__init__(f"{path} has uncommitted changes ({shown}); {fix}")
        self.path = path
        self.changes = changes


class MergeConflict(GitError):
    """The merge stopped on conflicts; it was aborted and the repository is as it was."""

    def __init__(self, branch: str, base: str, files: list[str],
                 fix: str = "merge the base into the branch, resolve, commit, and merge again"
                 ) -> None:
        super().__init__(f"merging {branch} into {base} conflicts in: {', '.join(files)};"
                         f" the merge was aborted and nothing changed; {fix}")
        self.branch = branch
        self.base = base
        self.files = files


@dataclass(frozen=True)
class MergeResult:
    """A merge built but not yet applied: `base` moves from `previous` to `commit`."""

    commit: str
    fast_forward: bool
    base: str
    previous: str


def git(*args: str, cwd: Path | str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in `cwd`; raises GitError with git's own message on failure."""
    if shutil.which("git") is None:
        raise GitError("git is not installed or not on PATH; install git to use worker branches")
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, env=env)
    if check and done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise GitError(f"git {' '.join(args)} failed: {message[-1] if message else done.returncode}")
    return done


def repo_root(path: Path | str) -> Path:
    """The top of the work tree containing `path`; GitError if it is not in a repository."""
    if not Path(path).is_dir():
        raise GitError(f"{path} is not a directory; pass --repo with a git repository")
    done = git("rev-parse", "--show-toplevel", cwd=path, check=False)
    if done.returncode != 0:
        raise GitError(f"{path} is not inside a git repository; pass --repo or run git init")
    return Path(done.stdout.strip())


def current_branch(repo: Path) -> str:
    done = git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=repo, check=False)
    if done.returncode != 0:
        raise GitError(f"{repo} has a detached HEAD; pass --base with the branch to work from")
    return done.stdout.strip()


def check_branch_name(repo: Path, name: str) -> None:
    if git("check-ref-format", "--branch", name, cwd=repo, check=False).returncode != 0:
        raise GitError(f"{name!r} is not a valid branch name; choose task and worker ids "
                       "without spaces, '..', '~', '^', ':' or a trailing '.lock'")


def require_commits(repo: Path) -> None:
    """GitError unless the repository has at least one commit (a worktree needs one)."""
    if git("rev-parse", "--verify", "--quiet", "HEAD", cwd=repo, check=False).returncode != 0 \
            and not git("for-each-ref", "--count=1", "refs/heads", cwd=repo).stdout.strip():
        raise GitError(f"{repo} has no commits yet; make a first commit"
                       " (git commit --allow-empty -m initial) and spawn again")


def commits_beyond(path: Path, base: str, ref: str = "HEAD") -> int:
    """How many commits `ref` has that `base` does not."""
    return int(git("rev-list", "--count", f"{base}..{ref}", cwd=path).stdout.strip())


def changed_paths(path: Path, base: str, ref: str = "HEAD") -> list[str]:
    """The paths `ref` changes since it left `base` (base...ref; a rename as both paths)."""
    out = git("diff", "--name-only", "--no-renames", "-z", f"{base}...{ref}", cwd=path).stdout
    return [p for p in out.split("\0") if p]


def diff_against_base(repo: Path, base: str, branch: str) -> tuple[list[str], str]:
    """What `branch` changed since it left `base` (`git diff base...branch`): the
    `--stat` lines and the patch."""
    since = f"{base}...{branch}"
    stat = git("diff", "--stat", "--no-color", since, cwd=repo).stdout.splitlines()
    return stat, git("diff", "--no-color", since, cwd=repo).stdout


def is_merged(repo: Path, branch: str, base: str) -> bool:
    """True if every commit of `branch` is in `base`."""
    return git("merge-base", "--is-ancestor", branch, base, cwd=repo,
               check=False).returncode == 0


def delete_branch(repo: Path, branch: str) -> None:
    git("branch", "-D", branch, cwd=repo)


def branch_exists(repo: Path, name: str) -> bool:
    return git("rev-parse", "--verify", "--quiet", f"refs/heads/{name}",
               cwd=repo, check=False).returncode == 0


def add_worktree(repo: Path, path: Path, branch: str, base: str) -> None:
    """Create `branch` from `base` and check it out in a new worktree at `path`."""
    if not branch_exists(repo, base):
        raise GitError(f"base branch {base!r} does not exist in {repo}")
    if branch_exists(repo, branch):
        raise GitError(f"branch {branch!r} already exists in {repo}; choose another worker id")
    if path.exists():
        raise GitError(f"{path} already exists; remove it or choose another worker id")
    path.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "-b", branch, str(path), base, cwd=repo)


def remove_worktree(repo: Path, path: Path) -> None:
    if path.exists():
        git("worktree", "remove", "--force", str(path), cwd=repo)
    git("worktree", "prune", cwd=repo, check=False)


def uncommitted_changes(path: Path, untracked: bool = True) -> list[str]:
    """Paths with uncommitted changes (untracked files too, unless told not to)."""
    mode = "--untracked-files=normal" if untracked else "--untracked-files=no"
    lines = git("status", "--porcelain", mode, cwd=path).stdout.splitlines()
    return [line[3:] for line in lines if line.strip()]


def require_clean(path: Path, untracked: bool = True) -> None:
    changes = uncommitted_changes(path, untracked)
    if changes:
        raise DirtyWorktree(path, changes)


def head_commit(path: Path, ref: str = "HEAD") -> str:
    return git("rev-parse", ref, cwd=path).stdout.strip()


def worktree_of(repo: Path, branch: str) -> Path | None:
    """The worktree where `branch` is checked out, if any."""
    current = None
    for line in git("worktree", "list", "--porcelain", cwd=repo).stdout.splitlines():
        if line.startswith("worktree "):
            current = Path(line[len("worktree "):])
        elif line == f"branch refs/heads/{branch}":
            return current
    return None


def prepare_merge(repo: Path, branch: str, base: str, scratch: Path,
                  commit: str | None = None) -> MergeResult:
    """Build the merge of `branch` (at `commit`, its head by default) into `base`
    without moving `base`.

    The merge runs (hooks and all) in a detached worktree at `scratch` on
    base's current commit: a fast-forward when possible, else a merge commit.
    `base` itself is untouched; `advance_base` moves it. If `base` is checked
    out, that worktree must be clean (apart from untracked files), as it is
    moved along with the branch. On a conflict the merge is aborted and
    MergeConflict names the files. The caller removes `scratch` afterwards
    (while it exists, its HEAD keeps the new commit from git's gc).
    """
    where = worktree_of(repo, base)
    if where is not None:
        require_clean(where, untracked=False)
    previous = head_commit(repo, f"refs/heads/{base}")
    git("worktree", "add", "--detach", str(scratch), previous, cwd=repo)
    return _merge_in(scratch, branch, commit or head_commit(repo, branch), base, previous)


def advance_base(repo: Path, merged: MergeResult) -> None:
    """Move `merged.base` from `merged.previous` to `merged.commit`, or change nothing.

    A compare-and-set on the branch: GitError if it is no longer at
    `previous`. Where the base is checked out, its worktree moves with it (a
    fast-forward that git refuses rather than overwrite a local change);
    hooks do not run again, they ran when the merge was built.
    """
    where = worktree_of(repo, merged.base)
    if where is None:
        moved = git("update-ref", "-m", f"worker merge into {merged.base}",
                    f"refs/heads/{merged.base}", merged.commit, merged.previous, cwd=repo,
                    check=False)
        if moved.returncode != 0:
            raise _base_moved(repo, merged)
        return
    require_clean(where, untracked=False)
    if head_commit(where) != merged.previous:
        raise _base_moved(repo, merged)
    done = git("-c", "core.hooksPath=/dev/null", "merge", "--ff-only", "--quiet", merged.commit,
               cwd=where, check=False)
    if done.returncode != 0:
        raise GitError(f"git merge {merged.base} failed: {(done.stderr or done.stdout).strip()}")


def _base_moved(repo: Path, merged: MergeResult) -> GitError:
    now = head_commit(repo, f"refs/heads/{merged.base}")
    return GitError(f"{merged.base} moved while the merge ran (from {merged.previous[:12]} to"
                    f" {now[:12]}); nothing was merged; run the merge again")


def undo_advance(repo: Path, merged: MergeResult) -> None:
    """Put `merged.base` back at `merged.previous` after `advance_base`, unless it moved since."""
    where = worktree_of(repo, merged.base)
    if where is None:
        git("update-ref", f"refs/heads/{merged.base}", merged.previous, merged.commit, cwd=repo)
    elif head_commit(where) == merged.commit:
        git("reset", "--quiet", "--keep", merged.previous, cwd=where)


def _merge_in(worktree: Path, branch: str, commit: str, base: str, previous: str) -> MergeResult:
    done = git("merge", "--no-edit", "-m", f"Merge {branch} into {base}", commit,
               cwd=worktree, check=False)
    if done.returncode != 0:
        conflicts = git("diff", "--name-only", "--diff-filter=U", cwd=worktree).stdout.split()
        git("merge", "--abort", cwd=worktree, check=False)
        if conflicts:
            raise MergeConflict(branch, base, conflicts)
        raise GitError(f"git merge {branch} failed: {(done.stderr or done.stdout).strip()}")
    after = head_commit(worktree)
    # A fast-forward leaves the base exactly at the branch head; a merge commit does not.
    return MergeResult(after, after == commit, base, previous)
