"""`bus task ...`: the task graph from the shell, text and --json, errors and exit codes."""

from __future__ import annotations

import json

import pytest

from bus import Bus
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import iso
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run


@pytest.fixture
def graph(db_path):
    """design <- build <- ship, and ship waits on design too."""
    assert run(["init"], db_path).exit_code == 0
    for args in (["design", "--title", "Design it"], ["build", "--after", "design",
                                                      "--priority", "1"],
                 ["ship", "--after", "build", "--after", "design"]):
        assert run(["task", "add", *args], db_path).exit_code == 0
    return db_path


def test_cli_tasks_add_says_what_it_waits_on(db_path):
    run(["init"], db_path)
    result = run(["task", "add", "a", "--title", "A"], db_path)
    assert (result.exit_code, result.output) == (0, "added a (priority 2)\n")
    result = run(["task", "add", "b", "--after", "a", "--priority", "0", "--json"], db_path)
    assert result.exit_code == 0
    added = json.loads(result.output)
    assert {k: added[k] for k in ("task", "priority", "state", "waiting_on", "after")} == {
        "task": "b", "priority": 0, "state": "open", "waiting_on": 1, "after": ["a"]}
    result = run(["task", "add", "c", "--after", "a", "--after", "b"], db_path)
    assert result.output == "added c (priority 2, waiting on a, b)\n"


def test_cli_tasks_ready_list_and_show(graph):
    assert run(["task", "ready"], graph).output == (
        "task    priority  title\n"
        "design  2         Design it\n")
    assert [t["task"] for t in json_lines(run(["task", "ready", "--json"], graph).output)] == [
        "design"]
    assert run(["task", "list"], graph).output == (
        "task    priority  state  waiting_on  title\n"
        "design  2         open   0           Design it\n"
        "build   1         open   1\n"
        "ship    2         open   2\n")
    assert run(["task", "list", "--state", "done"], graph).output == "no done tasks\n"
    shown = run(["task", "show", "build"], graph).output.splitlines()
    assert shown[1:2] == ["state:        blocked (waiting on 1)"]
    assert "waits on:     design (open)" in shown and "needed by:    ship (open)" in shown
    detail = json.loads(run(["task", "show", "design", "--json"], graph).output)
    assert [d["task"] for d in detail["dependents"]] == ["build", "ship"]
    assert (detail["ready"], detail["holder"], detail["events"]) == (True, None, [])


def test_cli_tasks_claim_next_then_done_unblocks_the_next(graph):
    result = run(["task", "claim-next", "--agent", "w1", "--lease-ms", "60000", "--json"], graph)
    assert result.exit_code == 0
    claimed = json.loads(result.output)
    assert (claimed["claimed"], claimed["task"], claimed["agent"], claimed["fence"]) == (
        True, "design", "w1", 1)
    with Bus.open(graph) as bus:
        [claim] = bus.claims.list()
    assert claimed["lease_until_ms"] == claim.lease_until_ms
    nothing = run(["task", "claim-next", "--agent", "w2"], graph)
    assert nothing.exit_code == 1
    assert nothing.stderr == ("Error: no task is ready: see `bus task list --state open` for"
                              " what the open ones wait on\n")
    nothing = run(["task", "claim-next", "--agent", "w2", "--json"], graph)
    assert (nothing.exit_code, json.loads(nothing.output)) == (1, {"claimed": False,
                                                                   "task": None})
    done = run(["task", "done", "design", "--agent", "w1", "--fence", "1"], graph)
    assert (done.exit_code, done.output) == (0, "design is done\n")
    result = run(["task", "claim-next", "--agent", "w2"], graph)
    with Bus.open(graph) as bus:
        [claim] = bus.claims.list()
    assert result.output == f"w2 holds build until {iso(claim.lease_until_ms)} (fence 1)\n"
    shown = json.loads(run(["task", "show", "design", "--json"], graph).output)
    assert (shown["state"], shown["finished_by"]) == ("done", "w1")
    assert [e["type"] for e in shown["events"]] == ["task_done"]


def test_cli_tasks_done_by_another_agent_is_refused_with_exit_1(graph):
    run(["task", "claim-next", "--agent", "w1"], graph)
    result = run(["task", "done", "design", "--agent", "w2"], graph)
    assert result.exit_code == 1
    assert result.stderr == ("Error: --agent w2 does not hold design (w1 holds it); take it with"
                             " `bus task claim-next` or `bus claim` before marking it done\n")
    result = run(["task", "done", "design", "--agent", "w2", "--json"], graph)
    assert result.exit_code == 1 and json.loads(result.stderr)["field"] == "--agent"
    result = run(["task", "done", "build", "--agent", "w1"], graph)
    assert result.exit_code == 1 and "build is waiting on design" in result.stderr
    with Bus.open(graph) as bus:
        assert bus.tasks.find("design").state == "open"


def test_cli_tasks_unknown_dependency_and_cycle_are_usage_errors(graph):
    result = run(["task", "add", "x", "--after", "nope"], graph)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "--after", "no task 'nope' in the task graph; add it first with `bus task add`"
                   " (or list them with `bus task list`)")
    result = run(["task", "depend", "design", "--after", "ship", "--json"], graph)
    assert result.exit_code == 2
    error = json.loads(result.stderr)
    assert error["field"] == "--after"
    assert error["error"] == (
        "Invalid value for '--after': design cannot wait on ship: that closes the cycle"
        " design -> ship -> design (each waits on the next); drop one of these dependencies")
    result = run(["task", "add", "y", "--priority", "5"], graph)
    assert result.exit_code == 2 and "'--priority'" in result.stderr
    with Bus.open(graph) as bus:
        assert [t.task_id for t in bus.tasks.list()] == ["design", "build", "ship"]


def test_cli_tasks_cancel_and_its_refusals(graph):
    result = run(["task", "cancel", "ship", "--agent", "lead", "--reason", "later"], graph)
    assert (result.exit_code, result.output) == (0, "ship is cancelled\n")
    again = run(["task", "cancel", "ship", "--json"], graph)
    assert again.exit_code == 1
    assert json.loads(again.stderr) == {
        "error": "task: ship is cancelled, so `task cancel` does nothing; it cannot be cancelled",
        "field": "task"}
    missing = run(["task", "cancel", "nope"], graph)
    assert missing.exit_code == 1 and "no task 'nope'" in missing.stderr
    with Bus.open(graph) as bus:
        [event] = [m for m in bus.list_messages(0, 100) if m.type == "task_cancelled"]
    assert (event.from_agent, event.payload["reason"]) == ("lead", "later")


def test_cli_tasks_every_command_has_help_with_an_example():
    for name in ("add", "depend", "ready", "list", "show", "claim-next", "done", "cancel"):
        result = run(["task", name, "--help"])
        assert result.exit_code == 0 and "Example: bus task " in result.output, name


def test_cli_tasks_done_with_a_stale_fence_is_refused_naming_the_current_one(graph):
    """A holder paused past its lease wakes up after another agent took the task over."""
    with Bus.open(graph) as bus:
        first = bus.tasks.claim_next("w1", 1, now=1_700_000_000_000)  # a lease long over
    taken = json.loads(run(["task", "claim-next", "--agent", "w2", "--json"], graph).output)
    assert (first.fence, taken["task"], taken["fence"]) == (1, "design", 2)
    result = run(["task", "done", "design", "--agent", "w1", "--fence", "1"], graph)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: --fence 1 is stale: the current fence of task"
                                    " design is 2 (held by w2")
    refused = run(["task", "done", "design", "--agent", "w1", "--fence", "1", "--json"], graph)
    assert refused.exit_code == 1 and json.loads(refused.stderr)["field"] == "--fence"
    shown = json.loads(run(["task", "show", "design", "--json"], graph).output)
    assert (shown["state"], shown["holder"], shown["fence"]) == ("open", "w2", 2)
    done = run(["task", "done", "design", "--agent", "w2", "--fence", "2"], graph)
    assert (done.exit_code, done.output) == (0, "design is done\n")
