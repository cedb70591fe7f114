-- 0010_pump_inbox_clustered: the pump's inbox keyed by (organism, seq), WITHOUT ROWID.
-- Every client request inserts a row and the pump's routing transaction
-- deletes it; both looked it up by organism in idx_pump_inbox_organism and
-- then wrote the table too: two B-trees, two pages per commit. Clustered on
-- the key it is read by, the table is its own index: one. A seq belongs to
-- one organism's envelope, so the key stays unique as seq alone was.
CREATE TABLE pump_inbox_new (
    organism TEXT NOT NULL,
    seq INTEGER NOT NULL,              -- messages.seq of the envelope
    root_tag TEXT NOT NULL,
    to_listener TEXT,                  -- NULL: every listener of the root tag
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (organism, seq)
) WITHOUT ROWID;
INSERT INTO pump_inbox_new (organism, seq, root_tag, to_listener, created_at_ms)
    SELECT organism, seq, root_tag, to_listener, created_at_ms FROM pump_inbox;
DROP TABLE pump_inbox;
ALTER TABLE pump_inbox_new RENAME TO pump_inbox;
