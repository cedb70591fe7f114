-- 0002_coordination: leased claims with attempt limits, dead claims, and the
-- indexes that blob gc and the reaper need (seed 003: Task Claim Pattern,
-- Blob Storage; DESIGN.md "Semantics that are not negotiable").

-- A claim remembers its lease length (renew reuses it), how often the task
-- has been taken (each take after an expiry is one more attempt) and how
-- many takes it may have before it is declared dead.
ALTER TABLE task_claims ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 60000;
ALTER TABLE task_claims ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE task_claims ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 5;
CREATE INDEX idx_task_claims_claimed_by ON task_claims(claimed_by);

-- Tasks whose leases expired too often: not claimable, kept for people to look at.
CREATE TABLE dead_claims (
    task_id TEXT PRIMARY KEY,
    last_holder TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    reason TEXT NOT NULL,
    died_at_ms INTEGER NOT NULL
);

-- Blob gc and compaction look up referenced blobs; few rows have one.
CREATE INDEX idx_messages_payload_ref ON messages(payload_ref)
    WHERE payload_ref IS NOT NULL;
