-- 0006_threads: the thread registry of the message pump (seeds 001 and 002)
-- and the nonces of the pump's out-of-band control channel (seed 000).
-- Times are epoch milliseconds.

-- A call chain is a path of rows linked by parent id: the root row names the
-- organism, each child the listener the conversation went to. Chains are not
-- stored as dotted strings because listener names may contain '.'
-- ("calc.add"). Every extension is a new row with a new random UUID, so two
-- conversations on the same path never share a thread (and never steal each
-- other's replies). Closed rows are kept for history.
CREATE TABLE threads (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,          -- what handlers and envelopes see
    parent_id INTEGER REFERENCES threads(id),
    name TEXT NOT NULL,                 -- organism (root) or listener name
    depth INTEGER NOT NULL,             -- 0 for a root
    status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    created_at_ms INTEGER NOT NULL,
    closed_at_ms INTEGER,
    CHECK ((parent_id IS NULL) = (depth = 0)),
    CHECK ((status = 'closed') = (closed_at_ms IS NOT NULL))
);
CREATE INDEX idx_threads_parent ON threads(parent_id, name);
-- One open root per organism: a restarted pump finds its root instead of
-- making a second one, even when two processes start at once.
CREATE UNIQUE INDEX idx_threads_open_root ON threads(name)
    WHERE parent_id IS NULL AND status = 'open';

-- Nonces of accepted out-of-band requests: a replayed request is refused,
-- across restarts too. Rows older than the replay horizon are pruned (a
-- request that old is refused as stale anyway).
CREATE TABLE oob_nonces (
    nonce TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    ts_ms INTEGER NOT NULL,             -- the request's own timestamp
    seen_at_ms INTEGER NOT NULL
);
CREATE INDEX idx_oob_nonces_ts ON oob_nonces(ts_ms);
