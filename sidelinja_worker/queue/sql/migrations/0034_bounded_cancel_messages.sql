-- The message a cancelled child gets from its failed parent is bounded. Before, it held the
-- parent's job type and error whole, and a child cancelled by a cancelled parent held that
-- parent's message whole, so each level of a graph carried the messages of all the levels
-- above it. A chain of 10,000 jobs failing at its head wrote 3.5 billion characters of
-- messages (each row's compressed for TOAST): 65 s in one statement, so the statement that
-- failed the head (the worker's, with its 10 s timeout; a rescue; a cancel) could not finish.
-- Every child of a parent copied the parent's error and type, which a plain-SQL writer makes
-- any size: 1,000 children of a parent whose error is 1 MB took 24 s and 1 GB.
--
-- Now the message names the parent with at most 200 characters of its type and 1,000 of its
-- error (for a cancelled parent, its own message: the nearest levels above it), so a child's
-- message is at most ~1,300 characters whatever the graph: the chain of 10,000 is cancelled in
-- 1.5 s, the 1,000 children in 0.1 s and 3 MB. The failed ancestor itself is found by
-- following `cancelled_by` (as the admin's retry does).

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
                   (SELECT p.id
                    FROM (SELECT d.parent_id FROM job_dependencies d
                          WHERE d.child_id = c.id AND NOT d.run_anyway OFFSET 0) e
                    CROSS JOIN LATERAL (
                        SELECT p.id, p.completed_at FROM job_queue p
                        WHERE p.id = e.parent_id AND p.status IN ('error', 'cancelled')
                        OFFSET 0) p
                    ORDER BY p.completed_at LIMIT 1) AS failed_parent,
                   EXISTS (SELECT 1
                           FROM (SELECT d.parent_id FROM job_dependencies d
                                 WHERE d.child_id = c.id OFFSET 0) e
                           CROSS JOIN LATERAL (
                               SELECT 1 FROM job_queue p
                               WHERE p.id = e.parent_id
                                 AND p.status NOT IN ('completed', 'error', 'cancelled')
                               OFFSET 0) p) AS unfinished
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
                        SELECT 'parent ' || p.id || ' (' || left(p.job_type, 200) || ') ended in '
                               || p.status || coalesce(': ' || left(p.error_msg, 1000), '')
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
        children := sidelinja_held_children(moved);
    END LOOP;
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', '', true);
    END IF;
END
$$;
