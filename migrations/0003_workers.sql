-- 0003_workers: the worker lifecycle (seed 003 header: ASSIGNED -> WORKING ->
-- IN_REVIEW -> APPROVED -> COMPLETED, plus CANCELLED and FAILED).
-- Every transition updates the row and publishes its state_change message in
-- one transaction, so the log replays to exactly this state.
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('ASSIGNED', 'WORKING', 'IN_REVIEW', 'APPROVED',
                                         'COMPLETED', 'CANCELLED', 'FAILED')),
    repo TEXT NOT NULL,            -- the repository's top directory
    base TEXT NOT NULL,            -- the branch the work starts from and merges into
    branch TEXT NOT NULL,          -- <worker>/<task>
    worktree TEXT NOT NULL,
    head_commit TEXT,              -- branch head recorded by `done`
    merge_commit TEXT,             -- base head after `merge`
    note TEXT,                     -- done message, reject or fail reason
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX idx_workers_task ON workers(task_id);
