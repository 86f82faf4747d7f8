-- A job in a graph keeps its created_at. The edge trigger refuses an edge whose parent was
-- created after its child and looks for cycles only among the jobs of one instant, so edges
-- point forward in time and no cycle can form: while created_at stays put. Any writer could
-- update it: move a parent past its child, and the edge back from the child was a forward
-- edge, accepted unchecked. The two jobs waited for each other for good, and once a failed
-- ancestor had cancelled them, each named the other in `cancelled_by`, so a retry of that
-- ancestor never brought them back.
--
-- Now an UPDATE that changes the created_at of a job with an edge (either way) is refused
-- (check_violation). A job outside any graph may still change it, and its edges are checked
-- against the new value when it joins one. The trigger fires only for an UPDATE that sets
-- created_at: the worker's claims and outcomes never do, and pay nothing for it.
CREATE OR REPLACE FUNCTION sidelinja_graph_instant_kept() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.has_children OR EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = NEW.id)
    THEN
        RAISE EXCEPTION 'job % is in a job graph: its created_at orders its edges and stays', NEW.id
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
    EXECUTE FUNCTION sidelinja_graph_instant_kept();
