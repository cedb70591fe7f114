"""`bus serve`: a real server process, real HTTP, and the page in headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

from bus import Bus
from bus.storage.db import connect
from bus.log.messages import now_ms
from bus.pump.threads import ThreadRegistry
from bus.views.charts import call_trees
from bus.views.charts import History
from bus.views.charts import worker_swimlane
from bus.views.serve import listen
from bus.views.serve import plotly_js
from bus.views.status import status_of
from tests.support.broken_files import break_the_file
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT

CHROMIUM = shutil.which("chromium")
CHARTS = ("chart-rate", "chart-lag", "chart-swimlane", "chart-claims", "chart-threads")
PAGE_TIMEOUT_MS = 20_000  # generous: the machine may be loaded; tests never assert on time


def seed(bus: Bus) -> None:
    """Something for every chart: types, a consumer, worker transitions, claims, threads;
    and a task graph: t1 held (its claim below), t3 ready, t4 blocked on t3."""
    for task, after in (("t1", []), ("t3", []), ("t4", ["t3"])):
        bus.tasks.add(task, after=after)
    for type_ in ("task_assign", "task_assign", "note", "heartbeat_note"):
        bus.publish("planner", type_, {"n": 1})
    bus.ack("w1", 2)
    for worker, states in (("w1", ["ASSIGNED", "WORKING", "IN_REVIEW"]),
                           ("w2", ["ASSIGNED", "WORKING"])):
        previous = None
        for state in states:
            bus.publish(worker, "state_change", {"from": previous, "to": state,
                                                 "command": "x"})
            previous = state
    assert bus.claims.claim("t1", "w1")
    assert bus.claims.claim("t2", "w2", lease_ms=1, now=1_700_000_000_000)
    assert bus.claims.claim("t2", "w1")  # the expired lease is taken over
    registry = ThreadRegistry(bus, "org")
    registry.get_or_create(["org", "calc", "add"])
    registry.get_or_create(["org", "calc", "mul"])
    bus.heartbeats.beat("w1", "working", "t1")


class Server:
    """`bus serve --port 0` in its own process; the URL comes from its first line."""

    def __init__(self, db: Path, env: dict[str, str], *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bus.cli", "--db", str(db), "serve", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        assert " at http://" in line, line + self.proc.stderr.read()
        self.url = line.split(" at ")[1].split()[0]

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=30) as response:
            return response.read()

    def stop(self) -> int:
        self.proc.send_signal(2)  # Ctrl-C
        return self.proc.wait(timeout=30)


@pytest.fixture
def seeded_db(db_path: Path) -> Path:
    with Bus.open(db_path) as bus:
        seed(bus)
    return db_path


@pytest.fixture
def server(seeded_db: Path, python_env: dict[str, str]):
    started = Server(seeded_db, python_env)
    yield started
    if started.proc.poll() is None:
        started.stop()


# --- the chart series ----------------------------------------------------------


def history_of(db: Path, now: int | None = None) -> History:
    conn = connect(db, readonly=True)
    try:
        with conn:
            history = History()
            history.update(conn, status_of(conn, str(db), now=now))
            return history
    finally:
        conn.close()


def test_swimlane_segments_follow_state_changes(seeded_db: Path) -> None:
    now = now_ms() + 3_600_000  # an hour on: every state still open until now
    segments = worker_swimlane(history_of(seeded_db, now), now)
    assert [(s["worker"], s["state"]) for s in segments] == [
        ("w1", "ASSIGNED"), ("w1", "WORKING"), ("w1", "IN_REVIEW"),
        ("w2", "ASSIGNED"), ("w2", "WORKING")]
    for this, after in zip(segments, segments[1:]):
        if this["worker"] == after["worker"]:
            assert this["end_ms"] == after["start_ms"]
    assert segments[2]["end_ms"] == segments[4]["end_ms"] == now  # still in that state


def test_call_trees_are_a_forest(seeded_db: Path) -> None:
    conn = connect(seeded_db, readonly=True)
    trees = call_trees(conn)
    conn.close()
    by_id = dict(zip(trees["ids"], zip(trees["parents"], trees["labels"])))
    labels = {label: parent for parent, label in by_id.values()}
    assert set(labels) == {"org", "calc", "add", "mul"}
    assert labels["org"] == ""
    assert by_id[labels["add"]][1] == by_id[labels["mul"]][1] == "calc"


# --- the server ------------------------------------------------------------------


@pytest.mark.slow
def test_serve_status_plotly_and_events(server: Server, seeded_db: Path) -> None:
    snapshot = json.loads(server.get("/api/status"))
    assert snapshot["status"]["log"]["last_seq"] == 10  # 9, and task_reclaimed for t2
    assert set(snapshot["charts"]) == {"rate", "lag", "swimlane", "claims", "threads", "window_ms"}
    assert server.get("/static/plotly.min.js") == plotly_js().read_bytes()
    assert b"/static/plotly.min.js" in server.get("/")
    assert b"EventSource" in server.get("/static/app.js")
    with urllib.request.urlopen(server.url + "events", timeout=30) as stream:
        first = stream.readline()
        assert first.startswith(b"data: {") and json.loads(first[6:])["status"]["log"]


@pytest.mark.slow
def test_serve_has_no_route_that_writes(server: Server) -> None:
    for method in ("POST", "PUT", "DELETE"):
        request = urllib.request.Request(server.url + "api/status", data=b"{}", method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405


@pytest.mark.slow
def test_serve_stops_on_ctrl_c(server: Server) -> None:
    assert server.stop() == 0


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "::"])
def test_serve_refuses_a_remote_host_without_a_token(seeded_db: Path, host: str) -> None:
    result = run(["serve", "--host", host], seeded_db)
    assert result.exit_code == 2
    assert last_error(result.stderr) == bad_value(
        "--host", f"{host} is reachable from other machines, so every request needs a token,"
        " and none exists; create one with bus token create --agent ID, or use 127.0.0.1")


def test_serve_refuses_a_port_in_use(seeded_db: Path, server: Server) -> None:
    port = server.url.rstrip("/").rsplit(":", 1)[1]
    result = run(["serve", "--port", port], seeded_db)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(
        f"Error: Invalid value for '--port': cannot listen on 127.0.0.1:{port} (")


# --- a file that cannot be read while the server runs -----------------------------------


def status_response(server: Server) -> tuple[int, dict]:
    try:
        return 200, json.loads(server.get("/api/status"))
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read())


def wait_for_status(server: Server, shown, what: str) -> dict:
    deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
    while True:
        code, body = status_response(server)
        if shown(code, body):
            return body
        assert time.monotonic() < deadline, f"never saw {what}; last: {code} {body}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["overwritten", "replaced", "removed"])
def test_serve_reports_a_file_it_cannot_read_and_recovers(
        server: Server, seeded_db: Path, tmp_path: Path, how: str) -> None:
    good = seeded_db.read_bytes()  # the bus is closed: everything is in the main file
    assert status_response(server)[0] == 200
    expected = break_the_file(seeded_db, how, tmp_path)
    # The first read after the change may catch it half done (a removed file read through
    # the open connection is a disk I/O error); the reader reopens every few seconds, so
    # the error it reports settles on the one that names what happened.
    failure = wait_for_status(
        server, lambda code, body: code == 503 and re.search(expected, body["error"]),
        "the failure named")
    assert str(seeded_db) in failure["error"]
    assert set(failure) == {"error", "field", "since_ms"}
    with urllib.request.urlopen(server.url + "events", timeout=30) as stream:
        assert json.loads(stream.readline()[6:])["status"]["log"]["last_seq"] == 10
        stream.readline()  # the blank line that ends an event
        streamed = json.loads(stream.readline()[6:])  # a new page learns both
        assert set(streamed) == set(failure) and re.search(expected, streamed["error"])
    restored = tmp_path / "restored.db"
    restored.write_bytes(good)
    os.replace(restored, seeded_db)
    body = wait_for_status(server, lambda code, _body: code == 200, "the recovery")
    assert body["status"]["log"]["last_seq"] == 10
    assert server.proc.poll() is None


def test_serve_a_missing_file(tmp_path: Path) -> None:
    result = run(["serve", "--port", "0"], tmp_path / "none.db")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no bus database at")


# --- the page in Chromium ---------------------------------------------------------


def chart_points(page, chart: str) -> int:
    return page.evaluate(
        "(id) => (document.getElementById(id).data || []).reduce("
        " (n, t) => n + (t.x || t.ids || []).length, 0)", chart)


def file_state(db: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(db.parent.iterdir())
            if p.name.startswith(db.name) and not p.name.endswith("-shm")}


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_in_chromium(server: Server, seeded_db: Path, python_env: dict[str, str],
                                tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    local = server.url.rstrip("/")
    elsewhere: list[str] = []
    watcher = connect(seeded_db, readonly=True)
    version = watcher.execute("PRAGMA data_version").get
    before = file_state(seeded_db)
    with sync_api.sync_playwright() as pw:
        # No name resolves but the loopback, and any request elsewhere is refused
        # and recorded: the page must work with the network off.
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(local)
                   else (elsewhere.append(route.request.url), route.abort()))
        page.goto(server.url)
        page.wait_for_function("document.body.dataset.lastSeq === '10'", timeout=PAGE_TIMEOUT_MS)
        assert page.text_content("#messages") == "10"  # with task_reclaimed for t2
        assert page.text_content("#claims-held") == "2"
        cells = page.eval_on_selector_all(
            "#claims tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
        assert cells[0] == ["task", "holder", "fence", "lease left s", "attempt"]
        assert [row[:3] for row in cells[1:]] == [["t1", "w1", "1"], ["t2", "w1", "2"]]
        assert page.text_content("#tasks") == "1 / 1 / 1"  # ready / blocked / held
        assert "w1" in page.text_content("#consumers")
        for chart in CHARTS:
            page.wait_for_function(f"(document.getElementById('{chart}').data || []).length > 0",
                                   timeout=PAGE_TIMEOUT_MS)
            assert chart_points(page, chart) > 0, chart
        page.reload()  # a second visit: still nothing written
        page.wait_for_function("document.body.dataset.lastSeq === '10'", timeout=PAGE_TIMEOUT_MS)
        assert watcher.execute("PRAGMA data_version").get == version
        assert file_state(seeded_db) == before
        subprocess.run([sys.executable, "-m", "bus.cli", "--db", str(seeded_db), "publish",
                        "--from", "other", "--type", "late"], env=python_env, check=True,
                       capture_output=True)
        published = time.monotonic()
        page.wait_for_function("document.body.dataset.lastSeq === '11'", polling=50,
                               timeout=PAGE_TIMEOUT_MS)
        print(f"page updated {time.monotonic() - published:.3f} s after the publish returned")
        assert page.text_content("#messages") == "11"
        page.screenshot(path=str(tmp_path / "bus-serve.png"), full_page=True)
        browser.close()
    watcher.close()
    assert elsewhere == []
    if os.environ.get("BUS_DOCS_SCREENSHOT"):
        shutil.copy(tmp_path / "bus-serve.png", REPO_ROOT / "docs" / "bus-serve.png")


@contextlib.contextmanager
def live_page(server: Server) -> Iterator[Any]:
    """The served page in headless Chromium, once it says it is live."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_function("document.getElementById('live').className === ''",
                               timeout=PAGE_TIMEOUT_MS)
        yield page
        browser.close()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_marks_itself_stale_with_the_error_and_recovers(
        server: Server, seeded_db: Path, tmp_path: Path) -> None:
    good = seeded_db.read_bytes()
    with live_page(server) as page:
        assert page.text_content("#live").startswith("live, as of ")
        expected = break_the_file(seeded_db, "overwritten", tmp_path)
        page.wait_for_function("document.getElementById('live').className === 'stale'",
                               timeout=PAGE_TIMEOUT_MS)
        shown = page.text_content("#live")
        assert shown.startswith("stale: since ") and re.search(expected, shown), shown
        assert page.text_content("#messages") == "10"  # what was read last stays in view
        page.reload()  # a page opened meanwhile shows the last status, marked stale
        page.wait_for_function("document.getElementById('live').className === 'stale'"
                               " && document.body.dataset.lastSeq === '10'",
                               timeout=PAGE_TIMEOUT_MS)
        restored = tmp_path / "restored.db"
        restored.write_bytes(good)
        os.replace(restored, seeded_db)
        page.wait_for_function("document.getElementById('live').className === ''",
                               timeout=PAGE_TIMEOUT_MS)
        assert page.text_content("#live").startswith("live, as of ")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_marks_itself_stale_when_the_server_falls_silent(server: Server) -> None:
    """A server that sends nothing (here: stopped with SIGSTOP) is not mistaken for a
    quiet bus: the page says it has heard nothing, and is live again once it hears."""
    with live_page(server) as page:
        server.proc.send_signal(signal.SIGSTOP)
        try:
            page.wait_for_function("document.getElementById('live').className === 'stale'",
                                   timeout=PAGE_TIMEOUT_MS)
            assert page.text_content("#live") == "stale: nothing from the server for 10 s"
        finally:
            server.proc.send_signal(signal.SIGCONT)
        page.wait_for_function("document.getElementById('live').className === ''",
                               timeout=PAGE_TIMEOUT_MS)


def test_serve_answers_without_waiting_for_delayed_acks() -> None:
    """Each connection `bus serve` accepts has TCP_NODELAY: uvicorn writes a response's
    headers and body apart, and with Nagle on, the body waits ~40 ms for the client's
    delayed ACK on every kept-alive request (issue 34's HTTP against stdio rate)."""
    async def accepted_nodelay() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Note(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await asyncio.get_running_loop().create_server(
            Note, sock=listen("127.0.0.1", 0))
        async with server:
            _, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
            try:
                return await asyncio.wait_for(accepted, timeout=30)
            finally:
                writer.close()

    assert asyncio.run(accepted_nodelay()) != 0
