-- 0016_receipts: delivery receipts of direct messages (bus/log/receipts.py).
-- readers: unchanged (a new table; the read-only views read a file without it as one
-- where no delivery was recorded, so `bus status` after an upgrade needs no migrate)
-- A direct message (to_agent set) was delivered when the recipient's session was shown
-- it: a hook's output, an MCP poll/exchange/reply result, `bus inbox`, `bus poll`. One
-- row per message, written the first time and updated on each delivery after it (at
-- least once: a message not acknowledged is shown again). Whether it was acknowledged
-- is not stored here: the recipient's cursor at or past its seq says so.
-- The row goes with its message (retention deletes acknowledged messages).
CREATE TABLE receipts (
    seq INTEGER PRIMARY KEY REFERENCES messages (seq) ON DELETE CASCADE,
    agent TEXT NOT NULL,             -- the recipient shown it (the message's to_agent)
    first_ms INTEGER NOT NULL,       -- the first delivery
    last_ms INTEGER NOT NULL,        -- the latest one
    deliveries INTEGER NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    via TEXT NOT NULL,               -- what showed it first: hook:Stop, mcp:poll, inbox, poll
    session TEXT                     -- the recipient's session, where its client names one
);
-- "has this agent ever been shown a message" (bus/coordination/held_names.py, a recipient the bus knows)
CREATE INDEX idx_receipts_agent ON receipts (agent);
