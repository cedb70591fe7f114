"""`bus --help` by part, commands under the part they belong to, old names as hidden aliases."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys

import pytest

from bus.cli import main
from bus.cli.layout import MOVED
from bus.cli.layout import SECTIONS
from bus.cli.root import COMMAND_MODULES
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT

NOTE = re.compile(r"note: `bus (\S+)` is now `bus (\S+ \S+)`; the old name goes in the next release")


def section_of_help(text: str) -> dict[str, list[str]]:
    """Section title -> command names, read back from `bus --help`."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current and line.startswith("  ") and not line.startswith("   "):
            sections[current].append(line.split()[0])
    return sections


def test_cli_help_lists_every_visible_command_once_under_its_part():
    result = run(["--help"])
    assert result.exit_code == 0
    sections = section_of_help(result.stdout)
    assert list(sections) == ["Options", "Log", "Coordination", "Channels", "Pump and XML",
                              "Agents", "Export and history", "Beyond one host", "Admin"]
    listed = [name for title, names in sections.items() if title != "Options" for name in names]
    visible = sorted(name for name, cmd in main.commands.items() if not cmd.hidden)
    assert sorted(listed) == visible
    assert {title: names for title, names in sections.items() if title != "Options"} == {
        title: list(names) for title, names in SECTIONS}


# Section title -> the module under bus/cli/ that holds its commands: one module per section.
SECTION_MODULES = {"Log": "log", "Coordination": "coordination", "Channels": "channels",
                   "Pump and XML": "pump", "Agents": "agents", "Export and history": "history",
                   "Beyond one host": "replication", "Admin": "admin"}


def test_cli_each_section_is_one_module_holding_exactly_its_commands():
    """A command defined in another section's module would fail here, not drift."""
    assert [title for title, _ in SECTIONS] == list(SECTION_MODULES)
    assert COMMAND_MODULES == tuple(SECTION_MODULES.values())
    for title, names in SECTIONS:
        module = importlib.import_module(f"bus.cli.{SECTION_MODULES[title]}")
        assert [command.name for command in module.COMMANDS] == list(names), title


def test_cli_moved_commands_are_hidden_from_help():
    top = run(["--help"]).stdout
    for old in MOVED:
        assert not re.search(rf"^  {old}\b", top, re.M), old


@pytest.mark.parametrize("group,command", [("channel", "thread"), ("channel", "send"),
                                           ("pump", "threads"), ("pump", "organism"),
                                           ("pump", "oob")])
def test_cli_each_part_has_its_commands(group, command):
    assert command in main.commands[group].commands
    assert run([group, command, "--help"]).exit_code == 0


def test_cli_channel_thread_and_pump_threads_are_different_things(db_path):
    assert run(["init"], db_path).exit_code == 0
    threads = run(["pump", "threads"], db_path)
    assert (threads.exit_code, threads.stdout) == (0, "no threads\n")
    thread = run(["channel", "thread", "no-such-correlation"], db_path)
    assert (thread.exit_code, thread.stdout) == (0, "")


def test_cli_old_name_runs_the_same_command_and_says_its_new_name(db_path):
    assert run(["init"], db_path).exit_code == 0
    run(["channel", "create", "pe", "--type", "direct", "--owner", "planner"], db_path)
    run(["channel", "join", "pe", "--agent", "executor"], db_path)
    old = run(["send", "--channel", "pe", "--from", "planner", "--type", "text",
               "--content", "hi", "--json"], db_path)
    assert old.exit_code == 0
    assert NOTE.fullmatch(old.stderr.strip()).groups() == ("send", "channel send")
    assert json.loads(old.stdout)["seq"] == 1
    new = run(["channel", "receive", "--agent", "executor", "--json"], db_path)
    assert new.stderr.count("note:") == 0
    assert [m["content"] for m in map(json.loads, new.stdout.splitlines())] == ["hi"]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_cli_every_old_name_still_answers(old, db_path):
    assert run(["init"], db_path).exit_code == 0
    helped = run([old, "--help"])
    assert helped.exit_code == 0
    usage, _, summary = helped.stdout.splitlines()[:3]
    assert usage.split()[2] == old
    assert summary.strip() == f"Renamed: use `bus {MOVED[old]} {old}`."



def test_cli_old_group_name_runs_its_subcommands(db_path, tmp_path):
    organism = tmp_path / "organism.yaml"
    organism.write_text("name: demo\nlisteners:\n  - name: calc\n    root_tag: plus\n"
                        "    payload: nowhere:Plus\n    handler: nowhere:plus\n")
    old = run(["organism", "check", str(organism)], db_path)
    new = run(["pump", "organism", "check", str(organism)], db_path)
    assert (old.exit_code, old.stdout) == (new.exit_code, new.stdout) == (1, "")
    note, error = old.stderr.splitlines()
    assert NOTE.fullmatch(note).groups() == ("organism", "pump organism")
    assert error == new.stderr.strip()
    assert "nowhere" in error


def test_cli_old_name_in_a_real_process(db_path):
    subprocess.run([sys.executable, "-m", "bus.cli", "--db", str(db_path), "init"], check=True,
                   capture_output=True)
    old = subprocess.run([sys.executable, "-m", "bus.cli", "--db", str(db_path), "threads"],
                         capture_output=True, text=True)
    assert (old.returncode, old.stdout) == (0, "no threads\n")
    assert "`bus threads` is now `bus pump threads`" in old.stderr


def bus_commands_the_demo_runs() -> list[tuple[int, str]]:
    """(line, top-level name) of every `cli("bus", NAME, ...)` and `_argv("bus", [NAME, ...])`
    in scripts/demo.py."""
    tree = ast.parse((REPO_ROOT / "scripts" / "demo.py").read_text())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("cli", "_argv") and len(node.args) >= 2
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "bus"):
            continue
        name = node.args[1].elts[0] if isinstance(node.args[1], ast.List) else node.args[1]
        if isinstance(name, ast.Constant):
            found.append((node.lineno, name.value))
    return found


def test_demo_runs_only_current_command_names():
    # `make demo` is what a newcomer reads first: it must not teach a name that prints a note.
    used = bus_commands_the_demo_runs()
    assert {"export", "history", "pump"} <= {name for _, name in used}  # the walk found them
    stale = [(line, name) for line, name in used
             if name not in main.commands or main.commands[name].hidden or name in MOVED]
    assert stale == []


# Runs `bus` as `python -m bus.cli` does, then prints the modules the process imported.
RUN_AND_LIST_MODULES = """
import runpy, sys
sys.argv = ["bus", *sys.argv[1:]]
try:
    runpy.run_module("bus.cli", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
print(*sys.modules, file=sys.stderr)
"""


def imported_modules(*argv: str) -> set[str]:
    """The modules a real `bus` process imports to run `argv`."""
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES, *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stderr.split())


def test_cli_a_command_run_by_name_loads_its_own_part_only(db_path) -> None:
    """`bus channel list` imports the channels' commands, not the pump's, lxml or the server:
    every `bus` process would pay for the whole CLI otherwise; `--help` still loads all."""
    run(["--db", str(db_path), "init"])
    alone = imported_modules("--db", str(db_path), "channel", "list")
    assert "bus.cli.channels" in alone
    assert not alone & {"bus.cli.pump", "bus.pump", "lxml", "bus.cli.admin", "bus.views.serve"}
    assert {"bus.cli.pump", "bus.cli.admin"} <= imported_modules("--help")
    assert run(["--db", str(db_path), "channel", "list", "--db", str(db_path)]).exit_code == 0
