-- Job graphs of any depth settle in one statement. Before, a settle (0024) changed a level of
-- children with an UPDATE whose statement trigger (0027) settled the next level from inside
-- that UPDATE: one nested statement, trigger and function call per level, each on the stack of
-- the one above. A chain a few hundred jobs deep (plain SQL may declare any) ran out of
-- PostgreSQL's stack (max_stack_depth, 2 MB by default, ran out near 400 levels) when its head
-- failed, so nothing that ends such a head could be written: the worker's failure (the job went
-- back to the queue and ran again, its attempt returned, for ever), a cancel, and the rescue,
-- one statement for every dead worker's jobs, which then failed for all of them at every turn.
--
-- Now sidelinja_settle_children follows its changes down the graph itself, a level per turn of
-- a loop, and while it runs (the transaction setting `sidelinja.settling` holds this
-- transaction's id: a value set by hand in a session never matches a later transaction) the
-- statement trigger leaves its UPDATEs alone: they are settled by the loop, in the same order
-- as before. The
-- trigger reads the setting before its probe of the waiting index, which a settle's own UPDATEs
-- would otherwise pay once per level (the probe skips the entries of every version the settle
-- wrote, so a chain's settle grew with the square of its depth); a statement of jobs without
-- edges pays one read of a setting more.

CREATE OR REPLACE FUNCTION sidelinja_settle_children(children UUID[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mark text := pg_current_xact_id()::text;
    outermost boolean := current_setting('sidelinja.settling', true) IS DISTINCT FROM mark;
    moved UUID[];
BEGIN
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', mark, true);
    END IF;
    WHILE coalesce(cardinality(children), 0) > 0 LOOP
        -- 0024's settle of one level: the children's rows are locked in id order first, and
        -- their parents read afterwards in a statement of its own. `state` is materialised:
        -- inlined, each child's failed parent was looked up again for every use in the UPDATE.
        PERFORM 1 FROM job_queue WHERE id = ANY(children) ORDER BY id FOR UPDATE;
        WITH state AS MATERIALIZED (
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
        ), settled AS (
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
                  s.failed_parent)
            RETURNING c.id, c.has_children
        )
        SELECT ARRAY(SELECT id FROM settled WHERE has_children) INTO moved;
        -- The next level: what the statement trigger settled for these rows' UPDATE before.
        children := ARRAY(
            SELECT DISTINCT d.child_id FROM job_dependencies d
            JOIN job_queue c ON c.id = d.child_id
            WHERE d.parent_id = ANY(moved)
              AND (c.status = 'waiting' OR (c.status = 'cancelled' AND c.cancelled_by IS NOT NULL)));
    END LOOP;
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', '', true);
    END IF;
END
$$;

-- 0027's trigger function, leaving a running settle's own UPDATEs to it.
CREATE OR REPLACE FUNCTION sidelinja_parents_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    parents UUID[];
BEGIN
    -- An UPDATE of sidelinja_settle_children, which settles the next level itself. "If
    -- assigned": a claim that took nothing has no transaction id, and is given none here.
    IF current_setting('sidelinja.settling', true) = pg_current_xact_id_if_assigned()::text THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_queue WHERE status = 'waiting' OR cancelled_by IS NOT NULL)
    THEN
        RETURN NULL;
    END IF;
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
