-- Progress reports and cluster-wide limits. All additive.

-- The latest progress report of a running job: {"message", "percent", "attempt",
-- "max_attempts", "at"}. Kept after the job ends, so a page shows where it stopped.
ALTER TABLE job_queue ADD COLUMN IF NOT EXISTS progress JSONB;

-- At most `max_running` jobs of this type run at once across every worker. A dead worker's
-- jobs count until they are rescued, so its slots free with its lease.
CREATE TABLE IF NOT EXISTS job_type_limits (
    job_type    TEXT PRIMARY KEY,
    max_running INTEGER NOT NULL CHECK (max_running >= 0),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Optional cap on the running jobs of one workspace.
CREATE TABLE IF NOT EXISTS workspace_limits (
    workspace_id UUID PRIMARY KEY REFERENCES workspaces(id) ON DELETE CASCADE,
    max_running  INTEGER NOT NULL CHECK (max_running >= 0),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Calls to an outside service (key "ai_gateway", or "ai_gateway:<model>"), shared by every
-- worker: at most `max_requests` in any `per_s` window, and none before `paused_until` (set by a
-- 429's Retry-After). `recent` holds the grant times inside the window; one row, so one row lock
-- serialises the decision without a table of calls.
CREATE TABLE IF NOT EXISTS rate_limits (
    key          TEXT PRIMARY KEY,
    max_requests INTEGER CHECK (max_requests > 0),
    per_s        DOUBLE PRECISION CHECK (per_s > 0),
    paused_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
    recent       TIMESTAMPTZ[] NOT NULL DEFAULT '{}',
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((max_requests IS NULL) = (per_s IS NULL))
);

-- Queue-wide switches, e.g. ('fair_workspaces', 'true').
CREATE TABLE IF NOT EXISTS queue_settings (
    name       TEXT PRIMARY KEY,
    value      JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO queue_settings (name, value) VALUES ('fair_workspaces', 'true')
ON CONFLICT (name) DO NOTHING;

-- Workers cache the limits and re-read them when told: a change applies at once, no restart.
-- (A rate_limits change from a grant is not a configuration change: only the limit columns.)
CREATE OR REPLACE FUNCTION sidelinja_notify_limits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sidelinja_limits_changed', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_type_limits_notify ON job_type_limits;
CREATE TRIGGER job_type_limits_notify AFTER INSERT OR UPDATE OR DELETE ON job_type_limits
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_notify_limits();
DROP TRIGGER IF EXISTS workspace_limits_notify ON workspace_limits;
CREATE TRIGGER workspace_limits_notify AFTER INSERT OR UPDATE OR DELETE ON workspace_limits
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_notify_limits();
DROP TRIGGER IF EXISTS queue_settings_notify ON queue_settings;
CREATE TRIGGER queue_settings_notify AFTER INSERT OR UPDATE OR DELETE ON queue_settings
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_notify_limits();
DROP TRIGGER IF EXISTS rate_limits_notify ON rate_limits;
CREATE TRIGGER rate_limits_notify AFTER INSERT OR DELETE OR UPDATE OF max_requests, per_s, paused_until
    ON rate_limits FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_notify_limits();

-- Fair claims look at each workspace's head of the queue: one index probe per workspace.
CREATE INDEX IF NOT EXISTS idx_job_queue_workspace_pending
    ON job_queue (workspace_id, priority DESC, scheduled_for)
    WHERE status IN ('pending', 'retry');
