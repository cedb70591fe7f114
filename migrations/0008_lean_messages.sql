-- 0008_lean_messages: the message log without AUTOINCREMENT and without the
-- (type, from_agent, ts_ms) index, which no query of the product used.
-- Every index on messages is paid on each publish, so each one left is named
-- here with the query that needs it.
--
-- seq stays strictly increasing for the life of the file without
-- AUTOINCREMENT (which wrote sqlite_sequence, one more page, on every
-- insert): SQLite gives a new row max(seq) + 1, and compaction never deletes
-- the newest message (bus/log/retention.py), so max(seq) never goes down.
-- A file whose newest messages were already compacted away keeps its floor
-- through a `seq_floor` marker row at the highest seq ever handed out.
--
-- The runner applies this with foreign keys off (bus/storage/schema.py): dropping the
-- old table must not cascade into channel_messages, and it checks
-- `PRAGMA foreign_key_check` before committing.

-- The old table steps aside under another name; legacy_alter_table keeps the
-- REFERENCES messages (seq) of channel_messages pointing at the name
-- "messages", which the new table takes (https://sqlite.org/pragma.html#pragma_legacy_alter_table).
PRAGMA legacy_alter_table = ON;
ALTER TABLE messages RENAME TO messages_v7;
DROP INDEX idx_messages_to_seq;
DROP INDEX idx_messages_correlation_seq;
DROP INDEX idx_messages_type_from_ts;
DROP INDEX idx_messages_payload_ref;

CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,           -- rowid: max(seq) + 1, never reused (see above)
    id TEXT NOT NULL UNIQUE,           -- UUID (v7 when the bus makes it): a retried publish is a no-op
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

INSERT INTO messages (seq, id, ts_ms, from_agent, to_agent, type, correlation_id,
                      in_reply_to, payload, payload_ref)
SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to, payload,
       payload_ref
FROM messages_v7 ORDER BY seq;

-- The floor: AUTOINCREMENT may have handed out seqs above the newest row left.
INSERT INTO messages (seq, id, ts_ms, from_agent, to_agent, type, payload)
SELECT s.seq,
       lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2)
             || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2)
             || '-' || hex(randomblob(6))),
       CAST(unixepoch('subsec') * 1000 AS INTEGER), 'bus', 'bus', 'seq_floor',
       '{"reason":"keeps seq increasing: the newest messages were compacted before migration 8"}'
FROM sqlite_sequence AS s
WHERE s.name IN ('messages', 'messages_v7')
  AND s.seq > coalesce((SELECT max(seq) FROM messages_v7), 0);

DROP TABLE messages_v7;
PRAGMA legacy_alter_table = OFF;

-- poll (bus/log/messages.py _POLL_SQL, _PENDING_COUNT_SQL): one range scan per
-- branch (to_agent = ?, to_agent IS NULL), merged by seq.
CREATE INDEX idx_messages_to_seq ON messages(to_agent, seq);
-- replies by conversation: the pump client's wait (bus/pump/client.py), channel
-- threads (`bus channel thread`) and answered queries (bus/channels/sending.py).
-- Partial: most messages carry no correlation id.
CREATE INDEX idx_messages_correlation_seq ON messages(correlation_id, seq)
    WHERE correlation_id IS NOT NULL;
-- blob gc and compaction (bus/log/retention.py): few rows have a blob.
CREATE INDEX idx_messages_payload_ref ON messages(payload_ref)
    WHERE payload_ref IS NOT NULL;
