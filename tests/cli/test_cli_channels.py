"""The message engine from the shell: `bus channel`, send, receive, acknowledge,
deliveries, query, thread and `bus dlq`.

In-process tests drive `bus.cli.main` with click's CliRunner and compare
whole outputs; ids and times that the bus assigns are read from the
command's own --json output or from the database. The seed's three
workflows run end to end; the threaded conversation also runs as real
`python -m bus.cli` processes.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bus import Bus
import bus.api
from bus.channels.engine import Channels
from bus.channels.engine import StoreLimits
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import iso
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import ManualClock

UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
TIMEOUT_S = 30.0  # overall limit of loops that wait for a deadline to pass


# --- helpers ----------------------------------------------------------------------


def ok(args: list[str], db: Path, *, input: str | None = None):
    result = run(args, db, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def ok_json(args: list[str], db: Path, *, input: str | None = None) -> dict:
    return json.loads(ok([*args, "--json"], db, input=input).stdout)


def assert_error(args: list[str], db: Path, message: str, *, input: str | None = None) -> None:
    """The command fails with exit 1 and exactly `Error: <message>` on stderr; a message
    `--flag: reason` (or `ARGUMENT: reason`) is a refused value: exit 2 after the usage."""
    result = run(args, db, input=input)
    flag, _, reason = message.partition(": ")
    if re.fullmatch(r"--[a-z-]+|[A-Z_]+", flag):
        assert (result.exit_code, result.stdout) == (2, ""), result.stderr
        assert last_error(result.stderr) == bad_value(flag, reason)
    else:
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"Error: {message}\n")


def assert_usage_error(args: list[str], db: Path, fragment: str) -> None:
    result = run(args, db)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert fragment in result.stderr


@pytest.fixture
def cli_clock(monkeypatch, clock: ManualClock) -> ManualClock:
    """The CLI's channel engine on an injected clock the test steps (no sleeping).

    Ack timers start at send, so with real time a slow machine could let a
    50 ms timer run out between two commands of a test.
    """
    monkeypatch.setattr(bus.api, "Channels", lambda b: Channels(b, clock=clock))
    return clock


def tick_until(db: Path, key: str, count: int = 1) -> dict:
    """Run `bus channel tick --json` until the report's `key` reaches `count`.

    The deadlines are 50 ms away; the loop waits for them instead of sleeping
    a fixed time, with a generous overall limit for a loaded machine.
    """
    deadline = time.monotonic() + TIMEOUT_S
    total = 0
    while time.monotonic() < deadline:
        report = ok_json(["channel", "tick"], db)
        total += report[key]
        if total >= count:
            return report
        threading.Event().wait(0.01)
    raise AssertionError(f"tick did not report {count} {key} within {TIMEOUT_S} s")


@pytest.fixture
def db(db_path: Path) -> Path:
    ok(["init"], db_path)
    return db_path


@pytest.fixture
def direct(db: Path) -> Path:
    """Channel `pe`: direct, planner (owner) and executor."""
    ok(["channel", "create", "pe", "--type", "direct", "--owner", "planner"], db)
    ok(["channel", "join", "pe", "--agent", "executor"], db)
    return db


@pytest.fixture
def group(db: Path) -> Path:
    """Channel `talk`: group of lead (owner), researcher and reviewer."""
    ok(["channel", "create", "talk", "--type", "group", "--owner", "lead"], db)
    ok(["channel", "join", "talk", "--agent", "researcher"], db)
    ok(["channel", "join", "talk", "--agent", "reviewer"], db)
    return db


@pytest.fixture
def ci(db: Path) -> Path:
    """Channel `ci`: pubsub owned by ci-agent; deploy, monitor and alert subscribed."""
    ok(["channel", "create", "ci", "--type", "pubsub", "--owner", "ci-agent"], db)
    for agent, pattern in (("deploy", "build.*.success"), ("monitor", "deploy.#"),
                           ("alert", "*.failure")):
        ok(["channel", "subscribe", "ci", "--agent", agent, "--pattern", pattern], db)
    return db


def line(sent: dict, extra: str = "") -> str:
    """The human line of a message, from its --json form."""
    fields = [f"#{sent['seq']}", iso(sent["ts_ms"]), f"{sent['sender']} -> #{sent['channel']}",
              sent["type"]]
    if sent.get("topic"):
        fields.append(f"topic={sent['topic']}")
    if sent["priority"] != 2:
        fields.append(f"priority={sent['priority']}")
    if sent.get("correlation_id"):
        fields.append(f"corr={sent['correlation_id']}")
    if sent.get("in_reply_to"):
        fields.append(f"reply-to={sent['in_reply_to']}")
    if extra:
        fields.append(extra)
    fields.append(json.dumps(sent["content"], separators=(",", ":"), ensure_ascii=False))
    return "  ".join(fields)


# --- the seed's workflows ------------------------------------------------------------


def test_workflow_task_delegation_command_received_then_completed(direct: Path) -> None:
    db = direct
    sent = ok_json(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "command",
                    "--content", "Deploy the authentication service to staging"], db)
    assert (sent["seq"], sent["sender"], sent["type"], sent["status"]) == (
        1, "planner", "command", "sent")

    got = ok(["channel", "receive", "--agent", "executor"], db)
    assert got.stdout == line(sent) + "\n"
    assert got.stderr == "1 of 1 message(s) for executor\n"

    received = ok(["channel", "acknowledge", "--agent", "executor", "--seq", "1", "--status", "received"], db)
    assert received.stdout == "executor acknowledged seq 1: received\n"
    done = ok_json(["channel", "acknowledge", "--agent", "executor", "--seq", "1", "--status", "completed",
                    "--note", "Deployed successfully. Health check passing."], db)
    assert done == {"seq": 1, "agent": "executor", "status": "completed"}

    assert ok(["channel", "deliveries", "--seq", "1"], db).stdout == (
        "recipient  status     attempts  retries  note\n"
        "executor   completed  1         0        Deployed successfully. Health check passing.\n")
    [history] = json_lines(ok(["channel", "query", "--status", "acknowledged", "--json"], db).stdout)
    assert (history["seq"], history["status"]) == (1, "acknowledged")
    empty = ok(["channel", "receive", "--agent", "executor"], db)
    assert (empty.stdout, empty.stderr) == ("", "no messages for executor\n")


def test_workflow_pubsub_ci_events_reach_matching_subscribers_only(ci: Path) -> None:
    db = ci
    sent = ok_json(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event",
                    "--topic", "build.frontend.success", "--content",
                    "Frontend build completed: 847 tests passed, bundle size 2.1 MB"], db)
    assert sent["topic"] == "build.frontend.success"

    deploy = ok(["channel", "receive", "--agent", "deploy", "--json"], db)
    [message] = json_lines(deploy.stdout)
    assert (message["seq"], message["recipient"], message["topic"], message["content"]) == (
        sent["seq"], "deploy", "build.frontend.success",
        "Frontend build completed: 847 tests passed, bundle size 2.1 MB")
    assert json.loads(deploy.stderr) == {"returned": 1, "total_count": 1, "has_more": False}
    for agent in ("alert", "monitor"):
        nothing = ok(["channel", "receive", "--agent", agent], db)
        assert (nothing.stdout, nothing.stderr) == ("", f"no messages for {agent}\n")

    failure = ok_json(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event",
                       "--topic", "deploy.failure", "--content", "staging deploy failed"], db)
    assert [m["seq"] for m in json_lines(
        ok(["channel", "receive", "--agent", "alert", "--json"], db).stdout)] == [failure["seq"]]
    assert [m["seq"] for m in json_lines(
        ok(["channel", "receive", "--agent", "monitor", "--json"], db).stdout)] == [failure["seq"]]


def test_workflow_threaded_conversation_in_real_processes(group: Path, bus_command,
                                                          python_env) -> None:
    env = dict(python_env)
    env.pop("BUS_DURABILITY", None)

    def bus_cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(bus_command + ["--db", str(group), *args], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done

    query = json.loads(bus_cli("channel", "send", "--channel", "talk", "--from", "lead", "--type", "query",
                               "--timeout", "30", "--content", "What is the recommended"
                               " connection pool size for 10K concurrent users?", "--json").stdout)
    corr = query["correlation_id"]
    assert corr == query["id"]  # a new query is its own thread
    answer = bus_cli("channel", "send", "--channel", "talk", "--from", "researcher", "--type", "response",
                     "--correlation-id", corr, "--content", "pool_size = num_cores * 2 +"
                     " disk_spindles. For your 8-core setup: 20 connections.")
    assert answer.stdout.startswith(f"sent seq {query['seq'] + 1} id ")
    assert answer.stdout.endswith(f" correlation_id {corr}\n")
    bus_cli("channel", "send", "--channel", "talk", "--from", "reviewer", "--type", "response",
            "--correlation-id", corr, "--content", "Agreed, but consider PgBouncer.")

    thread = json_lines(bus_cli("channel", "thread", corr, "--json").stdout)
    assert [(m["sender"], m["type"], m["correlation_id"], m["in_reply_to"]) for m in thread] == [
        ("lead", "query", corr, None), ("researcher", "response", corr, query["id"]),
        ("reviewer", "response", corr, query["id"])]
    human = bus_cli("channel", "thread", corr).stdout.splitlines()
    assert human == [line(m) for m in thread]
    # The reviewer's answer completed the query for it, so it receives only the
    # researcher's answer, not the query again nor its own answer (no echo).
    inbox = json_lines(bus_cli("channel", "receive", "--agent", "reviewer", "--json").stdout)
    assert [m["seq"] for m in inbox] == [thread[1]["seq"]]


def test_workflow_command_answered_by_acknowledgment_message(direct: Path) -> None:
    command = ok_json(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "command",
                       "--correlation-id", "deploy-1", "--content", "Deploy"], direct)
    answer = ok_json(["channel", "send", "--channel", "pe", "--from", "executor", "--type",
                      "acknowledgment", "--correlation-id", "deploy-1", "--content", "on it"],
                     direct)
    assert (answer["in_reply_to"], answer["correlation_id"]) == (command["id"], "deploy-1")
    assert [m["type"] for m in json_lines(ok(["channel", "thread", "deploy-1", "--json"], direct).stdout)] \
        == ["command", "acknowledgment"]


def test_receive_wait_in_real_process_returns_message_sent_meanwhile(
        direct: Path, bus: Bus, bus_command, python_env) -> None:
    env = dict(python_env)
    env.pop("BUS_DURABILITY", None)
    proc = subprocess.Popen(bus_command + ["--db", str(direct), "channel", "receive", "--agent", "executor",
                                           "--wait", "60", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        sent = bus.channels.send_message("pe", "planner", "command", "wake up")
        out, err = proc.communicate(timeout=45)  # well before --wait runs out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    [got] = json_lines(out)
    assert (got["seq"], got["content"], got["recipient"]) == (sent.seq, "wake up", "executor")
    assert json.loads(err) == {"returned": 1, "total_count": 1, "has_more": False}


# --- bus channel create / join / leave / subscribe / unsubscribe ----------------------------


def test_channel_create_human_line_shows_defaults(db: Path) -> None:
    result = ok(["channel", "create", "pe", "--type", "direct", "--owner", "planner"], db)
    assert result.stdout == ("created direct channel pe owned by planner"
                             " (at_least_once, ack timeout 30 s, 3 retries)\n")


def test_channel_create_json_carries_every_setting(db: Path) -> None:
    made = ok_json(["channel", "create", "jobs", "--type", "group", "--owner", "boss",
                    "--max-message-size", "64", "--delivery-mode", "exactly_once",
                    "--ack-timeout", "2.5", "--max-retries", "0", "--retry-backoff-ms", "0",
                    "--max-pending", "5", "--echo", "--priority-ordering"], db)
    made.pop("created_at_ms")
    assert made == {"id": 1, "name": "jobs", "type": "group", "owner": "boss", "state": "active",
                    "open_deliveries": 0, "max_message_size": 64,
                    "delivery_mode": "exactly_once", "ack_timeout": 2.5, "max_retries": 0,
                    "retry_backoff_ms": 0, "max_pending": 5, "echo": True,
                    "priority_ordering": True}


@pytest.mark.parametrize(("args", "message"), [
    (["--type", "bogus"], "--type: 'bogus' is not one of direct, group, broadcast, pubsub"),
    (["--type", "group", "--delivery-mode", "twice"],
     "--delivery-mode: 'twice' is not one of at_most_once, at_least_once, exactly_once"),
    (["--type", "group", "--ack-timeout", "0"],
     "--ack-timeout: must be seconds between 0.001 and 604800, got 0.0"),
    (["--type", "group", "--max-retries", "-1"], "--max-retries: must be an integer >= 0, got -1"),
    (["--type", "group", "--max-message-size", "0"],
     "--max-message-size: must be an integer >= 1, got 0"),
    (["--type", "group", "--max-pending", "0"], "--max-pending: must be an integer >= 1, got 0"),
], ids=["type", "delivery-mode", "ack-timeout", "max-retries", "max-message-size", "max-pending"])
def test_channel_create_bad_setting_is_error(db: Path, args: list[str], message: str) -> None:
    assert_error(["channel", "create", "c", "--owner", "o", *args], db, message)
    assert ok(["channel", "list"], db).stdout == "no channels\n"


def test_channel_create_taken_name_is_error(direct: Path) -> None:
    assert_error(["channel", "create", "pe", "--type", "group", "--owner", "x"], direct,
                 "NAME: a channel named 'pe' exists already; pick another name or use the"
                 " existing channel")


def test_channel_create_missing_type_is_usage_error(db: Path) -> None:
    assert_usage_error(["channel", "create", "c", "--owner", "o"], db,
                       "Missing option '--type'")


def test_channel_join_leave_human_and_json(group: Path) -> None:
    db = group
    assert ok(["channel", "join", "talk", "--agent", "bot", "--role", "observer"], db).stdout == (
        "bot joined talk as observer\n")
    assert ok_json(["channel", "join", "talk", "--agent", "bot"], db) == {
        "channel": "talk", "agent": "bot", "role": "member"}
    assert ok(["channel", "leave", "talk", "--agent", "bot"], db).stdout == "bot left talk\n"
    assert ok(["channel", "leave", "talk", "--agent", "bot"], db).stdout == "bot was not in talk\n"
    assert ok_json(["channel", "leave", "talk", "--agent", "bot"], db) == {
        "channel": "talk", "agent": "bot", "left": False}


@pytest.mark.parametrize(("args", "message"), [
    (["join", "nope", "--agent", "a"], "NAME: no channel named 'nope'; create it with"
     " `bus channel create` or list them with `bus channel list`"),
    (["join", "talk", "--agent", "a", "--role", "boss"],
     "--role: 'boss' is not one of member, observer"),
    (["join", "talk", "--agent", "a", "--role", "owner"],
     "--role: a channel has one owner, set when it is created; join as member or observer"),
    (["join", "talk", "--agent", "bad agent"],
     "--agent: contains ' '; allowed are letters, digits and . _ : -"),
    (["leave", "talk", "--agent", "lead"],
     "--agent: lead owns channel 'talk' and cannot leave it; close the channel instead"),
    (["subscribe", "talk", "--agent", "a", "--pattern", "x.#"],
     "NAME: channel 'talk' is a group channel; topic subscriptions need a pubsub channel"),
], ids=["unknown-channel", "bad-role", "owner-role", "bad-agent", "owner-leaves", "not-pubsub"])
def test_channel_membership_errors(group: Path, args: list[str], message: str) -> None:
    assert_error(["channel", *args], group, message)


def test_channel_direct_takes_two_participants(direct: Path) -> None:
    assert_error(["channel", "join", "pe", "--agent", "third"], direct,
                 "NAME: direct channel 'pe' has its two participants already;"
                 " use a group channel for more")


def test_channel_subscribe_and_unsubscribe_report_changes(ci: Path) -> None:
    db = ci
    args = ["ci", "--agent", "deploy", "--pattern", "build.*.success"]
    assert ok(["channel", "subscribe", *args], db).stdout == (
        "deploy was already subscribed to build.*.success on ci\n")
    assert ok_json(["channel", "unsubscribe", *args], db) == {
        "channel": "ci", "agent": "deploy", "pattern": "build.*.success", "unsubscribed": True}
    assert ok(["channel", "unsubscribe", *args], db).stdout == (
        "deploy was not subscribed to build.*.success on ci\n")
    assert ok(["channel", "subscribe", *args], db).stdout == (
        "deploy subscribed to build.*.success on ci\n")
    assert ok_json(["channel", "subscribe", *args], db)["subscribed"] is False


# --- bus channel list / show / state / tick ----------------------------------------------


def test_channel_list_table_and_json(direct: Path, ci: Path) -> None:
    db = ci
    assert ok(["channel", "list"], db).stdout == (
        "name  type    owner     state   delivery_mode  open\n"
        "ci    pubsub  ci-agent  active  at_least_once  0\n"
        "pe    direct  planner   active  at_least_once  0\n")
    assert [(c["name"], c["type"]) for c in json_lines(
        ok(["channel", "list", "--json"], db).stdout)] == [("ci", "pubsub"), ("pe", "direct")]


def test_channel_show_human_lists_config_participants_and_subscriptions(ci: Path,
                                                                         bus: Bus) -> None:
    ok(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event", "--topic",
        "deploy.web", "--content", "x"], ci)
    channel = bus.channels.get_channel("ci")
    joined = {p.agent: iso(p.joined_at_ms) for p in bus.channels.participants("ci")}
    assert ok(["channel", "show", "ci"], ci).stdout == (
        f"channel ci: pubsub, active, owner ci-agent, created {iso(channel.created_at_ms)}\n"
        "config: max_message_size 1048576, delivery_mode at_least_once, ack_timeout 30 s,"
        " max_retries 3, retry_backoff_ms 1000, max_pending unlimited, echo no,"
        " priority_ordering no\n"
        "open deliveries: 1\n"
        "participants:\n"
        "agent     role    joined\n"
        f"ci-agent  owner   {joined['ci-agent']}\n"
        f"deploy    member  {joined['deploy']}\n"
        f"monitor   member  {joined['monitor']}\n"
        f"alert     member  {joined['alert']}\n"
        "subscriptions:\n"
        "pattern          agent\n"
        "*.failure        alert\n"
        "build.*.success  deploy\n"
        "deploy.#         monitor\n")


def test_channel_show_json_has_participants_and_subscriptions(ci: Path) -> None:
    shown = ok_json(["channel", "show", "ci"], ci)
    assert (shown["name"], shown["state"], shown["open_deliveries"]) == ("ci", "active", 0)
    assert [(p["agent"], p["role"]) for p in shown["participants"]] == [
        ("ci-agent", "owner"), ("deploy", "member"), ("monitor", "member"), ("alert", "member")]
    assert shown["subscriptions"] == [{"pattern": "*.failure", "agent": "alert"},
                                      {"pattern": "build.*.success", "agent": "deploy"},
                                      {"pattern": "deploy.#", "agent": "monitor"}]


def test_channel_show_unknown_is_error(db: Path) -> None:
    assert_error(["channel", "show", "nope"], db, "NAME: no channel named 'nope'; create it"
                 " with `bus channel create` or list them with `bus channel list`")


def test_channel_pause_holds_sends_and_deliveries_until_resume(direct: Path) -> None:
    db = direct
    ok(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content", "a"], db)
    assert ok(["channel", "pause", "pe"], db).stdout == "channel pe is paused\n"
    assert_error(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content",
                  "b"], db, "--channel: channel 'pe' is paused; it accepts messages only while"
                            " active (bus channel resume pe)")
    assert ok(["channel", "receive", "--agent", "executor"], db).stdout == ""
    assert ok_json(["channel", "resume", "pe"], db) == {"channel": "pe", "state": "active"}
    assert [m["content"] for m in json_lines(
        ok(["channel", "receive", "--agent", "executor", "--json"], db).stdout)] == ["a"]


def test_channel_drain_delivers_but_refuses_new_sends(direct: Path) -> None:
    db = direct
    ok(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content", "a"], db)
    assert ok(["channel", "drain", "pe"], db).stdout == "channel pe is draining\n"
    assert_error(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content",
                  "b"], db, "--channel: channel 'pe' is draining; it accepts messages only while"
                            " active (bus channel resume pe)")
    assert len(ok(["channel", "receive", "--agent", "executor"], db).stdout.splitlines()) == 1


def test_channel_close_is_final(direct: Path) -> None:
    db = direct
    assert ok(["channel", "close", "pe"], db).stdout == "channel pe is closed\n"
    assert_error(["channel", "resume", "pe"], db, "state: channel 'pe' is closed; a closed"
                 " channel cannot be reopened, create a new one")
    assert_error(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content",
                  "b"], db, "--channel: channel 'pe' is closed; it accepts messages only while"
                            " active")
    assert_error(["channel", "join", "pe", "--agent", "x"], db, "NAME: channel 'pe' is closed")


def test_channel_state_of_unknown_channel_is_error(db: Path) -> None:
    for command in ("pause", "resume", "drain", "close"):
        assert_error(["channel", command, "nope"], db, "NAME: no channel named 'nope'; create"
                     " it with `bus channel create` or list them with `bus channel list`")


def test_channel_tick_with_nothing_due(db: Path) -> None:
    assert ok(["channel", "tick"], db).stdout == (
        "redelivered 0, dead-lettered 0, expired queries 0\n")
    assert ok_json(["channel", "tick"], db) == {"redelivered": 0, "dead_lettered": 0,
                                                "expired_queries": 0}


def test_channel_tick_redelivers_unacknowledged_message(db: Path,
                                                    cli_clock: ManualClock) -> None:
    ok(["channel", "create", "j", "--type", "direct", "--owner", "boss", "--ack-timeout", "0.05",
        "--max-retries", "1", "--retry-backoff-ms", "0"], db)
    ok(["channel", "join", "j", "--agent", "w"], db)
    sent = ok_json(["channel", "send", "--channel", "j", "--from", "boss", "--type", "command",
                    "--content", "go"], db)
    ok(["channel", "receive", "--agent", "w"], db)
    cli_clock.now += 49
    assert ok_json(["channel", "tick"], db)["redelivered"] == 0
    cli_clock.now += 1
    assert ok_json(["channel", "tick"], db) == {"redelivered": 1, "dead_lettered": 0,
                                                "expired_queries": 0}
    again = ok(["channel", "receive", "--agent", "w"], db)
    assert again.stdout == line(sent, "attempt=2") + "\n"


# --- bus channel send ---------------------------------------------------------------------


def test_send_human_line_and_json(direct: Path) -> None:
    db = direct
    result = ok(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content",
                 "hi"], db)
    assert result.stdout.startswith("sent seq 1 id ")
    assert len(result.stdout) == len("sent seq 1 id ") + 36 + 1
    sent = ok_json(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "command",
                    "--content", "go", "--priority", "4", "--correlation-id", "t1",
                    "--in-reply-to", "x"], db)
    assert {k: sent[k] for k in ("seq", "channel", "sender", "type", "content", "priority",
                                 "correlation_id", "in_reply_to", "topic", "status")} == {
        "seq": 2, "channel": "pe", "sender": "planner", "type": "command", "content": "go",
        "priority": 4, "correlation_id": "t1", "in_reply_to": "x", "topic": None,
        "status": "sent"}


def test_send_content_from_stdin_drops_one_trailing_newline(direct: Path) -> None:
    sent = ok_json(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text",
                    "--content", "-"], direct, input="line one\nline two\n\n")
    assert sent["content"] == "line one\nline two\n"


def test_send_json_content_sends_the_value(direct: Path) -> None:
    sent = ok_json(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "command",
                    "--json-content", "--content", '{"task": "t1", "n": [1, 2]}'], direct)
    assert sent["content"] == {"task": "t1", "n": [1, 2]}
    [got] = json_lines(ok(["channel", "receive", "--agent", "executor", "--json"], direct).stdout)
    assert got["content"] == {"task": "t1", "n": [1, 2]}


def test_send_query_gets_correlation_id_and_response_answers_it(group: Path) -> None:
    db = group
    query = ok(["channel", "send", "--channel", "talk", "--from", "lead", "--type", "query", "--content",
                "q?"], db)
    corr = query.stdout.rsplit(" ", 1)[1].strip()
    assert query.stdout.startswith("sent seq 1 id ") and len(corr) == 36
    answer = ok_json(["channel", "send", "--channel", "talk", "--from", "researcher", "--type", "response",
                      "--correlation-id", corr, "--content", "a."], db)
    assert (answer["correlation_id"], answer["type"]) == (corr, "response")


def test_send_query_on_pubsub_with_topic_gets_correlation_id(ci: Path) -> None:
    ok(["channel", "subscribe", "ci", "--agent", "ci-agent", "--pattern", "ask.#"], ci)
    ok(["channel", "subscribe", "ci", "--agent", "deploy", "--pattern", "ask.#"], ci)
    query = ok_json(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "query",
                     "--topic", "ask.deploy", "--priority", "3", "--content", "ready?"], ci)
    assert len(query["correlation_id"]) == 36 and query["topic"] == "ask.deploy"
    answer = ok_json(["channel", "send", "--channel", "ci", "--from", "deploy", "--type", "response",
                      "--topic", "ask.deploy", "--correlation-id", query["correlation_id"],
                      "--content", "yes"], ci)
    assert answer["in_reply_to"] == query["id"]


def test_send_query_timeout_expires_unanswered_query(group: Path) -> None:
    db = group
    query = ok_json(["channel", "send", "--channel", "talk", "--from", "lead", "--type", "query",
                     "--timeout", "0.05", "--content", "anyone?"], db)
    tick_until(db, "expired_queries")
    [expired] = json_lines(ok(["channel", "query", "--status", "expired", "--json"], db).stdout)
    assert expired["seq"] == query["seq"]


@pytest.mark.parametrize(("args", "message"), [
    (["--channel", "nope", "--from", "planner", "--type", "text", "--content", "x"],
     "--channel: no channel named 'nope'; create it with `bus channel create` or list them with"
     " `bus channel list`"),
    (["--channel", "pe", "--from", "stranger", "--type", "text", "--content", "x"],
     "--from: stranger is not a participant of channel 'pe'; join it first"),
    (["--channel", "pe", "--from", "planner", "--type", "memo", "--content", "x"],
     "--type: 'memo' is not one of text, command, query, response, acknowledgment, notification,"
     " event"),
    (["--channel", "pe", "--from", "planner", "--type", "text", "--content", ""],
     "--content: must not be empty"),
    (["--channel", "pe", "--from", "planner", "--type", "text", "--content", "x",
      "--priority", "5"],
     "--priority: must be an integer 0-4 (0 lowest, 2 normal, 4 highest), got 5"),
    (["--channel", "pe", "--from", "planner", "--type", "response", "--content", "x"],
     "--correlation-id: a response needs the correlation_id of the query it answers"),
    (["--channel", "pe", "--from", "planner", "--type", "response", "--correlation-id", "c9",
      "--content", "x"],
     "--correlation-id: no query with correlation_id 'c9' on channel 'pe'; every response must"
     " answer one"),
    (["--channel", "pe", "--from", "planner", "--type", "acknowledgment", "--correlation-id",
      "c9", "--content", "x"],
     "--correlation-id: no command with correlation_id 'c9' on channel 'pe'; every acknowledgment"
     " must answer one"),
], ids=["unknown-channel", "non-participant", "bad-type", "empty", "bad-priority",
        "response-without-correlation", "response-without-query", "ack-without-command"])
def test_send_errors(direct: Path, args: list[str], message: str) -> None:
    assert_error(["channel", "send", *args], direct, message)
    assert ok(["channel", "query"], direct).stdout == ""


def test_send_oversized_content_is_error(db: Path) -> None:
    ok(["channel", "create", "small", "--type", "direct", "--owner", "a",
        "--max-message-size", "10"], db)
    ok(["channel", "join", "small", "--agent", "b"], db)
    assert_error(["channel", "send", "--channel", "small", "--from", "a", "--type", "text", "--content",
                  "x" * 20], db,
                 "--content: Message content exceeds channel max_message_size (10 bytes)")


def test_send_pubsub_without_topic_is_error(ci: Path) -> None:
    assert_error(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event",
                  "--content", "x"], ci,
                 "--topic: channel 'ci' is pubsub: a message needs a topic like"
                 " build.frontend.success")


def test_send_broadcast_only_from_owner(db: Path) -> None:
    ok(["channel", "create", "news", "--type", "broadcast", "--owner", "anchor"], db)
    ok(["channel", "join", "news", "--agent", "viewer"], db)
    assert_error(["channel", "send", "--channel", "news", "--from", "viewer", "--type", "text", "--content",
                  "x"], db, "--from: only the owner (anchor) sends on broadcast channel 'news'")
    ok(["channel", "send", "--channel", "news", "--from", "anchor", "--type", "text", "--content", "x"], db)
    assert len(ok(["channel", "receive", "--agent", "viewer"], db).stdout.splitlines()) == 1


def test_send_observer_cannot_send(group: Path) -> None:
    ok(["channel", "join", "talk", "--agent", "bot", "--role", "observer"], group)
    assert_error(["channel", "send", "--channel", "talk", "--from", "bot", "--type", "text", "--content",
                  "x"], group, "--from: bot observes channel 'talk' and cannot send; join it as"
                               " a member")


def test_send_usage_errors(direct: Path) -> None:
    base = ["channel", "send", "--channel", "pe", "--from", "planner"]
    assert_usage_error([*base, "--content", "x"], direct, "Missing option '--type'")
    assert_usage_error([*base, "--type", "text", "--content", "{", "--json-content"], direct,
                       "Invalid value for --content: not valid JSON")
    assert_usage_error([*base, "--type", "text", "--content", "x", "--priority", "high"], direct,
                       "'high' is not a valid integer")


def test_send_store_full_and_store_capacity_are_errors(direct: Path, monkeypatch) -> None:
    def limited(limits: StoreLimits):
        monkeypatch.setattr(bus.api, "Channels", lambda b: Channels(b, limits=limits))

    args = ["channel", "send", "--channel", "pe", "--from", "planner", "--type", "text", "--content", "x"]
    limited(StoreLimits(max_active=0))
    assert_error(args, direct, "the bus holds 0 unfinished deliveries, the limit is 0; receivers"
                 " must acknowledge (or dead letters be purged) before more messages are"
                 " accepted")
    limited(StoreLimits(max_file_bytes=4096, reserve_bytes=0))
    result = run(args, direct)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: the bus file is ")
    assert result.stderr.endswith(" bytes, within 0 bytes of its 4096-byte limit; run"
                                  " `bus compact` or purge dead letters\n")


# --- bus channel receive / acknowledge / deliveries -------------------------------------------------


def send_texts(db: Path, *contents: str, sender: str = "lead") -> list[dict]:
    return [ok_json(["channel", "send", "--channel", "talk", "--from", sender, "--type", "text",
                     "--content", c], db) for c in contents]


def test_receive_limit_reports_total_and_more_on_stderr(group: Path) -> None:
    sent = send_texts(group, "one", "two", "three")
    first = ok(["channel", "receive", "--agent", "reviewer", "--limit", "2"], group)
    assert first.stdout == line(sent[0]) + "\n" + line(sent[1]) + "\n"
    assert first.stderr == "2 of 3 message(s) for reviewer; more are waiting: receive again\n"
    rest = ok(["channel", "receive", "--agent", "reviewer", "--json"], group)
    assert [m["content"] for m in json_lines(rest.stdout)] == ["three"]
    assert json.loads(rest.stderr) == {"returned": 1, "total_count": 1, "has_more": False}


def test_receive_filters_by_sender_type_content_and_sort(group: Path) -> None:
    db = group
    send_texts(db, "alpha", "beta")
    send_texts(db, "gamma", sender="researcher")
    ok(["channel", "send", "--channel", "talk", "--from", "lead", "--type", "command", "--content", "do"], db)

    def contents(*args: str) -> list[str]:
        found = ok(["channel", "receive", "--agent", "reviewer", "--json", *args], db).stdout
        return [m["content"] for m in json_lines(found)]

    assert contents("--sender", "researcher") == ["gamma"]
    assert contents("--type", "command", "--type", "query") == ["do"]
    assert contents("--content-pattern", "^b") == ["beta"]
    assert contents("--sort-order", "desc", "--channel", "talk") == ["alpha"]


def test_receive_priority_ordering_channel_gives_urgent_first(db: Path) -> None:
    ok(["channel", "create", "ops", "--type", "direct", "--owner", "a", "--priority-ordering"], db)
    ok(["channel", "join", "ops", "--agent", "b"], db)
    for content, priority in (("low", "0"), ("urgent", "4"), ("normal", "2")):
        ok(["channel", "send", "--channel", "ops", "--from", "a", "--type", "text", "--content", content,
            "--priority", priority], db)
    found = json_lines(ok(["channel", "receive", "--agent", "b", "--json"], db).stdout)
    assert [m["content"] for m in found] == ["urgent", "normal", "low"]


@pytest.mark.parametrize(("args", "message"), [
    (["--channel", "nope"], "--channel: no channel named 'nope'; create it with"
     " `bus channel create` or list them with `bus channel list`"),
    (["--type", "memo"], "--type: 'memo' is not one of text, command, query, response,"
     " acknowledgment, notification, event"),
    (["--status", "lost"], "--status: 'lost' is not one of sent, delivered, acknowledged,"
     " failed, dead_letter, expired"),
    (["--sort-by", "size"], "--sort-by: 'size' is not one of created_at, priority, sender,"
     " type, topic"),
    (["--sort-order", "up"], "--sort-order: 'up' is not asc or desc"),
    (["--limit", "0"], "--limit: must be 1-10000, got 0"),
    (["--offset", "-1"], "--offset: must be >= 0, got -1"),
    (["--content-pattern", "("], "--content-pattern: is not a valid regular expression:"
     " missing ), unterminated subpattern at position 0"),
], ids=["unknown-channel", "type", "status", "sort-by", "sort-order", "limit", "offset", "regex"])
def test_receive_and_query_filter_errors(group: Path, args: list[str], message: str) -> None:
    assert_error(["channel", "receive", "--agent", "reviewer", *args], group, message)
    assert_error(["channel", "query", *args], group, message)


def test_receive_wait_returns_empty_after_timeout(group: Path) -> None:
    result = ok(["channel", "receive", "--agent", "reviewer", "--wait", "0.05"], group)
    assert (result.stdout, result.stderr) == ("", "no messages for reviewer\n")
    assert_usage_error(["channel", "receive", "--agent", "reviewer", "--wait", "-1"], group,
                       "Invalid value for '--wait'")


def test_receive_missing_agent_is_usage_error(group: Path) -> None:
    assert_usage_error(["channel", "receive"], group, "Missing option '--agent'")


def test_acknowledge_errors(direct: Path) -> None:
    db = direct
    ok(["channel", "send", "--channel", "pe", "--from", "planner", "--type", "command", "--content", "x"], db)
    ack = ["channel", "acknowledge", "--agent", "executor", "--seq", "1", "--status"]
    assert_error([*ack, "completed"], db, "--seq: message 1 has not been received by executor"
                 " yet; receive it before acknowledging it")
    assert_error(["channel", "acknowledge", "--agent", "executor", "--seq", "9", "--status", "completed"],
                 db, "--seq: message 9 has no delivery to executor; ack only messages you"
                     " received")
    ok(["channel", "receive", "--agent", "executor"], db)
    assert_error([*ack, "done"], db,
                 "--status: 'done' is not one of received, in_progress, completed, failed")
    assert ok([*ack, "failed", "--note", "disk full"], db).stdout == (
        "executor acknowledged seq 1: failed\n")
    assert_error([*ack, "completed"], db, "--status: message 1 to executor is already failed;"
                 " a final status cannot change")
    assert ok(["channel", "deliveries", "--seq", "1", "--json"], db).stdout.count('"note":"disk full"') == 1
    assert_usage_error(["channel", "acknowledge", "--agent", "executor", "--seq", "one", "--status",
                        "failed"], db, "'one' is not a valid integer")


def test_deliveries_of_message_without_recipients(db: Path) -> None:
    ok(["channel", "create", "solo", "--type", "group", "--owner", "a"], db)
    ok(["channel", "send", "--channel", "solo", "--from", "a", "--type", "text", "--content", "x"], db)
    assert ok(["channel", "deliveries", "--seq", "1"], db).stdout == "message 1 has no deliveries\n"
    assert_error(["channel", "deliveries", "--seq", "0"], db, "--seq: must be an integer >= 1, got 0")


# --- bus channel query / thread ---------------------------------------------------------------


def test_query_newest_first_and_nothing_is_delivered(group: Path) -> None:
    sent = send_texts(group, "one", "two", "three")
    result = ok(["channel", "query", "--channel", "talk"], group)
    assert result.stdout == "".join(line(s) + "\n" for s in reversed(sent))
    assert result.stderr == "3 of 3 message(s) matching\n"
    page = ok(["channel", "query", "--sort-order", "asc", "--limit", "1", "--offset", "1"], group)
    assert page.stdout == line(sent[1]) + "\n"
    assert page.stderr == "1 of 3 message(s) matching; more follow: page with --offset\n"
    assert len(ok(["channel", "receive", "--agent", "reviewer"], group).stdout.splitlines()) == 3


def test_query_by_time_range_and_topic_pattern(ci: Path) -> None:
    db = ci
    first = ok_json(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event",
                     "--topic", "build.web.success", "--content", "a"], db)
    second = ok_json(["channel", "send", "--channel", "ci", "--from", "ci-agent", "--type", "event",
                      "--topic", "deploy.web", "--content", "b"], db)

    def seqs(*args: str) -> list[int]:
        return [m["seq"] for m in json_lines(ok(["channel", "query", "--json", *args], db).stdout)]

    assert seqs("--topic", "build.#") == [first["seq"]]
    assert seqs("--topic", "*.web") == [second["seq"]]
    assert seqs("--after-ms", str(second["ts_ms"] + 1)) == []
    assert seqs("--before-ms", str(first["ts_ms"] + 1), "--after-ms", str(first["ts_ms"])) == [
        first["seq"]]
    empty = ok(["channel", "query", "--sender", "nobody"], db)
    assert (empty.stdout, empty.stderr) == ("", "no messages matching\n")


def test_thread_unknown_correlation_id_prints_nothing(db: Path) -> None:
    result = ok(["channel", "thread", "nope"], db)
    assert (result.stdout, result.stderr) == ("", "no messages with correlation id nope\n")
    assert ok(["channel", "thread", "nope", "--json"], db).stdout == ""
    assert_error(["channel", "thread", ""], db, "CORRELATION_ID: must be a non-empty string")


# --- bus dlq --------------------------------------------------------------------


@pytest.fixture
def dead(db: Path, cli_clock: ManualClock) -> dict:
    """A command on channel `jobs` (ack timeout 50 ms, no retries) received, never acked,
    and dead-lettered by `bus channel tick`; returns its send --json."""
    ok(["channel", "create", "jobs", "--type", "direct", "--owner", "boss", "--ack-timeout",
        "0.05", "--max-retries", "0"], db)
    ok(["channel", "join", "jobs", "--agent", "w"], db)
    sent = ok_json(["channel", "send", "--channel", "jobs", "--from", "boss", "--type", "command",
                    "--content", "do it"], db)
    assert len(ok(["channel", "receive", "--agent", "w"], db).stdout.splitlines()) == 1
    cli_clock.now += 50
    report = ok_json(["channel", "tick"], db)
    assert report == {"redelivered": 0, "dead_lettered": 1, "expired_queries": 0}
    return sent


def test_dlq_dead_letter_listed_shown_replayed_and_received_again(db: Path, dead: dict,
                                                                  bus: Bus) -> None:
    [letter] = json_lines(ok(["dlq", "list", "--json"], db).stdout)
    at = letter["dead_lettered_at_ms"]
    assert letter == {"id": 1, "recipient": "w", "retry_count": 0,
                      "last_error": "not acknowledged within 0.05 s", "dead_lettered_at_ms": at,
                      "dead_lettered_at": iso(at),
                      "message": {**{k: dead[k] for k in ("seq", "id", "channel", "sender",
                                                          "type", "content", "topic", "priority",
                                                          "correlation_id", "in_reply_to",
                                                          "ts_ms", "ts")},
                                  "status": "dead_letter"}}
    assert ok(["dlq", "list"], db).stdout == (
        "id  seq  channel  recipient  retries  dead_lettered_at          last_error\n"
        f"1   1    jobs     w          0        {iso(at)}  not acknowledged within 0.05 s\n")
    assert ok(["dlq", "show", "1"], db).stdout == (
        f"dead letter 1: seq 1 to w, 0 retries, dead since {iso(at)}\n"
        "last error: not acknowledged within 0.05 s\n"
        f"{line(dead)}\n")
    assert ok_json(["dlq", "show", "1"], db) == letter
    assert [m["seq"] for m in json_lines(
        ok(["channel", "query", "--status", "dead_letter", "--json"], db).stdout)] == [1]
    [notice] = json_lines(ok(["channel", "query", "--channel", "_system", "--json"], db).stdout)
    assert (notice["topic"], notice["content"]["dead_letter"], notice["content"]["seq"]) == (
        "_system.message.deadletter", 1, 1)

    assert ok(["dlq", "replay", "1"], db).stdout == (
        "replayed dead letter 1: seq 1 is waiting for w\n")
    assert ok(["dlq", "list"], db).stdout == "no dead letters\n"
    again = ok(["channel", "receive", "--agent", "w"], db)
    assert again.stdout == line(dead, "attempt=2") + "\n"
    ok(["channel", "acknowledge", "--agent", "w", "--seq", "1", "--status", "completed"], db)
    [message] = json_lines(ok(["channel", "query", "--channel", "jobs", "--json"], db).stdout)
    assert message["status"] == "acknowledged"


def test_a_subscriber_to_the_deadletter_topic_receives_the_notice(db: Path,
                                                                   cli_clock: ManualClock) -> None:
    assert ok(["channel", "subscribe", "_system", "--agent", "ops", "--pattern",
               "_system.message.deadletter"], db).stdout == (
        "ops subscribed to _system.message.deadletter on _system\n")
    ok(["channel", "create", "jobs", "--type", "direct", "--owner", "boss", "--ack-timeout",
        "0.05", "--max-retries", "0"], db)
    ok(["channel", "join", "jobs", "--agent", "w"], db)
    sent = ok_json(["channel", "send", "--channel", "jobs", "--from", "boss", "--type", "command",
                    "--content", "do it"], db)
    cli_clock.now += 50  # w never received it: its timer ran from the send
    assert ok_json(["channel", "tick"], db)["dead_lettered"] == 1
    [notice] = json_lines(ok(["channel", "receive", "--agent", "ops", "--json"], db).stdout)
    assert (notice["channel"], notice["sender"], notice["type"], notice["topic"]) == (
        "_system", "bus", "notification", "_system.message.deadletter")
    assert notice["content"] == {"dead_letter": 1, "seq": sent["seq"], "channel": "jobs",
                                 "recipient": "w", "retry_count": 0,
                                 "last_error": "not acknowledged within 0.05 s"}


def test_dlq_replay_json_and_discard(db: Path, dead: dict) -> None:
    assert ok_json(["dlq", "discard", "1"], db) == {"id": 1, "discarded": True}
    assert ok(["dlq", "list", "--json"], db).stdout == ""
    assert_error(["dlq", "replay", "1"], db,
                 "ID: no dead letter with id 1; list them with `bus dlq list`")


def test_dlq_replay_refused_on_paused_channel(db: Path, dead: dict) -> None:
    ok(["channel", "pause", "jobs"], db)
    assert_error(["dlq", "replay", "1"], db, "channel: channel 'jobs' is paused; replay needs it"
                                             " active")
    ok(["channel", "resume", "jobs"], db)
    assert ok_json(["dlq", "replay", "1"], db) == {"id": 1, "seq": 1, "recipient": "w"}


def test_dlq_purge_older_than(db: Path, dead: dict, cli_clock: ManualClock) -> None:
    assert ok(["dlq", "purge", "--older-than", "3600"], db).stdout == (
        "purged 0 dead letter(s) older than 3600 s\n")
    cli_clock.now += 1
    assert ok_json(["dlq", "purge", "--older-than", "0"], db) == {"purged": 1, "older_than": 0.0}
    assert ok(["dlq", "list"], db).stdout == "no dead letters\n"


@pytest.mark.parametrize(("args", "message"), [
    (["show", "7"], "ID: no dead letter with id 7; list them with `bus dlq list`"),
    (["replay", "7"], "ID: no dead letter with id 7; list them with `bus dlq list`"),
    (["discard", "7"], "ID: no dead letter with id 7; list them with `bus dlq list`"),
    (["show", "0"], "ID: must be an integer >= 1, got 0"),
    (["list", "--limit", "0"], "--limit: must be an integer >= 1, got 0"),
    (["purge", "--older-than", "-1"], "--older-than: must be seconds >= 0, got -1.0"),
], ids=["show", "replay", "discard", "zero-id", "limit", "purge-negative"])
def test_dlq_errors(db: Path, args: list[str], message: str) -> None:
    assert_error(["dlq", *args], db, message)


def test_dlq_usage_errors(db: Path) -> None:
    assert_usage_error(["dlq", "show", "one"], db, "'one' is not a valid integer")
    assert_usage_error(["dlq", "purge"], db, "Missing option '--older-than'")


# --- help ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["channel"], ["channel", "create"], ["channel", "join"], ["channel", "leave"],
    ["channel", "subscribe"], ["channel", "unsubscribe"], ["channel", "list"],
    ["channel", "show"], ["channel", "pause"], ["channel", "resume"], ["channel", "drain"],
    ["channel", "close"], ["channel", "tick"], ["channel", "send"], ["channel", "receive"], ["channel", "acknowledge"],
    ["channel", "deliveries"], ["channel", "query"], ["channel", "thread"], ["dlq"], ["dlq", "list"], ["dlq", "show"],
    ["dlq", "replay"], ["dlq", "discard"], ["dlq", "purge"],
], ids=" ".join)
def test_help_has_summary_and_example(tmp_path: Path, command: list[str]) -> None:
    result = run([*command, "-h"], tmp_path / "unused.db")
    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: main {' '.join(command)} ")
    assert "Example" in result.stdout
    if command not in (["channel"], ["dlq"]):
        assert "--json" in result.stdout
    assert not (tmp_path / "unused.db").exists()


@pytest.mark.parametrize("args", [["channel", "list"], ["channel", "receive", "--agent", "a"],
                                  ["dlq", "list"], ["channel", "query"]], ids=" ".join)
def test_commands_on_missing_database_exit_1_without_creating_it(tmp_path: Path,
                                                                  args: list[str]) -> None:
    db = tmp_path / "missing" / "bus.db"
    result = run(args, db)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (f"Error: no bus database at {db}; create it with `bus init` or point"
                             " --db (or BUS_DB) at an existing one\n")
    assert not db.parent.exists()
