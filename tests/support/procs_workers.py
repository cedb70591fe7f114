"""Child program and shared helpers for tests/workers/test_workers.py and tests/workers/test_worker_cli.py.

Child side: `python tests/support/procs_workers.py cli <go-fd> <worker CLI args...>`
prints "ready", blocks on the barrier pipe (file descriptor <go-fd>) until the
parent closes its write end, then runs the `worker` command line in-process
(`workers.cli.main`), so its exit status and `Error: ...` line are the CLI's
own. Everything is imported before "ready": released children race at once.

Parent side: `WorkerChild` (tests.support.procs_coordination.Child running this
program), plain git helpers (real `git`, no library) and `hermetic_git_env`,
the environment that keeps git away from the user's own configuration.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `tests.` importable like in the parent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.children import Child  # noqa: E402
from tests.support.procs_coordination import wait_for_go  # noqa: E402

PROGRAM = Path(__file__).resolve()
GIT_USER = ("Worker Tests", "worker-tests@example.invalid")


# --- child side -------------------------------------------------------------------


def cli(go_fd: int, args: list[str]) -> None:
    from workers.cli import main as worker_main  # imported before the barrier on purpose

    wait_for_go(go_fd)
    worker_main(args=args, prog_name="worker")  # standalone mode: exits with the CLI's status


def main(argv: list[str]) -> int:
    role, rest = argv[0], argv[1:]
    if role == "cli":
        cli(int(rest[0]), rest[1:])
        return 0
    sys.stderr.write(f"procs_workers: unknown role {role!r}\n")
    return 2


# --- parent side --------------------------------------------------------------------


class WorkerChild(Child):
    """A `Child` running this program, with no stdin."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], stderr_path: Path,
                 pass_fds: tuple[int, ...] = ()) -> None:
        super().__init__(name, PROGRAM, argv, env, stderr_path, pass_fds, stdin=subprocess.DEVNULL)


def hermetic_git_env(tmp_path: Path) -> dict[str, str]:
    """Variables that keep git inside tmp_path: no global/system config read or written,
    no repository found above tmp_path, a HOME of its own."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(tmp_path),
        "GIT_TERMINAL_PROMPT": "0",
    }


# Variables that would point git at another repository than the one given with -C.
GIT_REPO_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                      "GIT_COMMON_DIR", "GIT_NAMESPACE")


def git(repo: Path | str, *args: str) -> str:
    """Run git in `repo`; its stdout without the trailing newline. Fails the test on error."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} in {repo} failed: {done.stderr}")
    return done.stdout.rstrip("\n")


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A real repository at `path` on branch main with one commit of `files`."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", GIT_USER[0])
    git(path, "config", "user.email", GIT_USER[1])
    for name, text in (files or {"README.md": "hello\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def commit_file(worktree: Path | str, name: str, text: str, message: str | None = None) -> str:
    """Write `name` in `worktree`, commit it there; the new commit's id."""
    path = Path(worktree) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(worktree, "add", name)
    git(worktree, "commit", "-q", "-m", message or f"write {name}")
    return git(worktree, "rev-parse", "HEAD")


def head(repo: Path | str, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref)


def worktree_paths(repo: Path | str) -> list[str]:
    """The worktrees git knows of (`git worktree list --porcelain`), main one first."""
    return [line[len("worktree "):] for line in
            git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under `root` (outside .git and .worker-state) with its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in (".git", ".worker-state") or not path.is_file():
            continue
        found[str(rel)] = path.read_bytes()
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
