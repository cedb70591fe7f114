-- 0013_file_reservations: agents reserve files of the repository by glob.
-- readers: unchanged (a new table; the read-only views read a file without it as one
-- where nobody reserved anything, so `bus status` after an upgrade needs no migrate)
-- A reservation is live until its TTL runs out, its holder's heartbeat turns
-- dead, or its holder's worker reaches COMPLETED, CANCELLED or FAILED; the bus
-- judges that when it reads (bus/coordination/reservations.py), so no process has to sweep.
-- Writes delete the ended ones they see, and a beat after death ends the
-- agent's reservations for good (an agent silent past `dead` lost them).
CREATE TABLE file_reservations (
    id INTEGER PRIMARY KEY,
    agent_id TEXT NOT NULL,
    pattern TEXT NOT NULL,          -- gitignore-style, relative to the repository root
    mode TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
    reason TEXT,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    UNIQUE (agent_id, pattern)
);
CREATE INDEX idx_file_reservations_expiry ON file_reservations (expires_at_ms);
