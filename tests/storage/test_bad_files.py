"""Every command on every kind of bad file names the problem and changes nothing.

Through click's CliRunner, in-process: every leaf command of `bus` and
`worker` (read from the click groups, so a new command is covered or this
test fails until tests/support/bad_files.py gives it arguments) on a corrupt, foreign,
newer, truncated, header-then-garbage, missing and read-only file. A bad file
gets exit 1, `Error: ...` naming the file, and the directory holding it is
byte-identical afterwards: no -wal, -shm or blobs/ appear beside it. A missing
file is created only by the commands that create a bus (`bus init`, the
pump, `worker spawn`); on a read-only bus the read commands work and the
write commands say it cannot be written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus
from bus.cli import main as bus_main
from tests.support import bad_files
from tests.support.bad_files import BAD_KINDS
from tests.support.bad_files import CREATES
from tests.support.bad_files import GOES_ON_WITHOUT_A_BUS
from tests.support.bad_files import NOT_REFUSED_WHEN_MISSING
from tests.support.bad_files import NAMED
from tests.support.bad_files import NAMED_BY_COMMAND
from tests.support.bad_files import NO_BUS
from tests.support.bad_files import NOTHING_TO_WRITE
from tests.support.bad_files import READ_ONLY_ERRORS
from tests.support.bad_files import READS
from tests.support.bad_files import RUN_ON
from workers.cli import main as worker_main


def invoke(command: str, db: Path, scratch: Path):
    program, *words = command.split()
    main = bus_main if program == "bus" else worker_main
    argv = ["--db", str(db), *words, *bad_files.arguments(command, scratch)]
    return CliRunner().invoke(main, argv, env={"BUS_DB": None, "BUS_DURABILITY": None},
                              input=bad_files.STDIN.get(command))


def test_every_command_has_arguments_and_a_place_in_the_table() -> None:
    names = set(bad_files.command_names())
    assert names == set(bad_files.ARGS)
    assert set(NO_BUS) | CREATES | READS | set(RUN_ON) | set(NOTHING_TO_WRITE) <= names
    assert set(READ_ONLY_ERRORS) <= names


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_every_command_on_a_bad_file_names_it_and_changes_nothing(tmp_path: Path,
                                                                   kind: str) -> None:
    failures = []
    for command in bad_files.command_names():
        if command in NO_BUS or (kind == "missing" and command in NOT_REFUSED_WHEN_MISSING):
            continue
        directory = tmp_path / command.replace(" ", "-")
        db = bad_files.make_kind(kind, directory / "bus")
        before = bad_files.snapshot(db.parent)
        result = invoke(command, db, directory / "scratch")
        if (kind, command) in NAMED_BY_COMMAND:
            problem = _problem(result, None, NAMED_BY_COMMAND[kind, command])
        else:
            problem = _problem(result, db, NAMED[kind])
        if problem is None and bad_files.snapshot(db.parent) != before:
            problem = "changed files: " + ", ".join(_changed(before, bad_files.snapshot(db.parent)))
        if problem:
            failures.append(f"{command}: {problem}")
    assert failures == [], "\n".join(failures)


def test_commands_that_go_on_without_a_bus_say_so_and_make_none(tmp_path: Path) -> None:
    for command, note in GOES_ON_WITHOUT_A_BUS.items():
        directory = tmp_path / command.replace(" ", "-")
        db = bad_files.make_kind("missing", directory / "bus")
        result = invoke(command, db, directory / "scratch")
        assert result.exit_code == 0, (command, result.output)
        assert note.format(db=db) in result.output
        assert not db.exists()


def test_commands_that_create_a_missing_bus_make_a_good_one(tmp_path: Path) -> None:
    for command in sorted(CREATES):
        directory = tmp_path / command.replace(" ", "-")
        db = bad_files.make_kind("missing", directory / "bus")
        result = invoke(command, db, directory / "scratch")
        assert result.exit_code == 0, (command, result.output)
        with Bus.open(db, create=False) as bus:
            assert bus.last_seq() >= 0


def test_commands_that_do_not_open_the_bus_leave_any_file_alone(tmp_path: Path) -> None:
    for command in NO_BUS:
        for kind in BAD_KINDS:
            directory = tmp_path / command.replace(" ", "-") / kind
            db = bad_files.make_kind(kind, directory / "bus")
            before = bad_files.snapshot(db.parent)
            result = invoke(command, db, directory / "scratch")
            assert "Traceback" not in result.output and not _unexpected(result), command
            assert bad_files.snapshot(db.parent) == before, (command, kind)


def test_every_command_on_a_read_only_bus_reads_or_says_it_cannot_write(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    db = bad_files.make_kind("read-only", directory / "bus")
    scratch = directory / "scratch"
    failures = []
    with bad_files.read_only_directory(db.parent):
        before = bad_files.snapshot(db.parent)
        for command in bad_files.command_names():
            if command in NO_BUS or command in RUN_ON:
                continue
            result = invoke(command, db, scratch)
            if command in READS or command in NOTHING_TO_WRITE:
                problem = None if result.exit_code == 0 and not _unexpected(result) else (
                    f"a read failed: exit {result.exit_code}: {result.output.strip()[:300]}")
            else:
                problem = _problem(result, None, READ_ONLY_ERRORS.get(command,
                                                                     "cannot be written"))
            if problem:
                failures.append(f"{command}: {problem}")
        after = bad_files.snapshot(db.parent)
    assert failures == [], "\n".join(failures)
    assert after == before


def _problem(result, db: Path | None, named: str) -> str | None:
    """Why `result` is not exit 1 with `Error: ...` naming `db` and the problem, if it is not."""
    text = result.output
    if _unexpected(result):
        return f"raised {result.exception!r}"
    if result.exit_code != 1 or "Error: " not in text:
        return f"exit {result.exit_code}: {text.strip()[:300]}"
    error = text[text.index("Error: "):]
    if (db is not None and str(db) not in error) or named not in error:
        return f"the error does not name the file and its problem: {error.strip()[:300]}"
    return None


def _unexpected(result) -> bool:
    return result.exception is not None and not isinstance(result.exception, SystemExit)


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(name for name in before.keys() | after.keys()
                  if before.get(name, "gone") != after.get(name, "gone"))
