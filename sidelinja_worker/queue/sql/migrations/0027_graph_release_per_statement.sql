-- Job graphs, release per statement: the children of every parent a statement finished (or put
-- back after a failure) are settled by ONE call per UPDATE statement of job_queue, whatever the
-- number of rows, in place of 0024's per-row trigger (one call and one statement per parent).
-- A batch of 1,000 completions that are all parents of one join job settles that join once.
--
-- The trigger reads the statement's new rows from a transition table. PostgreSQL captures one
-- transition table per table and event and shares it between every statement trigger that asks
-- for it: job_queue_status_events (0009) already has UPDATE's new rows captured, so this trigger
-- adds no copy of its own while that one exists (bench/pg_instructions.py measures both cases;
-- docs/workflows.md has the figures). What it adds to a statement of jobs without edges is one
-- function call per statement and one probe of an index that is empty while no graph is in
-- flight, in place of the per-row WHEN of 0024; with a graph in flight anywhere, a test of
-- `status` and `has_children` per row as well.
--
-- Only the new rows are read (no OLD TABLE, which would be a second copy of every claimed and
-- completed row): a parent whose new status is anything but `running` has its waiting children
-- and the children its failure cancelled settled again. Settling is idempotent, so a parent
-- whose status did not change costs a look at its children and changes nothing; this covers
-- completion, failure, cancellation, a retry of a failed parent (it is `pending` or `retry`
-- again), and a cancelled child brought back (`waiting`), whose own children then follow.
-- A claim (-> running) and a progress report of a running job never look at the edges. The
-- trigger fires on every UPDATE (PostgreSQL refuses a column list with a transition table).
--
-- Locking is 0024's, in sidelinja_settle_children: the children of all of the statement's
-- parents are locked in id order before their parents are read in a statement of their own, so
-- two parents of one child finishing in concurrent transactions are serialised there and the
-- second sees the first's commit.
CREATE OR REPLACE FUNCTION sidelinja_parents_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    parents UUID[];
BEGIN
    -- Nothing to settle while no job anywhere is `waiting` (to release or cancel) or cancelled
    -- by a parent (`cancelled_by`, to bring back): one probe of idx_job_queue_admin_waiting, empty
    -- then, whatever the number of rows, so a statement of jobs without edges reads none of its
    -- rows here. A graph being declared concurrently is safe: its edge trigger holds its parents
    -- FOR SHARE, so a parent's finish waits for it to commit, and this runs after, seeing it.
    IF NOT EXISTS (SELECT 1 FROM job_queue WHERE status = 'waiting' OR cancelled_by IS NOT NULL)
    THEN
        RETURN NULL;
    END IF;
    -- A claim's rows are all `running`: this test reads each row only as far as `status`, the
    -- fifth column, where `has_children` is near the end of the row.
    IF NOT EXISTS (SELECT 1 FROM changed WHERE status <> 'running') THEN
        RETURN NULL;
    END IF;
    parents := ARRAY(SELECT id FROM changed WHERE has_children AND status <> 'running');
    IF cardinality(parents) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM sidelinja_settle_children(ARRAY(
        SELECT DISTINCT d.child_id FROM job_dependencies d
        JOIN job_queue c ON c.id = d.child_id
        WHERE d.parent_id = ANY(parents)
          AND (c.status = 'waiting' OR (c.status = 'cancelled' AND c.cancelled_by IS NOT NULL))));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_parent_changed ON job_queue;
DROP TRIGGER IF EXISTS job_queue_parents_changed ON job_queue;
CREATE TRIGGER job_queue_parents_changed
    AFTER UPDATE ON job_queue
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_parents_changed();
DROP FUNCTION IF EXISTS sidelinja_parent_changed();

-- One partial index for graphs in flight: waiting children, and children a parent's failure
-- cancelled (settling clears `cancelled_by` when it brings them back). Only such jobs are in
-- it, so a claim or a completion of other jobs tests its predicate and never writes it.
--   * The finish trigger's probe (its predicate, exactly): empty, no statement reads its rows.
--   * The admin list's `waiting` page, newest first with keyset pagination as for the other
--     statuses (0009, 0013): `status = 'waiting'` implies the predicate, so the index order
--     serves ORDER BY created_at DESC, id DESC. The cancelled children in it are skipped.
-- One index, not one per use or per workspace (as 0013's pending index): each partial index
-- costs every claim and completion a test of its predicate, ~100 instructions a row each.
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_waiting
    ON job_queue (created_at DESC, id DESC) WHERE status = 'waiting' OR cancelled_by IS NOT NULL;
