"""The console of `bus serve`: its query functions on real files, its pages over real
HTTP from a real server process, and the pages in headless Chromium with the network off."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from typing import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.log import browse
from bus.coordination import tasks
from bus.log.browse import LogFilter
from bus.channels.queries import channel_detail
from bus.storage.db import connect
from bus.storage.errors import SearchDisabled
from bus.storage.errors import ValidationFailed
from bus.log.messages import now_ms
from bus.views import queries
from bus.views.charts import History
from bus.views.charts import claims_by_agent
from bus.views.charts import message_rate
from bus.views.charts import worker_swimlane
from bus.views.pages import sort_rows
from bus.views.routes import branch_commits
from bus.views.status import status_of
from tests.support.broken_files import break_the_file
from tests.conftest import REPO_ROOT
from tests.support.properties import scaled_settings
from tests.views.test_views_serve import CHROMIUM
from tests.views.test_views_serve import PAGE_TIMEOUT_MS
from tests.views.test_views_serve import Server
from tests.support.worker_fixtures import hermetic_git  # noqa: F401  (autouse: git kept in tmp_path)
from tests.support.worker_fixtures import make_repo
from workers.lifecycle import Workers

GENERATED = 20_000  # messages of the generated bus the Chromium tests browse
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium is not installed (make test installs it)")


def seed_console(bus: Bus, repo: Path) -> None:
    """A bus with one of each thing a page shows: a conversation with a reply, a channel
    with deliveries, a blob payload, a takeover, a worker on a real repository."""
    bus.publish("planner", "task_assign", {"task": "t1"}, to="w1", correlation_id="t1")
    question = bus.publish("w1", "question", {"q": "which branch?"}, to="planner",
                           correlation_id="t1")
    answer = bus.publish("planner", "answer", {"a": "main"}, to="w1", correlation_id="t1",
                         in_reply_to=question.id)
    bus.record_delivered("w1", [answer.seq], "hook:Stop", session="s-42")  # not acked
    bus.publish("w1", "note", "x" * 6000)  # into the blob store
    bus.channels.create_channel("ops", "group", "planner")
    bus.channels.join_channel("ops", "w1")
    bus.channels.send_message("ops", "planner", "text", {"deploy": "now"})
    assert bus.claims.claim("t2", "w2", lease_ms=1, now=1_700_000_000_000)
    assert bus.claims.claim("t2", "w1")  # the expired lease is taken over: task_reclaimed
    bus.heartbeats.beat("w1", "working", "t1")
    bus.ack("w1", 1)
    bus.tasks.add("build", "build the thing")
    bus.tasks.add("ship", after=["build"])
    assert bus.claims.claim("build", "w1")
    bus.reservations.reserve("w1", ["src/**"], reason="refactor")
    workers = Workers(bus)
    workers.spawn("t3", "w3", repo=repo)
    workers.start("w3")
    workers.cancel("w3", "not needed")


@pytest.fixture
def console_db(db_path: Path, tmp_path: Path) -> Path:
    with Bus.open(db_path) as bus:
        seed_console(bus, make_repo(tmp_path / "repo"))
    return db_path


def read(db: Path, fn, *args):
    conn = connect(db, readonly=True)
    try:
        with conn:
            return fn(conn, *args)
    finally:
        conn.close()


def all_pages(db: Path, filt: LogFilter) -> list[int]:
    """Every seq the browser shows for `filt`, following its `older` links to the end."""
    seqs: list[int] = []
    while True:
        page = read(db, browse.list_messages, filt, now_ms())
        seqs += [m.seq for m in page.messages]
        if page.next_before is None:
            return seqs
        filt = LogFilter(**{**filt.__dict__, "before": page.next_before})


# --- the query functions ------------------------------------------------------------------


@pytest.fixture
def mixed_db(db_path: Path) -> Path:
    with Bus.open(db_path) as bus:
        for i in range(300):
            bus.publish(f"a{i % 3}", ("tick", "tock", "rare")[min(i % 7, 2)], {"i": i},
                        to=None if i % 2 else f"a{(i + 1) % 3}",
                        correlation_id=f"c{i % 5}" if i % 4 == 0 else None)
    return db_path


def reference(db: Path, where) -> list[int]:
    rows = read(db, lambda conn: conn.execute(
        "SELECT seq, type, from_agent, to_agent, correlation_id FROM messages").fetchall())
    return sorted((seq for seq, *rest in rows if where(*rest)), reverse=True)


@pytest.mark.parametrize("given, where", [
    ({}, lambda t, f, to, c: True),
    ({"type": "rare"}, lambda t, f, to, c: t == "rare"),
    ({"sender": "a1"}, lambda t, f, to, c: f == "a1"),
    ({"to": "a2"}, lambda t, f, to, c: to == "a2"),
    ({"task": "c3"}, lambda t, f, to, c: c == "c3"),
    ({"type": "tick", "sender": "a0", "to": "a1"},
     lambda t, f, to, c: (t, f, to) == ("tick", "a0", "a1")),
])
@pytest.mark.parametrize("window", [browse.SCAN_WINDOW, 40])
def test_list_messages_pages_every_match_once_newest_first(
        mixed_db: Path, monkeypatch: pytest.MonkeyPatch, given, where, window: int) -> None:
    """Page by page, by seq: each match once, in order, also when a page stops at the
    scan window before it is full (a small window here)."""
    monkeypatch.setattr(queries, "SCAN_WINDOW", window)
    assert all_pages(mixed_db, LogFilter(**given, limit=7)) == reference(mixed_db, where)


MIXED_TYPES = ("tick", "tock", "rare")
MIXED_AGENTS = ("a0", "a1", "a2")


@scaled_settings(max_examples=40, deadline=None)
@given(filt=st.fixed_dictionaries({}, optional={
           "type": st.sampled_from(MIXED_TYPES), "sender": st.sampled_from(MIXED_AGENTS),
           "to": st.sampled_from(MIXED_AGENTS), "task": st.sampled_from(("c0", "c3", "c9"))}),
       limit=st.integers(1, 60), window=st.integers(1, 400),
       before=st.one_of(st.none(), st.integers(1, 320)))
def test_list_messages_pages_match_a_reference_model(mixed_db: Path, filt: dict, limit: int,
                                                     window: int, before: int | None) -> None:
    """Any filter, page size, scan window and start: following `older` from `before`
    gives exactly the matching seqs below it, newest first, each once."""
    names = {"type": 0, "sender": 1, "to": 2, "task": 3}

    def matches(*columns) -> bool:
        return all(columns[names[k]] == v for k, v in filt.items())
    expected = [seq for seq in reference(mixed_db, matches) if before is None or seq < before]
    original = browse.SCAN_WINDOW
    browse.SCAN_WINDOW = window  # a module constant; put back below
    try:
        shown = all_pages(mixed_db, LogFilter(**filt, limit=limit, before=before))
    finally:
        browse.SCAN_WINDOW = original
    assert shown == expected


def test_list_messages_since_starts_at_the_first_message_of_the_range(db_path: Path) -> None:
    with Bus.open(db_path) as bus:
        for ts in range(10):
            bus.publish("a", "old", {"ts": ts})
    conn = connect(db_path, readonly=True)
    times = dict(conn.execute("SELECT seq, ts_ms FROM messages").fetchall())
    conn.close()
    for cut in sorted(set(times.values())):
        first = min(seq for seq, ts in times.items() if ts >= cut)
        assert read(db_path, browse.first_seq_at, cut) == first
    newest = max(times.values())
    shown = all_pages(db_path, LogFilter(since="1h"))
    assert shown == sorted(times, reverse=True)  # all within the hour
    page = read(db_path, browse.list_messages, LogFilter(since="1s"), newest + 60_000)
    assert page.messages == [] and page.next_before is None


@pytest.mark.parametrize("params, field", [
    ({"since": "yesterday"}, "since"), ({"since": "5"}, "since"), ({"before": "x"}, "before"),
    ({"limit": "0"}, "limit"), ({"limit": "100000"}, "limit"),
])
def test_message_filter_names_the_bad_parameter(params, field: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        LogFilter.from_params(params)
    assert refused.value.field == field


def test_message_filter_round_trips_through_its_parameters() -> None:
    params = {"type": "note", "sender": "a b", "to": "w1", "task": "t/1", "since": "15m",
              "text": "deploy", "before": "42", "limit": "10"}
    assert LogFilter.from_params(params).params() == params
    assert LogFilter.from_params({"type": " ", "limit": "50"}).params() == {}


def test_list_messages_full_text_when_enabled(mixed_db: Path) -> None:
    with pytest.raises(SearchDisabled):
        read(mixed_db, browse.list_messages, LogFilter(text="i"), now_ms())
    with Bus.open(mixed_db) as bus:
        bus.publish("a0", "note", "deploy the frontend")
        bus.enable_search()
    page = read(mixed_db, browse.list_messages, LogFilter(text="frontend"), now_ms())
    assert [m.payload for m in page.messages] == ["deploy the frontend"]
    with pytest.raises(ValidationFailed) as refused:
        read(mixed_db, browse.list_messages, LogFilter(text='"unclosed'), now_ms())
    assert refused.value.field == "text"


def plan(db: Path, filt: LogFilter) -> str:
    def explain(conn):
        params = browse.message_page_params(conn, filt, now_ms())
        rows = conn.execute("EXPLAIN QUERY PLAN " + browse.message_page_sql(filt), params)
        return " | ".join(row[-1] for row in rows)
    return read(db, explain)


@pytest.mark.parametrize("given, uses", [
    ({}, "USING INTEGER PRIMARY KEY"), ({"type": "rare"}, "USING INTEGER PRIMARY KEY"),
    ({"sender": "a1", "since": "1h"}, "USING INTEGER PRIMARY KEY"),
    ({"to": "a2"}, "USING INDEX idx_messages_to_seq"),
    ({"task": "c3"}, "USING INDEX idx_messages_correlation_seq"),
])
def test_list_messages_walks_an_index_never_the_whole_table(mixed_db: Path, given,
                                                            uses: str) -> None:
    shown = plan(mixed_db, LogFilter(**given))
    assert uses in shown, shown
    assert "TEMP B-TREE" not in shown, shown  # no sort: the order is the index's


def test_message_detail_has_its_reply_thread_blob_and_deliveries(console_db: Path) -> None:
    question = read(console_db, queries.message_detail, 2)
    assert [m.type for m in question.replies] == ["answer"]
    assert [m.seq for m in question.thread] == [1, 2, 3]
    answer = read(console_db, queries.message_detail, 3)
    assert answer.answers.seq == 2
    blob = read(console_db, queries.message_detail, 4)
    assert blob.message.payload_ref.startswith("sha256-")
    channel_seq = read(console_db, lambda conn: conn.execute(
        "SELECT seq FROM channel_messages").get)
    sent = read(console_db, queries.message_detail, channel_seq)
    assert sent.channel["name"] == "ops"
    assert [(d.recipient, d.status) for d in sent.deliveries] == [("w1", "pending")]
    assert read(console_db, queries.message_detail, 10_000) is None


def test_message_detail_has_the_receipt_of_a_direct_message(console_db: Path) -> None:
    states = {seq: read(console_db, queries.message_detail, seq).receipt for seq in (1, 2, 3, 4)}
    assert [r.state if r else None for r in states.values()] == [
        "acked", "sent", "delivered", None]  # 4 is a broadcast: no receipt
    assert (states[3].delivery.via, states[3].delivery.session) == ("hook:Stop", "s-42")
    assert read(console_db, queries.message_detail, 3).to_json_dict()["receipt"]["state"] == (
        "delivered")
    channel_seq = read(console_db, lambda conn: conn.execute(
        "SELECT seq FROM channel_messages").get)
    assert read(console_db, queries.message_detail, channel_seq).receipt is None  # a channel's


def test_task_rows_and_detail(console_db: Path) -> None:
    rows = {t.task_id: t for t in read(console_db, tasks.list_task_rows, now_ms())}
    assert (rows["build"].status, rows["build"].holder, rows["build"].fence) == ("held", "w1", 1)
    assert rows["ship"].status == "blocked"
    detail = read(console_db, tasks.find_task_detail, "ship", now_ms())
    assert [t.task_id for t in detail.dependencies] == ["build"]
    assert read(console_db, tasks.find_task_detail, "t2", now_ms()) is None  # leased only
    assert [m.type for m in read(console_db, queries.claim_events, "t2")] == ["task_reclaimed"]


def test_agent_worker_and_channel_details(console_db: Path) -> None:
    agent = read(console_db, queries.agent_detail, "w1", now_ms())
    assert agent.liveness.status == "working"
    assert [c.task_id for c in agent.claims] == ["build", "t2"]
    assert [r.pattern for r in agent.reservations] == ["src/**"]
    assert agent.channels == [("ops", "member")]
    assert agent.cursor == 1
    assert {m.type for m in agent.sent} >= {"question", "note"}
    assert not agent.is_worker and read(console_db, queries.agent_detail, "w3", now_ms()).is_worker
    worker = read(console_db, queries.worker_detail, "w3")
    assert [h.to_state for h in worker.history] == ["ASSIGNED", "WORKING", "CANCELLED"]
    assert worker.worker.note == "not needed"
    assert read(console_db, queries.worker_detail, "nobody") is None
    channel = read(console_db, channel_detail, "ops")
    assert [p.agent for p in channel.participants] == ["planner", "w1"]
    assert len(channel.deliveries) == 1


def test_worker_commits_from_its_repository_or_why_not(console_db: Path, tmp_path: Path) -> None:
    worker = read(console_db, queries.worker_detail, "w3").worker
    repo = Path(worker.repo)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "work of w3"], check=True,
                   cwd=worker.worktree)
    commits, note = branch_commits(worker)
    assert len(commits) == 1 and commits[0].endswith(": work of w3") and note == ""
    shutil.rmtree(repo)
    commits, note = branch_commits(worker)
    assert commits is None
    assert note.startswith(f"the repository {repo} cannot be read from here (")


def test_history_swimlane_stops_at_a_terminal_state(console_db: Path) -> None:
    now = now_ms() + 600_000
    history = History()
    read(console_db, lambda conn: history.update(conn, status_of(conn, str(console_db),
                                                                  now=now)))
    lanes = [s for s in worker_swimlane(history, now) if s["worker"] == "w3"]
    assert [s["state"] for s in lanes] == ["ASSIGNED", "WORKING", "CANCELLED"]
    assert lanes[-1]["terminal"] and lanes[-1]["end_ms"] == lanes[-1]["start_ms"] < now
    assert lanes[1]["end_ms"] == lanes[2]["start_ms"]


def test_history_records_each_liveness_change_it_sees(console_db: Path) -> None:
    history = History()
    beat = read(console_db, lambda conn: conn.execute(
        "SELECT ts_ms FROM heartbeats WHERE agent_id = 'w1'").get)
    for after_s in (1, 5, 40, 45, 200, 400):  # alive, alive, warn, warn, stale, dead
        read(console_db, lambda conn: history.update(
            conn, status_of(conn, str(console_db), now=beat + after_s * 1000)))
    assert [(ts - beat, state) for ts, state in history.liveness["w1"]] == [
        (1000, "alive"), (40_000, "warn"), (200_000, "stale"), (400_000, "dead")]


def test_history_keeps_the_hour_and_reads_only_what_is_new(console_db: Path) -> None:
    history = History()

    def update(conn):
        history.update(conn, status_of(conn, str(console_db)))
    read(console_db, update)
    first = sum(sum(s["n"]) for s in message_rate(history).values())
    assert first == read(console_db, lambda conn: conn.execute(
        "SELECT count(*) FROM messages").get)  # a new server shows the hour so far
    status = read(console_db, lambda conn: status_of(conn, str(console_db)))
    assert claims_by_agent(status, history)["w1"]["taken_over"] == 1  # task_reclaimed
    with Bus.open(console_db) as bus:
        bus.publish("late", "late", {})
    read(console_db, update)
    rate = message_rate(history)
    assert sum(sum(s["n"]) for s in rate.values()) == first + 1 and sum(rate["late"]["n"]) == 1


# --- the pages over HTTP ------------------------------------------------------------------


@pytest.fixture
def console(console_db: Path, python_env: dict[str, str]):
    started = Server(console_db, python_env)
    yield started
    if started.proc.poll() is None:
        started.stop()


def get(server: Server, path: str) -> tuple[int, str]:
    try:
        return 200, server.get(path).decode()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.read().decode()


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href")


def links(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.hrefs


@pytest.mark.slow
def test_console_pages_answer_and_link_what_they_name(console: Server) -> None:
    for path in ("/messages", "/messages?type=note&since=1h", "/messages/2", "/agents",
                 "/agents/w1", "/workers", "/workers/w3", "/claims", "/channels",
                 "/channels/ops", "/dead-letters", "/pump", "/messages?sort=x", "/tasks",
                 "/tasks?status=ready", "/tasks/ship", "/tasks/t2", "/reservations"):
        code, html = get(console, path)
        assert code == 200, (path, html)
        assert 'id="live"' in html and "/static/live.js" in html
    _code, html = get(console, "/messages/2")
    found = set(links(html))
    assert {"/agents/w1", "/agents/planner", "/messages?type=question", "/tasks/t1",
            "/messages/3"} <= found
    _code, html = get(console, "/workers/w3")
    assert "CANCELLED" in html and "not needed" in html and 'id="commits"' in html
    _code, html = get(console, "/agents/w1")
    assert re.search(r'<table id="liveness">.*<td>alive</td>', html)
    _code, html = get(console, "/tasks/ship")
    assert {"/tasks/build", "/messages?task=ship"} <= set(links(html))
    _code, html = get(console, "/tasks/build")
    assert {"/tasks/ship", "/agents/w1"} <= set(links(html)) and "<th>fence</th><td>1</td>" in html
    _code, html = get(console, "/tasks/t2")  # leased, not in the graph: its takeover shows
    assert 'id="not-in-graph"' in html and "task_reclaimed" in html
    _code, html = get(console, "/tasks?status=blocked")
    assert "/tasks/ship" in links(html) and "/tasks/build" not in links(html)
    _code, html = get(console, "/reservations")
    assert "src/**" in html and "/agents/w1" in links(html)
    _code, html = get(console, "/claims?sort=holder&order=desc")
    assert "/agents/w1" in html and "▼" in html


@pytest.mark.slow
def test_console_browser_answers_its_script_with_the_results_alone(console: Server,
                                                                  console_db: Path) -> None:
    """What browse.js asks for: the results of the same URL, never stored, with when they
    were read and the last seq they saw (live.js judges staleness from those)."""
    def results(query: str):  # code, headers (any case), body
        ask = urllib.request.Request(console.url + "messages" + query,
                                     headers={"X-Bus-Fragment": "results"})
        try:
            with urllib.request.urlopen(ask, timeout=30) as answer:
                return answer.status, answer.headers, answer.read().decode()
        except urllib.error.HTTPError as answer:
            return answer.code, answer.headers, answer.read().decode()

    _code, whole = get(console, "/messages?type=note")
    code, headers, part = results("?type=note")
    assert code == 200 and part.startswith('<div id="results">') and "<form" not in part
    assert part in whole  # the same results the page shows
    assert headers["Cache-Control"] == "no-store"
    assert int(headers["X-Bus-Last-Seq"]) == read(console_db, lambda conn: conn.execute(
        "SELECT max(seq) FROM messages").get) and int(headers["X-Bus-Read-Ms"]) > 0
    code, _headers, part = results("?since=yesterday")
    assert code == 200 and "since: must be a number and a unit" in part


@pytest.mark.slow
def test_console_says_what_is_missing_or_wrong(console: Server) -> None:
    assert get(console, "/messages/999")[0] == 404
    assert get(console, "/workers/nobody")[0] == 404
    assert get(console, "/channels/nothing")[0] == 404
    assert get(console, "/tasks/nothing")[0] == 404
    code, html = get(console, "/messages?since=yesterday")
    assert code == 200 and "since: must be a number and a unit" in html
    code, html = get(console, "/messages?text=deploy")
    assert code == 200 and "bus search --enable" in html


@pytest.mark.slow
def test_console_page_of_an_unreadable_file_is_marked_stale(console: Server, console_db: Path,
                                                           tmp_path: Path) -> None:
    expected = break_the_file(console_db, "overwritten", tmp_path)
    code, html = get(console, "/messages")
    assert code == 503
    assert re.search(r'<p id="live" class="stale">stale: the bus cannot be read: ', html)
    assert re.search(expected, html.replace("&#x27;", "'")), html


# --- in Chromium, on a generated bus ------------------------------------------------------


@pytest.fixture(scope="module")
def generated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("generated") / "bus.db"
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gen_history.py"), "--bus",
                    str(db), "-n", str(GENERATED), "--seed", "7"], check=True,
                   capture_output=True)
    return db


@pytest.fixture
def generated(generated_db: Path, tmp_path: Path, python_env: dict[str, str]):
    db = tmp_path / "bus.db"  # a copy each: a test may break it
    shutil.copy(generated_db, db)
    started = Server(db, python_env)
    yield started, db
    if started.proc.poll() is None:
        started.stop()


@contextlib.contextmanager
def offline_page(server: Server) -> Iterator[Any]:
    """A Chromium page that may reach only the server (the network is off); on leaving,
    no request went anywhere else."""
    sync_api = pytest.importorskip("playwright.sync_api")
    local = server.url.rstrip("/")
    elsewhere: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(local)
                   else (elsewhere.append(route.request.url), route.abort()))
        yield page


def screenshot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    if os.environ.get("BUS_DOCS_SCREENSHOT"):
        (REPO_ROOT / "docs" / "screenshots").mkdir(exist_ok=True)
        shutil.copy(tmp_path / f"{name}.png", REPO_ROOT / "docs" / "screenshots" / f"{name}.png")


@pytest.mark.slow
@needs_chromium
def test_console_every_link_of_a_message_page_resolves(generated, tmp_path: Path) -> None:
    server, _db = generated
    with offline_page(server) as page:
        page.goto(server.url + "messages?type=answer")
        first = page.eval_on_selector("#messages a[href^='/messages/']", "a => a.href")
        page.goto(first)  # an answer: it has a question, a task, a thread
        page.wait_for_selector("#payload")
        hrefs = page.eval_on_selector_all("a", "links => links.map(a => a.href)")
        assert any("/agents/" in h for h in hrefs) and any("/tasks/" in h for h in hrefs)
        screenshot(page, tmp_path, "console-message")
        for href in sorted(set(hrefs)):
            answer = page.request.get(href)
            assert answer.status == 200, href


@pytest.mark.slow
@needs_chromium
def test_console_message_page_shows_whether_it_was_delivered_and_acked(
        console: Server, console_db: Path, tmp_path: Path) -> None:
    def receipt(page) -> dict[str, str]:
        return dict(page.eval_on_selector_all(
            "#receipt tr", "rows => rows.map(r => [r.cells[0].textContent,"
                           " r.cells[1].textContent])"))

    with offline_page(console) as page:
        page.goto(console.url + "messages/3")  # planner -> w1, shown by w1's Stop hook
        page.wait_for_selector("#receipt")
        shown = receipt(page)
        assert shown["state"] == "delivered to the recipient's session, not acked yet"
        assert (shown["deliveries"], shown["last via"], shown["session"]) == (
            "1", "hook:Stop", "s-42")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
                            shown["first delivered"])
        screenshot(page, tmp_path, "console-receipt")
        with Bus.open(console_db) as bus:
            bus.ack("w1", 3)
        page.reload()
        assert receipt(page)["state"] == "acked by the recipient"
        page.goto(console.url + "messages/2")  # w1 -> planner: never shown to planner
        assert receipt(page) == {"state": "sent, never delivered to the recipient's session"}
        page.goto(console.url + "messages/4")  # a broadcast has no receipt
        page.wait_for_selector("#payload")
        assert page.query_selector("#receipt") is None


@pytest.mark.slow
@needs_chromium
def test_console_filters_round_trip_through_the_url(generated, tmp_path: Path) -> None:
    server, db = generated
    with offline_page(server) as page:
        page.goto(server.url + "messages")
        page.fill("input[name=type]", "state_change")
        page.fill("input[name=sender]", "worker-03")
        page.fill("input[name=since]", "1h")
        page.click("#filters button")
        page.wait_for_url(re.compile(r"type=state_change"))
        query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
        assert query == {"type": ["state_change"], "sender": ["worker-03"], "since": ["1h"]}
        shown = page.eval_on_selector_all(
            "#messages tr", "rows => rows.slice(1).map(r => [...r.cells].map(c => c.textContent))")
        expected = reference(db, lambda t, f, to, c: (t, f) == ("state_change", "worker-03"))
        assert [int(row[0]) for row in shown] == expected[:browse.PAGE_SIZE]
        page.reload()  # the URL alone brings the same view back, filters filled in
        assert page.input_value("input[name=type]") == "state_change"
        assert page.input_value("input[name=sender]") == "worker-03"
        screenshot(page, tmp_path, "console-messages")


def shown_seqs(page) -> list[int]:
    return page.eval_on_selector_all(
        "#messages tr", "rows => rows.slice(1).map(r => Number(r.cells[0].textContent))")


def results_shown(page, count: int) -> None:
    """Wait until browse.js has put `count` results in place since the page loaded."""
    page.wait_for_function("n => performance.getEntriesByName('bus-results').length >= n",
                           arg=count, timeout=PAGE_TIMEOUT_MS)


@pytest.mark.slow
@needs_chromium
def test_console_filters_and_pages_inside_the_open_page(generated, tmp_path: Path) -> None:
    """With scripts, a filter or a page turned replaces the rows in place (no navigation),
    with every filter in the URL, back and forward included; without, the same form and
    links navigate; a bus that cannot be read then gets the page that says so."""
    server, db = generated
    size = browse.PAGE_SIZE
    every = reference(db, lambda t, f, to, c: True)
    expected = reference(db, lambda t, f, to, c: t == "state_change")
    assert len(expected) > size  # so there is an older page
    with offline_page(server) as page:
        page.goto(server.url + "messages")
        page.evaluate("window.sameDocument = true")
        page.fill("input[name=type]", "state_change")
        page.click("#filters button")
        results_shown(page, 1)
        assert urllib.parse.urlparse(page.url).query == "type=state_change"
        assert shown_seqs(page) == expected[:size]
        page.click("#older")
        results_shown(page, 2)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
        assert query == {"type": ["state_change"], "before": [str(expected[size - 1])]}
        assert shown_seqs(page) == expected[size:2 * size]
        # the new page's first rows are in view, as after a navigation (to a pixel's part)
        top = page.evaluate("document.getElementById('results').getBoundingClientRect().top")
        assert top > -1
        page.go_back()
        results_shown(page, 3)
        assert shown_seqs(page) == expected[:size]
        page.go_back()
        results_shown(page, 4)
        assert page.url == server.url + "messages" and page.input_value("input[name=type]") == ""
        assert shown_seqs(page) == every[:size]
        assert page.evaluate("window.sameDocument") is True  # never navigated
        page.wait_for_function("document.getElementById('live').textContent.endsWith('current')",
                               timeout=PAGE_TIMEOUT_MS)
        screenshot(page, tmp_path, "console-messages-in-page")
        without = page.context.browser.new_context(java_script_enabled=False).new_page()
        without.goto(server.url + "messages?type=state_change")
        without.click("#older")
        without.wait_for_url(re.compile(r"before="))
        assert shown_seqs(without) == expected[size:2 * size]
        broken = break_the_file(db, "overwritten", tmp_path)
        page.click("#newest")  # the results cannot be read: the page that says why
        page.wait_for_function("document.getElementById('live').className === 'stale'",
                               timeout=PAGE_TIMEOUT_MS)
        assert re.search(broken, page.text_content("#error").replace("&#x27;", "'"))


@pytest.mark.slow
@needs_chromium
def test_console_pages_mark_themselves_stale(generated, tmp_path: Path) -> None:
    """A page read before the file was replaced by a corrupt one says so; so does one
    left open while the bus moved on."""
    server, db = generated
    with offline_page(server) as page:
        page.goto(server.url + "agents/worker-03")
        page.wait_for_function("document.getElementById('live').textContent.endsWith('current')",
                               timeout=PAGE_TIMEOUT_MS)
        with Bus.open(db) as bus:
            bus.publish("other", "late", {})
        page.wait_for_function("document.getElementById('live').className === 'stale'",
                               timeout=PAGE_TIMEOUT_MS)
        assert "1 newer messages since; reload" in page.text_content("#live")
        page.reload()
        page.wait_for_function("document.getElementById('live').className === ''",
                               timeout=PAGE_TIMEOUT_MS)
        expected = break_the_file(db, "overwritten", tmp_path)
        page.wait_for_function("document.getElementById('live').className === 'stale'",
                               timeout=PAGE_TIMEOUT_MS)
        shown = page.text_content("#live")
        assert shown.startswith("stale: since ") and re.search(expected, shown), shown
        screenshot(page, tmp_path, "console-stale")


@pytest.mark.slow
@needs_chromium
def test_console_overview_shows_the_last_hour_on_a_new_page(generated, tmp_path: Path) -> None:
    server, _db = generated
    with offline_page(server) as page:
        page.goto(server.url)
        page.wait_for_function(
            "(document.getElementById('chart-rate').data || []).length > 0"
            " && (document.getElementById('chart-swimlane').data || []).length > 1",
            timeout=PAGE_TIMEOUT_MS)
        total = page.evaluate("document.getElementById('chart-rate').data"
                              ".reduce((n, t) => n + t.y.reduce((a, b) => a + b, 0), 0)")
        assert total == GENERATED  # written before this page and this server started
        ended = page.evaluate("document.getElementById('chart-swimlane').data"
                              ".find(t => t.name === 'ended').x.length")
        assert ended > 0  # finished workers' lanes stop with a marker
        screenshot(page, tmp_path, "console-overview")


def test_sort_rows_by_a_column_either_way_missing_values_last() -> None:
    rows = [SimpleNamespace(name="b", n=2), SimpleNamespace(name="a", n=None),
            SimpleNamespace(name="c", n=10)]
    columns = {"name": "name", "count": "n"}
    ordered, sort = sort_rows(rows, {"sort": "count"}, columns, "name")
    assert [r.name for r in ordered] == ["b", "c", "a"] and sort == ("count", False)
    ordered, _ = sort_rows(rows, {"sort": "count", "order": "desc"}, columns, "name")
    assert [r.name for r in ordered] == ["c", "b", "a"]
    ordered, sort = sort_rows(rows, {"sort": "nonsense"}, columns, "name")
    assert [r.name for r in ordered] == ["a", "b", "c"] and sort == ("name", False)
