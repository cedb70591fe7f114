-- 0007_pump: the durable message pump (seed 000) on the bus.
-- Every envelope is a `messages` row (type 'envelope', to_agent '@<organism>',
-- correlation_id = its thread UUID). These tables say what is still to do
-- with them. Times are epoch milliseconds.

-- One row per organism that has booted: <boot/> goes out once, when this row
-- is inserted; a restarted pump finds it and resumes instead.
CREATE TABLE pump_organisms (
    name TEXT PRIMARY KEY,
    booted_at_ms INTEGER NOT NULL,
    boot_id TEXT NOT NULL              -- messages.id of the <boot/> envelope
);

-- Client envelopes waiting for the running pump to route them: the pump's
-- routing table (changed by OOB commands) decides, not the client's copy of
-- organism.yaml. A row is deleted in the transaction that routes it.
CREATE TABLE pump_inbox (
    seq INTEGER PRIMARY KEY,           -- messages.seq of the envelope
    organism TEXT NOT NULL,
    root_tag TEXT NOT NULL,
    to_listener TEXT,                  -- NULL: every listener of the root tag
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX idx_pump_inbox_organism ON pump_inbox(organism, seq);

-- A work unit: one (input envelope, listener) pair, inserted in the same
-- transaction as the envelope it routes, so routing is durable and a
-- restarted pump resumes. A pump claims a unit with a lease (owner, until,
-- one more attempt) and finishes it in ONE transaction that also inserts its
-- replies; a unit whose lease expired `max_attempts` times is dead.
-- No foreign key to messages: compaction may delete old envelopes.
CREATE TABLE pump_work (
    id INTEGER PRIMARY KEY,
    organism TEXT NOT NULL,
    input_seq INTEGER NOT NULL,
    listener TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('call', 'answer')),
    thread TEXT NOT NULL,              -- the thread UUID the handler sees
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'dead')),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_owner TEXT,
    lease_until_ms INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER,
    outcome TEXT,                      -- replied, huh, dead, listener-removed
    UNIQUE (input_seq, listener)
);
-- Claims look at pending units only; finished ones are history.
CREATE INDEX idx_pump_work_pending ON pump_work(organism, listener, id)
    WHERE status = 'pending';
-- Expired leases (lease_until_ms from 1 to now: 0 means never claimed) and the
-- next lease to expire, without reading the backlog of unclaimed units.
CREATE INDEX idx_pump_work_lease ON pump_work(organism, lease_until_ms)
    WHERE status = 'pending';
