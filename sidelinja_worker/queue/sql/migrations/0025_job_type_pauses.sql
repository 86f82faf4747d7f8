-- An operator pauses a job type cluster-wide (a broken outside service, a bad deploy of its
-- handler): every claim statement skips the types listed here, so their jobs stay pending until
-- the row is deleted. The row is the pause, so plain SQL pauses and resumes as well as the CLI
-- and the admin view:
--   INSERT INTO job_type_pauses (job_type, paused_by, reason) VALUES ('whisper_transcribe', 'ops', 'GPU host down');
--   DELETE FROM job_type_pauses WHERE job_type = 'whisper_transcribe';
-- Every pause and resume is written to admin_audit by a trigger, whoever wrote the row: who
-- (paused_by; for a resume the setting `sidelinja.actor` if the writer set one, else the
-- database role) and why (reason; for a resume the setting `sidelinja.reason`).
CREATE TABLE IF NOT EXISTS job_type_pauses (
    job_type  TEXT PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    paused_by TEXT NOT NULL DEFAULT current_user,
    reason    TEXT NOT NULL DEFAULT ''
);

CREATE OR REPLACE FUNCTION sidelinja_audit_pause() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO admin_audit (action, detail)
        VALUES ('pause', jsonb_build_object('job_type', NEW.job_type, 'by', NEW.paused_by,
                                            'reason', NEW.reason));
    ELSE
        INSERT INTO admin_audit (action, detail)
        VALUES ('resume', jsonb_build_object(
            'job_type', OLD.job_type,
            'by', coalesce(nullif(current_setting('sidelinja.actor', true), ''), current_user),
            'reason', coalesce(current_setting('sidelinja.reason', true), ''),
            'paused_by', OLD.paused_by, 'paused_at', OLD.paused_at));
        -- The paused jobs are due now and no insert announces them: wake the idle workers
        -- (a hint; they claim only what the table allows).
        PERFORM pg_notify('sidelinja_job_due', '');
    END IF;
    PERFORM pg_notify('sidelinja_limits_changed', 'job_type_pauses');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_type_pauses_audit ON job_type_pauses;
CREATE TRIGGER job_type_pauses_audit AFTER INSERT OR DELETE ON job_type_pauses
    FOR EACH ROW EXECUTE FUNCTION sidelinja_audit_pause();

-- Pauses are queue-wide configuration, like the limits: a web role may read them (its overview
-- shows them) but not change them.
GRANT SELECT ON job_type_pauses TO sidelinja_app;
