"""`bus status`, `consumers`, `consumer info`, `cursor set|delete`, `poll --from-latest`,
`sql` output shapes, `tables` and `schema`."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from bus import Bus
from bus.views.tables import NO_PURPOSE
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import LATEST_VERSION
from tests.conftest import REPO_ROOT


@pytest.fixture
def seeded(bus: Bus) -> Bus:
    bus.publish("p", "t", to="w1")   # 1
    bus.publish("p", "t", to="w2")   # 2
    bus.publish("p", "t")            # 3 broadcast
    bus.ack("w1", 1)
    bus.ack("w2", 3)
    bus.heartbeats.beat("w1", "working", "t1")
    return bus


# --- status -------------------------------------------------------------------


def test_status_text_shows_every_part(seeded: Bus, db_path: Path) -> None:
    result = run(["status"], db_path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(rf"bus {re.escape(str(db_path))}  schema {LATEST_VERSION}"
                        r"  durability normal  file \S+ \S+  WAL \S+ \S+", lines[0])
    assert re.fullmatch(r"log: 3 messages, last seq 3, oldest retained seq 1 \(\S+Z\)", lines[1])
    assert lines[2:4] == ["consumers: 2", "  consumer  kind   cursor  pending  lag  last ack"]
    assert re.fullmatch(r"  w1        agent  1       1        2    \d+\.\d s ago", lines[4])
    assert re.fullmatch(r"  w2        agent  3       0        0    \d+\.\d s ago", lines[5])
    assert lines[6:8] == ["agents: 1 alive", "  agent  state  silent  status   task"]
    assert re.fullmatch(r"  w1     alive  \d+\.\d s +working  t1", lines[8])
    assert lines[9:] == [
        "receipts: every direct message acked",
        "claims: 0 held, 0 expiring soon, 0 expired, 0 taken over, 0 dead",
        "tasks: 0 ready, 0 blocked, 0 held, 0 done, 0 cancelled",
        "workers: none", "reservations: none", "channels: none",
        "pump: no organism booted; units 0 queued, 0 in flight, 0 dead",
        "export: never run (bus export)"]


def test_status_and_consumers_read_an_agent_that_stopped(seeded: Bus, db_path: Path) -> None:
    """`worker done`, `fail` and `cancel` leave a `stopped` beat: every reader shows it."""
    seeded.heartbeats.beat("w2", "stopped", "t2")
    result = run(["status"], db_path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[6:8] == ["agents: 1 alive, 1 stopped", "  agent  state    silent  status   task"]
    assert re.fullmatch(r"  w2     stopped  \d+\.\d s +stopped  t2", lines[9])
    out = json.loads(run(["status", "--json"], db_path).stdout)
    assert out["agents_by_state"] == {"alive": 1, "warn": 0, "stale": 0, "dead": 0,
                                      "stopped": 1}
    assert [(a["agent"], a["state"]) for a in out["agents"]] == [("w1", "alive"),
                                                                  ("w2", "stopped")]
    assert run(["consumers"], db_path).exit_code == 0
    assert run(["consumer", "info", "w2"], db_path).stdout.splitlines()[0] == (
        "consumer w2 (agent)")


def test_status_counts_the_exporter_as_a_consumer(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t")
    bus.export_jsonl()
    lines = run(["status"], db_path).stdout.splitlines()
    assert lines[2:4] == ["consumers: 1", "  consumer  kind      cursor  pending  lag  last ack"]
    assert lines[4] == "  (export)  exporter  1       0        0    -"


def test_status_json(seeded: Bus, db_path: Path) -> None:
    result = run(["status", "--json"], db_path)
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert set(out) == {"now_ms", "file", "log", "consumers", "agents", "agents_by_state",
                        "claims", "workers", "worker_list", "channels", "pump", "export",
                        "tasks", "reservations", "receipts", "replica"}
    assert out["log"] == {"messages": 3, "last_seq": 3, "oldest_seq": 1,
                          "oldest_ts_ms": out["log"]["oldest_ts_ms"]}
    assert [(c["agent"], c["cursor"], c["pending"], c["lag"]) for c in out["consumers"]] == [
        ("w1", 1, 1, 2), ("w2", 3, 0, 0)]
    assert out["file"]["path"] == str(db_path) and out["file"]["durability"] == "normal"


def test_status_missing_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    result = run(["status"], tmp_path / "none.db")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no bus database at")
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("args", [["status", "--json"], ["--json", "status"],
                                  ["consumers", "--json"], ["consumer", "info", "w1", "--json"]])
def test_status_readers_with_json_report_a_bad_file_as_json(tmp_path: Path, args) -> None:
    bad = tmp_path / "bus.db"
    bad.write_bytes(b"garbage, not a database")
    result = run(args, bad)
    assert (result.exit_code, result.stdout) == (1, "")
    assert json.loads(result.stderr) == {
        "error": f"{bad} is not a SQLite database (wrong file header); it was left untouched."
                 " Point --db (or BUS_DB) at an agentbus database or at a new path",
        "field": None}
    assert bad.read_bytes() == b"garbage, not a database"


# --- consumers ----------------------------------------------------------------


def test_consumers_text_and_json(seeded: Bus, db_path: Path) -> None:
    text = run(["consumers"], db_path)
    assert text.stdout.splitlines()[0] == "consumer  kind   cursor  pending  lag  last ack"
    assert [line.split()[:5] for line in text.stdout.splitlines()[1:]] == [
        ["w1", "agent", "1", "1", "2"], ["w2", "agent", "3", "0", "0"]]
    rows = json_lines(run(["consumers", "--json"], db_path).stdout)
    assert [(r["agent"], r["kind"], r["cursor"], r["pending"], r["lag"]) for r in rows] == [
        ("w1", "agent", 1, 1, 2), ("w2", "agent", 3, 0, 0)]


def test_consumers_empty(bus: Bus, db_path: Path) -> None:
    result = run(["consumers"], db_path)
    assert (result.exit_code, result.stdout) == (0, "no consumers yet (no agent has acked)\n")
    assert run(["consumers", "--json"], db_path).stdout == ""


def test_consumer_info(seeded: Bus, db_path: Path) -> None:
    lines = run(["consumer", "info", "w1"], db_path).stdout.splitlines()
    assert lines[:3] == ["consumer w1 (agent)", "cursor: 1 (last seq 3)", "pending: 1, lag: 2"]
    assert re.fullmatch(r"last ack: \S+Z \(\d+\.\d s ago\)", lines[3])
    info = json.loads(run(["consumer", "info", "w1", "--json"], db_path).stdout)
    assert (info["agent"], info["cursor"], info["pending"], info["lag"]) == ("w1", 1, 1, 2)
    assert info["last_ack_ms"] == seeded.list_cursors()[0].updated_at_ms


def test_consumer_info_unknown_agent(seeded: Bus, db_path: Path) -> None:
    result = run(["consumer", "info", "w9"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "AGENT", "no consumer 'w9' (known: w1, w2); see `bus consumers`")


# --- cursor set / delete --------------------------------------------------------


def _cursors(bus: Bus) -> dict[str, int]:
    return {c.agent: c.last_acked_seq for c in bus.list_cursors()}


def test_cursor_set_forward_and_latest(seeded: Bus, db_path: Path) -> None:
    assert run(["cursor", "set", "w1", "2"], db_path).stdout == "w1 cursor at seq 2\n"
    seeded.publish("p", "t")
    out = json.loads(run(["cursor", "set", "w1", "--latest", "--json"], db_path).stdout)
    assert out == {"agent": "w1", "last_acked_seq": 4}
    assert _cursors(seeded) == {"w1": 4, "w2": 3}


def test_cursor_set_refuses_an_unknown_agent_unless_create(seeded: Bus, db_path: Path) -> None:
    result = run(["cursor", "set", "w1typo", "2"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "AGENT", "no consumer 'w1typo' (known: w1, w2); pass --create to start a new consumer")
    assert _cursors(seeded) == {"w1": 1, "w2": 3}
    assert run(["cursor", "set", "w3", "2", "--create"], db_path).exit_code == 0
    assert _cursors(seeded)["w3"] == 2


def test_cursor_set_accepts_an_agent_that_beats(seeded: Bus, db_path: Path) -> None:
    seeded.heartbeats.beat("fresh")
    assert run(["cursor", "set", "fresh", "--latest"], db_path).exit_code == 0
    assert _cursors(seeded)["fresh"] == 3


def test_cursor_set_never_moves_backwards_without_force(seeded: Bus, db_path: Path) -> None:
    result = run(["cursor", "set", "w2", "1"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "[SEQ]", "1 is behind w2's cursor at 3, which would hand it those messages again;"
                 " pass --force to replay them")
    assert _cursors(seeded)["w2"] == 3
    assert run(["cursor", "set", "w2", "1", "--force"], db_path).exit_code == 0
    assert _cursors(seeded)["w2"] == 1
    assert [m.seq for m in seeded.poll("w2")] == [2, 3]


@pytest.mark.parametrize("args, code, message", [
    (["cursor", "set", "w1", "9"], 2,
     "Error: Invalid value for '[SEQ]': is 9; the last seq is 3\n"),
    (["cursor", "set", "w1"], 2, "give SEQ or --latest"),
    (["cursor", "set", "w1", "2", "--latest"], 2, "give SEQ or --latest"),
    (["cursor", "set", "w1", "--", "-1"], 2, "-1 is not in the range x>=0"),
])
def test_cursor_set_refuses_bad_positions(seeded: Bus, db_path: Path, args, code,
                                          message) -> None:
    result = run(args, db_path)
    assert result.exit_code == code
    assert message in result.stderr
    assert _cursors(seeded) == {"w1": 1, "w2": 3}


def test_cursor_delete(seeded: Bus, db_path: Path) -> None:
    assert run(["cursor", "delete", "w1"], db_path).stdout == (
        "deleted w1's cursor (it was at seq 1)\n")
    assert _cursors(seeded) == {"w2": 3}
    again = run(["cursor", "delete", "w1"], db_path)
    assert again.exit_code == 2
    assert last_error(again.stderr).startswith(
        "Error: Invalid value for 'AGENT': no consumer 'w1' (known: w2)")


# --- poll --from-latest ----------------------------------------------------------


def test_poll_from_latest_skips_the_backlog_for_a_new_agent(seeded: Bus, db_path: Path) -> None:
    first = run(["poll", "--agent", "late", "--from-latest", "--json"], db_path)
    assert (first.exit_code, first.stdout) == (0, "")
    seeded.publish("p", "t", to="late")
    again = json_lines(run(["poll", "--agent", "late", "--from-latest", "--json"], db_path).stdout)
    assert [m["seq"] for m in again] == [4]
    assert _cursors(seeded)["late"] == 3


def test_poll_from_latest_leaves_an_existing_cursor(seeded: Bus, db_path: Path) -> None:
    found = json_lines(run(["poll", "--agent", "w1", "--from-latest", "--json"], db_path).stdout)
    assert [m["seq"] for m in found] == [3]
    assert _cursors(seeded)["w1"] == 1


# --- sql shapes, tables, schema ----------------------------------------------------

QUERY = "SELECT seq, to_agent, payload FROM messages ORDER BY seq"


def test_sql_shapes(bus: Bus, db_path: Path) -> None:
    bus.publish("p", "t", {"a": "x,y"}, to="w")
    bus.publish("p", "t")
    table = run(["sql", "--table", QUERY], db_path).stdout
    assert table == run(["sql", QUERY], db_path).stdout == (
        'seq  to_agent  payload\n1    w         {"a":"x,y"}\n2    NULL      NULL\n')
    assert json.loads(run(["sql", "--json", QUERY], db_path).stdout) == [
        {"seq": 1, "to_agent": "w", "payload": '{"a":"x,y"}'},
        {"seq": 2, "to_agent": None, "payload": None}]
    assert json_lines(run(["sql", "--nl", QUERY], db_path).stdout) == [
        {"seq": 1, "to_agent": "w", "payload": '{"a":"x,y"}'},
        {"seq": 2, "to_agent": None, "payload": None}]
    rows = list(csv.reader(io.StringIO(run(["sql", "--csv", QUERY], db_path).stdout)))
    assert rows == [["seq", "to_agent", "payload"], ["1", "w", '{"a":"x,y"}'], ["2", "", ""]]


def test_sql_json_of_no_rows_is_an_empty_array(bus: Bus, db_path: Path) -> None:
    assert run(["sql", "--json", "SELECT seq FROM messages"], db_path).stdout == "[]\n"
    assert run(["sql", "--csv", "SELECT seq FROM messages"], db_path).stdout == ""


def test_tables_lists_every_table_with_its_purpose(bus: Bus, db_path: Path) -> None:
    listed = json_lines(run(["tables", "--json"], db_path).stdout)
    names = {name for (name,) in bus.conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {t["name"] for t in listed} == names
    assert [t["name"] for t in listed if t["purpose"] == NO_PURPOSE] == []
    text = run(["tables"], db_path).stdout.splitlines()
    assert text[0].split() == ["table", "purpose"]
    assert any(line.startswith("messages ") and "the log" in line for line in text)


def test_docs_sql_section_lists_every_table(bus: Bus) -> None:
    guide = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = guide[guide.index("## Inspecting the file with SQL"):]
    section = section[:section.index("\n## ", 5)]
    names = [name for (name,) in bus.conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table'")]
    assert [n for n in names if f"`{n}`" not in section] == []


def test_schema_of_one_table_and_of_all(bus: Bus, db_path: Path) -> None:
    one = run(["schema", "cursors"], db_path)
    assert one.stdout.startswith("CREATE TABLE cursors (") and one.stdout.endswith(");\n")
    every = json_lines(run(["schema", "--json"], db_path).stdout)
    messages = next(t for t in every if t["table"] == "messages")
    assert messages["sql"][0].startswith("CREATE TABLE messages")
    assert any("idx_messages_to_seq" in sql for sql in messages["sql"][1:])


def test_schema_unknown_table(bus: Bus, db_path: Path) -> None:
    result = run(["schema", "mesages"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(
        "Error: Invalid value for '[TABLE]': no table 'mesages'; the tables are: ")
