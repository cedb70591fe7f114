"""Bad files, from the installed wheel: every command names the problem and changes nothing.

A person points `bus` or `worker` at the wrong file: a corrupt copy, another
application's database, a bus a newer agentbus migrated, a truncated copy,
SQLite's header followed by garbage, a path with no file, or a bus in a
directory they cannot write. Every command of both installed programs runs
on every kind (tests/support/bad_files.py lists them and their arguments), as
subprocesses several at a time; each must exit 1 with `Error: ...` naming the
file and the problem, without a traceback, and leave the directory holding
the file byte-identical. A missing file is created only by the commands that
create a bus; on a read-only bus the reads work and the writes say why not.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import bad_files
from tests.support.bad_files import BAD_KINDS
from tests.support.bad_files import CREATES
from tests.support.bad_files import NOT_REFUSED_WHEN_MISSING
from tests.support.bad_files import NAMED
from tests.support.bad_files import NAMED_BY_COMMAND
from tests.support.bad_files import NO_BUS
from tests.support.bad_files import NOTHING_TO_WRITE
from tests.support.bad_files import READ_ONLY_ERRORS
from tests.support.bad_files import READS
from tests.support.bad_files import RUN_ON
from tests.journeys.conftest import Installed

pytestmark = pytest.mark.slow

# Commands that need an optional module: where the venv lacks it, they say which extra.
NEEDS_EXTRA = {"bus history": ("pyspark", "spark"), "bus mirror nats": ("nats", "nats")}
PARALLEL = max(2, min(8, os.cpu_count() or 2))


def run_installed(installed: Installed, command: str, db: Path,
                  scratch: Path) -> subprocess.CompletedProcess[str]:
    program, *words = command.split()
    argv = [program, "--db", str(db), *words, *bad_files.arguments(command, scratch)]
    return installed.run(*argv, cwd=scratch, timeout=180, input=bad_files.STDIN.get(command))


def error_problem(result: subprocess.CompletedProcess[str], db: Path | None,
                  named: str) -> str | None:
    """Why `result` is not exit 1 with `Error: ...` naming `db` and the problem, if it is not."""
    if "Traceback" in result.stderr:
        return f"a traceback: {result.stderr.strip()[-400:]}"
    if result.returncode != 1 or not result.stderr.startswith("Error: "):
        return f"exit {result.returncode}: {(result.stderr or result.stdout).strip()[:300]}"
    if (db is not None and str(db) not in result.stderr) or named not in result.stderr:
        return f"the error does not name the file and its problem: {result.stderr.strip()[:300]}"
    return None


def has_module(installed: Installed, module: str) -> bool:
    return installed.run("python", "-c", f"import {module}").returncode == 0


def check_bad_kind(installed: Installed, root: Path, kind: str, command: str,
                   missing_extras: dict[str, str]) -> str | None:
    directory = root / kind / command.replace(" ", "-")
    db = bad_files.make_kind(kind, directory / "bus")
    before = bad_files.snapshot(db.parent)
    result = run_installed(installed, command, db, directory / "scratch")
    if command in missing_extras:  # the command cannot start: it names the extra to install
        problem = error_problem(result, None, missing_extras[command])
    elif (kind, command) in NAMED_BY_COMMAND:
        problem = error_problem(result, None, NAMED_BY_COMMAND[kind, command])
    else:
        problem = error_problem(result, db, NAMED[kind])
    if problem is None and bad_files.snapshot(db.parent) != before:
        problem = "files beside it changed"
    return None if problem is None else f"{kind} / {command}: {problem}"


def test_every_installed_command_on_every_bad_file(installed: Installed, tmp_path: Path) -> None:
    cases = [(kind, command) for kind in BAD_KINDS for command in bad_files.command_names()
             if command not in NO_BUS
             and not (kind == "missing" and command in NOT_REFUSED_WHEN_MISSING)]
    missing_extras = {command: f"pip install 'agentbus[{extra}]'"
                      for command, (module, extra) in NEEDS_EXTRA.items()
                      if not has_module(installed, module)}
    with ThreadPoolExecutor(PARALLEL) as pool:
        found = pool.map(lambda case: check_bad_kind(installed, tmp_path, *case, missing_extras),
                         cases)
        failures = [f for f in found if f is not None]
    assert failures == [], "\n".join(failures)


def test_installed_commands_that_create_a_missing_bus(installed: Installed,
                                                      tmp_path: Path) -> None:
    for command in sorted(CREATES):
        directory = tmp_path / command.replace(" ", "-")
        db = bad_files.make_kind("missing", directory / "bus")
        result = run_installed(installed, command, db, directory / "scratch")
        assert result.returncode == 0, (command, result.stderr)
        status = installed.run("bus", "--db", str(db), "status", "--json", cwd=directory)
        assert status.returncode == 0, (command, status.stderr)


def test_every_installed_command_on_a_read_only_bus(installed: Installed,
                                                    tmp_path: Path) -> None:
    db = bad_files.make_kind("read-only", tmp_path / "bus")
    commands = [c for c in bad_files.command_names() if c not in NO_BUS and c not in RUN_ON]
    failures = []
    with bad_files.read_only_directory(db.parent):
        before = bad_files.snapshot(db.parent)
        with ThreadPoolExecutor(PARALLEL) as pool:
            results = pool.map(
                lambda c: run_installed(installed, c, db, tmp_path / "scratch" / c.replace(
                    " ", "-")), commands)
            for command, result in zip(commands, results):
                if command in READS or command in NOTHING_TO_WRITE:
                    if result.returncode != 0:
                        failures.append(f"{command}: a read failed: {result.stderr.strip()[:300]}")
                    continue
                problem = error_problem(result, None,
                                        READ_ONLY_ERRORS.get(command, "cannot be written"))
                if problem:
                    failures.append(f"{command}: {problem}")
        after = bad_files.snapshot(db.parent)
    assert failures == [], "\n".join(failures)
    assert after == before
