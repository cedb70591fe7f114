"""JSONL export: every message once, in seq order, for `tail -f` and Spark.

One line per message, in a stable schema:
    {"seq", "id", "ts_ms", "ts" (ISO 8601 UTC), "from", "to", "type",
     "correlation_id", "in_reply_to", "payload_ref", "payload"}
`payload` is the message's JSON (null when the payload is in the blob store,
whose reference is `payload_ref`).

Exactly once across crashes, and the file only ever grows: lines are
written whole and fsynced, then export_state records (last_seq, bytes) in
one transaction. A crash in between leaves lines past the recorded end;
they are exactly what would be written again (messages never change), so
the next run keeps them and moves the state up to them. A last line cut off
mid-write is completed from its expected text, not truncated, so a reader
tailing the file never sees a record twice or a record that later changes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

import apsw
import orjson

from blobs.files import fsync_directory
from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.storage.file_errors import translate_os_errors

BATCH = 20_000  # messages per write + fsync + state update
FOLLOW_WAKE_S = 1.0  # a follow looks again at least this often, even without a wake
_STATE_SQL = "SELECT last_seq, path, part, bytes FROM export_state WHERE id = 1"
_SAVE_SQL = (
    "UPDATE export_state SET last_seq = ?, path = ?, part = ?, bytes = ?"
    " WHERE id = 1 AND last_seq = ? AND path IS ?"
)
_ROWS_SQL = (
    "SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to,"
    " payload, payload_ref FROM messages WHERE seq > ? ORDER BY seq LIMIT ?"
)
_SECOND_PREFIXES: dict[int, str] = {}  # epoch second -> "YYYY-MM-DDTHH:MM:SS."


class ExportError(BusError):
    """The export file or its recorded position cannot be used as it is."""


def export_path(conn: apsw.Connection, db_path: str | os.PathLike[str]) -> Path:
    """Where the JSONL export goes: the path it went to before, else bus.jsonl beside the
    bus file at `db_path`."""
    recorded = conn.execute("SELECT path FROM export_state WHERE id = 1").get
    return Path(recorded) if recorded else Path(db_path).absolute().parent / "bus.jsonl"


def format_line(row: tuple) -> bytes:
    """The JSONL line of a messages row (deterministic: the same row, the same bytes)."""
    seq, id_, ts_ms, from_agent, to_agent, type_, correlation_id, in_reply_to, text, ref = row
    second = ts_ms // 1000
    prefix = _SECOND_PREFIXES.get(second)
    if prefix is None:  # messages come in time order: one strftime per second
        if len(_SECOND_PREFIXES) > 4096:
            _SECOND_PREFIXES.clear()
        moment = datetime.fromtimestamp(second, tz=timezone.utc)
        prefix = _SECOND_PREFIXES[second] = moment.strftime("%Y-%m-%dT%H:%M:%S.")
    try:
        payload = None if text is None else orjson.loads(text)
    except orjson.JSONDecodeError:
        payload = {"undecodable_payload": text}  # written around the library: keep it visible
    return orjson.dumps({
        "seq": seq, "id": id_, "ts_ms": ts_ms, "ts": f"{prefix}{ts_ms % 1000:03d}Z",
        "from": from_agent, "to": to_agent, "type": type_, "correlation_id": correlation_id,
        "in_reply_to": in_reply_to, "payload_ref": ref, "payload": payload,
    }) + b"\n"


class JsonlExporter:
    """Appends new messages to a JSONL file, or to date partitions of a directory.

        with JsonlExporter(conn, path) as exporter:
            exporter.export()          # everything new; returns the count

    With `partition_by="date"`, `path` is a directory of
    `date=YYYY-MM-DD/part-<first seq>.jsonl` files (Spark's partition
    layout); a part is named by its first message, so after a crash the next
    part is found and checked like the tail of the current one. An exclusive
    lock (flock) keeps a second exporter out while this one is open.
    """

    def __init__(self, conn: apsw.Connection, path: str | os.PathLike[str],
                 partition_by: str | None = None) -> None:
        if partition_by not in (None, "date"):
            raise ValidationFailed("partition_by", f"{partition_by!r} is not one of: date")
        self.conn = conn
        self.path = Path(path).absolute()
        self.partitioned = partition_by == "date"
        self._lock_fd = -1
        self._part: str | None = None  # relative name of the file being appended to
        self._fd = -1

    def __enter__(self) -> JsonlExporter:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Lock the export, check it against the recorded position, repair a torn tail."""
        _seq, recorded_path, part, _bytes = self._state()
        if recorded_path is not None and recorded_path != str(self.path):
            raise ExportError(f"this bus exports to {recorded_path}; use that"
                              f" {'directory' if part else 'file'} or move it there")
        if self.partitioned and self.path.is_file():
            raise ExportError(f"{self.path} is a file; a partitioned export needs a directory")
        if not self.partitioned and self.path.is_dir():
            raise ExportError(f"{self.path} is a directory; export into it with"
                              " --partition-by date, or name a file")
        lock_path = self.path / ".export.lock" if self.partitioned else self.path
        created = not lock_path.exists()
        with translate_os_errors(lock_path):
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if created:  # for a single file the lock is the export itself: its name must last
                fsync_directory(lock_path.parent)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise ExportError(f"another exporter is writing {self.path}; stop it first") from None
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._switch(None)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1

    def export(self, batch: int = BATCH) -> int:
        """Append every message not exported yet; return how many."""
        return sum(self.export_batches(batch))

    def export_batches(self, batch: int = BATCH) -> Iterator[int]:
        """Export batch by batch, yielding each batch's size once it is recorded."""
        while True:
            last_seq, _path, _part, written = self._state()
            rows = self.conn.execute(_ROWS_SQL, (last_seq, batch)).fetchall()
            if not rows:
                return
            for part, lines in self._by_part(rows):
                if part != self._part:
                    self._switch(part)
                    written = 0
                data = b"".join(lines)
                self._append(written, data)
                written += len(data)
            self._save(last_seq, rows[-1][0], written)
            yield len(rows)

    def follow(self, wait_for_change: Callable[[float], object],
               wake_s: float = FOLLOW_WAKE_S) -> None:
        """Export as messages arrive until Ctrl-C (SIGINT), then return.

        `wait_for_change(seconds)` blocks until the bus file changes or the
        seconds pass (`Bus.wait_for_change`). The lines of a batch are on disk
        before its state commits: stopping in between is safe (the next run
        completes the state) but leaves the export behind its file, so a
        SIGINT during a batch only asks the loop to stop once the batch is
        recorded; one while waiting stops at once. Off the main thread, where
        no SIGINT arrives, it follows until the process ends.
        """
        exporting = False
        stop = False

        def on_sigint(signum: int, frame: Any) -> None:
            nonlocal stop
            if not exporting:
                raise KeyboardInterrupt
            stop = True

        previous = _set_sigint_handler(on_sigint)
        try:
            while not stop:
                wait_for_change(wake_s)
                exporting = True
                self.export()
                exporting = False
        except KeyboardInterrupt:
            return
        finally:
            _set_sigint_handler(previous)

    def pending(self) -> int:
        """Messages not exported yet."""
        return self.conn.execute("SELECT count(*) FROM messages WHERE seq > ?",
                                 (self._state()[0],)).get

    # --- where lines go -----------------------------------------------------

    def _by_part(self, rows: list[tuple]) -> Iterator[tuple[str, list[bytes]]]:
        """Consecutive runs of rows that go to the same file, with their lines."""
        part, lines = self._part, []
        for row in rows:
            line = format_line(row)
            target = self._part_for(row[0], line, part)
            if target != part and lines:
                yield part, lines
                lines = []
            part = target
            lines.append(line)
        if lines:
            yield part, lines

    def _part_for(self, seq: int, line: bytes, current: str | None) -> str:
        if not self.partitioned:
            return ""
        date = _line_date(line)
        if current is not None and current.startswith(f"date={date}/"):
            return current
        return f"date={date}/part-{seq:012d}.jsonl"

    def _switch(self, part: str | None) -> None:
        """Make `part` the file being appended to (None: close it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._part = part
        if part is None:
            return
        file = self.path / part if part else self.path
        created = not file.exists()
        with translate_os_errors(file):
            file.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if created:
                fsync_directory(file.parent)  # the new name must survive a crash too

    # --- recovery -----------------------------------------------------------

    def _recover(self) -> None:
        last_seq, recorded_path, part, recorded = self._state()
        if recorded_path is None:
            self._start_fresh(last_seq)
            return
        if (part is not None) != self.partitioned and (part or recorded):
            raise ExportError(f"{self.path} was exported {'with' if part else 'without'}"
                              " --partition-by date; export it the same way")
        seq, end = last_seq, recorded
        if part is not None or not self.partitioned:
            self._switch(part if self.partitioned else "")
            seq, end = self._adopt(seq, recorded)
        while self.partitioned:  # parts a crashed run created after the recorded one
            expected = self._expected_line(seq)
            if expected is None:
                break
            following = self._part_for(orjson.loads(expected)["seq"], expected, self._part)
            if following == self._part or not (self.path / following).exists():
                break
            self._switch(following)
            seq, end = self._adopt(seq, 0)
        self._save(last_seq, seq, end)

    def _start_fresh(self, last_seq: int) -> None:
        if self.partitioned:
            leftovers = [p for p in self.path.iterdir() if p.name != ".export.lock"]
            if leftovers:
                raise ExportError(f"{self.path} already holds files this bus did not write;"
                                  " export to a new directory")
        else:
            self._switch("")
            if os.fstat(self._fd).st_size:
                raise ExportError(f"{self.path} already holds data this bus did not write;"
                                  " export to a new file")
        self._save(last_seq, last_seq, 0, old_path=None)

    def _adopt(self, seq: int, recorded: int) -> tuple[int, int]:
        """Keep whole lines written after `recorded` bytes; finish a torn last line."""
        size = os.fstat(self._fd).st_size
        if size < recorded:
            raise ExportError(f"{self._file_name()} has {size} bytes but {recorded} were"
                              " exported to it; it was truncated or replaced. Restore it")
        tail = os.pread(self._fd, size - recorded, recorded)
        end = recorded
        for line in _complete_lines(tail):
            seq = self._check_line(line, seq)
            end += len(line)
        torn = tail[end - recorded:]
        if torn:
            expected = self._expected_line(seq)
            if expected is None or not expected.startswith(torn):
                raise ExportError(f"{self._file_name()} ends in {len(torn)} bytes that are not"
                                  f" part of the next record; it was changed by hand")
            self._append(size, expected[len(torn):])
            end += len(expected)
            seq = orjson.loads(expected)["seq"]
        return seq, end

    def _check_line(self, line: bytes, previous: int) -> int:
        try:
            seq = orjson.loads(line)["seq"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ExportError(f"{self._file_name()} has a line after the exported part that"
                              " is not an export record; it was changed by hand") from None
        if not isinstance(seq, int) or seq <= previous or self._expected_line(previous) != line:
            raise ExportError(f"{self._file_name()} has a record (seq {seq}) that does not match"
                              " the bus; it was changed by hand or belongs to another bus")
        return seq

    def _expected_line(self, after: int) -> bytes | None:
        row = self.conn.execute(_ROWS_SQL, (after, 1)).fetchone()
        return format_line(row) if row else None

    def _file_name(self) -> Path:
        return self.path / self._part if self._part else self.path

    # --- state and file -----------------------------------------------------

    def _state(self) -> tuple[int, str | None, str | None, int]:
        return self.conn.execute(_STATE_SQL).fetchone()

    def _save(self, old_seq: int, new_seq: int, size: int, old_path: str | None = "") -> None:
        """Record the new position if nobody else moved it (seq and path both checked)."""
        part = self._part if self.partitioned else None
        expected_path = str(self.path) if old_path == "" else old_path
        with write_transaction(self.conn):
            self.conn.execute(_SAVE_SQL, (new_seq, str(self.path), part, size, old_seq,
                                          expected_path))
            if self.conn.changes() != 1:
                raise ExportError("the export position moved under this exporter;"
                                  " only one exporter may run per bus")

    def _append(self, offset: int, data: bytes) -> None:
        """Write `data` at `offset` completely, then fsync: the state follows the disk.

        A write that fails (a full disk: DiskFull) is cut back to `offset`, so
        no torn line stays behind.
        """
        view, start = memoryview(data), offset
        with translate_os_errors(self._file_name()):
            try:
                while view:
                    written = os.pwrite(self._fd, view, offset)
                    view, offset = view[written:], offset + written
                os.fsync(self._fd)
            except OSError:
                os.ftruncate(self._fd, start)
                raise


def _set_sigint_handler(handler: Any) -> Any:
    """Install `handler` for SIGINT on the main thread; the one it replaces (None elsewhere,
    where Python allows no handler and no SIGINT arrives)."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)


def _line_date(line: bytes) -> str:
    """The UTC date of an export line, from its "ts" field."""
    at = line.index(b'"ts":"') + 6
    return line[at:at + 10].decode()


def _complete_lines(data: bytes) -> Iterator[bytes]:
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        yield data[start:end + 1]
        start = end + 1
