"""The console's history page: what `bus history` prints, through the warm Spark.

`/history` brings the history lake beside the export up to date and shows
the totals and the top rows of each query (bus.history.report's summary),
as `bus history` does. It runs on the warm Spark Connect server of `bus
history serve` only: a JVM started for one page view would take half a
minute and a gigabyte of the console's machine. Without a server, or
without the `[spark]` extra, the page says what to do. The lake takes one
writer, so the console runs one update at a time; a second view waits for
the first and then finds little new.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse

from bus.history.errors import first_line
from bus.history.serve import live_server
from bus.log.export import export_path
from bus.log.messages import last_seq
from bus.log.messages import now_ms
from bus.storage.db import connect
from bus.views import pages
from bus.views.follow import read_failure
from bus.views.pages import Safe

HISTORY_TOP = 10  # rows per query on the page


class HistoryPage:
    """The `/history` endpoint of the console on the bus at `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._one_update = threading.Lock()

    def endpoint(self, request: Request) -> HTMLResponse:
        """The page (Starlette runs it in its thread pool: a run never holds up the rest)."""
        read_ms = now_ms()
        try:
            export, last = self._read()
        except Exception as exc:  # the page says why, as the other pages do
            return self._failure(str(read_failure(exc, self.path)), read_ms)
        server = live_server(self.path)
        if server is None:
            return self._page(read_ms, last, _no_server())
        if not export.exists():
            return self._page(read_ms, last, _note(
                f"No export at {export} yet: `bus export` writes it, and this page reads"
                " what it holds."))
        try:
            with self._one_update:
                seen, results = _compute(server.url, export)
        except ImportError as exc:
            return self._page(read_ms, last, _note(
                f"The history needs the spark extra ({exc}): pip install 'agentbus[spark]'."),
                status=503)
        except Exception as exc:
            return self._failure(first_line(exc), read_ms)
        return self._page(read_ms, last, _report(server.url, export, seen, results))

    def _read(self) -> tuple[Path, int]:
        """The export's path, and the last seq of the log (the page is stale past it)."""
        conn = connect(self.path, readonly=True)
        try:
            with conn:
                return export_path(conn, self.path), last_seq(conn)
        finally:
            conn.close()

    def _page(self, read_ms: int, last: int, body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(pages.shell("history", body, read_ms, last), status_code=status)

    @staticmethod
    def _failure(why: str, read_ms: int) -> HTMLResponse:
        return HTMLResponse(pages.failure_page("history", why, read_ms), status_code=503)


def _compute(url: str, export: Path) -> tuple[Any, list[Any]]:
    """The overview and every query's rows, on the server at `url`, after the lake takes
    in what the export gained."""
    from bus.history.job import compute  # the [spark] extra: imported when a server runs
    from bus.history.queries import Options
    from bus.history.queries import query_names
    from bus.history.session import connect_spark

    spark = connect_spark(url)
    try:
        return compute(spark, str(export), query_names("all"), Options())
    finally:
        spark.stop()  # this session on the server; the server runs on


def _report(url: str, export: Path, seen: Any, results: list[Any]) -> Safe:
    from bus.history.report import summary
    from bus.history.report import totals

    sections = summary(totals(seen), results, HISTORY_TOP)
    parts = [f'<p id="source">the lake of {pages.esc(export)}, read through Spark Connect at'
             f" {pages.esc(url)}</p>"]
    for section in sections:
        parts.append(f"<h2>{pages.esc(section.heading().strip('= '))}</h2>"
                     + pages.table(section.columns, section.rows,
                                   id=f"history-{section.title.split(':')[0]}"))
    return Safe("".join(parts))


def _no_server() -> Safe:
    return _note("No warm Spark runs for this bus. `bus history serve` starts one; this page"
                 " then brings the history lake up to date through it and shows what"
                 " `bus history` prints: volume, lifecycles, reply latency, silences, dead"
                 " tasks, lead times, time blocked and throughput.")


def _note(text: str) -> Safe:
    return Safe(f'<p class="note" id="history-note">{pages.esc(text)}</p>')
