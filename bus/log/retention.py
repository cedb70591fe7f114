"""Retention: delete old messages every consumer has acknowledged, gc blobs, shrink the WAL.

A message may go only when it is older than the retention period AND at or
below every cursor, so nothing any consumer still has to handle is lost. The
newest message always stays: it is what keeps seq increasing.
Once the exporter has exported anything, its position counts as one more
cursor, so history reaches the JSONL export before it leaves the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

import apsw

if TYPE_CHECKING:
    from blobs.store import BlobStore

from bus.storage.db import write_transaction
from bus.log.messages import referenced_blobs

DELETE_BATCH = 5000  # rows per write transaction, so other writers get their turn
# The newest message is never deleted: seq is max(seq) + 1 (no AUTOINCREMENT,
# migrations/0008_lean_messages.sql), so it must never go down. min() of a NULL
# (no cursor yet, or no message) is NULL: then nothing is deleted.
_MIN_CURSOR_SQL = (
    "SELECT min((SELECT min(seq) FROM (SELECT last_acked_seq AS seq FROM cursors"
    " UNION ALL SELECT last_seq FROM export_state WHERE last_seq > 0)),"
    " (SELECT max(seq) FROM messages) - 1)"
)
_CHECKPOINT_SQL = "PRAGMA wal_checkpoint(TRUNCATE)"
# Litestream reads the WAL behind the application's back and must see every
# frame before it is gone: a bus it replicates checkpoints PASSIVE only, and
# leaves truncating the WAL to Litestream (https://litestream.io/tips/).
_PASSIVE_CHECKPOINT_SQL = "PRAGMA wal_checkpoint(PASSIVE)"
# A channel message stays while a delivery of it is unfinished or a dead
# letter: the channel tables cascade from `messages`, so deleting it would
# drop work nobody has acknowledged.
_KEPT_FOR_CHANNELS = (
    " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.seq = messages.seq"
    " AND (d.status = 'pending' OR d.deadline_ms IS NOT NULL))"
    " AND NOT EXISTS (SELECT 1 FROM dead_letters dl WHERE dl.seq = messages.seq)"
)
_CANDIDATES_SQL = (
    "SELECT count(*) FROM messages WHERE seq <= ? AND ts_ms < ?" + _KEPT_FOR_CHANNELS
)
_DELETE_BATCH_SQL = (
    "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages WHERE seq <= ? AND ts_ms < ?"
    + _KEPT_FOR_CHANNELS + " ORDER BY seq LIMIT ?)"
)


@dataclass
class CompactReport:
    """What compact removed (or, with dry_run, would remove)."""

    dry_run: bool
    cutoff_ms: int
    acked_through: int  # the lowest cursor: nothing above it is touched
    messages: int = 0
    blobs: list[str] = field(default_factory=list)
    wal_bytes_before: int = 0
    wal_bytes_after: int = 0
    checkpoint: str = "truncate"  # "passive" on a bus Litestream replicates

    def to_json_dict(self) -> dict[str, object]:
        return {"dry_run": self.dry_run, "cutoff_ms": self.cutoff_ms,
                "acked_through": self.acked_through, "messages": self.messages,
                "blobs": len(self.blobs), "wal_bytes_before": self.wal_bytes_before,
                "wal_bytes_after": self.wal_bytes_after, "checkpoint": self.checkpoint}


def acked_through(conn: apsw.Connection) -> int:
    """The highest seq compaction may delete: every cursor (and the exporter, once used)
    has passed it, and it is below the newest message; 0 if none."""
    return conn.execute(_MIN_CURSOR_SQL).get or 0


def compact(conn: apsw.Connection, blobs: BlobStore, cutoff_ms: int, grace_seconds: float,
            dry_run: bool = False) -> CompactReport:
    """Delete acknowledged messages older than `cutoff_ms`, orphaned blobs, and checkpoint."""
    report = CompactReport(dry_run, cutoff_ms, acked_through(conn))
    if dry_run:
        report.messages = conn.execute(_CANDIDATES_SQL, (report.acked_through, cutoff_ms)).get
        return report
    report.messages = _delete_in_batches(conn, report.acked_through, cutoff_ms)
    report.blobs = blobs.gc(referenced_blobs(conn), grace_seconds)
    report.checkpoint = "passive" if replicated_by_litestream(conn.filename) else "truncate"
    report.wal_bytes_before, report.wal_bytes_after = checkpoint(conn, report.checkpoint)
    return report


def _delete_in_batches(conn: apsw.Connection, through_seq: int, cutoff_ms: int) -> int:
    deleted = 0
    while True:
        with write_transaction(conn):
            conn.execute(_DELETE_BATCH_SQL, (through_seq, cutoff_ms, DELETE_BATCH))
            batch = conn.changes()
        deleted += batch
        if batch < DELETE_BATCH:
            return deleted


def checkpoint(conn: apsw.Connection, mode: str = "truncate") -> tuple[int, int]:
    """Copy the WAL into the database and truncate it; return its size before and after.

    TRUNCATE waits (busy timeout) for readers to finish; if some still hold
    old snapshots it does what it can and the WAL is truncated next time.
    `mode="passive"` (a replicated bus) copies what it can and truncates nothing.
    Run as a PRAGMA (a statement step) so apsw lets other threads run meanwhile.
    """
    wal = Path(conn.filename + "-wal")
    before = _size(wal)
    conn.execute(_PASSIVE_CHECKPOINT_SQL if mode == "passive" else _CHECKPOINT_SQL).fetchall()
    return before, _size(wal)


def replicated_by_litestream(path: str) -> bool:
    """Whether Litestream replicates the file at `path`: its `.<name>-litestream`
    directory is beside it (Litestream makes it on start; https://litestream.io/tips/)."""
    db = Path(path)
    return (db.parent / f".{db.name}-litestream").is_dir()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
