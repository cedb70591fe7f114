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
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Iterator

import apsw
import orjson

from bus.db import write_transaction
from bus.errors import BusError

BATCH = 20_000  # messages per write + fsync + state update
_STATE_SQL = "SELECT last_seq, path, bytes FROM export_state WHERE id = 1"
_SAVE_SQL = (
    "UPDATE export_state SET last_seq = ?, path = ?, bytes = ? WHERE id = 1 AND last_seq = ?"
)
_ROWS_SQL = (
    "SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to,"
    " payload, payload_ref FROM messages WHERE seq > ? ORDER BY seq LIMIT ?"
)
_SECOND_PREFIXES: dict[int, str] = {}  # epoch second -> "YYYY-MM-DDTHH:MM:SS."


class ExportError(BusError):
    """The export file or its recorded position cannot be used as it is."""


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
    """Appends new messages to one JSONL file; holds an exclusive lock on it while open.

        with JsonlExporter(conn, path) as exporter:
            exporter.export()          # everything new; returns the count
    """

    def __init__(self, conn: apsw.Connection, path: str | os.PathLike[str]) -> None:
        self.conn = conn
        self.path = Path(path).absolute()
        self._fd = -1

    def __enter__(self) -> JsonlExporter:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Lock the file, check it against the recorded position, repair a torn tail."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise ExportError(f"another exporter is writing {self.path}; stop it first") from None
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1

    def export(self, batch: int = BATCH) -> int:
        """Append every message not exported yet; return how many."""
        return sum(self.export_batches(batch))

    def export_batches(self, batch: int = BATCH) -> Iterator[int]:
        """Export batch by batch, yielding each batch's size once it is recorded."""
        while True:
            last_seq, _path, written = self._state()
            rows = self.conn.execute(_ROWS_SQL, (last_seq, batch)).fetchall()
            if not rows:
                return
            data = b"".join(format_line(row) for row in rows)
            self._append(written, data)
            self._save(last_seq, rows[-1][0], written + len(data))
            yield len(rows)

    def pending(self) -> int:
        """Messages not exported yet."""
        return self.conn.execute("SELECT count(*) FROM messages WHERE seq > ?",
                                 (self._state()[0],)).get

    # --- recovery -----------------------------------------------------------

    def _recover(self) -> None:
        last_seq, recorded_path, recorded = self._state()
        size = os.fstat(self._fd).st_size
        if recorded_path is None:
            if size:
                raise ExportError(f"{self.path} already holds data this bus did not write;"
                                  " export to a new file")
            self._save(last_seq, last_seq, 0)
            return
        if recorded_path != str(self.path):
            raise ExportError(f"this bus exports to {recorded_path}; use that file"
                              " (bus export --out) or move it there")
        if size < recorded:
            raise ExportError(f"{self.path} has {size} bytes but {recorded} were exported to it;"
                              " it was truncated or replaced. Move it away and restore it")
        if size > recorded:
            self._adopt_tail(last_seq, recorded, size)

    def _adopt_tail(self, last_seq: int, recorded: int, size: int) -> None:
        """Keep whole lines written after the last recorded export; finish a torn one."""
        tail = os.pread(self._fd, size - recorded, recorded)
        end, seq = recorded, last_seq
        for line in _complete_lines(tail):
            seq = self._check_line(line, seq)
            end += len(line)
        torn = tail[end - recorded:]
        if torn:
            expected = self._expected_line(seq)
            if expected is None or not expected.startswith(torn):
                raise ExportError(f"{self.path} ends in {len(torn)} bytes that are not part of"
                                  f" message {seq + 1}'s line; it was changed by hand")
            self._append(size, expected[len(torn):])
            end += len(expected)
            seq = orjson.loads(expected)["seq"]
        self._save(last_seq, seq, end)

    def _check_line(self, line: bytes, previous: int) -> int:
        try:
            seq = orjson.loads(line)["seq"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ExportError(f"{self.path} has a line after the exported part that is not"
                              " an export record; it was changed by hand") from None
        if not isinstance(seq, int) or seq <= previous or self._expected_line(previous) != line:
            raise ExportError(f"{self.path} has a record (seq {seq}) that does not match the"
                              " bus; it was changed by hand or belongs to another bus")
        return seq

    def _expected_line(self, after: int) -> bytes | None:
        row = self.conn.execute(_ROWS_SQL, (after, 1)).fetchone()
        return format_line(row) if row else None

    # --- state and file -----------------------------------------------------

    def _state(self) -> tuple[int, str | None, int]:
        return self.conn.execute(_STATE_SQL).fetchone()

    def _save(self, old_seq: int, new_seq: int, size: int) -> None:
        with write_transaction(self.conn):
            self.conn.execute(_SAVE_SQL, (new_seq, str(self.path), size, old_seq))
            if self.conn.changes() != 1:
                raise ExportError("the export position moved under this exporter;"
                                  " only one exporter may run per bus")

    def _append(self, offset: int, data: bytes) -> None:
        """Write `data` at `offset` completely, then fsync: the state follows the disk."""
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written
        os.fsync(self._fd)


def _complete_lines(data: bytes) -> Iterator[bytes]:
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        yield data[start:end + 1]
        start = end + 1
