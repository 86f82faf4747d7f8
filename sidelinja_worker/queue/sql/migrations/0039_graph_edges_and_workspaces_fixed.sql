-- Two ways round the graph's insert checks, for a writer that sees every workspace (the owner,
-- `sidelinja_platform_admin`; the web app's role may not update edges at all):
--
-- 1. An edge updated in place. The checks (both jobs exist, one workspace, forward in time or
--    no cycle among the jobs of one instant) run when an edge is inserted; an UPDATE of its
--    parent_id or child_id ran none of them. Re-pointed at another workspace's job, the child
--    read that job's result (`ctx.parent_results`); re-pointed backwards, two jobs waited for
--    each other for good. An edge now keeps its two jobs: delete it and insert the new one,
--    which is checked. `run_anyway` may still change.
--
-- 2. A job moved to another workspace with its edges. The child of an edge in workspace B,
--    moved to A, read its B parents' results as A's job. A job in a graph now keeps its
--    workspace, as it keeps its created_at (0036); a job outside any graph may still move.
--
-- Both triggers fire only for an UPDATE that sets those columns: the worker's claims and
-- outcomes never do, and pay nothing for them.

CREATE OR REPLACE FUNCTION sidelinja_edge_kept() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the edge from job % to job % cannot be moved: delete it and insert the new one',
        OLD.parent_id, OLD.child_id
        USING ERRCODE = 'check_violation';
END
$$;

DROP TRIGGER IF EXISTS job_dependencies_kept ON job_dependencies;
CREATE TRIGGER job_dependencies_kept
    BEFORE UPDATE OF parent_id, child_id ON job_dependencies
    FOR EACH ROW
    WHEN (OLD.parent_id IS DISTINCT FROM NEW.parent_id
          OR OLD.child_id IS DISTINCT FROM NEW.child_id)
    EXECUTE FUNCTION sidelinja_edge_kept();

-- One check for both columns a job in a graph keeps (the column named by the trigger), in
-- place of 0036's for created_at alone.
CREATE OR REPLACE FUNCTION sidelinja_graph_job_kept() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.has_children OR EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = NEW.id)
    THEN
        RAISE EXCEPTION 'job % is in a job graph: it keeps its %', NEW.id, TG_ARGV[0]
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS job_queue_graph_instant ON job_queue;
CREATE TRIGGER job_queue_graph_instant
    AFTER UPDATE OF created_at ON job_queue
    FOR EACH ROW
    WHEN (OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION sidelinja_graph_job_kept('created_at');
DROP FUNCTION IF EXISTS sidelinja_graph_instant_kept();

DROP TRIGGER IF EXISTS job_queue_graph_workspace ON job_queue;
CREATE TRIGGER job_queue_graph_workspace
    AFTER UPDATE OF workspace_id ON job_queue
    FOR EACH ROW
    WHEN (OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)
    EXECUTE FUNCTION sidelinja_graph_job_kept('workspace_id');

-- The edges across workspaces made since 0035 by those two ways, as 0035 removed the earlier
-- ones: deleted, the waiting children they held settled on the edges they have left.
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
