-- A unique key is unique within its workspace: two workspaces may use the same key (a periodic
-- job's "stats_parse:next", say), and no workspace can hold a key that blocks another's job.
-- Same name as the index it replaces, so a plain-SQL insert fails on the name it always did.
DROP INDEX IF EXISTS idx_job_queue_unique_key;
CREATE UNIQUE INDEX idx_job_queue_unique_key ON job_queue (workspace_id, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running');
