-- The workers page shows what each worker is (version, concurrency, since when) and lets an
-- operator drain one: `drain_requested_at` set, the worker reads it at its next heartbeat,
-- finishes the jobs it holds and claims no more (until the column is cleared again).
ALTER TABLE job_workers
    ADD COLUMN IF NOT EXISTS version TEXT,
    ADD COLUMN IF NOT EXISTS concurrency INTEGER,
    ADD COLUMN IF NOT EXISTS started_at TIMESTAMPTZ DEFAULT now(),
    ADD COLUMN IF NOT EXISTS last_heartbeat_at TIMESTAMPTZ DEFAULT now(),
    ADD COLUMN IF NOT EXISTS drain_requested_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS drain_requested_by TEXT;
