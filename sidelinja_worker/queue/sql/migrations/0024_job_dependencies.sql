-- Job graphs (workflows), declared in plain SQL: a row in job_dependencies says that `child_id`
-- runs only after `parent_id` completed. Everything is enforced here, in triggers, so that it
-- holds for every writer (the web app's INSERTs, psql, the admin view, the CLI, the worker):
--   * inserting an edge holds its child (`waiting`) while any parent is unfinished, and
--     cancels it at once if a parent already failed;
--   * a parent that completes makes each waiting child whose parents have all completed due
--     (`pending`, which also wakes the workers through job_queue_update_notify);
--   * a parent that ends in `error` or `cancelled` cancels its waiting children, naming itself
--     and its error, unless the edge says `run_anyway`; the cancellation cascades down;
--   * a failed parent put back in the queue (any retry: SQL, CLI, admin) brings back the
--     children it cancelled, and they bring back theirs.
-- Jobs without edges pay nothing but a C-evaluated WHEN on `has_children` per status change:
-- no function call, no extra statement, and the claim statements are unchanged.

CREATE TABLE IF NOT EXISTS job_dependencies (
    -- No foreign keys: they would put two referential triggers on every update of job_queue
    -- (each claim and completion; ~3,000 PostgreSQL instructions per job). The insert trigger
    -- checks that both jobs exist, and the delete trigger below removes a deleted job's edges.
    parent_id  UUID NOT NULL,
    child_id   UUID NOT NULL,
    -- The child runs even if this parent ends in `error` or `cancelled` (a clean-up, a report).
    run_anyway BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT job_dependencies_not_self CHECK (parent_id <> child_id)
);

-- A parent's children, for the release when it finishes.
CREATE INDEX IF NOT EXISTS idx_job_dependencies_parent ON job_dependencies (parent_id);

ALTER TABLE job_queue
    -- Set when a first edge names this job as a parent: the finish trigger's WHEN tests it, so
    -- jobs that are nobody's parent never call the trigger's function.
    ADD COLUMN IF NOT EXISTS has_children BOOLEAN NOT NULL DEFAULT false,
    -- The parent whose failure cancelled this job: a retry of that parent brings it back, a
    -- job cancelled by hand (NULL here) stays cancelled.
    ADD COLUMN IF NOT EXISTS cancelled_by UUID;

-- The state a held job should be in, from its parents' statuses. Failed parents through edges
-- without run_anyway cancel; unfinished parents hold; otherwise it is due.
CREATE OR REPLACE FUNCTION sidelinja_settle_children(children UUID[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- The children's rows are locked in id order first, and their parents read afterwards in
    -- a statement of its own: two parents of one child finishing in concurrent transactions are
    -- serialised here, and the second sees the first's commit (READ COMMITTED takes a new
    -- snapshot per statement), so a child is never left waiting on parents that are all done.
    PERFORM 1 FROM job_queue WHERE id = ANY(children) ORDER BY id FOR UPDATE;
    WITH state AS (
        SELECT c.id,
               (SELECT p.id FROM job_dependencies d JOIN job_queue p ON p.id = d.parent_id
                WHERE d.child_id = c.id AND NOT d.run_anyway
                  AND p.status IN ('error', 'cancelled')
                ORDER BY p.completed_at LIMIT 1) AS failed_parent,
               EXISTS (SELECT 1 FROM job_dependencies d JOIN job_queue p ON p.id = d.parent_id
                       WHERE d.child_id = c.id
                         AND p.status NOT IN ('completed', 'error', 'cancelled')) AS unfinished
        FROM job_queue c
        WHERE c.id = ANY(children)
          AND (c.status IN ('pending', 'retry', 'waiting')
               OR (c.status = 'cancelled' AND c.cancelled_by IS NOT NULL))
    )
    UPDATE job_queue c
    SET status = CASE WHEN s.failed_parent IS NOT NULL THEN 'cancelled'
                      WHEN s.unfinished THEN 'waiting'
                      WHEN c.status IN ('waiting', 'cancelled') THEN 'pending'
                      ELSE c.status END::job_status,
        cancelled_by = s.failed_parent,
        completed_at = CASE WHEN s.failed_parent IS NOT NULL THEN now() END,
        error_msg = CASE
            WHEN s.failed_parent IS NOT NULL THEN (
                SELECT 'parent ' || p.id || ' (' || p.job_type || ') ended in ' || p.status
                       || coalesce(': ' || p.error_msg, '')
                FROM job_queue p WHERE p.id = s.failed_parent)
            WHEN c.cancelled_by IS NOT NULL THEN NULL
            ELSE c.error_msg END,
        -- Due now, not at the time it was inserted: its wait is counted from here, and it
        -- queues behind jobs that were due before it.
        scheduled_for = CASE WHEN s.failed_parent IS NULL AND NOT s.unfinished
                                  AND c.status IN ('waiting', 'cancelled')
                             THEN greatest(c.scheduled_for, now())
                             ELSE c.scheduled_for END
    FROM state s
    WHERE c.id = s.id
      AND (c.status::text, c.cancelled_by) IS DISTINCT FROM (
          CASE WHEN s.failed_parent IS NOT NULL THEN 'cancelled'
               WHEN s.unfinished THEN 'waiting'
               WHEN c.status IN ('waiting', 'cancelled') THEN 'pending'
               ELSE c.status::text END,
          s.failed_parent);
END
$$;

-- New edges: checked (no cycle), their parents marked, their children held or cancelled.
CREATE OR REPLACE FUNCTION sidelinja_edges_added() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad RECORD;
BEGIN
    SELECT e.parent_id, e.child_id INTO bad
    FROM new_edges e
    WHERE NOT EXISTS (SELECT 1 FROM job_queue p WHERE p.id = e.parent_id)
       OR NOT EXISTS (SELECT 1 FROM job_queue c WHERE c.id = e.child_id)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job dependency % -> % names a job that does not exist',
            bad.parent_id, bad.child_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- A parent created after its child is refused: edges then only point forward in time,
    -- so no cycle can form across jobs created at different moments.
    SELECT e.parent_id, e.child_id INTO bad
    FROM new_edges e
    JOIN job_queue p ON p.id = e.parent_id
    JOIN job_queue c ON c.id = e.child_id
    WHERE p.created_at > c.created_at
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job % cannot depend on job %, created after it', bad.child_id, bad.parent_id
            USING ERRCODE = 'check_violation';
    END IF;
    -- Jobs created in one transaction share created_at: among them a cycle is looked for
    -- (only through jobs of that same instant). Edge inserts take a lock for it, so two
    -- transactions cannot each add half of a cycle.
    PERFORM pg_advisory_xact_lock(7226133950251622722);
    WITH RECURSIVE reach(origin, node) AS (
        SELECT e.parent_id, e.child_id FROM new_edges e
        UNION
        SELECT r.origin, d.child_id
        FROM reach r
        JOIN job_dependencies d ON d.parent_id = r.node
        JOIN job_queue o ON o.id = r.origin
        JOIN job_queue n ON n.id = d.child_id
        WHERE n.created_at = o.created_at
    )
    SELECT origin AS parent_id, node AS child_id INTO bad FROM reach WHERE node = origin LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job dependencies would form a cycle through job %', bad.parent_id
            USING ERRCODE = 'check_violation';
    END IF;
    -- The parents' rows are locked (in id order) against a concurrent finish: a parent that
    -- finishes before this commits is seen finished below; one that finishes after sees the
    -- edge when its trigger runs.
    PERFORM 1 FROM job_queue
    WHERE id IN (SELECT parent_id FROM new_edges) ORDER BY id FOR SHARE;
    UPDATE job_queue SET has_children = true
    WHERE id IN (SELECT parent_id FROM new_edges) AND NOT has_children;
    PERFORM sidelinja_settle_children(ARRAY(SELECT DISTINCT child_id FROM new_edges));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_dependencies_insert ON job_dependencies;
CREATE TRIGGER job_dependencies_insert
    AFTER INSERT ON job_dependencies
    REFERENCING NEW TABLE AS new_edges
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_edges_added();

-- Deleted jobs (retention, or by hand) take their edges with them: one statement per DELETE
-- statement, which only pruning runs. As the owner (SECURITY DEFINER): a role allowed to delete
-- jobs but not edges still deletes them whole, and it touches only the edges of rows it deleted.
CREATE OR REPLACE FUNCTION sidelinja_jobs_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM gone) THEN
        RETURN NULL;
    END IF;
    DELETE FROM job_dependencies WHERE child_id IN (SELECT id FROM gone);
    DELETE FROM job_dependencies WHERE parent_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_delete_edges ON job_queue;
CREATE TRIGGER job_queue_delete_edges
    AFTER DELETE ON job_queue
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_jobs_deleted();

-- A parent finished, failed, or was put back after failing: its children follow. As the owner
-- (SECURITY DEFINER): any role that may change a job's status (the web app's, older roles
-- without rights on job_dependencies) moves its graph on. Its edges were checked when added
-- (the insert trigger runs as the inserting role, so they join only jobs that role could see).
CREATE OR REPLACE FUNCTION sidelinja_parent_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM sidelinja_settle_children(ARRAY(
        SELECT d.child_id FROM job_dependencies d
        JOIN job_queue c ON c.id = d.child_id
        WHERE d.parent_id = NEW.id
          AND (c.status = 'waiting' OR (c.status = 'cancelled' AND c.cancelled_by IS NOT NULL))));
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_parent_changed ON job_queue;
CREATE TRIGGER job_queue_parent_changed
    AFTER UPDATE OF status ON job_queue
    FOR EACH ROW
    WHEN (NEW.has_children
          AND OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('completed', 'error', 'cancelled')
               OR OLD.status IN ('error', 'cancelled')))
    EXECUTE FUNCTION sidelinja_parent_changed();

-- The application roles (the web app, the admin view) declare graphs and retry their jobs: they
-- read and add edges, confined as for job_queue. An edge is visible when its child is. Which
-- jobs an edge may join is checked by the insert trigger, which runs as that role and so finds
-- only the jobs it sees (one workspace): a policy's WITH CHECK cannot do it, as it runs before
-- the end of the statement and would not see jobs inserted by the same statement. The finish
-- and delete triggers run as the owner (above).
GRANT SELECT, INSERT ON job_dependencies TO sidelinja_app;
ALTER TABLE job_dependencies ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS job_dependencies_workspace ON job_dependencies;
CREATE POLICY job_dependencies_workspace ON job_dependencies
    FOR ALL TO sidelinja_app
    USING (EXISTS (SELECT 1 FROM job_queue c WHERE c.id = child_id))
    WITH CHECK (true);
DROP POLICY IF EXISTS job_dependencies_platform ON job_dependencies;
CREATE POLICY job_dependencies_platform ON job_dependencies
    FOR ALL TO sidelinja_platform_admin USING (true) WITH CHECK (true);
