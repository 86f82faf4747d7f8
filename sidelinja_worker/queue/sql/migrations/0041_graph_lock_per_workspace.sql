-- The lock that keeps two transactions from each adding half of a cycle is taken per workspace
-- (edges never cross workspaces, so neither do cycles). It was one key for the whole cluster:
-- a web request of one workspace that inserted a graph and went on working before its commit
-- held every other workspace's graph inserts (the web app's own, and the worker's follow-ups
-- with edges) for as long. The workspaces of a statement's edges are locked in order, so two
-- statements spanning the same workspaces cannot deadlock.
--
-- sidelinja_edges_added is rewritten in place from its own definition, to change that one
-- statement without restating the function.
DO $migration$
DECLARE
    old_lock CONSTANT text := 'PERFORM pg_advisory_xact_lock(7226133950251622722);';
    new_lock CONSTANT text := $lock$PERFORM pg_advisory_xact_lock(7226133950251622722 # hashtextextended(w::text, 0))
    FROM (SELECT DISTINCT c.workspace_id AS w
          FROM new_edges e JOIN job_queue c ON c.id = e.child_id
          ORDER BY 1) AS edge_workspaces;$lock$;
    definition text := pg_get_functiondef('sidelinja_edges_added()'::regprocedure);
BEGIN
    IF position(old_lock IN definition) = 0 THEN
        RAISE EXCEPTION 'sidelinja_edges_added has no cluster-wide graph lock to replace';
    END IF;
    EXECUTE replace(definition, old_lock, new_lock);
END
$migration$;
