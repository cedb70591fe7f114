"""bus/harness/git_exclude.py against real git: the line added to .git/info/exclude ignores the bus's
directory, whatever its name, and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bus import ValidationFailed
from bus.harness.git_exclude import exclude_directory


def git_repository(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def untracked(repo: Path) -> set[str]:
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z"],
                          cwd=repo, capture_output=True, text=True, check=True)
    return {entry[3:] for entry in done.stdout.split("\0") if entry}


# Each odd name beside a sibling its pattern would also match were it read as a glob, a
# comment or a negation.
ODD_NAMES = [("state dir", "state dir2"), ("#state", "state"), ("!state", "state"),
             ("st*te", "stXte"), ("st?te", "stXte"), ("[st]ate", "sate"),
             ("back\\slash", "backslash"), ("trailing ", "trailing")]


@pytest.mark.parametrize(("name", "sibling"), ODD_NAMES)
def test_exclude_directory_with_an_odd_name_ignores_it_and_nothing_else(
        tmp_path: Path, name: str, sibling: str) -> None:
    repo = git_repository(tmp_path / "repo")
    for directory in (name, sibling):
        (repo / directory).mkdir()
        (repo / directory / "bus.db").write_text("x")
    found = exclude_directory(repo / name)
    assert found.added
    assert untracked(repo) == {f"{sibling}/bus.db"}
    assert not exclude_directory(repo / name).added  # git ignores it now: nothing added again


def test_exclude_directory_refuses_a_name_the_exclude_file_cannot_hold(tmp_path: Path) -> None:
    repo = git_repository(tmp_path / "repo")
    before = (repo / ".git" / "info" / "exclude").read_text()
    (repo / "two\nlines").mkdir()
    with pytest.raises(ValidationFailed, match="line break"):
        exclude_directory(repo / "two\nlines")
    assert (repo / ".git" / "info" / "exclude").read_text() == before
