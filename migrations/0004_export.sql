-- 0004_export: where the JSONL export writes and how far its file is known
-- good, so an export resumes exactly where the last one ended (seed 003,
-- "JSONL Export"): last_seq and bytes are updated in one transaction after
-- the lines are on disk.
ALTER TABLE export_state ADD COLUMN path TEXT;
ALTER TABLE export_state ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
