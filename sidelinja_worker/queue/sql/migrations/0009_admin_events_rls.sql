-- Admin view, live status events and workspace isolation. All additive: two tables,
-- a trigger function on two triggers, one queue setting, small partial indexes, one role, and
-- row-level security that changes nothing for the worker or any existing role.

-- Admin tokens. Only a SHA-256 of the token is stored, so a leaked table grants nothing.
-- workspace_id NULL with all_workspaces: a platform admin; otherwise exactly one workspace.
CREATE TABLE IF NOT EXISTS admin_tokens (
    id             UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    token_sha256   BYTEA NOT NULL UNIQUE,
    workspace_id   UUID REFERENCES workspaces(id) ON DELETE CASCADE,
    all_workspaces BOOLEAN NOT NULL DEFAULT false,
    label          TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at     TIMESTAMPTZ,
    CHECK (all_workspaces = (workspace_id IS NULL))
);

-- Every action taken in the admin view (retry, cancel, bulk retry): who, on what, when.
CREATE TABLE IF NOT EXISTS admin_audit (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    token_id     UUID REFERENCES admin_tokens(id) ON DELETE SET NULL,
    workspace_id UUID,          -- the token's scope; NULL for a platform admin
    action       TEXT NOT NULL,
    job_ids      UUID[] NOT NULL DEFAULT '{}',
    detail       JSONB NOT NULL DEFAULT '{}'::jsonb
);

-- Status events, published by PostgreSQL itself so that a plain-SQL writer (the web app, psql)
-- produces them too. Channel `sidelinja_job_events`; one notification per statement, workspace,
-- job type and status, listing up to 150 jobs (NOTIFY payloads must stay under 8000 bytes):
--   {"workspace_id": W, "job_type": T, "status": "error", "max_attempts": 3,
--    "ids": [id, ...], "attempts": [n, ...]}
-- It carries the jobs' status after every INSERT or UPDATE of job_queue (an UPDATE that left the
-- status alone, rare, repeats it). Progress reports (`report_progress`) use the same channel
-- with one object per job and no `ids`: {"id", "workspace_id", "job_type", "status", "progress"}.
--
-- Cost, measured with EXPLAIN ANALYZE of a claim-like UPDATE of status on 20,000 rows of a
-- 1,000,000-row table (bench/admin_list_bench.py; PostgreSQL 15, 2 shared and busy cores, median
-- of 7): 753 ms without the trigger, 815 ms with it (+8 %); the trigger itself 70 ms, 3.5 µs per
-- row. Alternatives measured on 100,000 rows: the same joining old and new rows to skip
-- unchanged statuses, 140 ms instead of 85 ms; one JSON object per job instead of id arrays was slower still and
-- hit the 8000-byte limit at 40 jobs; a per-row trigger calling pg_notify made the whole UPDATE
-- ~60 % slower. Hence one function call per statement over the transition table, no join, ids
-- aggregated as arrays. bench/admin_list_bench.py measures it again.
--
-- A notifying transaction takes PostgreSQL's cluster-wide notify-queue lock at commit, so commits
-- that publish are serialised (claims and completions now do). For a deployment that needs
-- every last commit per second and has no live pages, events can be switched off, at once:
--   UPDATE queue_settings SET value = 'false' WHERE name = 'job_events';
INSERT INTO queue_settings (name, value) VALUES ('job_events', 'true')
ON CONFLICT (name) DO NOTHING;

CREATE OR REPLACE FUNCTION sidelinja_publish_job_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT value = 'false'::jsonb FROM queue_settings WHERE name = 'job_events') THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('sidelinja_job_events', json_build_object(
                'workspace_id', c.workspace_id, 'job_type', c.job_type, 'status', c.status,
                'max_attempts', c.max_attempts,
                'ids', array_agg(c.id), 'attempts', array_agg(c.attempts))::text)
    FROM (SELECT n.workspace_id, n.job_type, n.status, n.max_attempts, n.id, n.attempts,
                 (row_number() OVER (PARTITION BY n.workspace_id, n.job_type, n.status,
                                     n.max_attempts) - 1) / 150 AS chunk
          FROM new_rows n) c
    GROUP BY c.workspace_id, c.job_type, c.status, c.max_attempts, c.chunk;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_status_events ON job_queue;
CREATE TRIGGER job_queue_status_events
    AFTER UPDATE ON job_queue
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_publish_job_events();

DROP TRIGGER IF EXISTS job_queue_insert_events ON job_queue;
CREATE TRIGGER job_queue_insert_events
    AFTER INSERT ON job_queue
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_publish_job_events();

-- The admin list pages newest first with keyset pagination (admin.sql `list_jobs`). One
-- partial index per status an operator acts on, and per scope (a workspace token's pages, a
-- platform admin's). Partial, so claims and completions (pending -> running -> completed) never
-- write to them: a full index would add an entry to every claim and completion (+5 % to +50 %
-- on the 20,000-row UPDATE on this noisy machine). Per status, because under row-level security
-- `status = 'error'` cannot be an index condition (enum equality is not LEAKPROOF), but it
-- does prove a partial index's predicate, so the index order serves ORDER BY created_at.
-- Completed jobs page over idx_job_queue_finished (completed_at) the same way.
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_error
    ON job_queue (created_at DESC, id DESC) WHERE status = 'error';
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_error_ws
    ON job_queue (workspace_id, created_at DESC, id DESC) WHERE status = 'error';
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_retry
    ON job_queue (created_at DESC, id DESC) WHERE status = 'retry';
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_retry_ws
    ON job_queue (workspace_id, created_at DESC, id DESC) WHERE status = 'retry';
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_cancelled
    ON job_queue (created_at DESC, id DESC) WHERE status = 'cancelled';
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_cancelled_ws
    ON job_queue (workspace_id, created_at DESC, id DESC) WHERE status = 'cancelled';

-- Row-level security for the application role. The admin view (and the web app) runs each
-- transaction as `SET LOCAL ROLE sidelinja_app` after
--   set_config('sidelinja.workspace_id', '<uuid>', true)   -- one workspace, or
--   set_config('sidelinja.all_workspaces', 'on', true)      -- a platform admin
-- and then sees and changes only those rows. NOLOGIN: it is entered with SET ROLE by a role
-- that is a member (the migrating role is made one below). Created once per cluster; two
-- concurrent migrations may race on it, hence the exception handler.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sidelinja_app') THEN
        CREATE ROLE sidelinja_app NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;

DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT sidelinja_app TO %I', current_user);
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO sidelinja_app;
GRANT SELECT, INSERT, UPDATE ON job_queue TO sidelinja_app;
GRANT SELECT ON workspaces, job_workers, queue_settings TO sidelinja_app;

-- ENABLE, not FORCE: the table's owner and superusers (the worker) bypass every policy, so the
-- worker sees exactly what it saw before.
ALTER TABLE job_queue ENABLE ROW LEVEL SECURITY;

-- Settings are read with missing_ok, so an unset workspace sees nothing rather than erroring.
DROP POLICY IF EXISTS job_queue_workspace ON job_queue;
CREATE POLICY job_queue_workspace ON job_queue
    FOR ALL TO sidelinja_app
    USING (current_setting('sidelinja.all_workspaces', true) = 'on'
           OR workspace_id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid)
    WITH CHECK (current_setting('sidelinja.all_workspaces', true) = 'on'
                OR workspace_id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid);

-- Any other non-owner role that already reads or writes the queue (on the real platform, the
-- web app's login role may) keeps full access: enabling RLS alone would have locked it out.
-- Roles holding sidelinja_app's privileges (SET ROLE to it, or an INHERIT member) are excluded,
-- so the policy above is theirs alone. A NOINHERIT member keeps full access until it runs
-- SET LOCAL ROLE sidelinja_app: that is how a web app opts in per transaction.
DROP POLICY IF EXISTS job_queue_other_roles ON job_queue;
CREATE POLICY job_queue_other_roles ON job_queue
    FOR ALL TO PUBLIC
    USING (NOT pg_has_role('sidelinja_app', 'USAGE'))
    WITH CHECK (NOT pg_has_role('sidelinja_app', 'USAGE'));
