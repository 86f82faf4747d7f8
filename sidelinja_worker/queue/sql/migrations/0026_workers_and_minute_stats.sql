-- The workers page shows what each worker is (version, concurrency, since when) and lets an
-- operator drain one: `drain_requested_at` set, the worker reads it at its next heartbeat,
-- finishes the jobs it holds and claims no more (until the column is cleared again).
-- The dashboard's charts read per-minute aggregates that the workers keep, never job_queue,
-- so the page costs the same at 10 million jobs as at ten.
ALTER TABLE job_workers
    ADD COLUMN IF NOT EXISTS version TEXT,
    ADD COLUMN IF NOT EXISTS concurrency INTEGER,
    ADD COLUMN IF NOT EXISTS started_at TIMESTAMPTZ DEFAULT now(),
    ADD COLUMN IF NOT EXISTS last_heartbeat_at TIMESTAMPTZ DEFAULT now(),
    ADD COLUMN IF NOT EXISTS drain_requested_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS drain_requested_by TEXT;

-- One row per minute, workspace and job type with any ended attempt: attempts completed and
-- failed, and the handlers' run times as counts per bucket (the bounds are MINUTE_BOUNDS_S in
-- queue/metrics.py; p50/p95 are read from the summed buckets). Each worker adds its own counts
-- every few seconds (an upsert that adds); rows older than two days are deleted by the workers.
-- The whole queue's numbers are kept too, under the nil workspace (00000000-...), so that a
-- platform admin's page reads a day of one row per minute and type, not one per workspace;
-- no workspace token can see those rows.
CREATE TABLE IF NOT EXISTS job_minute_stats (
    minute       TIMESTAMPTZ NOT NULL,
    workspace_id UUID NOT NULL,
    job_type     TEXT NOT NULL,
    completed    INTEGER NOT NULL DEFAULT 0,
    failed       INTEGER NOT NULL DEFAULT 0,
    run_buckets  INTEGER[] NOT NULL,
    PRIMARY KEY (workspace_id, minute, job_type)
);

-- A workspace's numbers are its own, as its jobs are (the policies of job_queue).
ALTER TABLE job_minute_stats ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS job_minute_stats_workspace ON job_minute_stats;
CREATE POLICY job_minute_stats_workspace ON job_minute_stats
    FOR SELECT TO sidelinja_app
    USING (workspace_id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid);
DROP POLICY IF EXISTS job_minute_stats_platform ON job_minute_stats;
CREATE POLICY job_minute_stats_platform ON job_minute_stats
    FOR SELECT TO sidelinja_platform_admin USING (true);
GRANT SELECT ON job_minute_stats TO sidelinja_app;
