"""The status as text: the lines of `bus status`, and the tables `bus top` shows.

Plain strings, no terminal control: the CLI echoes them, the terminal view
puts the same rows in its tables.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from bus.log.messages import iso_utc
from bus.log.receipts import Receipt
from bus.views.status import ConsumerPosition
from bus.views.status import Status

CONSUMER_COLUMNS = ["consumer", "kind", "cursor", "pending", "lag", "last ack"]
AGENT_COLUMNS = ["agent", "state", "silent", "status", "task"]
CLAIM_COLUMNS = ["task", "holder", "fence", "lease left", "attempt"]
WORKER_COLUMNS = ["worker", "task", "state", "branch", "changed"]
RESERVATION_COLUMNS = ["pattern", "holder", "mode", "left", "reason"]
CHANNEL_COLUMNS = ["channel", "type", "state", "open", "awaiting ack", "dead letters"]
RECEIPT_COLUMNS = ["seq", "from", "to", "type", "sent", "state", "delivered"]


def status_lines(status: Status) -> list[str]:
    """One screen: a line per part, with a table under the parts that have rows."""
    f, log = status.file, status.log
    lines = [f"bus {f.path}  {schema(status)}  durability {f.durability}"
             f"  file {human_bytes(f.size_bytes)}  WAL {human_bytes(f.wal_bytes)}",
             f"log: {log.messages} messages, last seq {log.last_seq}, {_oldest(status)}"]
    lines += _section("consumers", str(len(status.consumers)) if status.consumers else
                      "none (no agent has acked, nothing exported)",
                      CONSUMER_COLUMNS, consumer_rows(status))
    lines += _section("agents", counts(status.agents_by_state) or "none has sent a heartbeat",
                      AGENT_COLUMNS, agent_rows(status))
    lines += _section("receipts", receipts_summary(status), RECEIPT_COLUMNS,
                      receipt_rows(status))
    lines += _section("claims", claims_summary(status), CLAIM_COLUMNS, claim_rows(status))
    lines.append(f"tasks: {tasks_summary(status)}")
    lines += _section("workers", counts(status.workers) or "none", WORKER_COLUMNS,
                      worker_rows(status))
    lines += _section("reservations", reservations_summary(status), RESERVATION_COLUMNS,
                      reservation_rows(status))
    lines += _section("channels", str(len(status.channels)) if status.channels else "none",
                      CHANNEL_COLUMNS, channel_rows(status))
    lines.append(f"pump: {pump_summary(status)}")
    lines.append(f"export: {export_summary(status)}")
    if status.replica is not None:
        lines.append(f"replica: {replica_summary(status)}")
    return lines


def replica_summary(status: Status) -> str:
    """`file:///backups/bus at txid 42, caught up` or `..., 3 transactions (1.2s) behind`."""
    r = status.replica
    assert r is not None
    if r.replica_txid is None:
        return f"{r.url} (position not read), Litestream took txid {r.local_txid}"
    if r.replica_txid == 0:
        return f"{r.url}, nothing replicated yet (is `bus replicate` running?)"
    if not r.lag_txns:
        return f"{r.url} at txid {r.replica_txid}, caught up (sync every {r.sync_interval})"
    return (f"{r.url} at txid {r.replica_txid}, {r.lag_txns} transactions"
            f" ({seconds(r.lag_ms / 1000)}) behind (sync every {r.sync_interval})")


def consumer_rows(status: Status) -> list[tuple[Any, ...]]:
    return [consumer_row(c) for c in status.consumers]


def consumer_row(c: ConsumerPosition) -> tuple[Any, ...]:
    return (c.agent, c.kind, c.cursor, c.pending, c.lag, last_ack(c))


def last_ack(c: ConsumerPosition) -> str:
    return "-" if c.last_ack_age_s is None else f"{seconds(c.last_ack_age_s)} ago"


def agent_rows(status: Status) -> list[tuple[Any, ...]]:
    return [(a.agent, a.state, seconds(a.age_s), a.status, a.task or "-") for a in status.agents]


def receipts_summary(status: Status) -> str:
    """`2 direct messages not delivered, 1 delivered and not acked (oldest first)`."""
    r = status.receipts
    if not r.not_delivered and not r.delivered_not_acked:
        return "every direct message acked"
    waiting = r.not_delivered + r.delivered_not_acked
    shown = f" (the oldest {len(r.oldest)})" if len(r.oldest) < waiting else ""
    return (f"{r.not_delivered} direct messages not delivered, {r.delivered_not_acked}"
            f" delivered and not acked{shown}")


def receipt_rows(status: Status) -> list[tuple[Any, ...]]:
    now = status.now_ms
    return [(f"#{r.seq}", r.from_agent, r.to_agent, r.type,
             f"{seconds((now - r.ts_ms) / 1000)} ago", r.state, delivery_cell(r, now))
            for r in status.receipts.oldest]


def delivery_cell(receipt: Receipt, now_ms: int) -> str:
    """`-`, or `mcp:poll 2x, last 4.2 s ago`: how the message was last shown, how often."""
    d = receipt.delivery
    if d is None:
        return "-"
    return f"{d.via} {d.deliveries}x, last {seconds((now_ms - d.last_ms) / 1000)} ago"


def claim_rows(status: Status) -> list[tuple[Any, ...]]:
    return [(c.task_id, c.agent, c.fence, seconds((c.lease_until_ms - status.now_ms) / 1000),
             f"{c.attempts}/{c.max_attempts}") for c in status.claims.claims]


def worker_rows(status: Status) -> list[tuple[Any, ...]]:
    return [(w.worker, w.task, w.state, w.branch,
             f"{seconds((status.now_ms - w.updated_ms) / 1000)} ago") for w in status.worker_list]


def reservation_rows(status: Status) -> list[tuple[Any, ...]]:
    return [(r.pattern, r.agent, r.mode, seconds((r.expires_at_ms - status.now_ms) / 1000),
             r.reason or "-") for r in status.reservations]


def reservations_summary(status: Status) -> str:
    """`3 live (2 exclusive)`, or `none`."""
    if not status.reservations:
        return "none"
    exclusive = sum(r.exclusive for r in status.reservations)
    return f"{len(status.reservations)} live ({exclusive} exclusive)"


def channel_rows(status: Status) -> list[tuple[Any, ...]]:
    return [(c.name, c.type, c.state, c.open_deliveries, c.awaiting_ack, c.dead_letters)
            for c in status.channels]


def claims_summary(status: Status) -> str:
    c = status.claims
    return (f"{c.held} held, {c.expiring_soon} expiring soon, {c.expired} expired,"
            f" {c.taken_over} taken over, {c.dead} dead")


def tasks_summary(status: Status) -> str:
    t = status.tasks
    return (f"{t.ready} ready, {t.blocked} blocked, {t.held} held, {t.done} done,"
            f" {t.cancelled} cancelled")


def pump_summary(status: Status) -> str:
    p = status.pump
    organisms = ", ".join(p.organisms) or "no organism booted"
    return f"{organisms}; units {p.queued} queued, {p.in_flight} in flight, {p.dead} dead"


def export_summary(status: Status) -> str:
    e = status.export
    if e.path is None and e.last_seq == 0:
        return "never run (bus export)"
    return f"last exported seq {e.last_seq}, lag {e.lag}, to {e.path}"


def counts(by_name: dict[str, int]) -> str:
    """`2 alive, 1 dead`; names with no count are left out."""
    return ", ".join(f"{n} {name}" for name, n in by_name.items() if n)


def table_lines(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip()
            for line in [list(columns), *rows]]


def seconds(value: float) -> str:
    """A duration for people: 4.2 s, 3 min, 2.5 h (negative: already past)."""
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 120:
        return f"{sign}{value:.1f} s"
    if value < 7200:
        return f"{sign}{value / 60:.0f} min"
    return f"{sign}{value / 3600:.1f} h"


def schema(status: Status) -> str:
    """`schema 11`, or `schema 10 (11 after bus migrate)` for a file a writer has not
    migrated yet (the views read it as it is when the change is not theirs to see)."""
    f = status.file
    if f.schema_version < f.schema_latest:
        return f"schema {f.schema_version} ({f.schema_latest} after bus migrate)"
    return f"schema {f.schema_version}"


def human_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value, units = size / 1024, ["KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def _oldest(status: Status) -> str:
    if status.log.oldest_seq is None:
        return "no message retained"
    return f"oldest retained seq {status.log.oldest_seq} ({iso_utc(status.log.oldest_ts_ms)})"


def _section(title: str, summary: str, columns: list[str],
             rows: list[tuple[Any, ...]]) -> list[str]:
    """`title: summary`, then the rows as a table indented under it."""
    cells = [[str(v) for v in row] for row in rows]
    table = table_lines(columns, cells) if cells else []
    return [f"{title}: {summary}"] + ["  " + line for line in table]
