-- Wake-up: PostgreSQL itself notifies the workers, so a plain-SQL INSERT from the web
-- app wakes them as fast as the Python client does.
--
-- Inserts: one notification per *statement* (a 20,000-row bulk insert sends one), no transition
-- table, no per-row function call. A job scheduled for later also wakes the workers; they find
-- nothing due and go back to sleep, which costs one empty claim.
CREATE OR REPLACE FUNCTION sidelinja_notify_job_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sidelinja_job_due', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_insert_notify ON job_queue;
CREATE TRIGGER job_queue_insert_notify
    AFTER INSERT ON job_queue
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_notify_job_due();

-- Updates that make a job due now (an admin's "retry now", a job given back at shutdown). The
-- WHEN clause is evaluated in C for each row, so claims and completions (which never match it)
-- pay no function call; PostgreSQL folds identical notifications within a transaction into one.
DROP TRIGGER IF EXISTS job_queue_update_notify ON job_queue;
CREATE TRIGGER job_queue_update_notify
    AFTER UPDATE OF status, scheduled_for ON job_queue
    FOR EACH ROW
    WHEN (NEW.status IN ('pending', 'retry')
          AND NEW.scheduled_for <= now()
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.scheduled_for IS DISTINCT FROM NEW.scheduled_for))
    EXECUTE FUNCTION sidelinja_notify_job_due();
