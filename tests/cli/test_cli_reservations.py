"""`bus reserve`, `bus reservations`, `bus unreserve` from the command line: exit codes,
exact output, --json, and errors that name the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus import Bus
from tests.support.cli_helpers import iso
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run


@pytest.fixture
def db(db_path: Path) -> Path:
    Bus.open(db_path).close()
    return db_path


def reserve_json(db: Path, *args: str) -> dict:
    result = run(["reserve", *args, "--json"], db)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_reserve_prints_each_reservation(db: Path) -> None:
    result = run(["reserve", "--agent", "agent-a", "src/auth/**", "docs/**", "--ttl", "2h",
                  "--reason", "login rework"], db)
    assert result.exit_code == 0
    [first, second] = result.stdout.splitlines()
    made = {r["pattern"]: r for r in json_lines(run(["reservations", "--json"], db).stdout)}
    assert first == f"agent-a reserved src/auth/** (exclusive) until" \
                    f" {iso(made['src/auth/**']['expires_at_ms'])}"
    assert second.startswith("agent-a reserved docs/** (exclusive) until ")
    r = made["src/auth/**"]
    assert (r["agent"], r["mode"], r["reason"]) == ("agent-a", "exclusive", "login rework")
    assert r["expires_at_ms"] - r["created_at_ms"] == 2 * 3600 * 1000


def test_cli_reserve_conflict_exits_1_naming_each_conflict_and_reserves_nothing(db: Path) -> None:
    held = reserve_json(db, "--agent", "agent-a", "src/auth/**", "--reason", "login rework")
    expires = held["reservations"][0]["expires_at_ms"]
    result = run(["reserve", "--agent", "agent-b", "/docs/**", "src/auth/login.py"], db)
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: agent-b reserved nothing; 1 conflict(s) with other agents' reservations:\n"
        f"  src/auth/login.py conflicts with: agent-a holds src/auth/** (exclusive) until"
        f" {iso(expires)}: login rework (both match src/auth/login.py)\n"
        "Wait until they end (bus reservations), ask agent-a to release them (bus"
        " unreserve --agent agent-a), or reserve --shared where the holder's is shared\n")
    assert run(["reservations", "--agent", "agent-b"], db).stdout == "no live reservations\n"


def test_cli_reserve_conflict_json(db: Path) -> None:
    reserve_json(db, "--agent", "agent-a", "src/auth/**", "--shared")
    result = run(["reserve", "--agent", "agent-b", "src/auth/login.py", "--json"], db)
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["granted"] is False
    [conflict] = out["conflicts"]
    assert {k: conflict[k] for k in ("pattern", "holder", "held_pattern", "mode")} == {
        "pattern": "src/auth/login.py", "holder": "agent-a", "held_pattern": "src/auth/**",
        "mode": "shared"}
    assert conflict["expires"] == iso(conflict["expires_at_ms"])
    # Shared next to shared is no conflict.
    assert reserve_json(db, "--agent", "agent-b", "src/auth/login.py", "--shared")["granted"]


def test_cli_reservations_table_and_path_filter(db: Path) -> None:
    a = reserve_json(db, "--agent", "agent-a", "src/auth/**")["reservations"][0]
    reserve_json(db, "--agent", "agent-b", "docs/**", "--shared", "--reason", "typos")
    table = run(["reservations"], db).stdout.splitlines()
    assert table[0].split() == ["pattern", "agent", "mode", "expires", "reason"]
    assert [line.split()[:3] for line in table[1:]] == [["docs/**", "agent-b", "shared"],
                                                        ["src/auth/**", "agent-a", "exclusive"]]
    found = json_lines(run(["reservations", "--path", "src/auth/login.py", "--json"], db).stdout)
    assert found == [{**a, "expires": iso(a["expires_at_ms"])}]


def test_cli_unreserve_some_then_all(db: Path) -> None:
    reserve_json(db, "--agent", "agent-a", "src/**", "docs/**", "tests/**")
    assert run(["unreserve", "--agent", "agent-a", "docs/**"], db).stdout == \
        "agent-a released docs/**\n"
    out = json.loads(run(["unreserve", "--agent", "agent-a", "--json"], db).stdout)
    assert sorted(r["pattern"] for r in out["released"]) == ["src/**", "tests/**"]
    assert run(["unreserve", "--agent", "agent-a"], db).stdout == "agent-a held no reservations\n"


def test_cli_unreserve_a_pattern_not_held_exits_1(db: Path) -> None:
    reserve_json(db, "--agent", "agent-a", "src/**")
    result = run(["unreserve", "--agent", "agent-a", "docs/**"], db)
    assert result.exit_code == 1
    assert result.stderr == ("Error: agent-a holds no reservation of docs/**; it holds: src/**"
                             " (bus reservations --agent agent-a); nothing was released\n")
    result = run(["unreserve", "--agent", "agent-a", "docs/**", "--json"], db)
    assert json.loads(result.stderr)["field"] == "pattern"


def test_cli_reserve_check(db: Path) -> None:
    held = reserve_json(db, "--agent", "agent-a", "src/auth/**")["reservations"][0]
    ok = run(["reserve", "--check", "--agent", "agent-b", "docs/a.md", "README.md"], db)
    assert (ok.exit_code, ok.stdout) == (
        0, "no other live agent holds any of the 2 path(s) exclusively\n")
    mine = run(["reserve", "--check", "--agent", "agent-a", "src/auth/login.py"], db)
    assert mine.exit_code == 0
    refused = run(["reserve", "--check", "--agent", "agent-b", "src/auth/login.py"], db)
    assert refused.exit_code == 1
    assert refused.stderr == (
        "Error: the change touches 1 path(s) another agent holds exclusively:\n"
        f"  src/auth/login.py: agent-a holds src/auth/** (exclusive) until"
        f" {iso(held['expires_at_ms'])}\n"
        "Wait until the reservation ends (bus reservations), ask agent-a to release it"
        " (bus unreserve --agent agent-a), or leave these paths out\n")
    as_json = run(["reserve", "--check", "--agent", "agent-b", "src/auth/login.py", "--json"], db)
    assert as_json.exit_code == 1
    out = json.loads(as_json.stdout)
    assert (out["ok"], [(h["path"], h["holder"]) for h in out["held"]]) == (
        False, [("src/auth/login.py", "agent-a")])


@pytest.mark.parametrize("args, flag, reason", [
    (["reserve", "--agent", "a", "!src/**"], "PATTERN...", "starts with '!'"),
    (["reserve", "--agent", "a", "src/**", "--ttl", "2x"], "--ttl", "is not a duration"),
    (["reserve", "--agent", "a", "src/**", "--ttl", "0s"], "--ttl", "is not a duration"),
    (["reserve", "--agent", "", "src/**"], "--agent", ""),
    (["reservations", "--path", "/etc/passwd"], "--path", "is absolute"),
    (["reserve", "--check", "--agent", "a", "../x"], "PATTERN...", "leaves the repository"),
])
def test_cli_reservation_usage_errors_name_the_flag(db: Path, args: list[str], flag: str,
                                                    reason: str) -> None:
    result = run(args, db)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(f"Error: Invalid value for '{flag}': ")
    assert reason in result.stderr
    as_json = run([*args, "--json"], db)
    assert as_json.exit_code == 2 and json.loads(as_json.stderr)["field"] == flag
    assert run(["reservations"], db).stdout == "no live reservations\n"


def test_cli_reserve_check_refuses_reserving_options(db: Path) -> None:
    result = run(["reserve", "--check", "--agent", "a", "src/x.py", "--ttl", "2h"], db)
    assert result.exit_code == 2
    assert last_error(result.stderr) == "Error: --check reserves nothing: drop --ttl\n"
