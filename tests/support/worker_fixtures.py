"""Fixtures the worker tests share: git isolated from the user, a repo, a Workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bus import Bus
from tests.conftest import REPO_ROOT
from tests.support.procs_workers import GIT_REPO_VARIABLES
from tests.support.procs_workers import hermetic_git_env
from tests.support.procs_workers import make_repo
from workers.lifecycle import Workers


def isolate_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git sees no user config and writes nothing outside tmp_path."""
    for name, value in hermetic_git_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    for name in GIT_REPO_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """isolate_git, and child processes import this checkout."""
    isolate_git(tmp_path, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def ws(bus: Bus) -> Workers:
    return Workers(bus)
