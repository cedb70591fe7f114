"""Every library error names the flag the user typed: the map from ValidationFailed.field
to the command line (bus/cli/flags.py), checked against every field the code raises."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import click
import pytest

from bus.cli import main as bus_main
from bus.cli.flags import in_flags
from bus.cli.flags import parameter_of
from bus.cli.flags import typed_name
from bus.cli.layout import leaf_commands
from tests.support.cli_helpers import run
from workers.cli import main as worker_main

ROOT = Path(__file__).resolve().parents[2]
FIELD = re.compile(r"[a-z_]+(\.[a-z_]+)?")

# Fields the library raises that no command takes as a value: each with where it comes from.
NOT_ON_THE_COMMAND_LINE = {
    "mode": "bus.reservations.reserve(mode=...): bus reserve gives it by --exclusive/--shared,"
            " never a bad one",
    "blob_threshold": "Bus.open(blob_threshold=...): no flag",
    "handler": "process_loop's handler: a Python callable, no command",
    "max_messages": "process_loop(max_messages=...): no command runs the loop",
    "filter": "MessageFilter passed whole from Python",
    "filter.topic_pattern": "MessageFilter from Python; the CLI has no topic filter",
    "max_payload_bytes": "bus --max-payload-bytes is an IntRange",
    "now": "an injected clock (tests, the pump)",
    "search": "bus search without --enable first: a state of the bus",
    "since_ms": "bus search --since is parsed by its own click type",
    "thresholds": "bus alive --warn/--stale/--dead together: no single flag",
    "thread": "pump threads: XML envelopes and the registry",
    "thread_id": "pump threads: a caller-chosen UUID, from Python",
    "durability": "bus --durability is a Choice",
    "echo": "channel settings from Python (bus channel create has --echo as a flag)",
    "organism": "an organism's name, read from organism.yaml",
    "recipient": "a dead letter's recipient who left its channel (bus dlq replay)",
    "stdin": "bus hook claude: the event Claude Code sends on stdin",
    "hooks": "bus hook install claude: a .claude/settings.json whose hooks is no object",
    "moment": "heartbeats.presence: a session's moment, which bus hook claude maps from its event",
    "before": "bus serve's message browser: /messages?before=SEQ, a URL parameter",
    "text": "bus serve's message browser: /messages?text=..., a URL parameter",
    "via": "Bus.record_delivered(via=...): the place that showed a message, set by the bus",
    "session": "Bus.record_delivered(session=...): a hook's session id, read from the event",
    "headers": "bus mirror nats --import: a JetStream message's Bus-From and Bus-Type headers",
}


def raised_fields() -> set[str]:
    """Every literal field given to ValidationFailed or a validate_* helper in bus/ and workers/."""
    found = set()
    for package in ("bus", "workers"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                position = 0 if name == "ValidationFailed" else 1 if name.startswith(
                    "validate_") else None
                if position is None or len(node.args) <= position:
                    continue
                arg = node.args[position]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                        and FIELD.fullmatch(arg.value):
                    found.add(arg.value)
    return found


def commands() -> list[click.Command]:
    return [*leaf_commands(bus_main), *leaf_commands(worker_main)]


def test_every_field_the_library_raises_names_a_flag_or_is_listed() -> None:
    fields = raised_fields()
    assert len(fields) > 30  # the scan found the library's fields
    on_the_command_line = {f for f in fields
                           if any(parameter_of(c, f) is not None for c in commands())}
    assert fields - on_the_command_line - set(NOT_ON_THE_COMMAND_LINE) == set()
    assert set(NOT_ON_THE_COMMAND_LINE) & on_the_command_line == set()


def test_every_parameter_is_found_by_its_own_name() -> None:
    for command in commands():
        for param in command.params:
            if param.expose_value and param.name:
                # (several options may share a name: bus sql --csv / --json-array set `shape`)
                assert parameter_of(command, param.name).name == param.name, command.name


@pytest.mark.parametrize("command, field, flag", [
    ("publish", "from_agent", "--from"),
    ("publish", "type", "--type"),
    ("publish", "id", "--id"),
    ("publish", "correlation_id", "--correlation-id"),
    ("ack", "seq", "--seq"),
    ("claim", "lease_ms", "--lease-ms"),
    ("compact", "keep_days", "--keep-days"),
])
def test_library_fields_map_to_the_flags_typed(command: str, field: str, flag: str) -> None:
    assert typed_name(parameter_of(bus_main.commands[command], field)) == flag


def test_python_keywords_in_a_reason_become_flags() -> None:
    cursor_set = bus_main.commands["cursor"].commands["set"]
    assert in_flags(cursor_set, "pass force=True to replay them") == "pass --force to replay them"
    assert in_flags(cursor_set, "pass other=True") == "pass other=True"


@pytest.mark.parametrize("args, flag", [
    (["publish", "--from", "a b", "--type", "t"], "--from"),
    (["publish", "--from", "a", "--type", ""], "--type"),
    (["publish", "--from", "a", "--type", "t", "--id", "x"], "--id"),
    (["channel", "send", "--channel", "nope", "--from", "a", "--type", "text", "--content", "x"],
     "--channel"),
    (["channel", "create", "c", "--type", "bogus", "--owner", "o"], "--type"),
    (["heartbeat", "--agent", "a", "--progress", "2"], "--progress"),
    (["compact", "--keep-days", "-1"], "--keep-days"),
])
def test_refused_values_exit_2_naming_the_flag_in_json(db_path: Path, args, flag: str) -> None:
    run(["init"], db_path)
    result = run(["--json", *args], db_path)
    assert result.exit_code == 2
    error = json.loads(result.stderr)
    assert error["field"] == flag and error["error"].startswith(f"Invalid value for '{flag}': ")
