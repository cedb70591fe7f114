"""`bus top`: the bus live in the terminal (on Textual), to watch and to look into.

One screen: the summary, a table per part of the bus (agents, workers,
claims, tasks, consumers, channels, reservations; keys switch between them),
and the message stream, one line per message as it commits. Enter opens the
selected row (a worker's state history, an agent's liveness, claims and last
messages, a task's dependencies and holder); Escape goes back; `s` cycles
the column the table is sorted by, `r` reverses it; q or Ctrl-C quits.

A thread reads the status and the new messages through its own read-only
connection after each commit (bus/views/follow.py), so the screen changes
as soon as an agent beats or a message lands, and every few seconds without
one, so "silent" keeps counting. Looking never writes. When reading fails
(the file became corrupt or foreign, or is gone) the view ends and
`run_top` raises the error, for the command to print it and exit 1.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Sequence

import apsw
from textual import work
from textual.app import App
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable
from textual.widgets import Footer
from textual.widgets import RichLog
from textual.widgets import Static
from textual.widgets import TabbedContent
from textual.widgets import TabPane

from bus.log import messages
from bus.storage.blob_errors import BusBlobStore
from bus.storage.db import connect
from bus.storage.db import translate_busy
from bus.storage.errors import BusError
from bus.log.messages import Message
from bus.views import details
from bus.views import render
from bus.views.follow import follow
from bus.views.follow import read_failure
from bus.views.status import Status
from bus.views.status import read_status
from bus.views.status import status_of

if TYPE_CHECKING:
    from blobs.store import BlobStore

# The tables the status fills (bus/views/render.py makes their rows).
TABLES = (
    ("agents", render.AGENT_COLUMNS, render.agent_rows),
    ("consumers", render.CONSUMER_COLUMNS, render.consumer_rows),
    ("claims", render.CLAIM_COLUMNS, render.claim_rows),
    ("workers", render.WORKER_COLUMNS, render.worker_rows),
    ("channels", render.CHANNEL_COLUMNS, render.channel_rows),
    ("reservations", render.RESERVATION_COLUMNS, render.reservation_rows),
)
# The tabs in their order, with the key that shows each: the status's tables, and the
# task graph's (read beside the status, bus/views/details.py).
TABS = {"agents": "a", "workers": "w", "claims": "c", "tasks": "t", "consumers": "n",
        "channels": "h", "reservations": "e"}
COLUMNS = {name: columns for name, columns, _rows in TABLES} | {"tasks": details.TASK_COLUMNS}
SHOWN_KEYS = ("agents", "workers", "claims", "tasks")  # in the footer; the README has all
TABLE_ACTIONS = frozenset({"show_table", "sort", "reverse", "open"})
STREAM_BACKLOG = 200  # messages the stream starts with
# The most a later read adds: more than a person reads in a quarter second, and more
# than the pane shows; drawing every message of a fast writer cost a core (bench_views).
STREAM_BURST = 60
STREAM_LINES = 1000  # lines the stream pane keeps


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


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?) (s|min|h)(?: ago)?")
_UNIT_S = {"s": 1, "min": 60, "h": 3600}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FRACTION = re.compile(r"(\d+)/(\d+)")


def sort_key(cell: str) -> tuple[int, Any, str]:
    """How a cell compares when its column is sorted: numbers and durations by value
    (`3 min` after `59.0 s`, attempts `2/5` by the first number), then text."""
    duration = _DURATION.fullmatch(cell)
    if duration:
        return (0, float(duration[1]) * _UNIT_S[duration[2]], cell)
    if _NUMBER.fullmatch(cell):
        return (0, float(cell), cell)
    fraction = _FRACTION.fullmatch(cell)
    if fraction:
        return (0, int(fraction[1]), cell)
    return (1, cell, cell)


@dataclass(frozen=True)
class SortOrder:
    """Which column a table is sorted by (None: as the status lists it), and which way."""

    column: int | None = None
    reverse: bool = False

    def next_column(self, columns: int) -> SortOrder:
        """The next column, and back to the status's own order after the last one."""
        if self.column is None:
            return SortOrder(0, self.reverse)
        return SortOrder(self.column + 1 if self.column + 1 < columns else None, self.reverse)

    def reversed(self) -> SortOrder:
        return SortOrder(self.column, not self.reverse)

    def apply(self, rows: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
        if self.column is None:
            return list(reversed(rows)) if self.reverse else list(rows)
        column = self.column
        return sorted(rows, key=lambda row: sort_key(row[column]), reverse=self.reverse)

    def labels(self, columns: Sequence[str]) -> list[str]:
        """The column headers, the sorted one marked ▲ (ascending) or ▼."""
        mark = " ▼" if self.reverse else " ▲"
        return [c + mark if i == self.column else c for i, c in enumerate(columns)]


class MessageStream:
    """The messages the stream pane has not shown yet, read after each commit.

    The first read takes the newest STREAM_BACKLOG; each later one what came
    after the last seq shown, and a burst of more than STREAM_BURST is shown
    by its newest ones, with a line that says how many were skipped.
    """

    def __init__(self, blobs: BlobStore | None = None) -> None:
        self.blobs = blobs  # where a big payload's first bytes are read from
        self.last_seq: int | None = None

    def read_new(self, conn: apsw.Connection) -> list[str]:
        newest = messages.last_seq(conn)
        if self.last_seq is not None and newest <= self.last_seq:
            return []
        skipped = 0 if self.last_seq is None else newest - self.last_seq - STREAM_BURST
        if self.last_seq is None or skipped > 0:
            count = STREAM_BACKLOG if self.last_seq is None else STREAM_BURST
            found = messages.select_last(conn, count, self.blobs, details.PREVIEW_BYTES)
        else:
            found = messages.select_after(conn, self.last_seq, STREAM_BURST, self.blobs,
                                          details.PREVIEW_BYTES)
        self.last_seq = newest
        lines = [f"… {skipped} messages not shown (a burst)"] if skipped > 0 else []
        return lines + [details.message_line(m) for m in found]


def row_keys(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A key per row that stays with it across refreshes: its first cell (a name), made
    unique where names repeat (two agents sharing a reservation's pattern)."""
    seen: dict[str, int] = {}
    keys = []
    for row in rows:
        n = seen[row[0]] = seen.get(row[0], 0) + 1
        keys.append(row[0] if n == 1 else f"{row[0]}\x00{n}")
    return keys


@dataclass(frozen=True)
class Opened:
    """The row a detail screen shows: its table, its key (first cell) and its cells."""

    table: str
    key: str
    cells: tuple[str, ...]


def detail_lines(conn: apsw.Connection, status: Status, opened: Opened,
                 blobs: BlobStore | None = None) -> list[str]:
    """What the detail screen shows of `opened`, read in the caller's transaction."""
    if opened.table == "workers":
        worker = next((w for w in status.worker_list if w.worker == opened.key), None)
        history = [] if worker is None else details.worker_history(conn, worker.worker,
                                                                   worker.task)
        return details.worker_lines(status, opened.key, history,
                                    details.agent_messages(conn, opened.key, blobs))
    if opened.table == "agents":
        return details.agent_lines(status, opened.key,
                                   details.agent_messages(conn, opened.key, blobs))
    if opened.table == "tasks":
        return details.task_lines(conn, status, opened.key)
    recent: list[Message] = []
    if opened.table == "claims":
        recent = details.task_messages(conn, opened.key, blobs)
    elif opened.table == "consumers":
        recent = details.agent_messages(conn, opened.key, blobs)
    elif opened.table == "reservations":  # a pattern: its holder's messages
        recent = details.agent_messages(conn, opened.cells[1], blobs)
    return details.row_lines(f"{opened.table[:-1]} {opened.key}", COLUMNS[opened.table],
                             opened.cells, recent)


@dataclass(frozen=True)
class Snapshot:
    """One read of the live view: the status, the stream's new lines, the open row's lines."""

    status: Status
    tasks: list[tuple[str, ...]]
    stream: list[str]
    opened: Opened | None
    detail: list[str] | None


class DetailScreen(Screen[None]):
    """One row opened: what the bus knows of it, refreshed with the rest; Escape goes back."""

    BINDINGS = [Binding("escape", "dismiss", "Back")]
    DEFAULT_CSS = """
    DetailScreen VerticalScroll { height: 1fr; }
    DetailScreen #detail { text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, opened: Opened) -> None:
        super().__init__()
        self.opened = opened

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(f"{self.opened.table[:-1]} {self.opened.key}: reading …", id="detail",
                         markup=False)
        yield Footer()

    def show_lines(self, lines: Sequence[str]) -> None:
        self.query_one("#detail", Static).update("\n".join(lines))


class TopApp(App[None]):
    """The live view of one bus file."""

    TITLE = "bus top"
    main: Screen[Any]  # the screen of the tables and the stream, set on mount
    CSS = """
    #summary { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }
    TabbedContent { height: 1fr; }
    TabbedContent > ContentSwitcher { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    DataTable { height: 1fr; }
    #stream { height: 1fr; border-top: solid $accent; overflow-x: hidden; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        *[Binding(key, f"show_table('{name}')", name, show=name in SHOWN_KEYS)
          for name, key in TABS.items()],
        Binding("s", "sort", "Sort"),
        Binding("r", "reverse", "Reverse"),
        Binding("enter", "open", "Details"),
    ]

    def __init__(self, path: str, durability: str = "normal") -> None:
        super().__init__()
        self.path = path
        self.durability = durability
        self.throughput = Throughput()
        self.blobs = BusBlobStore(Path(path).absolute().parent / "blobs")  # beside the file
        self.stream = MessageStream(self.blobs)
        self.stopping = threading.Event()
        self.failure: BusError | None = None  # why reading stopped, for run_top to raise
        self.shown: dict[str, list[tuple[str, ...]]] = {}
        self.cells: dict[str, list[tuple[str, ...]]] = {}
        self.order = {name: SortOrder() for name in TABS}
        self.opened: Opened | None = None  # read by the reader thread: set, never mutated

    def compose(self) -> ComposeResult:
        yield Static(id="summary", markup=False)
        with TabbedContent(initial="agents"):
            for name, columns in ((name, COLUMNS[name]) for name in TABS):
                with TabPane(name, id=name):
                    table: DataTable[str] = DataTable(id=f"{name}-table", cursor_type="row",
                                                      zebra_stripes=True)
                    table.add_columns(*columns)
                    yield table
        stream = RichLog(id="stream", max_lines=STREAM_LINES, wrap=False, markup=False,
                         auto_scroll=True)
        stream.border_title = "messages, newest last"
        yield stream
        yield Footer()

    def on_mount(self) -> None:
        self.main = self.screen  # the detail screen goes over it; the reader fills this one
        self.main.query_one("#agents-table", DataTable).focus()
        self.read_live()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The table keys act on the main screen only (not under a detail screen)."""
        if action in TABLE_ACTIONS and isinstance(self.screen, DetailScreen):
            return False
        return True

    async def action_quit(self) -> None:
        self.stopping.set()  # first: the reader hands nothing more to an app that is leaving
        await super().action_quit()

    # --- reading -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="live")
    def read_live(self) -> None:
        """Read after each commit (see bus/views/follow.py) until quit; when reading
        fails, record why and end the app (a screen frozen on an old status would look
        like a quiet bus)."""
        try:
            follow(self.path, self.read_snapshot, self._show_soon, self.stopping)
        except BusError as exc:  # follow names every failure as a BusError
            if not self.stopping.is_set():
                self.failure = exc
                self.call_from_thread(self.exit, return_code=1)

    def read_snapshot(self, conn: apsw.Connection) -> Snapshot:
        """The status, the new messages and the open row, in one read transaction."""
        opened = self.opened
        with translate_busy(conn), conn:
            status = status_of(conn, self.path, self.durability)
            task_rows = details.task_rows(conn, status)
            stream = self.stream.read_new(conn)
            detail = None if opened is None else detail_lines(conn, status, opened, self.blobs)
        return Snapshot(status, task_rows, stream, opened, detail)

    def _show_soon(self, snapshot: Snapshot) -> None:
        if not self.stopping.is_set():
            self.call_from_thread(self.show, snapshot)

    @work(thread=True, group="detail")
    def read_detail_now(self, opened: Opened) -> None:
        """Fill a detail screen just opened, without waiting for the next commit."""
        try:
            conn = connect(self.path, readonly=True)
            try:
                with translate_busy(conn), conn:
                    status = status_of(conn, self.path, self.durability)
                    lines = detail_lines(conn, status, opened, self.blobs)
            finally:
                conn.close()
        except Exception as exc:  # the live reader ends the view if the file is broken
            lines = [f"reading failed: {read_failure(exc, self.path)}"]
        if not self.stopping.is_set():
            self.call_from_thread(self.show_detail, opened, lines)

    # --- showing -------------------------------------------------------------------

    def show(self, snapshot: Snapshot) -> None:
        status = snapshot.status
        per_s = self.throughput.add(time.monotonic(), status.log.last_seq)
        self.main.query_one("#summary", Static).update(summary_lines(status, per_s))
        self.cells = table_cells(status) | {"tasks": snapshot.tasks}
        for name in self.cells:
            self.fill_table(name)
        stream = self.main.query_one("#stream", RichLog)
        if snapshot.stream:  # one write: each is a layout and a repaint
            stream.write("\n".join(snapshot.stream))
        if snapshot.opened is not None and snapshot.detail is not None:
            self.show_detail(snapshot.opened, snapshot.detail)

    def fill_table(self, name: str) -> None:
        """Put the table's rows in its sort order, keeping the selected row selected."""
        rows = self.order[name].apply(self.cells.get(name, []))
        if rows == self.shown.get(name):  # redrawing a table costs the writers CPU too
            return
        self.shown[name] = rows
        table = self.main.query_one(f"#{name}-table", DataTable)
        selected = self.selected_key(table)
        table.clear()
        keys = row_keys(rows)
        for row, key in zip(rows, keys):
            table.add_row(*row, key=key)
        if selected in keys:
            table.move_cursor(row=keys.index(selected), animate=False)

    @staticmethod
    def selected_key(table: DataTable[str]) -> str | None:
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def show_detail(self, opened: Opened, lines: Sequence[str]) -> None:
        screen = self.screen
        if isinstance(screen, DetailScreen) and screen.opened == opened:
            screen.show_lines(lines)

    # --- keys ----------------------------------------------------------------------

    def active_table(self) -> tuple[str, DataTable[str]]:
        name = self.main.query_one(TabbedContent).active
        return name, self.main.query_one(f"#{name}-table", DataTable)

    def action_show_table(self, name: str) -> None:
        self.main.query_one(TabbedContent).active = name
        self.main.query_one(f"#{name}-table", DataTable).focus()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.main.query_one(f"#{event.pane.id}-table", DataTable).focus()

    def action_sort(self) -> None:
        self.resort(lambda order, columns: order.next_column(columns))

    def action_reverse(self) -> None:
        self.resort(lambda order, _columns: order.reversed())

    def resort(self, change: Callable[[SortOrder, int], SortOrder]) -> None:
        name, table = self.active_table()
        columns = COLUMNS[name]
        self.order[name] = change(self.order[name], len(columns))
        table.clear(columns=True)
        table.add_columns(*self.order[name].labels(columns))
        self.shown.pop(name, None)
        self.fill_table(name)

    def action_open(self) -> None:
        name, table = self.active_table()
        key = self.selected_key(table)
        if key is None:
            return
        cells = tuple(str(cell) for cell in table.get_row(key))
        opened = self.opened = Opened(name, cells[0], cells)
        self.push_screen(DetailScreen(opened), callback=self.forget_opened)
        self.read_detail_now(opened)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def forget_opened(self, _result: object) -> None:
        self.opened = None


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
