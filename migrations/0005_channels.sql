-- 0005_channels: the message engine (seed 004): channels, their participants
-- and pub/sub subscriptions, one delivery row per (message, recipient),
-- dead letters and the exactly-once dedup set.
--
-- A channel message is an ordinary `messages` row (so `bus tail`, the export
-- and Spark see it) addressed to '#<channel>': agent ids cannot contain '#',
-- so `poll` never returns it. Its channel fields live in `channel_messages`.
-- Times are epoch milliseconds.

CREATE TABLE channels (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL CHECK (type IN ('direct', 'group', 'broadcast', 'pubsub')),
    owner TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'paused', 'draining', 'closed')),
    created_at_ms INTEGER NOT NULL,
    max_message_size INTEGER NOT NULL CHECK (max_message_size > 0),
    delivery_mode TEXT NOT NULL
        CHECK (delivery_mode IN ('at_most_once', 'at_least_once', 'exactly_once')),
    ack_timeout_ms INTEGER NOT NULL CHECK (ack_timeout_ms > 0),
    max_retries INTEGER NOT NULL CHECK (max_retries >= 0),
    retry_backoff_ms INTEGER NOT NULL CHECK (retry_backoff_ms >= 0),
    max_pending INTEGER CHECK (max_pending IS NULL OR max_pending > 0),  -- NULL: unlimited
    echo INTEGER NOT NULL DEFAULT 0 CHECK (echo IN (0, 1)),
    priority_ordering INTEGER NOT NULL DEFAULT 0 CHECK (priority_ordering IN (0, 1)),
    -- Deliveries not yet finished (pending or handed out and unacknowledged):
    -- kept here so the store limit is one sum, not a count over deliveries.
    open_deliveries INTEGER NOT NULL DEFAULT 0,
    -- Bumped by every (un)subscribe: a process caches a channel's topic
    -- index and rebuilds it only when this changes.
    subscriptions_version INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE participants (
    channel_id INTEGER NOT NULL REFERENCES channels (id),
    agent TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('owner', 'member', 'observer')),
    joined_at_ms INTEGER NOT NULL,
    PRIMARY KEY (channel_id, agent)
) WITHOUT ROWID;
CREATE INDEX idx_participants_agent ON participants (agent);

CREATE TABLE subscriptions (
    channel_id INTEGER NOT NULL REFERENCES channels (id),
    agent TEXT NOT NULL,
    pattern TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (channel_id, agent, pattern)
) WITHOUT ROWID;

-- One row per channel message, beside its `messages` row. sender, type and
-- ts_ms repeat the message's own so that filters on a channel's messages use
-- these indexes and never the hot `messages` table's.
CREATE TABLE channel_messages (
    seq INTEGER PRIMARY KEY REFERENCES messages (seq) ON DELETE CASCADE,
    channel_id INTEGER NOT NULL REFERENCES channels (id),
    sender TEXT NOT NULL,
    type TEXT NOT NULL,
    ts_ms INTEGER NOT NULL,
    topic TEXT,
    priority INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 4),
    status TEXT NOT NULL DEFAULT 'sent' CHECK (status IN
        ('sent', 'delivered', 'acknowledged', 'failed', 'dead_letter', 'expired')),
    expires_at_ms INTEGER  -- a query's answer deadline (send_query timeout)
);
CREATE INDEX idx_channel_messages_channel ON channel_messages (channel_id, seq);
CREATE INDEX idx_channel_messages_sender ON channel_messages (sender, seq);
CREATE INDEX idx_channel_messages_ts ON channel_messages (ts_ms);
CREATE INDEX idx_channel_messages_topic ON channel_messages (topic, seq) WHERE topic IS NOT NULL;
CREATE INDEX idx_channel_messages_expiry ON channel_messages (expires_at_ms)
    WHERE expires_at_ms IS NOT NULL;

-- status: pending (waiting to be received; visible from visible_at_ms),
-- delivered / received / in_progress (handed out; deadline_ms is when an
-- unacknowledged one is retried), completed, failed, dead_letter,
-- duplicate (exactly_once: the recipient already had this correlation id)
-- and cancelled (the recipient left the channel before finishing it).
CREATE TABLE deliveries (
    seq INTEGER NOT NULL REFERENCES channel_messages (seq) ON DELETE CASCADE,
    recipient TEXT NOT NULL,
    channel_id INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'received', 'in_progress',
                                           'completed', 'failed', 'dead_letter', 'duplicate',
                                           'cancelled')),
    visible_at_ms INTEGER NOT NULL,
    deadline_ms INTEGER,            -- set only while handed out and awaiting an ack
    attempts INTEGER NOT NULL DEFAULT 0,  -- times handed out
    retry_count INTEGER NOT NULL DEFAULT 0,
    delivered_at_ms INTEGER,
    acked_at_ms INTEGER,
    note TEXT,
    last_error TEXT,
    PRIMARY KEY (seq, recipient)
) WITHOUT ROWID;
-- receive: a recipient's waiting deliveries in seq order; only pending rows
-- are in the index, so finished history costs receive nothing, and it
-- covers channel and visibility, so counting them never reads the table.
CREATE INDEX idx_deliveries_pending ON deliveries (recipient, seq, channel_id, visible_at_ms)
    WHERE status = 'pending';
-- tick: handed-out deliveries whose ack deadline passed; max_pending counts per channel.
CREATE INDEX idx_deliveries_deadline ON deliveries (deadline_ms) WHERE deadline_ms IS NOT NULL;
CREATE INDEX idx_deliveries_inflight ON deliveries (channel_id) WHERE deadline_ms IS NOT NULL;

CREATE TABLE dead_letters (
    id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL REFERENCES channel_messages (seq) ON DELETE CASCADE,
    recipient TEXT NOT NULL,
    channel_id INTEGER NOT NULL,
    retry_count INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    dead_lettered_at_ms INTEGER NOT NULL,
    UNIQUE (seq, recipient)
);
CREATE INDEX idx_dead_letters_time ON dead_letters (dead_lettered_at_ms);

-- exactly_once: a recipient gets a correlation id once until the entry expires.
CREATE TABLE dedup (
    correlation_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    seq INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (correlation_id, recipient)
) WITHOUT ROWID;
