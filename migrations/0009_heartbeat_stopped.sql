-- 0009_heartbeat_stopped: a heartbeat status for agents that finished cleanly.
-- `worker done/fail/cancel` leave a last beat with status 'stopped', so
-- `bus alive` can tell an agent that stopped from one that died (silence
-- alone cannot). SQLite cannot change a CHECK in place: the table is rebuilt
-- (https://www.sqlite.org/lang_altertable.html#otheralter).
CREATE TABLE heartbeats_new (
    agent_id TEXT PRIMARY KEY,
    ts_ms INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('idle', 'working', 'blocked', 'stopped')),
    current_task TEXT,
    progress REAL
);
INSERT INTO heartbeats_new (agent_id, ts_ms, status, current_task, progress)
    SELECT agent_id, ts_ms, status, current_task, progress FROM heartbeats;
DROP TABLE heartbeats;
ALTER TABLE heartbeats_new RENAME TO heartbeats;
