-- 0001_core: the message log, per-consumer cursors, heartbeats, task claims,
-- metadata and export position (seed 003, "Database Schema").
-- Times are epoch milliseconds.

-- AUTOINCREMENT: a seq is never reused, even after old rows are deleted, so
-- a cursor (last acked seq) can never skip a message that arrives later.
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,           -- UUID: a retried publish is a no-op
    ts_ms INTEGER NOT NULL,
    from_agent TEXT NOT NULL,
    to_agent TEXT,                     -- NULL = broadcast
    type TEXT NOT NULL,
    correlation_id TEXT,
    in_reply_to TEXT,
    payload TEXT,                      -- JSON text, or NULL
    payload_ref TEXT,                  -- blob reference for large payloads
    CHECK (payload IS NULL OR payload_ref IS NULL)
);

-- poll: one range scan per branch (to_agent = ?, to_agent IS NULL), merged by seq.
CREATE INDEX idx_messages_to_seq ON messages(to_agent, seq);
-- Most messages carry no correlation id; a partial index keeps publish lean.
CREATE INDEX idx_messages_correlation_seq ON messages(correlation_id, seq)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX idx_messages_type_from_ts ON messages(type, from_agent, ts_ms);

-- The cursor moves only on ack, never on poll: at-least-once delivery.
CREATE TABLE cursors (
    agent_id TEXT PRIMARY KEY,
    last_acked_seq INTEGER NOT NULL DEFAULT 0,
    updated_at_ms INTEGER NOT NULL
);

-- One row per agent, upserted; kept out of messages so beats do not bloat the log.
CREATE TABLE heartbeats (
    agent_id TEXT PRIMARY KEY,
    ts_ms INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('idle', 'working', 'blocked')),
    current_task TEXT,
    progress REAL
);

CREATE TABLE task_claims (
    task_id TEXT PRIMARY KEY,
    claimed_by TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL
);

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('schema_version', '1');

-- The export resumes from last_seq, never from a count of exported lines.
CREATE TABLE export_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    last_seq INTEGER NOT NULL DEFAULT 0
);
INSERT INTO export_state (id, last_seq) VALUES (1, 0);
