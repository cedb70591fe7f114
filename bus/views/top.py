"""`bus top`: the status, live in the terminal (on Textual).

A thread reads the status through its own read-only connection after each
commit (bus/views/follow.py), so the screen changes as soon as an agent
beats or a message lands, and every few seconds without one, so "silent"
keeps counting. Textual draws; q or Ctrl-C quits. When reading fails (the
file became corrupt or foreign, or is gone) the view ends and `run_top`
raises the error, for the command to print it and exit 1.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from textual import work
from textual.app import App
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable
from textual.widgets import Footer
from textual.widgets import Static

from bus.errors import BusError
from bus.views import render
from bus.views.follow import follow
from bus.views.status import Status
from bus.views.status import read_status
from bus.views.status import status_of

TABLES = (
    ("agents", render.AGENT_COLUMNS, render.agent_rows),
    ("consumers", render.CONSUMER_COLUMNS, render.consumer_rows),
    ("claims", render.CLAIM_COLUMNS, render.claim_rows),
    ("workers", render.WORKER_COLUMNS, render.worker_rows),
    ("channels", render.CHANNEL_COLUMNS, render.channel_rows),
    ("reservations", render.RESERVATION_COLUMNS, render.reservation_rows),
)


class Throughput:
    """Messages per second over about the last WINDOW_S seconds of snapshots."""

    WINDOW_S = 5.0

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, last_seq: int) -> float:
        """Record a snapshot's last seq; return the rate since the window's first one."""
        self.samples.append((at, last_seq))
        # Keep one sample at least WINDOW_S old, so the span is a whole window.
        while len(self.samples) > 2 and at - self.samples[1][0] >= self.WINDOW_S:
            self.samples.popleft()
        first_at, first_seq = self.samples[0]
        return (last_seq - first_seq) / (at - first_at) if at > first_at else 0.0


def summary_lines(status: Status, per_s: float) -> str:
    """The lines above the tables: the file, the log with throughput, workers, pump, export."""
    f, log = status.file, status.log
    return "\n".join([
        f"bus {f.path}  {render.schema(status)}  file {render.human_bytes(f.size_bytes)}"
        f"  WAL {render.human_bytes(f.wal_bytes)}",
        f"log: {log.messages} messages, last seq {log.last_seq}, {per_s:.1f} msg/s",
        f"agents: {render.counts(status.agents_by_state) or 'none'}"
        f"   workers: {render.counts(status.workers) or 'none'}",
        f"claims: {render.claims_summary(status)}",
        f"tasks: {render.tasks_summary(status)}",
        f"reservations: {render.reservations_summary(status)}",
        f"pump: {render.pump_summary(status)}",
        f"export: {render.export_summary(status)}",
    ])


def table_cells(status: Status) -> dict[str, list[tuple[str, ...]]]:
    """Each table's rows as the screen shows them, cell by cell."""
    return {name: [tuple(str(cell) for cell in row) for row in rows(status)]
            for name, _columns, rows in TABLES}


class TopApp(App[None]):
    """The live view of one bus file."""

    TITLE = "bus top"
    CSS = """
    DataTable { height: auto; max-height: 12; margin-bottom: 1; }
    .title { text-style: bold; }
    """
    BINDINGS = [Binding("q", "quit", "Quit"),
                Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]

    def __init__(self, path: str, durability: str = "normal") -> None:
        super().__init__()
        self.path = path
        self.durability = durability
        self.throughput = Throughput()
        self.stopping = threading.Event()
        self.failure: BusError | None = None  # why reading stopped, for run_top to raise
        self.shown: dict[str, list[tuple[str, ...]]] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="summary")
        for name, columns, _rows in TABLES:
            yield Static(name, classes="title")
            table: DataTable[str] = DataTable(id=name, show_cursor=False)
            table.add_columns(*columns)
            yield table
        yield Footer()

    def on_mount(self) -> None:
        self.read_live()

    async def action_quit(self) -> None:
        self.stopping.set()  # first: the reader hands nothing more to an app that is leaving
        await super().action_quit()

    @work(thread=True, exclusive=True)
    def read_live(self) -> None:
        """Read the status after each commit (see bus/views/follow.py) until quit; when
        reading fails, record why and end the app (a screen frozen on an old status
        would look like a quiet bus)."""
        try:
            follow(self.path, lambda conn: status_of(conn, self.path, self.durability),
                   self._show_soon, self.stopping)
        except BusError as exc:  # follow names every failure as a BusError
            if not self.stopping.is_set():
                self.failure = exc
                self.call_from_thread(self.exit, return_code=1)

    def _show_soon(self, status: Status) -> None:
        if not self.stopping.is_set():
            self.call_from_thread(self.show, status)

    def show(self, status: Status) -> None:
        per_s = self.throughput.add(time.monotonic(), status.log.last_seq)
        self.query_one("#summary", Static).update(summary_lines(status, per_s))
        for name, cells in table_cells(status).items():
            if cells != self.shown.get(name):  # redrawing a table costs the writers CPU too
                self.shown[name] = cells
                table = self.query_one(f"#{name}", DataTable)
                table.clear()
                for row in cells:
                    table.add_row(*row)


def run_top(path: str, durability: str = "normal") -> None:
    """Run the terminal view until q or Ctrl-C.

    Reads the status once first, so a missing, foreign or outdated file
    raises its BusError here instead of inside the running view; one that
    fails later ends the view, and its BusError is raised once the terminal
    is restored.
    """
    read_status(path, durability)
    app = TopApp(path, durability)
    try:
        app.run()
    finally:
        app.stopping.set()  # the reader thread ends within STOP_CHECK_S
    if app.failure is not None:
        raise app.failure
