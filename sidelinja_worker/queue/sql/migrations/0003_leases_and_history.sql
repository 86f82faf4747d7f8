-- Leases, error history, dedupe keys, timeouts and cancellation. All additive.

-- Workers that are alive. A worker renews `expires_at` with one UPDATE per heartbeat, so the
-- lease of every job it runs is renewed at once instead of one row write per running job.
CREATE TABLE IF NOT EXISTS job_workers (
    id          UUID PRIMARY KEY,
    hostname    TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    job_types   TEXT[],
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL
);

ALTER TABLE job_queue
    -- The lease holder: the job_workers row of the worker running this job. A `running` job
    -- whose worker row has expired or vanished is rescued by any live worker.
    ADD COLUMN IF NOT EXISTS worker_id UUID,
    -- One entry per failed attempt: {"attempt", "at", "class", "message"}; error_msg keeps
    -- the last message as the seed wants.
    ADD COLUMN IF NOT EXISTS errors JSONB NOT NULL DEFAULT '[]'::jsonb,
    -- Dedupe: at most one pending/retry/running job per key (index below).
    ADD COLUMN IF NOT EXISTS unique_key TEXT,
    -- Per-job timeout override, capped by the worker (NULL: the job type's default).
    ADD COLUMN IF NOT EXISTS timeout_s INTEGER CHECK (timeout_s IS NULL OR timeout_s > 0),
    -- Set by a cancel of a running job; the worker holding it cancels the handler.
    ADD COLUMN IF NOT EXISTS cancel_requested_at TIMESTAMPTZ;

-- A plain-SQL insert with a duplicate key fails here just as the Python client's would: the
-- rule holds for every writer, including concurrent ones.
CREATE UNIQUE INDEX IF NOT EXISTS idx_job_queue_unique_key ON job_queue (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running');

-- Finds the running jobs of a worker (heartbeat, rescue) without scanning finished rows. Small:
-- it holds only running jobs, and finishing a job adds no entry to it.
CREATE INDEX IF NOT EXISTS idx_job_queue_running ON job_queue (worker_id)
    WHERE status = 'running';

-- Pruning of finished jobs by age, without a scan of the whole table.
CREATE INDEX IF NOT EXISTS idx_job_queue_finished ON job_queue (completed_at)
    WHERE status IN ('completed', 'error', 'cancelled');
