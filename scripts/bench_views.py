"""What the live views cost the writers: publish 1 per transaction with `bus serve`
(and a page's event stream open) and `bus top` (in a pseudo-terminal) watching
the file, against the same publishes with nothing watching, in the same run.

Each round makes two fresh files, each in a directory of its own (a view
watches its file's directory), opens both views on one, and publishes on
the two in turns of SLICE messages, from one thread, in alternating order,
so a load that comes and goes on a shared machine falls on both alike.
Target: watched >= 0.9x the publishes per second of the other.
The page's stream and the terminal are read by a helper process, as a
browser and a terminal emulator are processes of their own: read by threads
of the measuring process, they took the publishing thread's GIL (73.5 against
57.1 us of its CPU per publish, docs/benchmarks.md), which no real writer pays.

Beside the ratio of rates: the writer's own CPU time per publish, watched
against the other (`time.thread_time`; 1.0 = the views cost it nothing),
and the CPU the two view processes used meanwhile, as a share of one core.

    python scripts/bench_views.py [--rounds 3] [--scale 1.0]

With --browse, the message browser instead, on a generated bus of --messages
(1,000,000 by default; scripts/gen_history.py writes it, or --db reuses one):
each page loaded in headless Chromium with the network off (navigation to
the load event as Navigation Timing gives it, split into the server's part and
the rest), the same page fetched by this process alone, and the same filter
applied inside an open page (its click to the rows laid out), against the
same SQL run alone in this process (open a read-only connection, run the
page's query, fetch); medians of --repeat, each measure taken in turns with
the others. Beside them, the floor: a static file's navigation.
Target: each page <= 3x its SQL, by navigation or in the page; the ratios of
the page above the floor and of the server alone are printed beside it.
The writers' side (publish with the browser open) is the first benchmark's,
with a page of the browser open meanwhile.

    python scripts/bench_views.py --browse [--messages 1000000] [--db PATH] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

from bus import Bus

TARGET = 0.9
MESSAGES = 3000  # publishes per run at scale 1
STARTUP_TIMEOUT_S = 60.0
SETTLE_S = 1.0  # let the views finish starting (Textual's first layouts) before timing
SLICE = 100  # publishes per turn


def publish_in_turns(alone: Path, watched: Path, count: int) -> dict[str, list[float]]:
    """`count` publishes on each file, in alternating turns of SLICE: the wall and CPU
    seconds each file's publishes took, as {"alone": [wall, cpu], "watched": [...]}."""
    spent = {"alone": [0.0, 0.0], "watched": [0.0, 0.0]}
    with Bus.open(alone) as alone_bus, Bus.open(watched) as watched_bus:
        turns = [("alone", alone_bus), ("watched", watched_bus)]
        for n, first in enumerate(range(0, count, SLICE)):
            for kind, bus in turns if n % 2 == 0 else reversed(turns):
                wall, cpu = time.perf_counter(), time.thread_time()
                for i in range(first, min(count, first + SLICE)):
                    bus.publish("producer", "tick", {"n": i}, to="consumer")
                spent[kind][0] += time.perf_counter() - wall
                spent[kind][1] += time.thread_time() - cpu
    return spent


def bus_argv(path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bus.cli", "--db", str(path), *args]


def _drain(read: Callable[[], bytes]) -> None:
    """Read and drop everything until the other side closes."""
    try:
        while read():
            pass
    except (OSError, ValueError):
        pass


def _count(db: Path) -> int:
    from bus.storage.db import connect
    conn = connect(db, readonly=True)
    try:
        return conn.execute("SELECT count(*) FROM messages").get
    finally:
        conn.close()


@contextmanager
def serving(path: Path) -> Iterator[tuple[int, str]]:
    """`bus serve` with one page's event stream being read, as a browser would: its pid
    and URL."""
    server = subprocess.Popen(bus_argv(path, "serve", "--port", "0"), stdout=subprocess.PIPE,
                              text=True)
    try:
        url = server.stdout.readline().split(" at ")[1].split()[0]
        stream = urllib.request.urlopen(url + "events", timeout=STARTUP_TIMEOUT_S)
        stream.readline()  # the first snapshot: the server is up
        threading.Thread(target=_drain, args=(lambda: stream.read1(65536),), daemon=True).start()
        yield server.pid, url
    finally:
        server.send_signal(2)
        server.wait(timeout=STARTUP_TIMEOUT_S)


@contextmanager
def topping(path: Path) -> Iterator[int]:
    """`bus top` drawing into a pseudo-terminal whose output is read and dropped."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "45"}
    top = subprocess.Popen(bus_argv(path, "top"), stdin=follower, stdout=follower,
                           stderr=follower, env=env, close_fds=True)
    os.close(follower)
    try:
        first = os.read(leader, 65536)  # blocks until it draws
        assert first, "bus top drew nothing"
        threading.Thread(target=_drain, args=(lambda: os.read(leader, 65536),),
                         daemon=True).start()
        yield top.pid
    finally:
        os.write(leader, b"q")
        top.wait(timeout=STARTUP_TIMEOUT_S)
        os.close(leader)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def watching(path: Path, browser: bool = False) -> Iterator[tuple[int, int]]:
    """Both views open on `path`, read by a helper process (`--watch`): their pids.
    With `browser`, headless Chromium has the overview and the message browser open too."""
    helper = subprocess.Popen([sys.executable, __file__, "--watch", str(path),
                               *(["--with-browser"] if browser else [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = helper.stdout.readline().split()
        if len(pids) != 2:
            raise RuntimeError(f"the views did not start on {path} (see the errors above)")
        yield int(pids[0]), int(pids[1])
    finally:
        helper.stdin.close()
        helper.wait(timeout=STARTUP_TIMEOUT_S)


def watch(path: Path, browser: bool) -> None:
    """The helper: open both views, say their pids, read them until stdin closes."""
    with serving(path) as (server, url), topping(path) as top:
        if browser:
            with pages_open(url):
                print(server, top, flush=True)
                sys.stdin.read()
        else:
            print(server, top, flush=True)
            sys.stdin.read()


@contextmanager
def pages_open(url: str) -> Iterator[None]:
    """Headless Chromium with the overview (its live charts) and the message browser."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"))
        overview, browse = browser.new_page(), browser.new_page()
        overview.goto(url)
        overview.wait_for_function("document.getElementById('live').className === ''",
                                   timeout=STARTUP_TIMEOUT_S * 1000)
        browse.goto(url + "messages")
        yield
        browser.close()


def views_round(workdir: Path, count: int, browser: bool = False
                ) -> tuple[dict[str, list[float]], float]:
    """One round on fresh files: publish_in_turns, and the CPU seconds the views used."""
    alone, watched = workdir / "alone" / "bus.db", workdir / "watched" / "bus.db"
    for path in (alone, watched):
        Bus.open(path).close()
    with watching(watched, browser) as views:
        time.sleep(SETTLE_S)
        before = sum(map(cpu_seconds, views))
        spent = publish_in_turns(alone, watched, count)
        used = sum(map(cpu_seconds, views)) - before
    return spent, used


def views_rows(workdir: Path, rounds: int, scale: float, browser: bool = False) -> list[dict]:
    count = max(200, int(MESSAGES * scale))
    totals = {"alone": [0.0, 0.0], "watched": [0.0, 0.0]}
    views_cpu = 0.0
    for r in range(rounds):
        spent, used = views_round(workdir / f"round-{r}", count, browser)
        views_cpu += used
        for kind, (wall, cpu) in spent.items():
            totals[kind][0] += wall
            totals[kind][1] += cpu
    (alone_wall, alone_cpu), (watched_wall, watched_cpu) = totals["alone"], totals["watched"]
    ratio = alone_wall / watched_wall
    case = "serve + top + 2 Chromium pages" if browser else "publish 1/txn with serve + top open"
    return [{"case": case, "messages": count * rounds,
             "alone_per_s": round(count * rounds / alone_wall),
             "watched_per_s": round(count * rounds / watched_wall), "ratio": round(ratio, 3),
             "writer_cpu_ratio": round(watched_cpu / alone_cpu, 3),
             "views_cpu_share": round(views_cpu / (alone_wall + watched_wall), 3),
             "target": TARGET, "ok": ratio >= TARGET}]


def print_rows(rows: list[dict]) -> None:
    print(f"{'views':40} {'n':>6} {'alone/s':>9} {'watched/s':>10} {'ratio':>6}"
          f" {'writer cpu':>10} {'views cpu':>9}  target")
    for r in rows:
        print(f"{r['case']:40} {r['messages']:>6} {r['alone_per_s']:>9} {r['watched_per_s']:>10}"
              f" {r['ratio']:>6.2f} {r['writer_cpu_ratio']:>9.2f}x {r['views_cpu_share']:>8.0%}"
              f"  >={r['target']} {'ok' if r['ok'] else 'BELOW'}")
    print("(writer cpu: the publishing thread's CPU per publish, watched / alone; views cpu:"
          " the CPU the serve and top processes used while publishing, as a share of one core)")


# --- the message browser ---------------------------------------------------------------

BROWSE_TARGET = 3.0
SERVER_REPEAT = 20  # GETs and SQL runs per page: each is a millisecond or two
# The pages timed: the first page, a page filtered on columns without an index
# (it walks the log back, at most SCAN_WINDOW messages), and one on a task (its index).
BROWSE_PAGES = (("first page", {}),
                ("filtered: type + sender + since", {"type": "state_change",
                                                     "sender": "worker-03", "since": "1d"}),
                ("filtered: task", {"task": "task-000100"}))


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def sql_alone(path: Path, params: dict[str, str]) -> float:
    """Seconds to open the file read-only, run the page's SQL and fetch it."""
    from bus.storage.db import connect
    from bus.log.messages import now_ms
    from bus.log.browse import LogFilter
    from bus.log.browse import message_page_params
    from bus.log.browse import message_page_sql
    filt = LogFilter.from_params(params)
    started = time.perf_counter()
    conn = connect(path, readonly=True)
    with conn:
        bound = message_page_params(conn, filt, now_ms())
        conn.execute(message_page_sql(filt), bound).fetchall()
    conn.close()
    return time.perf_counter() - started


def server_alone(conn: Any, path: str) -> float:
    """Seconds for a GET of `path` from this process on the kept-alive `conn`, to the last
    byte of the answer: the server's time without the browser."""
    started = time.perf_counter()
    conn.request("GET", "/" + path)
    conn.getresponse().read()
    return time.perf_counter() - started


# What the browser says of its last navigation (Navigation Timing): the server's
# part is the document's request to its last byte; the rest is the browser's
# (parse, scripts, subresources, layout) until the load event ends.
NAVIGATION_TIMING = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return {page: n.loadEventEnd - n.startTime, server: n.responseEnd - n.requestStart,
          rest: n.loadEventEnd - n.startTime - (n.responseEnd - n.requestStart)};
}"""


def navigation(page: Any, url: str) -> dict[str, float]:
    """One navigation to `url` in Chromium to its load event, in seconds: `page` (from the
    navigation's start to the end of the load event, as the browser times it), its `server`
    and `rest` parts (NAVIGATION_TIMING), and `goto` (the same seen from here, through
    Playwright)."""
    started = time.perf_counter()
    page.goto(url, wait_until="load")
    goto = time.perf_counter() - started
    return {**{part: ms / 1000 for part, ms in page.evaluate(NAVIGATION_TIMING).items()},
            "goto": goto}


def in_new_tab(page: Any, url: str) -> float:
    """Seconds of a navigation to `url` (as `navigation`'s `page`) in a new tab beside
    `page`: its cache, not its memory (a page opened anew, the browser already running)."""
    tab = page.context.new_page()
    try:
        return navigation(tab, url)["page"]
    finally:
        tab.close()


FILTER_INPUTS = ("type", "sender", "to", "task", "since")


def in_page(page: Any, params: dict[str, str]) -> float | None:
    """Seconds from the filter form's submit click to the new rows laid out, inside the
    open /messages `page` (bus/views/static/browse.js fetches only the results; its
    "bus-results" measure); None from a server without browse.js (an older checkout, for
    a before/after run: this script run from the other checkout, with its python)."""
    if page.query_selector("script[src*='browse.js'], script[data-src$='browse.js']") is None:
        return None
    for name in FILTER_INPUTS:
        page.fill(f"#filters input[name={name}]", params.get(name, ""))
    shown = page.evaluate("performance.getEntriesByName('bus-results').length")
    page.click("#filters button")
    page.wait_for_function("n => performance.getEntriesByName('bus-results').length > n",
                           arg=shown, timeout=STARTUP_TIMEOUT_S * 1000)
    return page.evaluate("performance.getEntriesByName('bus-results').pop().duration") / 1000


def browse_samples(db: Path, url: str, repeat: int) -> list[dict[str, list[float]]]:
    """For the floor and each of BROWSE_PAGES, `repeat` samples of each measure, taken in
    turns (one of each, page after page, round after round, after a round to warm up), so
    a load that comes and goes on a shared machine falls on all alike."""
    import http.client
    from urllib.parse import urlencode
    from urllib.parse import urlsplit
    from playwright.sync_api import sync_playwright
    paths = ["static/style.css"] + [("messages?" + urlencode(params)).rstrip("?")
                                    for _name, params in BROWSE_PAGES]
    samples: list[dict[str, list[float]]] = [{} for _ in paths]
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=STARTUP_TIMEOUT_S)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=[
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        tabs = browser.new_context()  # one cache for the tabs, as in a browser's window
        navigating, browsing = tabs.new_page(), tabs.new_page()
        browsing.goto(url + "messages")
        for n in range(repeat + 1):
            for i, path in enumerate(paths):
                taken = {"server_alone": server_alone(conn, path),
                         **navigation(navigating, url + path),
                         "new_tab": in_new_tab(navigating, url + path)}
                if i:
                    params = BROWSE_PAGES[i - 1][1]
                    taken.update(sql=sql_alone(db, params), in_page=in_page(browsing, params),
                                 rows=navigating.eval_on_selector_all(
                                     "#messages tr", "rows => Math.max(0, rows.length - 1)"))
                for measure, seconds in taken.items():
                    if n:
                        samples[i].setdefault(measure, []).append(seconds)
        browser.close()
    conn.close()
    return samples


def browse_rows(db: Path, repeat: int) -> list[dict]:
    """A row per page (the floor first): the medians, in seconds, and the ratios."""
    with serving(db) as (_pid, url):
        floor, *pages = [{measure: None if None in spent else median(spent)
                          for measure, spent in taken.items()}
                         for taken in browse_samples(db, url, repeat)]
    rows = [{"case": "floor: a static file", **floor, "rows": 0, "ok": True}]
    for (name, _params), found in zip(BROWSE_PAGES, pages):
        sql = found["sql"]
        rows.append({"case": name, **found, "ratio": found["page"] / sql,
                     "above_floor": max(0.0, found["page"] - floor["page"]) / sql,
                     "server_ratio": found["server_alone"] / sql,
                     "in_page_ratio": None if found["in_page"] is None else found["in_page"] / sql,
                     "ok": min(found["page"], found["in_page"] or found["page"])
                     <= BROWSE_TARGET * sql})
    return rows


BROWSE_COLUMNS = (  # (heading, key, milliseconds or a ratio)
    ("sql", "sql", True), ("server", "server_alone", True), ("page", "page", True),
    ("=server", "server", True), ("+rest", "rest", True), ("goto", "goto", True),
    ("new tab", "new_tab", True), ("in page", "in_page", True), ("rows", "rows", False),
    ("page/", "ratio", False), ("-floor/", "above_floor", False),
    ("server/", "server_ratio", False), ("in page/", "in_page_ratio", False))


def print_browse(rows: list[dict], messages: int) -> None:
    print(f"the message browser on {messages:,} messages: milliseconds, and ratios to the sql")
    print(f"{'page':32}" + "".join(f" {heading:>8}" for heading, _key, _ms in BROWSE_COLUMNS)
          + "  target")
    for r in rows:
        cells = [_cell(r.get(key), ms) for _heading, key, ms in BROWSE_COLUMNS]
        print(f"{r['case']:32}" + "".join(f" {cell:>8}" for cell in cells)
              + f"  <={BROWSE_TARGET} {'ok' if r['ok'] else 'ABOVE'}")
    print("(medians. sql: the page's SQL alone, on a connection of its own; server: a GET of"
          " the page from this process, kept-alive, to its last byte; page: Chromium's"
          " navigation, network off, from its start to the load event's end (Navigation"
          " Timing) = server (the document's request to its last byte) + rest (the browser's:"
          " parse, scripts, subresources, layout); goto: the same seen from here through"
          " Playwright; new tab: the page's navigation in a new tab (the cache, not the"
          " memory of the tab before); in page: inside an open /messages page, the filter"
          " form's click to"
          " the new rows laid out (browse.js fetches the results alone). Ratios: page/ the"
          " navigation's; -floor/: (page - the static file's page) / sql; server/, in page/:"
          " theirs / sql. ok: the navigation or the in-page load within the target. Each"
          " measure is taken in turns with the others.)")


def _cell(value: float | None, milliseconds: bool) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f}" if milliseconds else f"{value:.1f}" if isinstance(
        value, float) else str(value)


def generate(db: Path, messages: int) -> None:
    script = Path(__file__).resolve().parent / "gen_history.py"
    subprocess.run([sys.executable, str(script), "--bus", str(db), "-n", str(messages),
                    "--seed", "7"], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds on fresh files; all count")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--browse", action="store_true", help="time the message browser")
    parser.add_argument("--messages", type=int, default=1_000_000, help="with --browse")
    parser.add_argument("--db", type=Path, help="with --browse: a generated bus to reuse")
    parser.add_argument("--repeat", type=int, default=5, help="with --browse: loads per page")
    parser.add_argument("--with-browser", action="store_true",
                        help="Chromium has the overview and the message browser open too")
    parser.add_argument("--watch", type=Path, help=argparse.SUPPRESS)  # the helper process
    args = parser.parse_args(argv)
    if args.watch:
        watch(args.watch, args.with_browser)
        return 0
    if args.browse:
        workdir = Path(tempfile.mkdtemp(prefix="agentbus-bench-browse-"))
        try:
            db = args.db or workdir / "bus.db"
            if args.db is None:
                generate(db, args.messages)
            rows = browse_rows(db, args.repeat)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print_browse(rows, args.messages if args.db is None else _count(db))
        return 0 if all(r["ok"] for r in rows) else 1
    workdir = Path(tempfile.mkdtemp(prefix="agentbus-bench-views-"))
    try:
        rows = views_rows(workdir, args.rounds, args.scale, args.with_browser)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_rows(rows)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
