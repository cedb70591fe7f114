"""The `bus` command line: every command, its output and each error path.

Most tests drive `bus.cli.main` in-process through click's CliRunner; a few
start the CLI as a real subprocess (poll --wait, tail --follow, a smoke run)
because they depend on a second process publishing while the CLI runs.
"""

from __future__ import annotations

import json
import queue
import re
import select
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import apsw
import pytest

from bus import Bus
from bus.storage.db import APPLICATION_ID
from bus.storage.db import connect
from tests.conftest import LATEST_VERSION
from tests.conftest import MIGRATION_NAMES
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import iso
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run

MESSAGE_KEYS = ["seq", "id", "ts_ms", "ts", "from", "to", "type", "correlation_id",
                "in_reply_to", "payload"]
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# Commands other than init, with the arguments they need to reach the database.
NON_INIT_COMMANDS = [
    pytest.param(["publish", "--from", "a", "--type", "t"], id="publish"),
    pytest.param(["poll", "--agent", "a"], id="poll"),
    pytest.param(["ack", "--agent", "a", "--seq", "1"], id="ack"),
    pytest.param(["tail"], id="tail"),
    pytest.param(["sql", "SELECT 1"], id="sql"),
    pytest.param(["migrate"], id="migrate"),
    pytest.param(["migrate", "--status"], id="migrate-status"),
    pytest.param(["status"], id="status"),
]
OPENING_COMMANDS = [pytest.param(["init"], id="init"), *NON_INIT_COMMANDS]
SUBCOMMANDS = ["init", "publish", "poll", "ack", "tail", "sql", "migrate", "status"]


# --- helpers ----------------------------------------------------------------


def file_state(path: Path) -> tuple[bytes, list[str]]:
    """The file's bytes and the names of its siblings (catches new -wal/-shm files)."""
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


def child_env(python_env: dict[str, str]) -> dict[str, str]:
    env = dict(python_env)
    env.pop("BUS_DURABILITY", None)
    return env


def restore_sigint() -> None:
    """Run in the child before exec: a SIGINT ignored by our parent must not stay ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until_sleeping(proc: subprocess.Popen, timeout: float = 15.0) -> bool:
    """Block until `proc` sleeps in select/poll/nanosleep, i.e. waiting for a commit.

    Linux only (/proc/<pid>/wchan); returns False where the kernel does not say
    what a process waits on, so the caller can skip or check less.
    """
    wchan = Path(f"/proc/{proc.pid}/wchan")
    seen: set[str] = set()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            assert proc.poll() is None, "the CLI exited while it should be waiting"
            try:
                value = wchan.read_text().strip()
            except OSError:
                return False
            if any(word in value for word in ("nanosleep", "select", "poll")):
                return True
            seen.add(value)
            deadline.wait(0.005)
    finally:
        timer.cancel()
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
            self._lines.put(line)
        self._lines.put(None)

    def readline(self, timeout: float = 15.0) -> bytes:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None
        assert line is not None, "the process closed its stdout"
        return line


@pytest.fixture
def initialized(db_path: Path) -> Path:
    result = run(["init"], db_path)
    assert result.exit_code == 0, result.output
    return db_path


# --- init -------------------------------------------------------------------


def test_init_creates_file_and_missing_parent_directory(tmp_path: Path) -> None:
    db = tmp_path / "state" / "nested" / "bus.db"
    result = run(["init"], db)
    assert result.exit_code == 0
    assert result.stdout == f"bus created at {db} (schema version {LATEST_VERSION})\n"
    assert result.stderr == ""
    assert db.is_file()
    with Bus.open(db, create=False) as opened:
        assert opened.schema_version() == LATEST_VERSION


def test_init_second_time_reports_ready(db_path: Path) -> None:
    assert run(["init"], db_path).exit_code == 0
    result = run(["init"], db_path)
    assert result.exit_code == 0
    assert result.stdout == f"bus ready at {db_path} (schema version {LATEST_VERSION})\n"


def test_init_json_reports_path_created_and_version(db_path: Path) -> None:
    first = run(["init", "--json"], db_path)
    second = run(["init", "--json"], db_path)
    assert first.exit_code == second.exit_code == 0
    outside_git = {"repository": None, "pattern": None, "exclude_file": None, "added": False}
    assert json.loads(first.stdout) == {"path": str(db_path), "created": True,
                                        "schema_version": LATEST_VERSION,
                                        "git_exclude": outside_git}
    assert json.loads(second.stdout) == {"path": str(db_path), "created": False,
                                         "schema_version": LATEST_VERSION,
                                         "git_exclude": outside_git}


def test_init_defaults_to_worker_state_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(["init"])
    assert result.exit_code == 0
    assert result.stdout == f"bus created at .worker-state/bus.db (schema version {LATEST_VERSION})\n"
    assert (tmp_path / ".worker-state" / "bus.db").is_file()


def git_repository(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_init_in_a_git_checkout_excludes_the_bus_directory_once(tmp_path: Path,
                                                                monkeypatch) -> None:
    repo = git_repository(tmp_path / "repo")
    exclude = repo / ".git" / "info" / "exclude"
    before = exclude.read_text()
    monkeypatch.chdir(repo)
    first = run(["init"])
    assert first.exit_code == 0
    assert first.stdout == (
        f"bus created at .worker-state/bus.db (schema version {LATEST_VERSION})\n"
        "added .worker-state/ to .git/info/exclude so git status ignores it\n")
    second = run(["init", "--json"])
    assert json.loads(second.stdout)["git_exclude"] == {
        "repository": str(repo.resolve()), "pattern": "/.worker-state/", "exclude_file": None,
        "added": False}
    assert exclude.read_text() == before + "/.worker-state/\n"  # once, after git's own lines
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""


def test_init_excludes_in_the_repository_that_holds_the_bus_not_the_current_one(
        tmp_path: Path, monkeypatch) -> None:
    here, there = git_repository(tmp_path / "here"), git_repository(tmp_path / "there")
    here_before = (here / ".git" / "info" / "exclude").read_text()
    monkeypatch.chdir(here)
    result = run(["init", "--json"], there / "state" / "bus.db")
    assert json.loads(result.stdout)["git_exclude"] == {
        "repository": str(there.resolve()), "pattern": "/state/",
        "exclude_file": str((there / ".git" / "info" / "exclude").resolve()), "added": True}
    assert (here / ".git" / "info" / "exclude").read_text() == here_before
    assert (there / ".git" / "info" / "exclude").read_text().endswith("\n/state/\n")


def test_init_outside_git_or_at_the_top_of_a_checkout_writes_no_exclude(tmp_path: Path) -> None:
    repo = git_repository(tmp_path / "repo")
    before = (repo / ".git" / "info" / "exclude").read_text()
    at_top = run(["init", "--json"], repo / "bus.db")
    assert json.loads(at_top.stdout)["git_exclude"] == {
        "repository": str(repo.resolve()), "pattern": None, "exclude_file": None, "added": False}
    assert (repo / ".git" / "info" / "exclude").read_text() == before
    outside = run(["init"], tmp_path / "plain" / "bus.db")
    assert outside.stdout == (f"bus created at {tmp_path / 'plain' / 'bus.db'}"
                              f" (schema version {LATEST_VERSION})\n")
    assert not (tmp_path / ".git").exists() and not (tmp_path / "plain" / ".git").exists()


def test_init_respects_bus_db_env_var(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "from-env" / "bus.db"
    result = run(["init"], env={"BUS_DB": str(target)})
    assert result.exit_code == 0
    assert result.stdout == f"bus created at {target} (schema version {LATEST_VERSION})\n"
    assert target.is_file()
    assert not (tmp_path / ".worker-state").exists()


def test_init_db_option_overrides_bus_db_env_var(tmp_path: Path) -> None:
    from_env = tmp_path / "env.db"
    explicit = tmp_path / "explicit.db"
    result = run(["init"], explicit, env={"BUS_DB": str(from_env)})
    assert result.exit_code == 0
    assert explicit.is_file()
    assert not from_env.exists()


def test_init_db_pointing_at_directory_is_usage_error(tmp_path: Path) -> None:
    result = run(["init"], tmp_path)
    assert result.exit_code == 2
    assert "is a directory" in result.stderr


# --- opening: missing, foreign and too-new databases ----------------------------


@pytest.mark.parametrize("args", NON_INIT_COMMANDS)
def test_commands_missing_database_exit_1_without_creating_it(tmp_path: Path, args) -> None:
    db = tmp_path / "missing" / "bus.db"
    result = run(args, db)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")
    assert f"no bus database at {db}" in result.stderr
    assert "bus init" in result.stderr
    assert not db.exists()
    assert not db.parent.exists()


@pytest.mark.parametrize("args", OPENING_COMMANDS)
def test_commands_refuse_non_sqlite_file_and_leave_it_untouched(db_path: Path, args) -> None:
    db_path.write_text("these are my notes, not a database\n")
    before = file_state(db_path)
    result = run(args, db_path)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "not a SQLite database (wrong file header)" in result.stderr
    assert "left untouched" in result.stderr
    assert file_state(db_path) == before


@pytest.mark.parametrize("args", OPENING_COMMANDS)
def test_commands_refuse_sqlite_file_with_foreign_tables(db_path: Path, args) -> None:
    conn = apsw.Connection(str(db_path))
    conn.execute("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me')")
    conn.close()
    before = file_state(db_path)
    result = run(args, db_path)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "a SQLite database with tables that agentbus did not create" in result.stderr
    assert file_state(db_path) == before


@pytest.mark.parametrize("args", OPENING_COMMANDS)
def test_commands_refuse_sqlite_file_with_other_application_id(db_path: Path, args) -> None:
    conn = apsw.Connection(str(db_path))
    conn.execute("PRAGMA application_id = 305419896")  # 0x12345678
    conn.close()
    before = file_state(db_path)
    result = run(args, db_path)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "another application (application_id 0x12345678)" in result.stderr
    assert file_state(db_path) == before


@pytest.mark.parametrize("args", [p for p in OPENING_COMMANDS if p.id != "sql"])
def test_commands_refuse_schema_newer_than_code(initialized: Path, args) -> None:
    conn = apsw.Connection(str(initialized))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    result = run(args, initialized)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "schema version 99" in result.stderr
    assert f"supports up to version {LATEST_VERSION}" in result.stderr
    conn = apsw.Connection(str(initialized))
    try:
        assert conn.execute("PRAGMA user_version").get == 99
    finally:
        conn.close()


def test_commands_exit_75_when_database_stays_locked(initialized: Path) -> None:
    holder = connect(initialized)
    holder.execute("BEGIN IMMEDIATE")
    try:
        result = run(["publish", "--from", "a", "--type", "t"], initialized)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.exit_code == 75
    assert result.stdout == ""
    assert result.stderr.startswith("Error: the bus database stayed locked")
    assert "retry later" in result.stderr
    with Bus.open(initialized, create=False) as opened:
        assert opened.message_count() == 0


# --- publish ----------------------------------------------------------------


def test_publish_prints_seq_id_and_durability(bus: Bus, db_path: Path) -> None:
    bus.heartbeats.beat("worker-1")  # a name the bus knows: no warning
    result = run(["publish", "--from", "planner", "--to", "worker-1", "--type", "task_assign",
                  "--payload", '{"task": "t1"}'], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    match = re.fullmatch(rf"published seq 1 id ({UUID_RE}) \(durable: commit\)\n", result.stdout)
    assert match, result.stdout
    [message] = bus.poll("worker-1")
    assert (message.seq, message.id, message.from_agent, message.to_agent, message.type,
            message.payload) == (1, match.group(1), "planner", "worker-1", "task_assign",
                                 {"task": "t1"})


def test_publish_to_a_name_never_seen_is_accepted_with_a_warning(bus: Bus,
                                                                   db_path: Path) -> None:
    bus.heartbeats.beat("worker-1")
    warning = ("Warning: no agent named 'worker-l' is known to this bus (no heartbeat, cursor,"
               " worker, token, delivery or message from it); the message waits for it. Check"
               " the name: bus status lists the agents\n")
    typo = run(["publish", "--from", "planner", "--to", "worker-l", "--type", "t"], db_path)
    assert (typo.exit_code, typo.stderr) == (0, warning)
    assert typo.stdout.startswith("published seq 1 ")
    as_json = run(["publish", "--from", "planner", "--to", "worker-l", "--type", "t", "--json"],
                  db_path)
    assert json.loads(as_json.stdout)["warning"] == warning[len("Warning: "):-1]
    assert as_json.stderr == warning
    assert [m.to_agent for m in bus.list_messages()] == ["worker-l", "worker-l"]
    for known in (["--to", "worker-1"], ["--to", "planner"], []):  # a sender is known too
        result = run(["publish", "--from", "planner", "--type", "t", "--json", *known], db_path)
        assert result.stderr == "" and "warning" not in json.loads(result.stdout)


def test_publish_json_has_exact_keys(bus: Bus, db_path: Path) -> None:
    result = run(["publish", "--from", "a", "--type", "t", "--json"], db_path)
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert set(out) == {"seq", "id", "duplicate", "durable"}
    assert out["seq"] == 1
    assert out["duplicate"] is False
    assert out["durable"] == "commit"
    assert str(uuid.UUID(out["id"])) == out["id"]
    assert bus.list_messages()[0].id == out["id"]


def test_publish_durability_full_reports_fsync(bus: Bus, db_path: Path) -> None:
    result = run(["--durability", "full", "publish", "--from", "a", "--type", "t", "--json"],
                 db_path)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"seq": 1, "id": bus.list_messages()[0].id,
                                         "duplicate": False, "durable": "fsync"}
    human = run(["--durability", "full", "publish", "--from", "a", "--type", "t"], db_path)
    assert human.exit_code == 0
    assert re.fullmatch(rf"published seq 2 id {UUID_RE} \(durable: fsync\)\n", human.stdout)


def test_publish_durability_env_var(bus: Bus, db_path: Path) -> None:
    result = run(["publish", "--from", "a", "--type", "t", "--json"], db_path,
                 env={"BUS_DURABILITY": "full"})
    assert result.exit_code == 0
    assert json.loads(result.stdout)["durable"] == "fsync"


def test_publish_unknown_durability_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["--durability", "bogus", "publish", "--from", "a", "--type", "t"], db_path)
    assert result.exit_code == 2
    assert "'bogus' is not one of 'normal', 'full'" in result.stderr
    assert bus.message_count() == 0


def test_publish_same_id_twice_is_duplicate(bus: Bus, db_path: Path) -> None:
    message_id = str(uuid.uuid4())
    args = ["publish", "--from", "a", "--type", "t", "--id", message_id]
    first = run(args, db_path)
    second = run(args, db_path)
    third = run(args + ["--json"], db_path)
    assert first.exit_code == second.exit_code == third.exit_code == 0
    assert first.stdout == f"published seq 1 id {message_id} (durable: commit)\n"
    assert second.stdout == f"duplicate: id {message_id} was already published as seq 1\n"
    assert json.loads(third.stdout) == {"seq": 1, "id": message_id, "duplicate": True,
                                        "durable": "commit"}
    assert bus.message_count() == 1


def test_publish_id_is_stored_lower_case(bus: Bus, db_path: Path) -> None:
    message_id = str(uuid.uuid4())
    first = run(["publish", "--from", "a", "--type", "t", "--id", message_id.upper()], db_path)
    again = run(["publish", "--from", "a", "--type", "t", "--id", message_id], db_path)
    assert first.stdout == f"published seq 1 id {message_id} (durable: commit)\n"
    assert again.stdout == f"duplicate: id {message_id} was already published as seq 1\n"


@pytest.mark.parametrize("source", ["inline", "stdin", "file", "file-stdin"])
def test_publish_reads_payload_from_each_source(bus: Bus, db_path: Path, tmp_path: Path,
                                                source: str) -> None:
    text = '{"task": "t1", "files": ["a.py", "b.py"], "n": 3}'
    payload_file = tmp_path / "payload.json"
    payload_file.write_text(text)
    options, stdin = {
        "inline": (["--payload", text], None),
        "stdin": (["--payload", "-"], text),
        "file": (["--payload-file", str(payload_file)], None),
        "file-stdin": (["--payload-file", "-"], text),
    }[source]
    result = run(["publish", "--from", "a", "--type", "t", *options], db_path, input=stdin)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("published seq 1 ")
    [message] = bus.list_messages()
    assert message.payload == {"task": "t1", "files": ["a.py", "b.py"], "n": 3}


def test_publish_without_payload_stores_null(bus: Bus, db_path: Path) -> None:
    result = run(["publish", "--from", "a", "--type", "t"], db_path)
    assert result.exit_code == 0
    assert bus.list_messages()[0].payload is None


def test_publish_payload_and_payload_file_together_is_usage_error(bus: Bus, db_path: Path,
                                                                  tmp_path: Path) -> None:
    payload_file = tmp_path / "payload.json"
    payload_file.write_text("{}")
    result = run(["publish", "--from", "a", "--type", "t", "--payload", "{}",
                  "--payload-file", str(payload_file)], db_path)
    assert result.exit_code == 2
    assert "give --payload or --payload-file, not both" in result.stderr
    assert bus.message_count() == 0


@pytest.mark.parametrize("options,hint", [
    (["--payload", "{not json"], "--payload"),
    (["--payload", ""], "--payload"),
    (["--payload", "NaN"], "--payload"),
    (["--payload", "-"], "--payload -"),
    (["--payload-file", "-"], "--payload-file"),
])
def test_publish_invalid_json_is_usage_error(bus: Bus, db_path: Path, options, hint) -> None:
    result = run(["publish", "--from", "a", "--type", "t", *options], db_path,
                 input="{'single': 'quotes'}")
    assert result.exit_code == 2
    assert f"Invalid value for {hint}: not valid JSON" in result.stderr
    assert bus.message_count() == 0


def test_publish_missing_payload_file_is_usage_error(bus: Bus, db_path: Path,
                                                     tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = run(["publish", "--from", "a", "--type", "t", "--payload-file", str(missing)],
                 db_path)
    assert result.exit_code == 2
    assert "No such file or directory" in result.stderr
    assert bus.message_count() == 0


@pytest.mark.parametrize("agent,reason", [
    ("a b", "contains ' '; allowed are letters, digits and . _ : -"),
    ("", "must not be empty"),
    ("x" * 129, "is 129 characters long; the limit is 128"),
    ("caf\u00e9", "contains '\u00e9'; allowed are letters, digits and . _ : -"),
])
def test_publish_invalid_from_agent_exits_2(bus: Bus, db_path: Path, agent, reason) -> None:
    result = run(["publish", "--from", agent, "--type", "t"], db_path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert last_error(result.stderr) == bad_value("--from", reason)
    assert bus.message_count() == 0


def test_publish_accepts_longest_agent_id(bus: Bus, db_path: Path) -> None:
    agent = "a" * 128
    result = run(["publish", "--from", agent, "--to", agent, "--type", "t"], db_path)
    assert result.exit_code == 0
    assert bus.poll(agent, include_own=True)[0].from_agent == agent


@pytest.mark.parametrize("to,reason", [
    ("worker/1", "contains '/'; allowed are letters, digits and . _ : -"),
    ("", "must not be empty"),
    ("w" * 129, "is 129 characters long; the limit is 128"),
])
def test_publish_invalid_to_exits_2(bus: Bus, db_path: Path, to, reason) -> None:
    result = run(["publish", "--from", "a", "--to", to, "--type", "t"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value("--to", reason)
    assert bus.message_count() == 0


@pytest.mark.parametrize("bad_id", ["xyz", "", "12345678-1234-1234-1234-12345678901g"])
def test_publish_invalid_id_exits_2(bus: Bus, db_path: Path, bad_id) -> None:
    result = run(["publish", "--from", "a", "--type", "t", "--id", bad_id], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "--id", f"{bad_id!r} is not a UUID string like '00000000-0000-0000-0000-000000000000'")
    assert bus.message_count() == 0


@pytest.mark.parametrize("options,flag,reason", [
    (["--type", ""], "--type", "must not be empty"),
    (["--type", "t" * 129], "--type", "is 129 characters long; the limit is 128"),
    (["--type", "t", "--correlation-id", ""], "--correlation-id", "must not be empty"),
    (["--type", "t", "--in-reply-to", "r" * 257], "--in-reply-to",
     "is 257 characters long; the limit is 256"),
])
def test_publish_invalid_text_fields_exit_2(bus: Bus, db_path: Path, options, flag,
                                            reason) -> None:
    result = run(["publish", "--from", "a", *options], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(flag, reason)
    assert bus.message_count() == 0


@pytest.mark.parametrize("missing", ["--from", "--type"])
def test_publish_missing_required_option_is_usage_error(bus: Bus, db_path: Path,
                                                        missing: str) -> None:
    args = {"--from": "a", "--type": "t"}
    del args[missing]
    result = run(["publish", *[x for kv in args.items() for x in kv]], db_path)
    assert result.exit_code == 2
    assert f"Missing option '{missing}'" in result.stderr
    assert bus.message_count() == 0


def test_publish_correlation_id_and_in_reply_to_round_trip(bus: Bus, db_path: Path) -> None:
    first = json.loads(run(["publish", "--from", "planner", "--to", "w1", "--type", "ask",
                            "--correlation-id", "task-7", "--json"], db_path).stdout)
    reply = run(["publish", "--from", "w1", "--to", "planner", "--type", "answer",
                 "--correlation-id", "task-7", "--in-reply-to", first["id"]], db_path)
    assert reply.exit_code == 0
    [polled] = json_lines(run(["poll", "--agent", "planner", "--json"], db_path).stdout)
    assert polled["correlation_id"] == "task-7"
    assert polled["in_reply_to"] == first["id"]
    [asked] = json_lines(run(["poll", "--agent", "w1", "--json"], db_path).stdout)
    assert asked["correlation_id"] == "task-7"
    assert asked["in_reply_to"] is None


# --- poll -------------------------------------------------------------------


def test_poll_shows_own_and_broadcast_messages_only(bus: Bus, db_path: Path) -> None:
    bus.publish("planner", "for_w1", to="w1")
    bus.publish("planner", "for_w2", to="w2")
    bus.publish("planner", "for_all")
    bus.publish("planner", "for_w1_again", to="w1")
    result = run(["poll", "--agent", "w1", "--json"], db_path)
    assert result.exit_code == 0
    rows = json_lines(result.stdout)
    assert [(r["seq"], r["type"], r["to"]) for r in rows] == [
        (1, "for_w1", "w1"), (3, "for_all", None), (4, "for_w1_again", "w1")]
    w2 = json_lines(run(["poll", "--agent", "w2", "--json"], db_path).stdout)
    assert [r["seq"] for r in w2] == [2, 3]


def test_poll_seq_shows_that_message_whole_if_it_is_the_agents_and_leaves_the_cursor(
        bus: Bus, db_path: Path) -> None:
    long = bus.publish("planner", "note", "x" * 5000, to="w1").seq
    other = bus.publish("planner", "note", "for w2", to="w2").seq
    bus.ack("w1", long)
    [row] = json_lines(run(["poll", "--agent", "w1", "--seq", str(long), "--json"],
                           db_path).stdout)
    assert (row["seq"], row["payload"]) == (long, "x" * 5000)  # acked, and whole
    missing = run(["poll", "--agent", "w1", "--seq", str(other)], db_path)
    assert (missing.exit_code, missing.stdout) == (0, "")
    assert bus.cursor("w1") == long


def test_poll_records_the_delivery_of_the_direct_messages_it_shows(bus: Bus,
                                                                    db_path: Path) -> None:
    direct = bus.publish("planner", "for_w1", to="w1").seq
    broadcast = bus.publish("planner", "for_all").seq
    assert bus.receipt(direct).state == "sent"
    run(["poll", "--agent", "w1", "--json"], db_path)
    receipt = bus.receipt(direct)
    assert (receipt.state, receipt.delivery.via, receipt.delivery.deliveries) == (
        "delivered", "poll", 1)
    assert bus.receipt(broadcast) is None
    run(["ack", "--agent", "w1", "--seq", str(direct)], db_path)
    assert bus.receipt(direct).state == "acked"


def test_poll_human_format(bus: Bus, db_path: Path) -> None:
    bus.publish("planner", "task_assign", {"task": "t1", "files": ["a.py"]}, to="worker-1",
                correlation_id="c-1")
    bus.publish("worker-2", "note", in_reply_to="m-9")
    bus.publish("planner", "zero", 0, to="worker-1", correlation_id="c-2", in_reply_to="m-1")
    messages = bus.poll("worker-1")
    result = run(["poll", "--agent", "worker-1"], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    m1, m2, m3 = messages
    assert result.stdout.splitlines() == [
        f'#1  {iso(m1.ts_ms)}  planner -> worker-1  task_assign  corr=c-1  '
        '{"task":"t1","files":["a.py"]}',
        f"#2  {iso(m2.ts_ms)}  worker-2 -> *  note  reply-to=m-9",
        f"#3  {iso(m3.ts_ms)}  planner -> worker-1  zero  corr=c-2  reply-to=m-1  0",
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", iso(m1.ts_ms))


def test_poll_json_fields(bus: Bus, db_path: Path) -> None:
    published = bus.publish("planner", "task_assign", {"task": "t1"}, to="worker-1",
                            correlation_id="c-1", in_reply_to="m-0")
    result = run(["poll", "--agent", "worker-1", "--json"], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    [row] = json_lines(result.stdout)
    assert list(row) == MESSAGE_KEYS
    [stored] = bus.poll("worker-1")
    assert row == {"seq": 1, "id": published.id, "ts_ms": stored.ts_ms, "ts": iso(stored.ts_ms),
                   "from": "planner", "to": "worker-1", "type": "task_assign",
                   "correlation_id": "c-1", "in_reply_to": "m-0", "payload": {"task": "t1"}}


def test_poll_does_not_move_cursor(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "one", to="w1")
    bus.publish("a", "two")
    first = run(["poll", "--agent", "w1", "--json"], db_path)
    second = run(["poll", "--agent", "w1", "--json"], db_path)
    assert first.exit_code == second.exit_code == 0
    assert [r["seq"] for r in json_lines(first.stdout)] == [1, 2]
    assert second.stdout == first.stdout
    assert bus.cursor("w1") == 0


def test_poll_limit(bus: Bus, db_path: Path) -> None:
    for i in range(5):
        bus.publish("a", f"m{i}", to="w1")
    result = run(["poll", "--agent", "w1", "--limit", "2", "--json"], db_path)
    assert result.exit_code == 0
    assert [r["seq"] for r in json_lines(result.stdout)] == [1, 2]


@pytest.mark.parametrize("limit", ["0", "-1", "10001", "many"])
def test_poll_invalid_limit_is_usage_error(bus: Bus, db_path: Path, limit: str) -> None:
    bus.publish("a", "t", to="w1")
    result = run(["poll", "--agent", "w1", "--limit", limit], db_path)
    assert result.exit_code == 2
    assert "'--limit'" in result.stderr
    assert result.stdout == ""


def test_poll_negative_wait_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["poll", "--agent", "w1", "--wait", "-1"], db_path)
    assert result.exit_code == 2
    assert "'--wait'" in result.stderr


def test_poll_missing_agent_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["poll"], db_path)
    assert result.exit_code == 2
    assert "Missing option '--agent'" in result.stderr


def test_poll_invalid_agent_exits_2(bus: Bus, db_path: Path) -> None:
    result = run(["poll", "--agent", "w 1"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "--agent", "contains ' '; allowed are letters, digits and . _ : -")


def test_poll_nothing_waiting_says_so_on_stderr(bus: Bus, db_path: Path) -> None:
    result = run(["poll", "--agent", "w1"], db_path)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == "no messages for w1 above seq 0\n"
    bus.publish("a", "t", to="w1")
    bus.publish("a", "t", to="w2")
    bus.ack("w1", 1)
    after_ack = run(["poll", "--agent", "w1"], db_path)
    assert after_ack.exit_code == 0
    assert after_ack.stdout == ""
    assert after_ack.stderr == "no messages for w1 above seq 1\n"


def test_poll_json_nothing_waiting_prints_nothing(bus: Bus, db_path: Path) -> None:
    result = run(["poll", "--agent", "w1", "--json"], db_path)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == ""


def test_poll_wait_returns_when_nothing_arrives(bus: Bus, db_path: Path) -> None:
    result = run(["poll", "--agent", "w1", "--wait", "0.2"], db_path)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == "no messages for w1 above seq 0\n"


def test_poll_wait_returns_waiting_message_at_once(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "ready", to="w1")
    result = run(["poll", "--agent", "w1", "--wait", "30", "--json"], db_path)
    assert result.exit_code == 0
    assert [r["type"] for r in json_lines(result.stdout)] == ["ready"]


@pytest.mark.slow
def test_poll_wait_subprocess_wakes_on_publish(bus: Bus, db_path: Path, bus_command,
                                               python_env) -> None:
    bus.publish("a", "not_for_w1", to="someone-else")
    proc = subprocess.Popen(
        bus_command + ["--db", str(db_path), "poll", "--agent", "w1", "--wait", "30", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(python_env))
    try:
        # Publish only once the CLI sleeps between polls (where /proc tells), so the
        # message is found by the waiting loop, not by the first look.
        wait_until_sleeping(proc)
        assert proc.poll() is None  # still waiting: nothing was there for w1
        published = bus.publish("planner", "wake_up", {"n": 1}, to="w1")
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    [row] = json_lines(stdout.decode())
    assert (row["seq"], row["id"], row["type"], row["payload"]) == (2, published.id, "wake_up",
                                                                    {"n": 1})


# --- ack --------------------------------------------------------------------


def test_ack_moves_cursor_and_reports_it(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "one", to="w1")
    bus.publish("a", "two", to="w1")
    result = run(["ack", "--agent", "w1", "--seq", "2"], db_path)
    assert result.exit_code == 0
    assert result.stdout == "w1 acked up to seq 2\n"
    assert result.stderr == ""
    assert bus.cursor("w1") == 2


def test_ack_json(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "one", to="w1")
    result = run(["ack", "--agent", "w1", "--seq", "1", "--json"], db_path)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"agent": "w1", "last_acked_seq": 1}


def test_ack_older_seq_keeps_position(bus: Bus, db_path: Path) -> None:
    for _ in range(3):
        bus.publish("a", "t", to="w1")
    assert run(["ack", "--agent", "w1", "--seq", "3"], db_path).exit_code == 0
    result = run(["ack", "--agent", "w1", "--seq", "1"], db_path)
    assert result.exit_code == 0
    assert result.stdout == "w1 acked up to seq 3\n"
    as_json = run(["ack", "--agent", "w1", "--seq", "2", "--json"], db_path)
    assert json.loads(as_json.stdout) == {"agent": "w1", "last_acked_seq": 3}
    assert bus.cursor("w1") == 3


def test_ack_beyond_last_seq_exits_2(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "one", to="w1")
    bus.publish("a", "two", to="w1")
    result = run(["ack", "--agent", "w1", "--seq", "9"], db_path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert last_error(result.stderr) == bad_value("--seq",
                                                  "no message has seq 9; the last seq is 2")
    assert bus.cursor("w1") == 0
    assert bus.list_cursors() == []


def test_ack_on_empty_bus_exits_2(bus: Bus, db_path: Path) -> None:
    result = run(["ack", "--agent", "w1", "--seq", "1"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value("--seq",
                                                  "no message has seq 1; the last seq is 0")


@pytest.mark.parametrize("seq", ["0", "-1"])
def test_ack_non_positive_seq_exits_2(bus: Bus, db_path: Path, seq: str) -> None:
    bus.publish("a", "one", to="w1")
    result = run(["ack", "--agent", "w1", "--seq", seq], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value("--seq", f"must be an integer >= 1, got {seq}")
    assert bus.cursor("w1") == 0


@pytest.mark.parametrize("args,expected", [
    (["--agent", "w1", "--seq", "two"], "'two' is not a valid integer"),
    (["--agent", "w1"], "Missing option '--seq'"),
    (["--seq", "1"], "Missing option '--agent'"),
])
def test_ack_bad_arguments_are_usage_errors(bus: Bus, db_path: Path, args, expected) -> None:
    bus.publish("a", "one", to="w1")
    result = run(["ack", *args], db_path)
    assert result.exit_code == 2
    assert expected in result.stderr


def test_ack_invalid_agent_exits_2(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "one")
    result = run(["ack", "--agent", "", "--seq", "1"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value("--agent", "must not be empty")


def test_ack_then_poll_returns_only_newer(bus: Bus, db_path: Path) -> None:
    for i in range(4):
        bus.publish("a", f"m{i}", to="w1")
    assert run(["ack", "--agent", "w1", "--seq", "2"], db_path).exit_code == 0
    result = run(["poll", "--agent", "w1", "--json"], db_path)
    assert [r["seq"] for r in json_lines(result.stdout)] == [3, 4]


# --- tail -------------------------------------------------------------------


def _publish_many(bus: Bus, count: int) -> None:
    for i in range(1, count + 1):
        bus.publish("a", f"m{i}", {"i": i}, to=f"w{i % 3}" if i % 2 else None)


def test_tail_shows_last_ten_by_default(bus: Bus, db_path: Path) -> None:
    _publish_many(bus, 12)
    result = run(["tail"], db_path)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == [f"#{i}" for i in range(3, 13)]
    assert lines[0].split("  ")[2:] == ["a -> w0", "m3", '{"i":3}']
    assert lines[1].split("  ")[2:] == ["a -> *", "m4", '{"i":4}']


def test_tail_lines_option(bus: Bus, db_path: Path) -> None:
    _publish_many(bus, 12)
    for flag in ("-n", "--lines"):
        result = run(["tail", flag, "3", "--json"], db_path)
        assert result.exit_code == 0
        assert [r["seq"] for r in json_lines(result.stdout)] == [10, 11, 12]


def test_tail_since_shows_everything_after(bus: Bus, db_path: Path) -> None:
    _publish_many(bus, 12)
    result = run(["tail", "--since", "5", "--json"], db_path)
    assert [r["seq"] for r in json_lines(result.stdout)] == list(range(6, 13))
    everything = run(["tail", "--since", "0", "--json"], db_path)
    assert [r["seq"] for r in json_lines(everything.stdout)] == list(range(1, 13))
    past_end = run(["tail", "--since", "12"], db_path)
    assert past_end.exit_code == 0
    assert past_end.stdout == ""


def test_tail_json_fields(bus: Bus, db_path: Path) -> None:
    published = bus.publish("planner", "task_assign", {"task": "t1"}, to="w1",
                            correlation_id="c-1")
    result = run(["tail", "--json"], db_path)
    assert result.exit_code == 0
    [row] = json_lines(result.stdout)
    assert list(row) == MESSAGE_KEYS
    assert (row["seq"], row["id"], row["from"], row["to"], row["type"], row["correlation_id"],
            row["in_reply_to"], row["payload"]) == (1, published.id, "planner", "w1",
                                                    "task_assign", "c-1", None, {"task": "t1"})
    assert row["ts"] == iso(row["ts_ms"])


def test_tail_empty_bus_prints_nothing(bus: Bus, db_path: Path) -> None:
    result = run(["tail"], db_path)
    assert result.exit_code == 0
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["-n", "0"], ["--lines", "10001"], ["--since", "-1"]])
def test_tail_invalid_range_is_usage_error(bus: Bus, db_path: Path, args) -> None:
    result = run(["tail", *args], db_path)
    assert result.exit_code == 2
    assert "is not in the range" in result.stderr


def _follow_until_sigint(bus: Bus, db_path: Path, bus_command, python_env,
                         tail_args: list[str]) -> None:
    """Start `tail --follow --json`, see the backlog, then one new message, then Ctrl-C."""
    bus.publish("a", "first", to="w1")
    bus.publish("b", "second")
    proc = subprocess.Popen(
        bus_command + ["--db", str(db_path), "tail", "--follow", "--json", *tail_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(python_env),
        preexec_fn=restore_sigint)
    try:
        reader = LineReader(proc.stdout)
        assert json.loads(reader.readline())["type"] == "first"
        assert json.loads(reader.readline())["type"] == "second"
        published = bus.publish("c", "third", {"late": True}, to="w2")
        row = json.loads(reader.readline())
        assert (row["seq"], row["id"], row["type"], row["payload"]) == (
            3, published.id, "third", {"late": True})
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


@pytest.mark.slow
def test_tail_follow_since_subprocess_prints_new_messages_until_sigint(
        bus: Bus, db_path: Path, bus_command, python_env) -> None:
    _follow_until_sigint(bus, db_path, bus_command, python_env, ["--since", "0"])


@pytest.mark.slow
def test_tail_follow_last_lines_subprocess_prints_new_messages_until_sigint(
        bus: Bus, db_path: Path, bus_command, python_env) -> None:
    # Without --since the backlog is read in one query before printing, so the
    # third message can only come from the follow loop: no /proc needed.
    _follow_until_sigint(bus, db_path, bus_command, python_env, ["-n", "5"])


@pytest.mark.slow
def test_tail_follow_ctrl_c_while_printing_backlog_exits_0(
        bus: Bus, db_path: Path, bus_command, python_env) -> None:
    for start in range(0, 20_000, 1000):
        bus.publish_many([{"from_agent": "a", "type": "t", "payload": n}
                          for n in range(start, start + 1000)])
    proc = subprocess.Popen(
        bus_command + ["--db", str(db_path), "tail", "--follow", "--since", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(python_env),
        preexec_fn=restore_sigint)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "tail printed nothing within 15 s"
        assert proc.stdout.readline().startswith(b"#1 ")
        # Nobody reads the pipe now, so it fills: tail is still printing the backlog.
        proc.send_signal(signal.SIGINT)
        stdout_rest, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert b"Aborted" not in stderr


# --- sql --------------------------------------------------------------------


def _seed_for_sql(bus: Bus) -> None:
    bus.publish("planner", "task_assign", {"task": "t1"}, to="worker-1")
    bus.publish("planner", "note")


def test_sql_prints_aligned_table(bus: Bus, db_path: Path) -> None:
    _seed_for_sql(bus)
    result = run(["sql", "SELECT seq, type, to_agent FROM messages ORDER BY seq"], db_path)
    assert result.exit_code == 0
    assert result.stderr == ""
    assert result.stdout == (
        "seq  type         to_agent\n"
        "1    task_assign  worker-1\n"
        "2    note         NULL\n"
    )


def test_sql_renders_null_blob_and_float(bus: Bus, db_path: Path) -> None:
    table = run(["sql", "SELECT NULL AS n, x'00ff' AS b, 1.5 AS f"], db_path)
    assert table.exit_code == 0
    assert table.stdout == "n     b        f\nNULL  x'00ff'  1.5\n"
    as_json = run(["sql", "SELECT NULL AS n, x'00ff' AS b, 1.5 AS f", "--nl"], db_path)
    assert json_lines(as_json.stdout) == [{"n": None, "b": "x'00ff'", "f": 1.5}]


def test_sql_json_one_object_per_row(bus: Bus, db_path: Path) -> None:
    _seed_for_sql(bus)
    result = run(["sql", "SELECT seq, type, to_agent, payload FROM messages ORDER BY seq",
                  "--nl"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.stdout) == [
        {"seq": 1, "type": "task_assign", "to_agent": "worker-1", "payload": '{"task":"t1"}'},
        {"seq": 2, "type": "note", "to_agent": None, "payload": None},
    ]


@pytest.mark.parametrize("query", ["SELECT * FROM messages", "SELECT 1 WHERE 0"])
def test_sql_no_rows(bus: Bus, db_path: Path, query: str) -> None:
    result = run(["sql", query], db_path)
    assert result.exit_code == 0
    assert result.stdout == "(no rows)\n"
    as_json = run(["sql", query, "--nl"], db_path)
    assert as_json.exit_code == 0
    assert as_json.stdout == ""


@pytest.mark.parametrize("query", [
    "DELETE FROM messages",
    "INSERT INTO messages (id, ts_ms, from_agent, type) VALUES ('x', 1, 'a', 't')",
    "UPDATE messages SET type = 'changed'",
    "DROP TABLE messages",
    "CREATE TABLE extra (x)",
    "INSERT INTO cursors VALUES ('w1', 1, 1)",
    "PRAGMA user_version = 5",
    "PRAGMA journal_mode = DELETE",
    "ATTACH DATABASE 'other.db' AS other",
])
def test_sql_refuses_writes_and_leaves_data_unchanged(bus: Bus, db_path: Path,
                                                      query: str) -> None:
    _seed_for_sql(bus)
    before = run(["sql", "SELECT * FROM messages ORDER BY seq", "--nl"], db_path).stdout
    result = run(["sql", query], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")
    assert "read-only" in result.stderr
    after = run(["sql", "SELECT * FROM messages ORDER BY seq", "--nl"], db_path).stdout
    assert after == before
    assert len(json_lines(after)) == 2
    assert bus.list_cursors() == []


def test_sql_vacuum_into_is_refused_without_creating_the_copy(bus: Bus, db_path: Path) -> None:
    copy = db_path.parent / "copy.db"
    result = run(["sql", f"VACUUM INTO '{copy}'"], db_path)
    assert result.exit_code == 1
    assert "read-only" in result.stderr
    assert not copy.exists()


def test_sql_runs_one_statement_at_a_time(bus: Bus, db_path: Path) -> None:
    _seed_for_sql(bus)
    result = run(["sql", "SELECT 1; DELETE FROM messages"], db_path)
    assert result.exit_code == 2
    assert "one statement at a time" in result.stderr
    assert bus.message_count() == 2


def test_sql_json_keeps_repeated_column_names(bus: Bus, db_path: Path) -> None:
    result = run(["sql", "SELECT 1 AS a, 2 AS a, 3 AS b", "--nl"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.stdout) == [{"a": 1, "a_2": 2, "b": 3}]


def test_sql_reads_schema_pragmas(bus: Bus, db_path: Path) -> None:
    result = run(["sql", "PRAGMA table_info(cursors)", "--nl"], db_path)
    assert result.exit_code == 0
    assert [row["name"] for row in json_lines(result.stdout)] == [
        "agent_id", "last_acked_seq", "updated_at_ms"]
    assert bus.schema_version() == LATEST_VERSION
    tables = run(["sql", "SELECT name FROM sqlite_schema WHERE name = 'extra'"], db_path)
    assert tables.stdout == "(no rows)\n"


def test_sql_syntax_error_exits_1(bus: Bus, db_path: Path) -> None:
    result = run(["sql", "SELEC seq FROM messages"], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: SQL failed: ")
    assert "syntax error" in result.stderr


def test_sql_unknown_table_exits_1(bus: Bus, db_path: Path) -> None:
    result = run(["sql", "SELECT * FROM no_such_table"], db_path)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: SQL failed: ")
    assert "no such table: no_such_table" in result.stderr


def test_sql_missing_query_is_usage_error(bus: Bus, db_path: Path) -> None:
    result = run(["sql"], db_path)
    assert result.exit_code == 2
    assert "Missing argument 'QUERY'" in result.stderr


# --- migrate ----------------------------------------------------------------


def test_migrate_status_on_current_database(initialized: Path) -> None:
    result = run(["migrate", "--status"], initialized)
    assert result.exit_code == 0
    assert result.stdout == f"schema version {LATEST_VERSION} (latest {LATEST_VERSION})\n"
    assert result.stderr == ""


def test_migrate_on_current_database_applies_nothing(initialized: Path) -> None:
    result = run(["migrate"], initialized)
    assert result.exit_code == 0
    assert result.stdout == f"schema version {LATEST_VERSION} (latest {LATEST_VERSION})\n"


def test_migrate_json(initialized: Path) -> None:
    for args in (["migrate", "--json"], ["migrate", "--status", "--json"]):
        result = run(args, initialized)
        assert result.exit_code == 0
        assert json.loads(result.stdout) == {"path": str(initialized), "version": LATEST_VERSION,
                                             "latest": LATEST_VERSION, "pending": [], "applied": []}


def unmigrated_bus_file(path: Path) -> None:
    """A file marked as an agentbus database whose migrations have not run yet."""
    conn = apsw.Connection(str(path))
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.close()


def test_migrate_status_lists_pending_without_applying(db_path: Path) -> None:
    unmigrated_bus_file(db_path)
    result = run(["migrate", "--status"], db_path)
    assert result.exit_code == 0
    assert result.stdout == f"schema version 0 (latest {LATEST_VERSION})\n" + "".join(
        f"pending {name}\n" for name in MIGRATION_NAMES)
    as_json = run(["migrate", "--status", "--json"], db_path)
    assert json.loads(as_json.stdout) == {"path": str(db_path), "version": 0,
                                          "latest": LATEST_VERSION,
                                          "pending": MIGRATION_NAMES, "applied": []}


def test_migrate_applies_pending_migrations(db_path: Path) -> None:
    unmigrated_bus_file(db_path)
    result = run(["migrate"], db_path)
    assert result.exit_code == 0
    assert result.stdout == f"schema version {LATEST_VERSION} (latest {LATEST_VERSION})\n" + "".join(
        f"applied {name}\n" for name in MIGRATION_NAMES)
    again = run(["migrate", "--json"], db_path)
    assert json.loads(again.stdout)["applied"] == []
    with Bus.open(db_path, create=False) as opened:
        assert opened.schema_version() == LATEST_VERSION


def test_migrate_json_lists_applied(db_path: Path) -> None:
    unmigrated_bus_file(db_path)
    result = run(["migrate", "--json"], db_path)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"path": str(db_path), "version": LATEST_VERSION,
                                         "latest": LATEST_VERSION, "pending": [],
                                         "applied": MIGRATION_NAMES}


@pytest.mark.parametrize("command", [["migrate", "--status"], ["poll", "--agent", "a"],
                                     ["status"], ["tail"], ["sql", "SELECT 1"]])
def test_commands_leave_an_empty_file_untouched(db_path: Path, command: list[str]) -> None:
    db_path.touch()
    result = run(command, db_path)
    assert result.exit_code == 1
    assert "no bus database at" in result.stderr
    assert db_path.stat().st_size == 0
    assert not Path(f"{db_path}-wal").exists()


def test_migrate_missing_database_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "nope.db"
    result = run(["migrate"], db)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: no bus database at {db}")
    assert not db.exists()


# --- status: see tests/cli/test_cli_admin.py -------------------------------------


# --- version, help, unknown commands ------------------------------------------


def test_main_version() -> None:
    result = run(["--version"])
    assert result.exit_code == 0
    assert result.stdout == "bus, version 0.1.0\n"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_main_help_lists_commands_and_example(flag: str) -> None:
    result = run([flag])
    assert result.exit_code == 0
    assert "Example" in result.stdout
    for command in SUBCOMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help_has_example(command: str, tmp_path: Path) -> None:
    db = tmp_path / "never-created.db"
    result = run([command, "--help"], db)
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: ")
    assert f" {command} [OPTIONS]" in result.stdout.splitlines()[0]
    assert "Example" in result.stdout
    assert not db.exists()


def test_main_unknown_command_is_usage_error(tmp_path: Path) -> None:
    result = run(["frobnicate"], tmp_path / "bus.db")
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.stderr


# --- real subprocess smoke test -------------------------------------------------


@pytest.mark.slow
def test_cli_subprocess_smoke(tmp_path: Path, bus_command, python_env) -> None:
    db = tmp_path / "smoke" / "bus.db"
    env = child_env(python_env)

    def bus_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(bus_command + ["--db", str(db), *args], env=env,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    init = bus_cli("init")
    assert init.returncode == 0, init.stderr
    assert init.stdout == f"bus created at {db} (schema version {LATEST_VERSION})\n"

    publish = bus_cli("publish", "--from", "planner", "--to", "worker-1", "--type",
                      "task_assign", "--payload", '{"task": "t1"}')
    assert publish.returncode == 0, publish.stderr
    match = re.fullmatch(rf"published seq 1 id ({UUID_RE}) \(durable: commit\)\n",
                         publish.stdout)
    assert match, publish.stdout

    poll = bus_cli("poll", "--agent", "worker-1", "--json")
    assert poll.returncode == 0, poll.stderr
    [row] = json_lines(poll.stdout)
    assert (row["seq"], row["id"], row["from"], row["to"], row["type"], row["payload"]) == (
        1, match.group(1), "planner", "worker-1", "task_assign", {"task": "t1"})

    ack = bus_cli("ack", "--agent", "worker-1", "--seq", "1")
    assert ack.returncode == 0, ack.stderr
    assert ack.stdout == "worker-1 acked up to seq 1\n"

    empty = bus_cli("poll", "--agent", "worker-1")
    assert empty.returncode == 0
    assert empty.stdout == ""
    assert empty.stderr == "no messages for worker-1 above seq 1\n"

    missing = subprocess.run(bus_command + ["--db", str(tmp_path / "nope.db"), "status"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.startswith("Error: no bus database at")
    assert list(tmp_path.iterdir()) == [tmp_path / "smoke"]


def test_poll_human_line_shortens_long_payload_but_json_keeps_it(bus: Bus, db_path: Path) -> None:
    bus.publish("a", "report", {"log": "x" * 10_000}, to="w1")
    line = run(["poll", "--agent", "w1"], db_path).stdout.rstrip("\n")
    assert line.endswith('{"log":"' + "x" * 192 + '... (10010 bytes, see --json)')
    [row] = json_lines(run(["poll", "--agent", "w1", "--json"], db_path).stdout)
    assert row["payload"] == {"log": "x" * 10_000}
