"""What a person can query with `bus sql`: every table, what it is for, its schema."""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from bus.storage.errors import ValidationFailed

# One line per table, in the words a person querying it needs. A table that
# is missing here is listed with NO_PURPOSE (and a test fails).
PURPOSES = {
    "messages": "the log: one row per message (seq, id, ts_ms, from_agent, to_agent, type,"
                " correlation_id, in_reply_to, payload JSON or payload_ref to a blob)",
    "cursors": "each consumer's last acknowledged seq (moves forward only, on ack)",
    "receipts": "delivery receipts of direct messages: when and how often each was shown to"
                " its recipient, last via what and in which session (acked: the cursor)",
    "heartbeats": "each agent's last beat: time, status (idle/working/blocked), task, progress",
    "task_claims": "leases on tasks: holder, fence, lease end, attempts and their limit",
    "task_fences": "the highest fence handed out per task (kept after release, never reused)",
    "tasks": "the task graph: title, priority, state, dependencies not yet done",
    "task_dependencies": "the task graph's edges: which task waits on which",
    "file_reservations": "files agents reserved by glob: holder, exclusive or shared, expiry,"
                         " reason (`bus reservations` shows the live ones)",
    "tokens": "bearer tokens of `bus serve --mcp`: agent, the secret's SHA-256 only, expiry,"
              " last use, read-only",
    "dead_claims": "tasks that ran out of claim attempts, with their last holder",
    "workers": "the worker lifecycle: state, branch, worktree, commits (see `worker status`)",
    "meta": "key/value facts about the file (schema_version)",
    "export_state": "where the JSONL export stands: last exported seq, path, part, bytes",
    "channels": "channels (direct, group, broadcast, pubsub) with their delivery settings",
    "participants": "who is in each channel, with role (owner, member, observer)",
    "subscriptions": "pubsub topic patterns per agent and channel",
    "channel_messages": "the channel side of a message: channel, topic, priority, status",
    "deliveries": "one row per message and recipient: status, attempts, ack deadline",
    "dead_letters": "deliveries that ran out of retries, with the last error (`bus dlq`)",
    "dedup": "exactly-once dedup keys (correlation id and recipient) until they expire",
    "threads": "the pump's call chains: opaque thread UUIDs, parent, listener, open/closed",
    "oob_nonces": "nonces of signed out-of-band requests, kept to refuse replays",
    "pump_organisms": "organisms the pump has booted, with their boot message",
    "pump_inbox": "envelopes waiting to be routed by the pump",
    "pump_work": "the pump's work units: listener, thread, lease, attempts, outcome",
    "sqlite_sequence": "SQLite's own AUTOINCREMENT counters; unused since migration 8",
}
NO_PURPOSE = "(no description)"
_TABLES_SQL = ("SELECT name FROM sqlite_schema WHERE type = 'table'"
               " AND name NOT LIKE 'sqlite_stat%' ORDER BY name")
_SCHEMA_SQL = ("SELECT sql FROM sqlite_schema WHERE tbl_name = ? AND sql IS NOT NULL"
               " ORDER BY type = 'index', name")


@dataclass(frozen=True)
class Table:
    name: str
    purpose: str

    def to_json_dict(self) -> dict[str, str]:
        return {"name": self.name, "purpose": self.purpose}


def list_tables(conn: apsw.Connection) -> list[Table]:
    return [Table(name, PURPOSES.get(name, NO_PURPOSE)) for (name,) in conn.execute(_TABLES_SQL)]


def table_schema(conn: apsw.Connection, name: str) -> list[str]:
    """The CREATE statements of a table and its indexes; ValidationFailed for an unknown one."""
    statements = [sql for (sql,) in conn.execute(_SCHEMA_SQL, (name,))]
    if not statements:
        known = ", ".join(t.name for t in list_tables(conn))
        raise ValidationFailed("table", f"no table {name!r}; the tables are: {known}")
    return statements
