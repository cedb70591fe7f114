"""Options where people type them: --db and --json before or after the command,
errors as JSON with --json, `bus help CMD`, shell completion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bus import Bus
from tests.support.cli_helpers import run


def test_db_after_the_command(bus: Bus, tmp_path: Path, db_path: Path) -> None:
    result = run(["publish", "--from", "a", "--type", "t", "--db", str(db_path)])
    assert result.exit_code == 0, result.stderr
    assert bus.last_seq() == 1
    assert not (tmp_path / ".worker-state").exists()


def test_db_after_a_nested_command_and_after_an_old_name(bus: Bus, db_path: Path) -> None:
    bus.channels.create_channel("jobs", "broadcast", "boss")
    send = ["--channel", "jobs", "--from", "boss", "--type", "text", "--content", "hi"]
    sent = run(["channel", "send", *send, "--db", str(db_path)])
    assert sent.exit_code == 0, sent.stderr
    old = run(["send", *send, "--db", str(db_path)])
    assert old.exit_code == 0, old.stderr
    assert bus.last_seq() == 2


def test_db_after_the_command_wins_over_the_one_before(bus: Bus, db_path: Path,
                                                       tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    result = run(["--db", str(other), "publish", "--from", "a", "--type", "t",
                  "--db", str(db_path)])
    assert result.exit_code == 0
    assert bus.last_seq() == 1 and not other.exists()


@pytest.mark.parametrize("args", [
    ["--json", "ack", "--agent", "w", "--seq", "1"],
    ["ack", "--agent", "w", "--seq", "1", "--json"],
])
def test_json_before_or_after_the_command(bus: Bus, db_path: Path, args) -> None:
    bus.publish("p", "t")
    result = run(args, db_path)
    assert json.loads(result.stdout) == {"agent": "w", "last_acked_seq": 1}


def test_json_before_a_nested_command(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t")
    bus.ack("w", 1)
    result = run(["--json", "consumer", "info", "w"], db_path)
    assert json.loads(result.stdout)["cursor"] == 1


@pytest.mark.parametrize("args, error, field, code", [
    (["--json", "publish", "--from", "", "--type", "t"],
     "Invalid value for '--from': must not be empty", "--from", 2),
    (["ack", "--agent", "w", "--seq", "9", "--json"],
     "Invalid value for '--seq': no message has seq 9; the last seq is 0", "--seq", 2),
    (["poll", "--agent", "w", "--limit", "0", "--json"],
     "Invalid value for '--limit': 0 is not in the range 1<=x<=10000.", "--limit", 2),
    (["--json", "cursor", "delete", "w"],
     "Invalid value for 'AGENT': no consumer 'w' (known: none yet); see `bus consumers`",
     "AGENT", 2),
    (["--json", "channel", "send", "--channel", "c", "--from", "o", "--type", "bogus",
      "--content", "x"],
     "Invalid value for '--type': 'bogus' is not one of text, command, query, response,"
     " acknowledgment, notification, event", "--type", 2),
    (["--json", "channel", "send", "--from", "o", "--type", "text", "--content", "x"],
     "Missing option '--channel'.", "--channel", 2),
    (["--json", "cursor", "set", "nobody", "--latest"],
     "Invalid value for 'AGENT': no consumer 'nobody' (known: none yet); pass --create to"
     " start a new consumer", "AGENT", 2),
])
def test_errors_as_json_on_stderr(bus: Bus, db_path: Path, args, error, field, code) -> None:
    result = run(args, db_path)
    assert result.exit_code == code
    assert result.stdout == ""
    assert json.loads(result.stderr) == {"error": error, "field": field}


def test_errors_without_json_stay_text(bus: Bus, db_path: Path) -> None:
    result = run(["ack", "--agent", "w", "--seq", "9"], db_path)
    assert (result.exit_code, result.stderr) == (2, (
        "Usage: main ack [OPTIONS]\nTry 'main ack --help' for help.\n\n"
        "Error: Invalid value for '--seq': no message has seq 9; the last seq is 0\n"))


def test_json_error_for_a_missing_file(tmp_path: Path) -> None:
    result = run(["--json", "status"], tmp_path / "none.db")
    assert result.exit_code == 1
    error = json.loads(result.stderr)
    assert error["field"] is None and error["error"].startswith("no bus database at ")


def test_help_command_shows_a_command_help() -> None:
    assert run(["help", "channel", "send"]).stdout == run(["channel", "send", "--help"]).stdout
    assert run(["help", "status"]).stdout == run(["status", "--help"]).stdout
    assert run(["help"]).stdout == run(["--help"]).stdout


def test_help_command_unknown() -> None:
    result = run(["help", "channel", "nope"])
    assert result.exit_code == 2
    assert "no command `bus channel nope`; `bus --help` lists them" in result.stderr


def test_every_command_help_has_an_example() -> None:
    from bus.cli import main
    from bus.cli.layout import leaf_commands
    missing = [c.name for c in leaf_commands(main) if "Example" not in (c.help or "")]
    assert missing == []


def test_shell_completion_script_and_answers(python_env) -> None:
    bus_command = [str(Path(sys.executable).parent / "bus")]  # the installed entry point
    script = subprocess.run(bus_command, env={**python_env, "_BUS_COMPLETE": "bash_source"},
                            capture_output=True, text=True)
    assert script.returncode == 0 and "_bus_completion" in script.stdout
    # What bash asks: complete `bus cons` (the prog name comes from argv[0]).
    env = {**python_env, "_BUS_COMPLETE": "bash_complete", "COMP_WORDS": "bus cons",
           "COMP_CWORD": "1"}
    answer = subprocess.run([*bus_command], env=env, capture_output=True, text=True)
    assert answer.returncode == 0
    assert "plain,consumer\n" in answer.stdout and "plain,consumers\n" in answer.stdout


def test_json_before_sql_is_its_array(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t")
    result = run(["--json", "sql", "SELECT seq, type FROM messages"], db_path)
    assert json.loads(result.stdout) == [{"seq": 1, "type": "t"}]
