-- Two rules of job graphs that held only for the web app's confined role now hold for every
-- writer.
--
-- 1. An edge joins two jobs of one workspace. The insert trigger runs as the inserting role, so
--    `sidelinja_app` never saw another workspace's job to name; a role that sees every workspace
--    (the owner, `sidelinja_platform_admin`) joined a job of one workspace to a job of another,
--    and the child waited for the other workspace's job, was cancelled by its failure, and read
--    its result (`ctx.parent_results`). Such an edge is refused (check_violation), and the ones
--    already made are deleted, their waiting children settled on the edges they have left.
--
-- 2. A deleted job's waiting children are settled. Deleting a job deletes its edges, and a
--    child that waited for it was left `waiting` with no parent left to finish it: for good,
--    holding its unique key. It is now settled on the edges it has left (released once those
--    parents have completed, cancelled if one failed). A child whose edges the same statement
--    deleted with it (the prune takes graphs whole) is gone too: the prune settles nothing.

-- Runs before `job_dependencies_insert` (triggers of one event fire in name order), so an edge
-- across workspaces is refused before the cycle check walks it. As the inserting role: a
-- confined role does not see the other job, and the insert trigger refuses that edge as one
-- naming no job.
CREATE OR REPLACE FUNCTION sidelinja_edges_in_one_workspace() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad RECORD;
BEGIN
    SELECT e.parent_id, e.child_id INTO bad
    FROM new_edges e
    JOIN job_queue p ON p.id = e.parent_id
    JOIN job_queue c ON c.id = e.child_id
    WHERE p.workspace_id <> c.workspace_id
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job % cannot depend on job %, of another workspace',
            bad.child_id, bad.parent_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_dependencies_in_one_workspace ON job_dependencies;
CREATE TRIGGER job_dependencies_in_one_workspace
    AFTER INSERT ON job_dependencies
    REFERENCING NEW TABLE AS new_edges
    FOR EACH STATEMENT EXECUTE FUNCTION sidelinja_edges_in_one_workspace();

-- 0024's, settling the waiting children the deleted jobs leave behind. The edges to deleted
-- children go first, so the edges the second DELETE returns lead to children that remain.
CREATE OR REPLACE FUNCTION sidelinja_jobs_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    left_behind UUID[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM gone) THEN
        RETURN NULL;
    END IF;
    DELETE FROM job_dependencies WHERE child_id IN (SELECT id FROM gone);
    WITH cut AS (
        DELETE FROM job_dependencies WHERE parent_id IN (SELECT id FROM gone)
        RETURNING child_id
    )
    SELECT ARRAY(SELECT DISTINCT child_id FROM cut) INTO left_behind;
    IF cardinality(left_behind) > 0 THEN
        PERFORM sidelinja_settle_children(ARRAY(
            SELECT c.id FROM unnest(left_behind) AS o(id)
            JOIN job_queue c ON c.id = o.id
            WHERE c.status = 'waiting'));
    END IF;
    RETURN NULL;
END
$$;

-- The edges across workspaces made before this migration.
DO $$
DECLARE
    left_behind UUID[];
BEGIN
    WITH cut AS (
        DELETE FROM job_dependencies d
        USING job_queue p, job_queue c
        WHERE p.id = d.parent_id AND c.id = d.child_id AND p.workspace_id <> c.workspace_id
        RETURNING d.child_id
    )
    SELECT ARRAY(SELECT DISTINCT child_id FROM cut) INTO left_behind;
    PERFORM sidelinja_settle_children(ARRAY(
        SELECT c.id FROM unnest(left_behind) AS o(id)
        JOIN job_queue c ON c.id = o.id
        WHERE c.status = 'waiting'));
END
$$;
