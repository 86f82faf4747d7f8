-- Row-level security fails closed. Before this, a role that was not the table's owner saw every
-- job unless it opted in to the application role, and the application role could give itself
-- every workspace with a setting of its own choosing. Now:
--   * a role confined to one workspace (a member of sidelinja_app) sees and changes nothing
--     until `sidelinja.workspace_id` names its workspace, and nothing it sets widens that;
--   * every workspace at once is a separate role, sidelinja_platform_admin, that only a role
--     able to grant roles can hand out;
--   * any other non-owner role sees no row at all (no policy applies to it: PostgreSQL denies);
--   * the workspace-owned tables and `workspaces` itself carry the same policies, so a web role
--     reads its own workspace's settings, transcripts, results, statistics and knowledge only.
-- The table owner and superusers (the worker, the admin process) still bypass every policy:
-- ENABLE, not FORCE.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sidelinja_platform_admin') THEN
        CREATE ROLE sidelinja_platform_admin NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- roles are cluster-wide: a concurrent migration of another database made it
END
$$;

-- The platform admin holds the application role's table privileges; its own policies below
-- let it see every workspace. A web role that is a member of sidelinja_app does not become a
-- member of sidelinja_platform_admin this way (membership is granted downwards only).
GRANT sidelinja_app TO sidelinja_platform_admin;

-- The migrating role (the admin process runs as it) enters the platform role for a platform
-- token, so it must be a member; a superuser already is.
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT sidelinja_platform_admin TO %I', current_user);
    END IF;
END
$$;

-- job_queue: one workspace, named by the setting; `sidelinja.all_workspaces` no longer counts.
-- nullif(..., '') and missing_ok: an unset or empty setting matches no row instead of erroring.
DROP POLICY IF EXISTS job_queue_other_roles ON job_queue;
DROP POLICY IF EXISTS job_queue_workspace ON job_queue;
CREATE POLICY job_queue_workspace ON job_queue
    FOR ALL TO sidelinja_app
    USING (workspace_id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid)
    WITH CHECK (workspace_id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid);
DROP POLICY IF EXISTS job_queue_platform ON job_queue;
CREATE POLICY job_queue_platform ON job_queue
    FOR ALL TO sidelinja_platform_admin USING (true) WITH CHECK (true);

-- workspaces: a confined role reads its own row only (its settings, never another's).
ALTER TABLE workspaces ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS workspaces_own ON workspaces;
CREATE POLICY workspaces_own ON workspaces
    FOR SELECT TO sidelinja_app
    USING (id = nullif(current_setting('sidelinja.workspace_id', true), '')::uuid);
DROP POLICY IF EXISTS workspaces_platform ON workspaces;
CREATE POLICY workspaces_platform ON workspaces
    FOR ALL TO sidelinja_platform_admin USING (true) WITH CHECK (true);

-- Every table keyed by workspace_id gets the same two policies. knowledge_embeddings exists only
-- where pgvector is installed (0010), hence the to_regclass guard.
DO $$
DECLARE
    t TEXT;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'transcripts', 'transcript_segments', 'ai_results',
        'podcast_downloads_daily', 'podcast_listener_days', 'podcast_stats_salts',
        'podcast_log_files',
        'knowledge_nodes', 'knowledge_embeddings',
        'valgomat_profiles', 'valgomat_questions', 'valgomat_moderation',
        'prompt_eval_runs', 'prompt_eval_results']
    LOOP
        IF to_regclass(t) IS NULL THEN
            CONTINUE;
        END IF;
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS %I ON %I', t || '_workspace', t);
        EXECUTE format(
            'CREATE POLICY %I ON %I FOR ALL TO sidelinja_app'
            ' USING (workspace_id = nullif(current_setting(''sidelinja.workspace_id'', true),'
            ' '''')::uuid)'
            ' WITH CHECK (workspace_id = nullif(current_setting(''sidelinja.workspace_id'', true),'
            ' '''')::uuid)',
            t || '_workspace', t);
        EXECUTE format('DROP POLICY IF EXISTS %I ON %I', t || '_platform', t);
        EXECUTE format(
            'CREATE POLICY %I ON %I FOR ALL TO sidelinja_platform_admin'
            ' USING (true) WITH CHECK (true)',
            t || '_platform', t);
    END LOOP;
END
$$;

-- What the web app reads: the jobs' results. What it writes: the inputs the platform owns (the
-- knowledge graph's node texts, a quiz's questions) and a moderator's decision. The salts, the
-- per-listener hashes and the log offsets stay the worker's alone (no grant at all).
GRANT SELECT ON transcripts, transcript_segments, ai_results, podcast_downloads_daily,
    knowledge_nodes, valgomat_profiles, valgomat_questions, valgomat_moderation,
    prompt_eval_runs, prompt_eval_results TO sidelinja_app;
GRANT INSERT, UPDATE, DELETE ON knowledge_nodes, valgomat_questions TO sidelinja_app;
GRANT UPDATE ON valgomat_moderation TO sidelinja_app;
DO $$
BEGIN
    IF to_regclass('knowledge_embeddings') IS NOT NULL THEN
        GRANT SELECT ON knowledge_embeddings TO sidelinja_app;
    END IF;
END
$$;
