-- 0011_dead_letter_ids: a dead letter's id is never handed out again.
-- readers: unchanged (the same columns and rows; only future ids differ)
-- With a plain INTEGER PRIMARY KEY, SQLite gives a new row max(id) + 1, so
-- replaying (or discarding) the newest dead letter let the next one take its
-- id: `bus dlq replay 3` then a new `bus dlq show 3` named another message.
-- AUTOINCREMENT remembers the highest id ever used in sqlite_sequence
-- (https://sqlite.org/autoinc.html); dead letters are rare, so the extra
-- write it costs per insert does not matter here as it would for messages.
-- Ids freed before this migration cannot be known: the copy keeps every id
-- left, and the sequence starts above the highest of them.
CREATE TABLE dead_letters_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    seq INTEGER NOT NULL REFERENCES channel_messages (seq) ON DELETE CASCADE,
    recipient TEXT NOT NULL,
    channel_id INTEGER NOT NULL,
    retry_count INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    dead_lettered_at_ms INTEGER NOT NULL,
    UNIQUE (seq, recipient)
);
INSERT INTO dead_letters_new (id, seq, recipient, channel_id, retry_count, last_error,
                              dead_lettered_at_ms)
    SELECT id, seq, recipient, channel_id, retry_count, last_error, dead_lettered_at_ms
    FROM dead_letters ORDER BY id;
DROP TABLE dead_letters;
ALTER TABLE dead_letters_new RENAME TO dead_letters;
CREATE INDEX idx_dead_letters_time ON dead_letters (dead_lettered_at_ms);
