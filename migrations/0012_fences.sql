-- 0012_fences: every granted lease carries a fence, an integer that grows each
-- readers: unchanged (the views read an older file's claims with fence 1, what this gives them)
-- time the task's lease goes to a new holder and is never reused for that task
-- (DESIGN.md "Coordination for coding agents"; issue 32, fenced leases).
-- A claim row is deleted on release and when its task dies, so the highest
-- fence handed out per task lives in a table of its own: the next holder's
-- fence is one more, whatever happened to the rows in between.
ALTER TABLE task_claims ADD COLUMN fence INTEGER NOT NULL DEFAULT 1;
CREATE TABLE task_fences (
    task_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL CHECK (fence >= 1)
) WITHOUT ROWID;
-- The claims held now were each granted once, before fences existed: fence 1.
INSERT INTO task_fences (task_id, fence) SELECT task_id, fence FROM task_claims;
