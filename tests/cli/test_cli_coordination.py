"""The `bus` coordination commands: heartbeat, alive, claim, renew, release,
claims, reap, gc, compact; and poll --wait / tail --follow as real processes.

In-process tests drive `bus.cli.main` with click's CliRunner and compare
whole outputs; times that come from the clock are read back from the
database (or, for relative ages, matched loosely). Two tests run the CLI as a
real subprocess, because they depend on another process committing while
the CLI waits.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from datetime import datetime
from datetime import timezone
from pathlib import Path

import orjson
import pytest

from bus import Bus
from bus.coordination.heartbeats import KEEP
from bus.log.messages import now_ms
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import iso
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.support.hook_harness import has_inotify_fd

DAY_MS = 86_400_000
ISO_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


# --- helpers ----------------------------------------------------------------------


def parse_iso(text: str) -> int:
    moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return round(moment.timestamp() * 1000)


def make_silent(bus: Bus, agent: str, seconds: float) -> int:
    """Move the agent's last heartbeat `seconds` into the past; return its new ts_ms."""
    ts = now_ms() - int(seconds * 1000)
    bus.conn.execute("UPDATE heartbeats SET ts_ms = ? WHERE agent_id = ?", (ts, agent))
    return ts


def heartbeat_row(bus: Bus, agent: str) -> tuple:
    return bus.conn.execute(
        "SELECT ts_ms, status, current_task, progress FROM heartbeats WHERE agent_id = ?",
        (agent,)).fetchone()


def claim_of(bus: Bus, task: str):
    return next((c for c in bus.claims.list() if c.task_id == task), None)


def make_old(path: Path, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(path, (when, when))


def expired_claim(bus: Bus, task: str, agent: str, max_attempts: int = 5) -> None:
    """A claim whose one-second lease ran out ten seconds ago."""
    assert bus.claims.claim(task, agent, 1000, max_attempts=max_attempts, now=now_ms() - 10_000)


# --- missing database --------------------------------------------------------------


NEW_COMMANDS = [
    pytest.param(["heartbeat", "--agent", "a"], id="heartbeat"),
    pytest.param(["alive"], id="alive"),
    pytest.param(["forget", "a"], id="forget"),
    pytest.param(["claim", "--task", "t", "--agent", "a"], id="claim"),
    pytest.param(["renew", "--task", "t", "--agent", "a"], id="renew"),
    pytest.param(["release", "--task", "t", "--agent", "a"], id="release"),
    pytest.param(["claims"], id="claims"),
    pytest.param(["claims", "--dead"], id="claims-dead"),
    pytest.param(["reap"], id="reap"),
    pytest.param(["gc"], id="gc"),
    pytest.param(["compact"], id="compact"),
    pytest.param(["compact", "--dry-run"], id="compact-dry-run"),
]


@pytest.mark.parametrize("args", NEW_COMMANDS)
def test_coordination_commands_missing_database_exit_1_without_creating_it(tmp_path: Path,
                                                                          args) -> None:
    db = tmp_path / "missing" / "bus.db"
    expected = f"no bus database at {db}; create it with `bus init`"
    result = run(args, db)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.startswith(f"Error: {expected}")
    as_json = run(args + ["--json"], db)  # with --json the error is a JSON object too
    assert (as_json.exit_code, as_json.stdout) == (1, "")
    assert json.loads(as_json.stderr)["error"].startswith(expected)
    assert not db.parent.exists()


@pytest.mark.parametrize("command", ["heartbeat", "alive", "forget", "claim", "renew", "release",
                                     "claims",
                                     "reap", "gc", "compact"])
def test_coordination_commands_listed_with_help_and_example(command: str) -> None:
    assert f"  {command} " in run(["--help"]).stdout
    result = run([command, "--help"])
    assert result.exit_code == 0
    assert f"Example: bus {command}" in result.stdout


# --- heartbeat ---------------------------------------------------------------------


def test_heartbeat_prints_human_line_and_records_beat(bus: Bus, db_path: Path) -> None:
    result = run(["heartbeat", "--agent", "w1"], db_path)
    assert result.exit_code == 0
    ts, status, task, progress = heartbeat_row(bus, "w1")
    assert (status, task, progress) == ("idle", None, None)
    assert result.stdout == f"heartbeat for w1 at {iso(ts)} (idle)\n"
    assert result.stderr == ""


def test_heartbeat_json_with_status_task_and_progress(bus: Bus, db_path: Path) -> None:
    result = run(["heartbeat", "--agent", "w1", "--status", "working", "--task", "t1",
                  "--progress", "0.5", "--json"], db_path)
    assert result.exit_code == 0
    ts, status, task, progress = heartbeat_row(bus, "w1")
    assert (status, task, progress) == ("working", "t1", 0.5)
    assert json.loads(result.stdout) == {"agent": "w1", "ts_ms": ts, "status": "working",
                                         "task": "t1", "progress": 0.5}
    assert list(json.loads(result.stdout)) == ["agent", "ts_ms", "status", "task", "progress"]


def test_heartbeat_again_replaces_the_agents_row(bus: Bus, db_path: Path) -> None:
    assert run(["heartbeat", "--agent", "w1", "--status", "working", "--task", "t1"],
               db_path).exit_code == 0
    result = run(["heartbeat", "--agent", "w1", "--status", "blocked"], db_path)
    assert result.exit_code == 0
    assert bus.conn.execute("SELECT count(*) FROM heartbeats").get == 1
    ts, status, task, progress = heartbeat_row(bus, "w1")
    assert (status, task, progress) == ("blocked", "t1", None)
    assert result.stdout == f"heartbeat for w1 at {iso(ts)} (blocked)\n"


def test_heartbeat_without_task_keeps_the_task_and_progress(bus: Bus, db_path: Path) -> None:
    run(["heartbeat", "--agent", "w1", "--status", "working", "--task", "t1", "--progress",
         "0.5"], db_path)
    result = run(["heartbeat", "--agent", "w1", "--status", "working", "--json"], db_path)
    assert heartbeat_row(bus, "w1")[1:] == ("working", "t1", 0.5)
    assert json.loads(result.stdout)["task"] == "t1"
    assert json.loads(result.stdout)["progress"] == 0.5
    run(["heartbeat", "--agent", "w1", "--status", "working", "--progress", "0.75"], db_path)
    assert heartbeat_row(bus, "w1")[1:] == ("working", "t1", 0.75)


def test_heartbeat_with_an_empty_task_clears_task_and_progress(bus: Bus, db_path: Path) -> None:
    run(["heartbeat", "--agent", "w1", "--task", "t1", "--progress", "0.5"], db_path)
    assert run(["heartbeat", "--agent", "w1", "--task", ""], db_path).exit_code == 0
    assert heartbeat_row(bus, "w1")[1:] == ("idle", None, None)


def test_heartbeat_with_a_new_task_starts_its_progress_afresh(bus: Bus, db_path: Path) -> None:
    run(["heartbeat", "--agent", "w1", "--task", "t1", "--progress", "0.5"], db_path)
    run(["heartbeat", "--agent", "w1", "--task", "t1"], db_path)
    assert heartbeat_row(bus, "w1")[2:] == ("t1", 0.5)
    run(["heartbeat", "--agent", "w1", "--task", "t2"], db_path)
    assert heartbeat_row(bus, "w1")[2:] == ("t2", None)


def test_heartbeat_python_api_none_clears_and_keep_keeps(bus: Bus) -> None:
    bus.heartbeats.beat("w1", "working", "t1", 0.5)
    bus.heartbeats.beat("w1", "working", KEEP, KEEP)
    assert heartbeat_row(bus, "w1")[2:] == ("t1", 0.5)
    bus.heartbeats.beat("w1", "working")
    assert heartbeat_row(bus, "w1")[2:] == (None, None)


def test_heartbeat_unknown_status_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["heartbeat", "--agent", "w1", "--status", "sleeping"], db_path)
    assert result.exit_code == 2
    assert "Invalid value for '--status'" in result.stderr
    assert "'idle', 'working', 'blocked'" in result.stderr
    assert bus.heartbeats.liveness() == []


@pytest.mark.parametrize("value, shown", [("50", "50.0"), ("-0.1", "-0.1"), ("1.5", "1.5"),
                                          ("nan", "nan")])
def test_heartbeat_progress_outside_0_1_exits_2(bus: Bus, db_path: Path, value: str,
                                                shown: str) -> None:
    result = run(["heartbeat", "--agent", "w1", "--progress", value], db_path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert last_error(result.stderr) == bad_value(
        "--progress", f"is a fraction from 0 to 1, got {shown} (50% is 0.5)")
    assert bus.heartbeats.liveness() == []


def test_heartbeat_bad_arguments(bus: Bus, db_path: Path) -> None:
    not_a_number = run(["heartbeat", "--agent", "w1", "--progress", "half"], db_path)
    assert not_a_number.exit_code == 2
    missing_agent = run(["heartbeat"], db_path)
    assert missing_agent.exit_code == 2
    assert "Missing option '--agent'" in missing_agent.stderr
    bad_agent = run(["heartbeat", "--agent", "w 1"], db_path)
    assert bad_agent.exit_code == 2
    assert last_error(bad_agent.stderr) == bad_value(
        "--agent", "contains ' '; allowed are letters, digits and . _ : -")
    assert bus.heartbeats.liveness() == []


# --- alive ---------------------------------------------------------------------------


def test_alive_without_heartbeats(bus: Bus, db_path: Path) -> None:
    result = run(["alive"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "no running agents; --all shows stopped ones too\n", "")
    result = run(["alive", "--all"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "no heartbeats yet\n", "")
    result = run(["alive", "--json"], db_path)
    assert (result.exit_code, result.stdout) == (0, "")


def test_alive_hides_stopped_agents_unless_all(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1", "working", "t1")
    bus.heartbeats.beat("w2", "stopped", "t2")
    make_silent(bus, "w2", 500)  # silent long enough to be dead, but it stopped cleanly
    result = run(["alive", "--json"], db_path)
    assert [r["agent"] for r in json_lines(result.stdout)] == ["w1"]
    result = run(["alive", "--all", "--json"], db_path)
    assert [(r["agent"], r["state"], r["status"]) for r in json_lines(result.stdout)] == [
        ("w1", "alive", "working"), ("w2", "stopped", "stopped")]
    lines = run(["alive", "--all"], db_path).stdout.splitlines()
    assert re.fullmatch(r"w2     stopped  5\d\d\.\d     stopped  t2", lines[2]), lines[2]


# --- forget --------------------------------------------------------------------------


def test_forget_removes_the_heartbeat_row(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1", "stopped", "t1")
    bus.heartbeats.beat("w2")
    result = run(["forget", "w1"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "forgot w1\n", "")
    assert [b.agent for b in bus.heartbeats.liveness()] == ["w2"]
    result = run(["forget", "w1", "--json"], db_path)
    assert (result.exit_code, result.stdout) == (0, '{"agent":"w1","forgotten":false}\n')
    result = run(["forget", "w1"], db_path)
    assert result.stdout == "w1 had no heartbeat; nothing to forget\n"


def test_forget_refused_while_the_agent_holds_claims(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    assert bus.claims.claim("t2", "w1", 60_000)
    expired_claim(bus, "t1", "w1")  # an expired claim is still held until someone takes it
    result = run(["forget", "w1"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (
        1, "", "Error: agent w1 holds claims on t1, t2; release them (bus release --task T"
               " --agent w1) or let another agent take them over first\n")
    assert [b.agent for b in bus.heartbeats.liveness()] == ["w1"]
    assert bus.claims.release("t1", "w1") and bus.claims.release("t2", "w1")
    assert run(["forget", "w1"], db_path).stdout == "forgot w1\n"


def _three_agents(bus: Bus) -> dict[str, int]:
    bus.heartbeats.beat("w1", "working", "t1", 0.25)
    bus.heartbeats.beat("worker-2", "idle")
    bus.heartbeats.beat("w3", "blocked", "t3")
    return {"w1": heartbeat_row(bus, "w1")[0],
            "worker-2": make_silent(bus, "worker-2", 40),
            "w3": make_silent(bus, "w3", 500)}


def test_alive_table_most_silent_first(bus: Bus, db_path: Path) -> None:
    _three_agents(bus)
    result = run(["alive"], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "agent     state  silent_s  status   task  progress"
    # Ages come from the clock: match their digits loosely, the rest exactly.
    assert re.fullmatch(r"w3        dead   5\d\d\.\d     blocked  t3", lines[1]), lines[1]
    assert re.fullmatch(r"worker-2  warn   4\d\.\d      idle", lines[2]), lines[2]
    assert re.fullmatch(r"w1        alive  \d\.\d       working  t1    0\.25", lines[3]), lines[3]
    assert len(lines) == 4


def test_alive_json_objects(bus: Bus, db_path: Path) -> None:
    ts = _three_agents(bus)
    before = now_ms()
    result = run(["alive", "--json"], db_path)
    after = now_ms()
    assert result.exit_code == 0
    rows = json_lines(result.stdout)
    assert [list(r) for r in rows] == [["agent", "state", "age_s", "status", "task", "progress",
                                        "ts_ms"]] * 3
    assert [(r["agent"], r["state"], r["status"], r["task"], r["progress"], r["ts_ms"])
            for r in rows] == [("w3", "dead", "blocked", "t3", None, ts["w3"]),
                               ("worker-2", "warn", "idle", None, None, ts["worker-2"]),
                               ("w1", "alive", "working", "t1", 0.25, ts["w1"])]
    for row in rows:
        assert (before - row["ts_ms"]) / 1000 - 0.001 <= row["age_s"]
        assert row["age_s"] <= (after - row["ts_ms"]) / 1000 + 0.001


@pytest.mark.parametrize("options, state", [
    ([], "warn"),                                          # 40 s: warn from 30 s
    (["--warn", "50"], "alive"),
    (["--warn", "10", "--stale", "39"], "stale"),
    (["--warn", "10", "--stale", "20", "--dead", "39.5"], "dead"),
    (["--warn", "1", "--stale", "1", "--dead", "1"], "dead"),  # equal thresholds are fine
    (["--warn", "100", "--stale", "200", "--dead", "300"], "alive"),
])
def test_alive_thresholds_change_the_state(bus: Bus, db_path: Path, options, state) -> None:
    bus.heartbeats.beat("w1")
    make_silent(bus, "w1", 40)
    result = run(["alive", "--json", *options], db_path)
    assert result.exit_code == 0, result.stderr
    [row] = json_lines(result.stdout)
    assert row["state"] == state
    human = run(["alive", *options], db_path)
    assert human.stdout.splitlines()[1].split()[:2] == ["w1", state]


@pytest.mark.parametrize("options, got", [
    (["--warn", "10", "--stale", "5"], "10.0, 5.0, 300.0"),
    (["--stale", "400"], "30.0, 400.0, 300.0"),
])
def test_alive_threshold_order_violated_exits_1(bus: Bus, db_path: Path, options, got) -> None:
    bus.heartbeats.beat("w1")
    result = run(["alive", *options], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"Error: thresholds: need 0 < warn <= stale <= dead, got {got}\n"


@pytest.mark.parametrize("option", ["--warn", "--stale", "--dead"])
@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_alive_non_positive_threshold_is_usage_error(bus: Bus, db_path: Path, option: str,
                                                     value: str) -> None:
    result = run(["alive", option, value], db_path)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.stderr


# --- claim -----------------------------------------------------------------------------


def test_claim_granted_prints_holder_lease_and_attempt(bus: Bus, db_path: Path) -> None:
    result = run(["claim", "--task", "t1", "--agent", "w1"], db_path)
    assert result.exit_code == 0
    claim = claim_of(bus, "t1")
    assert (claim.agent, claim.attempts, claim.max_attempts, claim.lease_ms) == ("w1", 1, 5, 60_000)
    assert claim.lease_until_ms - claim.claimed_at_ms == 60_000
    assert result.stdout == (f"w1 holds t1 until {iso(claim.lease_until_ms)} (attempt 1 of 5,"
                             " fence 1)\n")
    assert result.stderr == ""


def test_claim_held_by_another_agent_exits_1(bus: Bus, db_path: Path) -> None:
    assert run(["claim", "--task", "t1", "--agent", "w1", "--lease-ms", "30000",
                "--max-attempts", "3"], db_path).exit_code == 0
    held = claim_of(bus, "t1")
    result = run(["claim", "--task", "t1", "--agent", "w2"], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: t1 is held by w1 until {iso(held.lease_until_ms)}"
                             f" (attempt 1 of 3, fence 1)\n")
    assert claim_of(bus, "t1") == held


def test_claim_again_by_holder_extends_the_lease(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1", 1000, now=now_ms() - 500)
    first = claim_of(bus, "t1")
    result = run(["claim", "--task", "t1", "--agent", "w1", "--lease-ms", "90000"], db_path)
    assert result.exit_code == 0
    again = claim_of(bus, "t1")
    assert again.lease_until_ms > first.lease_until_ms
    assert (again.attempts, again.lease_ms, again.claimed_at_ms) == (1, 90_000, first.claimed_at_ms)
    assert result.stdout == (f"w1 holds t1 until {iso(again.lease_until_ms)} (attempt 1 of 5,"
                             " fence 1)\n")  # an extension keeps its fence


def test_claim_expired_lease_is_taken_over_as_next_attempt(bus: Bus, db_path: Path) -> None:
    expired_claim(bus, "t1", "w1")
    result = run(["claim", "--task", "t1", "--agent", "w2"], db_path)
    assert result.exit_code == 0
    claim = claim_of(bus, "t1")
    assert (claim.agent, claim.attempts) == ("w2", 2)
    assert result.stdout == (f"w2 holds t1 until {iso(claim.lease_until_ms)} (attempt 2 of 5,"
                             " fence 2)\n")


def test_claim_json_granted_and_refused(bus: Bus, db_path: Path) -> None:
    granted = run(["claim", "--task", "t1", "--agent", "w1", "--json"], db_path)
    assert granted.exit_code == 0
    claim = claim_of(bus, "t1")
    assert json.loads(granted.stdout) == {"granted": True, "fence": 1,
                                          "claim": claim.to_json_dict(), "dead": None}
    assert json.loads(granted.stdout)["claim"] == {
        "task": "t1", "agent": "w1", "fence": 1, "claimed_at_ms": claim.claimed_at_ms,
        "lease_until_ms": claim.lease_until_ms, "lease_ms": 60_000, "attempts": 1,
        "max_attempts": 5}
    refused = run(["claim", "--task", "t1", "--agent", "w2", "--json"], db_path)
    assert refused.exit_code == 1
    assert refused.stderr == ""
    assert json.loads(refused.stdout) == {"granted": False, "fence": None,
                                          "claim": claim.to_json_dict(), "dead": None}


def test_claim_dead_task_exits_1_and_is_announced_once(bus: Bus, db_path: Path) -> None:
    expired_claim(bus, "t1", "w1", max_attempts=1)
    result = run(["claim", "--task", "t1", "--agent", "w2"], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == ("Error: t1 is dead: lease expired 1 times (max_attempts 1)"
                             " (last holder w1); see bus claims --dead\n")
    [dead] = bus.claims.dead()
    again = run(["claim", "--task", "t1", "--agent", "w3", "--json"], db_path)
    assert again.exit_code == 1
    assert json.loads(again.stdout) == {"granted": False, "fence": None, "claim": None,
                                        "dead": dead.to_json_dict()}
    assert dead.to_json_dict() == {"task": "t1", "last_holder": "w1", "attempts": 1,
                                   "reason": "lease expired 1 times (max_attempts 1)",
                                   "died_at_ms": dead.died_at_ms}
    assert claim_of(bus, "t1") is None
    announced = [m for m in bus.list_messages() if m.type == "task_dead"]
    assert [(m.from_agent, m.to_agent, m.correlation_id, m.payload) for m in announced] == [
        ("bus", None, "t1", dead.to_json_dict())]


@pytest.mark.parametrize("options", [["--lease-ms", "0"], ["--lease-ms", "soon"],
                                     ["--max-attempts", "0"], ["--max-attempts", "-2"]])
def test_claim_bad_numbers_are_usage_errors(bus: Bus, db_path: Path, options) -> None:
    result = run(["claim", "--task", "t1", "--agent", "w1", *options], db_path)
    assert result.exit_code == 2
    assert bus.claims.list() == []


def test_claim_lease_longer_than_a_week_exits_2(bus: Bus, db_path: Path) -> None:
    result = run(["claim", "--task", "t1", "--agent", "w1", "--lease-ms",
                  str(7 * DAY_MS + 1)], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "--lease-ms", f"is {7 * DAY_MS + 1}; the longest lease is {7 * DAY_MS} (7 days)")
    assert bus.claims.list() == []


# --- renew -----------------------------------------------------------------------------


def test_renew_extends_the_holders_lease(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1", 60_000, now=now_ms() - 30_000)
    before = claim_of(bus, "t1")
    result = run(["renew", "--task", "t1", "--agent", "w1"], db_path)
    assert result.exit_code == 0
    after = claim_of(bus, "t1")
    assert after.lease_until_ms >= before.lease_until_ms + 30_000
    assert (after.lease_ms, after.attempts) == (60_000, 1)
    assert result.stdout == f"w1 holds t1 until {iso(after.lease_until_ms)}\n"
    assert result.stderr == ""


def test_renew_with_new_lease_length_and_json(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1", 60_000)
    started = now_ms()
    result = run(["renew", "--task", "t1", "--agent", "w1", "--lease-ms", "120000", "--json"],
                 db_path)
    finished = now_ms()
    assert result.exit_code == 0
    claim = claim_of(bus, "t1")
    assert claim.lease_ms == 120_000
    assert started + 120_000 <= claim.lease_until_ms <= finished + 120_000
    assert json.loads(result.stdout) == {"renewed": True, "claim": claim.to_json_dict()}


def test_renew_by_another_agent_exits_1_naming_the_holder(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1")
    held = claim_of(bus, "t1")
    result = run(["renew", "--task", "t1", "--agent", "w2"], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: w2 has no unexpired lease on t1 (held by w1 until"
                             f" {iso(held.lease_until_ms)}); bus claim takes a task that is"
                             f" free or expired\n")
    assert claim_of(bus, "t1") == held
    as_json = run(["renew", "--task", "t1", "--agent", "w2", "--json"], db_path)
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout) == {"renewed": False, "claim": held.to_json_dict()}


def test_renew_expired_or_unknown_task_exits_1(bus: Bus, db_path: Path) -> None:
    expired_claim(bus, "t1", "w1")
    lapsed = claim_of(bus, "t1")
    result = run(["renew", "--task", "t1", "--agent", "w1"], db_path)
    assert result.exit_code == 1
    assert result.stderr == (f"Error: w1 has no unexpired lease on t1 (the lease of w1 expired"
                             f" at {iso(lapsed.lease_until_ms)}); bus claim takes a task that"
                             f" is free or expired\n")
    assert claim_of(bus, "t1") == lapsed
    unknown = run(["renew", "--task", "t9", "--agent", "w1"], db_path)
    assert unknown.exit_code == 1
    assert unknown.stderr == ("Error: w1 has no unexpired lease on t9 (nobody holds it);"
                              " bus claim takes a task that is free or expired\n")
    as_json = run(["renew", "--task", "t9", "--agent", "w1", "--json"], db_path)
    assert (as_json.exit_code, json.loads(as_json.stdout)) == (1, {"renewed": False,
                                                                  "claim": None})


# --- release -----------------------------------------------------------------------------


def test_release_by_holder(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1")
    result = run(["release", "--task", "t1", "--agent", "w1"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "w1 released t1\n", "")
    assert bus.claims.list() == []
    assert bus.claims.claim("t1", "w2")  # free again


def test_release_by_non_holder_exits_1(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1")
    held = claim_of(bus, "t1")
    result = run(["release", "--task", "t1", "--agent", "w2"], db_path)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "Error: w2 does not hold t1\n"
    assert claim_of(bus, "t1") == held
    unknown = run(["release", "--task", "nothing", "--agent", "w1"], db_path)
    assert unknown.stderr == "Error: w1 does not hold nothing\n"


def test_release_json(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1")
    refused = run(["release", "--task", "t1", "--agent", "w2", "--json"], db_path)
    assert refused.exit_code == 1
    assert json.loads(refused.stdout) == {"released": False, "task": "t1", "agent": "w2"}
    released = run(["release", "--task", "t1", "--agent", "w1", "--json"], db_path)
    assert released.exit_code == 0
    assert json.loads(released.stdout) == {"released": True, "task": "t1", "agent": "w1"}


# --- claims --------------------------------------------------------------------------------


def test_claims_empty(bus: Bus, db_path: Path) -> None:
    assert run(["claims"], db_path).stdout == "no claims\n"
    assert run(["claims", "--dead"], db_path).stdout == "no dead tasks\n"
    assert run(["claims", "--json"], db_path).stdout == ""
    assert run(["claims", "--dead", "--json"], db_path).stdout == ""


def test_claims_table_and_json(bus: Bus, db_path: Path) -> None:
    bus.claims.claim("t1", "w1", 60_000)
    expired_claim(bus, "task-2", "worker-2", max_attempts=3)
    held, lapsed = claim_of(bus, "t1"), claim_of(bus, "task-2")
    result = run(["claims"], db_path)
    assert result.exit_code == 0
    assert result.stdout == (
        f"task    agent     fence  state    lease_until               attempts\n"
        f"t1      w1        1      held     {iso(held.lease_until_ms)}  1/5\n"
        f"task-2  worker-2  1      expired  {iso(lapsed.lease_until_ms)}  1/3\n")
    as_json = run(["claims", "--json"], db_path)
    assert json_lines(as_json.stdout) == [held.to_json_dict(), lapsed.to_json_dict()]


def test_claims_dead_table_and_json(bus: Bus, db_path: Path) -> None:
    expired_claim(bus, "t1", "w1", max_attempts=1)
    assert not bus.claims.claim("t1", "w2")
    [dead] = bus.claims.dead()
    result = run(["claims", "--dead"], db_path)
    assert result.exit_code == 0
    assert result.stdout == (
        f"task  last_holder  attempts  died                      reason\n"
        f"t1    w1           1         {iso(dead.died_at_ms)}  "
        f"lease expired 1 times (max_attempts 1)\n")
    assert json_lines(run(["claims", "--dead", "--json"], db_path).stdout) == [
        dead.to_json_dict()]
    assert run(["claims"], db_path).stdout == "no claims\n"


# --- reap -------------------------------------------------------------------------------------


def test_reap_nothing_to_reap(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    bus.claims.claim("t1", "w1")
    result = run(["reap"], db_path)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "nothing to reap: no live lease is held by a dead agent\n"
    assert run(["reap", "--json"], db_path).stdout == ""
    assert not claim_of(bus, "t1").expired(now_ms())


def test_reap_releases_claims_of_dead_agents(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    bus.heartbeats.beat("w2")
    bus.claims.claim("t1", "w1")
    bus.claims.claim("t2", "w2")
    bus.claims.claim("t3", "nobeat")  # never beat: not known dead, kept
    make_silent(bus, "w1", 1000)
    make_silent(bus, "w2", 200)  # stale, not dead
    result = run(["reap"], db_path)
    assert result.exit_code == 0
    assert result.stdout == "released t1 held by w1 (agent dead, fence 1)\n"
    assert claim_of(bus, "t1").expired(now_ms())
    assert not claim_of(bus, "t2").expired(now_ms())
    assert not claim_of(bus, "t3").expired(now_ms())
    [announced] = bus.list_messages()
    assert (announced.from_agent, announced.to_agent, announced.type,
            announced.correlation_id) == ("bus", None, "task_released", "t1")
    assert {k: v for k, v in announced.payload.items() if k != "silent_s"} == {
        "task": "t1", "agent": "w1", "reason": "agent dead", "fence": 1}
    assert 1000 <= announced.payload["silent_s"] < 1100
    # The lease is over, so a second reap has nothing to do; another agent may take t1.
    assert run(["reap"], db_path).stdout.startswith("nothing to reap")
    assert bus.claims.claim("t1", "w2")
    assert claim_of(bus, "t1").attempts == 2


def test_reap_json_prints_the_claims_as_they_were(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    bus.claims.claim("t1", "w1")
    bus.claims.claim("t2", "w1")
    before = [c.to_json_dict() for c in bus.claims.list()]
    make_silent(bus, "w1", 1000)
    result = run(["reap", "--json"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.stdout) == before


def test_reap_with_lower_thresholds(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    bus.claims.claim("t1", "w1")
    make_silent(bus, "w1", 100)
    assert run(["reap"], db_path).stdout.startswith("nothing to reap")
    result = run(["reap", "--warn", "10", "--dead", "60"], db_path)
    assert result.exit_code == 2  # reap judges by --dead alone
    assert "No such option '--warn'" in result.stderr


def test_alive_dead_alone_lowers_the_other_thresholds(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    make_silent(bus, "w1", 70)
    result = run(["alive", "--dead", "60", "--json"], db_path)
    assert result.exit_code == 0, result.stderr
    assert json_lines(result.stdout)[0]["state"] == "dead"


def test_reap_dead_alone_below_default_stale_works(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("w1")
    bus.claims.claim("t1", "w1")
    make_silent(bus, "w1", 100)
    result = run(["reap", "--dead", "60"], db_path)
    assert (result.exit_code, result.stdout) == (0, "released t1 held by w1 (agent dead, fence 1)\n")


# --- gc ----------------------------------------------------------------------------------------


def test_gc_deletes_old_unreferenced_blobs(bus: Bus, db_path: Path) -> None:
    kept_seq = bus.publish("a", "big", "K" * 5000).seq
    kept = bus.conn.execute("SELECT payload_ref FROM messages WHERE seq = ?", (kept_seq,)).get
    old = bus.blobs.put(orjson.dumps("old orphan"))
    young = bus.blobs.put(orjson.dumps("young orphan"))
    for ref in (kept, old):
        make_old(bus.blobs.path(ref), 7200)
    result = run(["gc"], db_path)
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "deleted 1 unreferenced blob(s)\n", "")
    assert sorted(bus.blobs.list_refs()) == sorted([kept, young])
    as_json = run(["gc", "--grace-seconds", "0", "--json"], db_path)
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout) == {"deleted": [young]}
    assert bus.blobs.list_refs() == [kept]
    assert run(["gc"], db_path).stdout == "deleted 0 unreferenced blob(s)\n"
    assert bus.poll("w1")[0].payload == "K" * 5000


def test_gc_negative_grace_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["gc", "--grace-seconds", "-1"], db_path)
    assert result.exit_code == 2
    assert "Invalid value for '--grace-seconds'" in result.stderr


# --- compact ------------------------------------------------------------------------------------


def _compactable(bus: Bus) -> str:
    """Five messages, three of them ten days old and acked; one old orphaned blob."""
    bus.publish_many([{"from_agent": "a", "type": "t", "payload": n} for n in range(5)])
    bus.conn.execute("UPDATE messages SET ts_ms = ts_ms - ? WHERE seq <= 3", (10 * DAY_MS,))
    bus.ack("w1", 4)
    bus.ack("w2", 3)
    orphan = bus.blobs.put(orjson.dumps("orphan"))
    make_old(bus.blobs.path(orphan), 7200)
    return orphan


def test_compact_dry_run_changes_nothing(bus: Bus, db_path: Path) -> None:
    orphan = _compactable(bus)
    before = now_ms()
    result = run(["compact", "--dry-run"], db_path)
    after = now_ms()
    assert result.exit_code == 0
    match = re.fullmatch(r"would delete 3 message\(s\) older than (\S+) acked by every cursor"
                         r" \(through seq 3\)\n", result.stdout)
    assert match, result.stdout
    assert before - 7 * DAY_MS - 1 <= parse_iso(match.group(1)) <= after - 7 * DAY_MS
    assert bus.message_count() == 5
    assert bus.blobs.list_refs() == [orphan]


def test_compact_deletes_and_reports(bus: Bus, db_path: Path) -> None:
    orphan = _compactable(bus)
    result = run(["compact"], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    match = re.fullmatch(r"deleted 3 message\(s\) older than (" + ISO_RE + r") acked by every"
                         r" cursor \(through seq 3\)\n"
                         r"deleted 1 unreferenced blob\(s\)\n"
                         r"WAL (\d+) -> 0 bytes\n", result.stdout)
    assert match, result.stdout
    assert int(match.group(2)) > 0
    assert [m.seq for m in bus.list_messages()] == [4, 5]
    assert orphan not in bus.blobs.list_refs()
    assert bus.blobs.list_refs() == []


def test_compact_json_and_keep_days(bus: Bus, db_path: Path) -> None:
    _compactable(bus)
    kept = run(["compact", "--keep-days", "30", "--json"], db_path)
    assert kept.exit_code == 0
    report = json.loads(kept.stdout)
    assert list(report) == ["dry_run", "cutoff_ms", "acked_through", "messages", "blobs",
                            "wal_bytes_before", "wal_bytes_after", "checkpoint"]
    assert report["checkpoint"] == "truncate"  # no Litestream beside this bus
    assert (report["dry_run"], report["acked_through"], report["messages"], report["blobs"],
            report["wal_bytes_after"]) == (False, 3, 0, 1, 0)
    assert abs(report["cutoff_ms"] - (now_ms() - 30 * DAY_MS)) < 60_000
    dry = json.loads(run(["compact", "--keep-days", "0", "--dry-run", "--json"], db_path).stdout)
    assert (dry["dry_run"], dry["messages"], dry["blobs"], dry["wal_bytes_before"]) == (
        True, 3, 0, 0)
    gone = json.loads(run(["compact", "--keep-days", "0", "--json"], db_path).stdout)
    assert (gone["messages"], gone["acked_through"]) == (3, 3)
    assert bus.message_count() == 2


@pytest.mark.parametrize("options", [["--keep-days", "-1"], ["--keep-days", "week"],
                                     ["--grace-seconds", "-5"]])
def test_compact_bad_options_are_usage_errors(bus: Bus, db_path: Path, options) -> None:
    result = run(["compact", *options], db_path)
    assert result.exit_code == 2


# --- real subprocesses: poll --wait and tail --follow ------------------------------------------


def child_env(python_env: dict[str, str]) -> dict[str, str]:
    env = dict(python_env)
    env.pop("BUS_DURABILITY", None)
    return env


def restore_sigint() -> None:
    """Run in the child before exec: a SIGINT ignored by our parent must not stay ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def process_sleeps(proc: subprocess.Popen, timeout: float = 15.0) -> bool:
    """Block until `proc` sleeps in select/poll/nanosleep (Linux /proc/<pid>/wchan).

    False where the kernel does not tell; fails if it tells and the process never sleeps.
    """
    wchan = Path(f"/proc/{proc.pid}/wchan")
    seen: set[str] = set()
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the CLI exited while it should be waiting"
        try:
            value = wchan.read_text().strip()
        except OSError:
            return False
        if any(word in value for word in ("nanosleep", "select", "poll")):
            return True
        seen.add(value)
        pause.wait(0.005)
    if seen <= {"", "0"}:
        return False
    raise AssertionError(f"the CLI did not start waiting within {timeout} s (wchan: {seen})")



class LineReader:
    """Reads a pipe's lines on a thread so a missing line fails the test instead of hanging."""

    def __init__(self, stream) -> None:
        self._lines: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in iter(stream.readline, b""):
            self._lines.put((time.monotonic(), line))
        self._lines.put((time.monotonic(), None))

    def readline(self, timeout: float = 15.0) -> tuple[float, bytes]:
        try:
            at, line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None
        assert line is not None, "the process closed its stdout"
        return at, line


@pytest.mark.slow
def test_poll_wait_subprocess_returns_promptly_on_publish(bus: Bus, db_path: Path, bus_command,
                                                          python_env) -> None:
    bus.publish("a", "not_for_w1", to="someone-else")
    proc = subprocess.Popen(
        bus_command + ["--db", str(db_path), "poll", "--agent", "w1", "--wait", "30", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(python_env))
    try:
        told = process_sleeps(proc)
        assert proc.poll() is None  # still waiting: nothing was there for w1
        if told:
            assert has_inotify_fd(proc.pid), "poll --wait should wait on inotify"
        published_at = time.monotonic()
        published = bus.publish("planner", "wake_up", {"n": 1}, to="w1")
        stdout, stderr = proc.communicate(timeout=25)
        returned_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert returned_at - published_at < 5.0  # far below --wait 30
    [row] = json_lines(stdout.decode())
    assert (row["seq"], row["id"], row["type"], row["payload"]) == (2, published.id, "wake_up",
                                                                    {"n": 1})


@pytest.mark.slow
def test_tail_follow_subprocess_shows_new_message_then_exits_0_on_sigint(
        bus: Bus, db_path: Path, bus_command, python_env) -> None:
    bus.publish("a", "before")
    proc = subprocess.Popen(
        bus_command + ["--db", str(db_path), "tail", "--follow", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(python_env),
        preexec_fn=restore_sigint)
    try:
        reader = LineReader(proc.stdout)
        assert json.loads(reader.readline()[1])["type"] == "before"
        if process_sleeps(proc):
            assert has_inotify_fd(proc.pid), "tail --follow should wait on inotify"
        published_at = time.monotonic()
        published = bus.publish("b", "after", {"late": True}, to="w2")
        shown_at, line = reader.readline()
        row = json.loads(line)
        assert (row["seq"], row["id"], row["from"], row["to"], row["type"], row["payload"]) == (
            2, published.id, "b", "w2", "after", {"late": True})
        assert shown_at - published_at < 5.0
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=15)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert returncode == 0, stderr
    assert stderr == b""
