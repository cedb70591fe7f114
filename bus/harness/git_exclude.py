"""Keeping the bus's own directory out of git: the exclude file of the repository around it.

The bus file, its WAL, blobs and worker mirrors change all the time; in a
checkout they would fill `git status` and could be committed by accident.
`bus init` and `worker spawn` add the directory to the repository's own
`.git/info/exclude` (`git rev-parse --git-path info/exclude`: shared by all
its worktrees), never to `.gitignore`, which is the project's file to change.
Only the repository whose work tree contains the directory is touched; outside
git (or without git installed) nothing is.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bus.storage.errors import ValidationFailed
from bus.coordination.githooks import git_output

_GLOB_CHARS = re.compile(r"[\\*?\[#!]")  # what a pattern reads as more than itself


@dataclass(frozen=True)
class Exclusion:
    """What `exclude_directory` found and did: `repository` is None outside git."""

    repository: str | None
    pattern: str | None  # `/.worker-state/`: None at the root of the work tree or outside
    exclude_file: str | None
    added: bool  # False: git ignored the directory already (or there is nothing to add)

    def to_json_dict(self) -> dict[str, object]:
        return {"repository": self.repository, "pattern": self.pattern,
                "exclude_file": self.exclude_file, "added": self.added}


def exclude_directory(directory: str | Path) -> Exclusion:
    """Add `directory` (which must exist) to its repository's exclude file unless git
    ignores it already; idempotent. Outside a work tree nothing changes."""
    directory = Path(directory).resolve()
    top = work_tree_of(directory)
    if top is None:
        return Exclusion(None, None, None, False)
    pattern = pattern_needed(directory, top)
    if pattern is None:
        already = directory != top and directory.is_relative_to(top)
        return Exclusion(str(top), _anchored(directory, top) if already else None, None, False)
    return Exclusion(str(top), pattern, str(exclude(top, pattern)), True)


def work_tree_of(directory: Path) -> Path | None:
    """The top of the git work tree that contains `directory`; None outside one (or
    inside a `.git` directory, or without git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=directory,
                              capture_output=True, text=True)
    except FileNotFoundError:
        return None  # git is not installed: there is no repository to keep clean
    top = done.stdout.strip()
    return Path(top).resolve() if done.returncode == 0 and top else None


def pattern_needed(directory: str | Path, repo: str | Path) -> str | None:
    """The exclude pattern (`/.worker-state/`) `directory` needs in `repo`: None when it
    is outside the repository, is its top, or git ignores it already."""
    directory, root = Path(directory).resolve(), Path(repo).resolve()
    if not directory.is_relative_to(root) or directory == root:
        return None
    if is_ignored(root, directory.relative_to(root).as_posix()):
        return None
    return _anchored(directory, root)


def is_ignored(repo: Path, relative: str) -> bool:
    """True if git ignores the path `relative` (to the repository's top)."""
    return subprocess.run(["git", "check-ignore", "-q", relative], cwd=repo,
                          capture_output=True).returncode == 0


def exclude_path(repo: Path) -> Path:
    """The repository's own ignore file, `.git/info/exclude` (shared by its worktrees)."""
    path = Path(git_output("rev-parse", "--git-path", "info/exclude", cwd=repo).strip())
    return path if path.is_absolute() else repo / path


def exclude(repo: Path, pattern: str) -> Path:
    """Append `pattern` to the repository's own .git/info/exclude; return that file."""
    path = exclude_path(repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.exists() else ""
    separator = "" if not existing or existing.endswith("\n") else "\n"
    with path.open("a") as out:
        out.write(f"{separator}{pattern}\n")
    return path


def _anchored(directory: Path, root: Path) -> str:
    """`/<path>/`: this directory alone, at the top of the work tree, whatever its name."""
    return "/" + escape_pattern(directory.relative_to(root).as_posix()) + "/"


def escape_pattern(path: str) -> str:
    """`path` as a gitignore pattern that matches it and nothing else (gitignore(5)).

    `*`, `?`, `[` and `\\` are glob syntax and `#` or `!` at the start of a
    line a comment or a negation: each is escaped with a backslash. (A trailing
    space, which git strips, never ends our line: the pattern ends with `/`.) A
    line break cannot be written in the file at all: ValidationFailed then,
    rather than a line that means another path.
    """
    if "\n" in path or "\r" in path:
        raise ValidationFailed("directory", f"{path!r} holds a line break, which"
                               " .git/info/exclude cannot hold; choose another directory")
    return _GLOB_CHARS.sub(r"\\\g<0>", path)
