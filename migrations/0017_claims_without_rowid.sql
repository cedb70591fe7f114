-- 0017_claims_without_rowid: task_claims keyed by its task id alone.
-- readers: unchanged (the same columns, in the same order)
-- A rowid table with a TEXT primary key is two B-trees: the rows by rowid and an index
-- from task id to rowid. Every claim and release wrote both. WITHOUT ROWID stores the row
-- in the task-id tree itself, so a claim writes one page fewer and a release too; the
-- rows are small (a task id, a holder, five integers), which is where SQLite advises it.
CREATE TABLE task_claims_keyed (
    task_id TEXT PRIMARY KEY,
    claimed_by TEXT NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL DEFAULT 60000,
    attempts INTEGER NOT NULL DEFAULT 1,
    max_attempts INTEGER NOT NULL DEFAULT 5,
    fence INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID;
INSERT INTO task_claims_keyed (task_id, claimed_by, claimed_at_ms, lease_until_ms, lease_ms,
                               attempts, max_attempts, fence)
    SELECT task_id, claimed_by, claimed_at_ms, lease_until_ms, lease_ms, attempts,
           max_attempts, fence FROM task_claims;
DROP TABLE task_claims;
ALTER TABLE task_claims_keyed RENAME TO task_claims;
CREATE INDEX idx_task_claims_claimed_by ON task_claims (claimed_by);
