"""The pages of `bus serve` beyond the overview: the message browser, one page per
thing, and the tables. Each request reads through a read-only connection of its
own, in one read transaction, with a bus/views/queries.py function, and renders
it with bus/views/pages.py; a file that cannot be read gets a page that says
why (503), marked stale. The message browser also answers its own script
(bus/views/static/browse.js) with the results alone, so that a filter or a page
turned replaces only the rows of an open page.

Starlette runs these plain functions in its thread pool, so a slow read never
holds up the event streams of the live overview.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Sequence

import apsw
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from bus.log import browse
from bus.coordination import claims
from bus.log import messages
from bus.coordination import tasks
from bus.coordination import worker_table
from bus.storage.blob_errors import BusBlobStore
from bus.log.browse import LogFilter
from bus.channels.queries import channel_detail
from bus.channels.queries import channel_summaries
from bus.channels.queries import dead_letter_summaries
from bus.storage.db import connect
from bus.storage.db import translate_busy
from bus.storage.errors import SearchDisabled
from bus.storage.errors import ValidationFailed
from bus.coordination.heartbeats import Thresholds
from bus.coordination.heartbeats import liveness
from bus.pump.work import newest_units
from bus.views import pages
from bus.views import queries
from bus.views.charts import History
from bus.views.follow import read_failure
from bus.views.lake import HistoryPage
from bus.views.pages import Safe

GIT_TIMEOUT_S = 5
COMMITS_MAX = 50
# The message browser applies a filter or turns a page inside the open page: its script
# asks for the results alone with this header (a navigation, without the script, gets
# the whole page at the same URL).
FRAGMENT_HEADER = "x-bus-fragment"
BROWSE_SCRIPTS = ("browse.js",)


class NotFound(Exception):
    """No such thing on this bus: a 404 page that says what was looked for."""


class PageReader:
    """Opens the bus read-only for one request, reads and renders in one transaction."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.blobs = BusBlobStore(Path(path).absolute().parent / "blobs")  # reads never create it

    def table(self, title: str,
              render: Callable[[apsw.Connection, int, dict[str, str]], Safe]) -> Callable:
        """The endpoint of a table page: `render` gets the query parameters (sorting)."""
        def endpoint(request: Request) -> HTMLResponse:
            params = dict(request.query_params)
            return self.page(title, lambda conn, now: render(conn, now, params))
        return endpoint

    def page(self, title: str, render: Callable[[apsw.Connection, int], Safe], *,
             scripts: Sequence[str] = (), fragment: bool = False) -> HTMLResponse:
        """The page `render` makes, in the shell with `scripts`; with `fragment`, what
        `render` made alone, its read time and last seq in headers (FRAGMENT_HEADER)
        for the script that asked to put it in place (a failure is the whole page, which
        that script navigates to)."""
        now = messages.now_ms()
        try:
            conn = connect(self.path, readonly=True)
            try:
                with translate_busy(conn), conn:
                    last = messages.last_seq(conn)
                    body = render(conn, now)
            finally:
                conn.close()
        except NotFound as missing:
            return HTMLResponse(pages.shell(title, Safe(f'<p class="error" id="error">'
                                                        f'{pages.esc(missing)}</p>'), now, 0),
                                status_code=404)
        except Exception as exc:  # the page says why, as the overview does
            failure = read_failure(exc, self.path)
            return HTMLResponse(pages.failure_page(title, str(failure), now), status_code=503)
        if fragment:
            # never stored: a history navigation to this URL must get the whole page
            return HTMLResponse(body, headers={"Cache-Control": "no-store",
                                               "X-Bus-Read-Ms": str(now),
                                               "X-Bus-Last-Seq": str(last)})
        return HTMLResponse(pages.shell(title, body, now, last, scripts))


def routes(path: str, history: History | None = None) -> list[Route]:
    """The console's routes on the bus at `path`; `history`, the server's (the agent page
    shows the liveness changes it saw), None for none."""
    console = Console(PageReader(path), history)
    reader = console.reader
    return [
        Route("/messages", console.browse), Route("/messages/{seq:int}", console.message),
        Route("/agents", reader.table("agents", agents_table)),
        Route("/agents/{name:path}", console.agent),
        Route("/workers", reader.table("workers", workers_table)),
        Route("/workers/{name:path}", console.worker),
        Route("/channels", reader.table("channels", channels_table)),
        Route("/channels/{name:path}", console.channel),
        Route("/tasks", reader.table("tasks", tasks_table)),
        Route("/tasks/{name:path}", console.task),
        Route("/claims", reader.table("claims", claims_table)),
        Route("/reservations", reader.table("reservations", reservations_table)),
        Route("/dead-letters", reader.table("dead letters", dead_letters_table)),
        Route("/pump", reader.table("pump units", pump_table)),
        Route("/history", HistoryPage(path).endpoint),
    ]


def _found(detail: Any, missing: str) -> Any:
    """`detail`, or NotFound saying what is missing (the page answers 404)."""
    if detail is None:
        raise NotFound(missing)
    return detail


class Console:
    """The endpoints of the console's pages: one per kind of thing, each a read."""

    def __init__(self, reader: PageReader, history: History | None) -> None:
        self.reader = reader
        self.history = history

    def browse(self, request: Request) -> HTMLResponse:
        """The message browser; asked by /static/browse.js (FRAGMENT_HEADER), only its
        results, which that script puts in place of the ones shown."""
        fragment = request.headers.get(FRAGMENT_HEADER) == "results"
        show = pages.messages_results if fragment else pages.messages_page
        try:
            filt = LogFilter.from_params(dict(request.query_params))
        except ValidationFailed as exc:
            return self.reader.page("messages", lambda conn, now: show(
                LogFilter(), None, f"{exc.field}: {exc.reason}"),
                scripts=BROWSE_SCRIPTS, fragment=fragment)

        def render(conn: apsw.Connection, now: int) -> Safe:
            try:
                page = browse.list_messages(conn, filt, now)
            except (ValidationFailed, SearchDisabled) as exc:
                return show(filt, None, str(exc))
            return show(filt, page, None)
        return self.reader.page("messages", render, scripts=BROWSE_SCRIPTS, fragment=fragment)

    def message(self, request: Request) -> HTMLResponse:
        seq = request.path_params["seq"]
        return self.reader.page(f"message {seq}", lambda conn, _now: pages.message_page(_found(
            queries.message_detail(conn, seq, self.reader.blobs),
            f"no message with seq {seq} (compacted, or not yet written)")))

    def agent(self, request: Request) -> HTMLResponse:
        name = request.path_params["name"]
        seen = self.history.liveness.get(name, ()) if self.history is not None else ()
        return self.reader.page(f"agent {name}", lambda conn, now: pages.agent_page(
            queries.agent_detail(conn, name, now), now, seen))

    def worker(self, request: Request) -> HTMLResponse:
        name = request.path_params["name"]

        def render(conn: apsw.Connection, _now: int) -> Safe:
            detail = _found(queries.worker_detail(conn, name),
                            f"no worker {name!r} (see the workers table)")
            commits, note = branch_commits(detail.worker)
            return pages.worker_page(queries.WorkerDetail(detail.worker, detail.history,
                                                          detail.sent, commits, note))
        return self.reader.page(f"worker {name}", render)

    def channel(self, request: Request) -> HTMLResponse:
        name = request.path_params["name"]
        return self.reader.page(f"channel {name}", lambda conn, _now: pages.channel_page(_found(
            channel_detail(conn, name), f"no channel {name!r} (see the channels table)")))

    def task(self, request: Request) -> HTMLResponse:
        name = request.path_params["name"]

        def render(conn: apsw.Connection, now: int) -> Safe:
            detail = tasks.find_task_detail(conn, name, now)
            claim = claims.get(conn, name)
            found = queries.claim_events(conn, name)
            if detail is None and claim is None and not queries.has_messages_about(conn, name):
                raise NotFound(f"no task {name!r}: not in the task graph, not leased, in no"
                               " message's correlation id (see the tasks and claims tables)")
            return pages.task_page(name, detail, claim, found, now)
        return self.reader.page(f"task {name}", render)


def branch_commits(worker: worker_table.Worker) -> tuple[list[str] | None, str]:
    """The worker's commits not on its base (`git log base..branch`), or None and why not:
    the repository may be on another machine, or gone."""
    argv = ["git", "-C", worker.repo, "log", f"--max-count={COMMITS_MAX}",
            "--format=%h %ad %an: %s", "--date=iso-strict", f"{worker.base}..{worker.branch}",
            "--"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the repository {worker.repo} cannot be read from here ({exc})"
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "git failed"
        return None, f"the repository {worker.repo} cannot be read from here ({why})"
    return done.stdout.splitlines(), ""


# --- the tables --------------------------------------------------------------------


def agents_table(conn: apsw.Connection, now: int, params: dict[str, str]) -> Safe:
    found = liveness(conn, now, Thresholds())
    rows, sort = pages.sort_rows(found, params, {"agent": "agent", "state": "state",
                                                 "silent s": "age_s", "status": "status",
                                                 "task": "task"}, "agent")
    return pages.join([pages.counts("agents", pages.tally(a.state for a in found)), pages.table(
        ("agent", "state", "silent s", "status", "task"),
        [[pages.agent_link(a.agent), a.state, f"{a.age_s:.1f}", a.status, pages.task_link(a.task)]
         for a in rows], id="agents", sort=sort,
        sortable=("agent", "state", "silent s", "status", "task"))])


_WORKER_SORT = {"worker": "worker", "task": "task", "state": "state", "branch": "branch",
                "updated": "updated_at_ms"}


def workers_table(conn: apsw.Connection, _now: int, params: dict[str, str]) -> Safe:
    found = worker_table.list_workers(conn)
    rows, sort = pages.sort_rows(found, params, _WORKER_SORT, "worker")
    return pages.join([pages.counts("workers", pages.tally(w.state for w in found)), pages.table(
        ("worker", "task", "state", "branch", "updated"),
        [[pages.worker_link(w.worker), pages.task_link(w.task), w.state, w.branch,
          pages.when(w.updated_at_ms)] for w in rows], id="workers", sort=sort,
        sortable=tuple(_WORKER_SORT))])


_CLAIM_SORT = {"task": "task_id", "holder": "agent", "fence": "fence", "claimed": "claimed_at_ms",
               "lease left s": "lease_until_ms", "attempt": "attempts"}


def claims_table(conn: apsw.Connection, now: int, params: dict[str, str]) -> Safe:
    found = claims.claims_table(conn)
    rows, sort = pages.sort_rows(found.held, params, _CLAIM_SORT, "task")
    expired = sum(c.expired(now) for c in found.held)
    line = pages.counts("claims", {"held": len(found.held) - expired, "expired": expired,
                                   "dead": len(found.dead)})
    dead = pages.table(("task", "last holder", "attempts", "reason", "died"),
                       [[pages.task_link(d.task_id), pages.agent_link(d.last_holder), d.attempts,
                         d.reason, pages.when(d.died_at_ms)] for d in found.dead], id="dead-claims")
    return pages.join([line, pages.claims_rows_table(rows, now, "claims", sort, tuple(_CLAIM_SORT)),
                       pages.section("dead claims (out of attempts)", dead)])


_CHANNEL_SORT = {"channel": "name", "type": "type", "owner": "owner", "state": "state",
                 "open": "open_deliveries", "dead letters": "dead_letters"}


def channels_table(conn: apsw.Connection, _now: int, params: dict[str, str]) -> Safe:
    found = channel_summaries(conn)
    rows, sort = pages.sort_rows(found, params, _CHANNEL_SORT, "channel")
    return pages.join([pages.counts("channels", pages.tally(c.type for c in found)), pages.table(
        ("channel", "type", "owner", "state", "open", "dead letters"),
        [[pages.channel_link(c.name), c.type, pages.agent_link(c.owner), c.state,
          c.open_deliveries, c.dead_letters] for c in rows], id="channels", sort=sort,
        sortable=tuple(_CHANNEL_SORT))])


_DEAD_LETTER_SORT = {"id": "id", "seq": "seq", "channel": "channel", "recipient": "recipient",
                     "retries": "retry_count", "dead since": "dead_lettered_at_ms"}


def dead_letters_table(conn: apsw.Connection, _now: int, params: dict[str, str]) -> Safe:
    found = dead_letter_summaries(conn)
    rows, sort = pages.sort_rows(found, params, _DEAD_LETTER_SORT, "id")
    return pages.join([pages.counts("dead letters", pages.tally(d.channel for d in found)),
                       pages.dead_letters_table(rows, "dead-letters", sort,
                                                tuple(_DEAD_LETTER_SORT))])


_PUMP_SORT = {"id": "id", "organism": "organism", "listener": "listener", "status": "status",
              "attempts": "attempts", "created": "created_ms"}


def pump_table(conn: apsw.Connection, _now: int, params: dict[str, str]) -> Safe:
    found = newest_units(conn)
    rows, sort = pages.sort_rows(found, params, _PUMP_SORT, "id")
    return pages.join([pages.counts("pump units", pages.tally(u.status for u in found)),
                       pages.table(
        ("id", "organism", "input", "listener", "kind", "thread", "status", "attempts",
         "lease owner", "created", "outcome"),
        [[u.id, u.organism, pages.message_link(u.input_seq), u.listener, u.kind, u.thread,
          u.status, f"{u.attempts}/{u.max_attempts}", pages.agent_link(u.lease_owner)
          if u.lease_owner else None, pages.when(u.created_ms), u.outcome] for u in rows],
        id="pump", sort=sort, sortable=tuple(_PUMP_SORT))])


_TASK_SORT = {"task": "task_id", "status": "status", "priority": "priority", "holder": "holder",
              "fence": "fence", "created": "created_ms"}


def tasks_table(conn: apsw.Connection, now: int, params: dict[str, str]) -> Safe:
    """The task graph; `?status=ready` (blocked, held, done, cancelled) shows those only."""
    found = tasks.list_task_rows(conn, now)
    wanted = params.get("status")
    shown = [t for t in found if wanted in (None, "", t.status)]
    rows, sort = pages.sort_rows(shown, params, _TASK_SORT, "task")
    filters = pages.join([pages.link("/tasks", "all")] + [
        pages.link(f"/tasks?status={s}", s) for s in ("ready", "blocked", "held", "done",
                                                      "cancelled")], " · ")
    return pages.join([pages.counts("tasks", pages.tally(t.status for t in found)),
                       Safe(f'<p id="task-filters">{filters}</p>'), pages.table(
        ("task", "title", "status", "priority", "waiting on", "holder", "fence", "created"),
        [[pages.task_link(t.task_id), t.task.title, t.status, t.priority, t.task.waiting_on,
          pages.agent_link(t.holder) if t.holder else None, t.fence, pages.when(t.created_ms)]
         for t in rows], id="tasks", sort=sort, sortable=tuple(_TASK_SORT))])


_RESERVATION_SORT = {"pattern": "pattern", "holder": "agent", "mode": "mode",
                     "expires": "expires_at_ms", "created": "created_at_ms"}


def reservations_table(conn: apsw.Connection, now: int, params: dict[str, str]) -> Safe:
    found = queries.list_reservations(conn, now)
    rows, sort = pages.sort_rows(found, params, _RESERVATION_SORT, "pattern")
    return pages.join([pages.counts("reservations", pages.tally(r.mode for r in found)),
                       pages.table(
        ("pattern", "holder", "mode", "expires", "created", "reason"),
        [[r.pattern, pages.agent_link(r.agent), r.mode, pages.when(r.expires_at_ms),
          pages.when(r.created_at_ms), r.reason] for r in rows], id="reservations", sort=sort,
        sortable=tuple(_RESERVATION_SORT))])
