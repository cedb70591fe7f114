-- 0014_task_graph: a graph of tasks with dependencies and a ready list
-- (`bus task add/ready/claim-next/done/cancel`, issue 32).
-- readers: unchanged (new tables only; the views count no tasks in an older file)
-- A task is open, done or cancelled. `waiting_on` counts its dependencies
-- that are not done: it is set when the task is added and lowered by one
-- for each dependent when a task is done, so "ready" (open, waiting on
-- nothing) is read from a partial index instead of re-checking every
-- dependency at each `bus task ready`. Leases stay in task_claims (same
-- task ids): whether a ready task is held is a lookup there, never a copy.

-- seq is the creation order: "oldest first" among tasks of one priority.
-- Tasks are never deleted, so the rowid is never reused.
CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL UNIQUE,
    title TEXT,
    priority INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 4),  -- 0 is the most urgent
    state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'done', 'cancelled')),
    waiting_on INTEGER NOT NULL DEFAULT 0 CHECK (waiting_on >= 0),
    created_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER,
    finished_by TEXT
);
-- The ready list in its order; only open tasks waiting on nothing are in it,
-- so it stays as small as the list itself. The planner uses a partial index
-- only when the query repeats its WHERE terms as literals (bus/coordination/tasks.py does).
CREATE INDEX idx_tasks_ready ON tasks (priority, seq) WHERE state = 'open' AND waiting_on = 0;
-- bus task list --state, and the counts of bus status (blocked = open - unblocked).
-- Not on waiting_on too: each done task lowers its dependents' counts, and an
-- index on that column would be rewritten at every step for no query's sake.
CREATE INDEX idx_tasks_state ON tasks (state);

-- task_seq depends on depends_on_seq: it is ready once that one is done.
CREATE TABLE task_dependencies (
    task_seq INTEGER NOT NULL REFERENCES tasks (seq),
    depends_on_seq INTEGER NOT NULL REFERENCES tasks (seq),
    PRIMARY KEY (task_seq, depends_on_seq),
    CHECK (task_seq != depends_on_seq)
) WITHOUT ROWID;
-- A task's dependents: whom a done task unblocks.
CREATE INDEX idx_task_dependencies_dependents ON task_dependencies (depends_on_seq, task_seq);
