-- 0004_export: where the JSONL export writes and how far its file is known
-- good, so an export resumes exactly where the last one ended (seed 003,
-- "JSONL Export"): last_seq and bytes are updated in one transaction after
-- the lines are on disk.
-- path: the export file, or the directory of a partitioned export;
-- part: the partition file being appended to (date=YYYY-MM-DD/part-<seq>.jsonl);
-- bytes: how much of that file is known good.
ALTER TABLE export_state ADD COLUMN path TEXT;
ALTER TABLE export_state ADD COLUMN part TEXT;
ALTER TABLE export_state ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
