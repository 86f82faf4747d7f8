-- A job waits while any of its parents is unfinished: also when a parent that had finished is
-- put back in the queue. A parent's failure releases its children on `run_anyway` edges (a
-- clean-up, a report); retried, the parent ran again while its released clean-up, still in
-- the queue behind a backlog, was claimed beside it and cleaned up under it. So was a child
-- that was running when its parent was put back and then failed into `retry`: it ran again
-- before the parent had finished again.
--
-- Now, after any UPDATE, a job that is `pending` or `retry` while one of its parents is
-- unfinished (neither `completed`, `error` nor `cancelled`) is `waiting` again, and is
-- settled with the other waiting children when that parent finishes: the jobs this
-- statement put back in the queue, the released children of the parents it put back, and
-- those of the jobs a settle brings back from `cancelled` (a grandparent's retry brings
-- back the child its failure cancelled, whose clean-up was released then).
-- Only holding, never cancelling: a job a writer put back by hand while a parent of it has
-- failed runs, as before. A running child is left to finish: nothing can take back a start.
--
-- What it costs the claims and completions of noop jobs, in PostgreSQL's instructions per
-- job (bench/pg_instructions.py, fair claims of 1,000): with no edge anywhere (no graphs in
-- use, or all pruned), a probe of the empty job_dependencies, +156 (0.1 %). Once edges exist,
-- while nothing waits, each statement passes over its rows (the shared transition table) to
-- find whether it put a job back, where the trigger returned before: +1,529 (1.1 %). While
-- graphs wait, the completions pass over their rows once more than before.
CREATE OR REPLACE FUNCTION sidelinja_parents_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    held boolean;
    edges boolean;
    parents UUID[];
    put_back UUID[];
BEGIN
    -- An UPDATE of sidelinja_settle_children, which settles the next level itself (or of the
    -- hold below). "If assigned": a claim that took nothing has no transaction id, and is
    -- given none here.
    IF current_setting('sidelinja.settling', true) = pg_current_xact_id_if_assigned()::text THEN
        RETURN NULL;
    END IF;
    SELECT EXISTS (SELECT 1 FROM job_queue WHERE status = 'waiting' OR cancelled_by IS NOT NULL),
           EXISTS (SELECT 1 FROM job_dependencies)
    INTO held, edges;
    IF NOT held AND NOT edges THEN
        RETURN NULL;  -- no graph anywhere: nothing to hold or release
    END IF;
    IF NOT EXISTS (SELECT 1 FROM changed WHERE status <> 'running') THEN
        RETURN NULL;  -- a claim
    END IF;
    put_back := ARRAY(SELECT id FROM changed WHERE status IN ('pending', 'retry'));
    IF cardinality(put_back) > 0 THEN
        PERFORM sidelinja_hold_again(ARRAY(
            SELECT c.id FROM unnest(put_back) AS c(id)
            WHERE EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = c.id)
            UNION
            SELECT d.child_id
            FROM changed p
            JOIN job_dependencies d ON d.parent_id = p.id
            WHERE p.has_children AND p.status IN ('pending', 'retry')));
    END IF;
    IF NOT held THEN
        RETURN NULL;  -- nothing was waiting or cancelled by a parent: nothing to settle
    END IF;
    parents := ARRAY(SELECT id FROM changed WHERE has_children AND status <> 'running');
    IF cardinality(parents) > 0 THEN
        PERFORM sidelinja_settle_children(sidelinja_held_children(parents));
    END IF;
    RETURN NULL;
END
$$;

-- The jobs among `jobs` that are queued (`pending`, `retry`) while a parent of theirs is
-- unfinished go back to `waiting`, their rows locked in id order first, as the settle does.
-- Each is read by its primary key: a statement that tests `status IN ('pending', 'retry')`
-- beside `id = ANY(jobs)` was planned over the due jobs' partial index, every pending job of
-- the table read for each edge a graph's declaration inserts. The UPDATE is marked as the
-- settle's: it starts no settle of its own.
CREATE OR REPLACE FUNCTION sidelinja_hold_again(jobs UUID[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mark text := pg_current_xact_id()::text;
    outermost boolean := current_setting('sidelinja.settling', true) IS DISTINCT FROM mark;
    held UUID[];
BEGIN
    IF coalesce(cardinality(jobs), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM job_queue WHERE id = ANY(jobs) ORDER BY id FOR UPDATE;
    held := ARRAY(
        SELECT j.id
        FROM unnest(jobs) AS j(id)
        CROSS JOIN LATERAL (SELECT c.status FROM job_queue c WHERE c.id = j.id OFFSET 0) c
        WHERE c.status IN ('pending', 'retry')
          AND EXISTS (SELECT 1
                      FROM (SELECT d.parent_id FROM job_dependencies d
                            WHERE d.child_id = j.id OFFSET 0) e
                      CROSS JOIN LATERAL (
                          SELECT 1 FROM job_queue p
                          WHERE p.id = e.parent_id
                            AND p.status NOT IN ('completed', 'error', 'cancelled')
                          OFFSET 0) p));
    IF cardinality(held) = 0 THEN
        RETURN;
    END IF;
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', mark, true);
    END IF;
    UPDATE job_queue SET status = 'waiting' WHERE id = ANY(held);
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', '', true);
    END IF;
END
$$;

-- 0033's settle; a job it brings back from `cancelled` holds its released children again.
CREATE OR REPLACE FUNCTION sidelinja_settle_children(children UUID[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mark text := pg_current_xact_id()::text;
    outermost boolean := current_setting('sidelinja.settling', true) IS DISTINCT FROM mark;
    moved UUID[];
    reopened UUID[];
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
            SELECT c.id, c.status AS was,
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
            RETURNING c.id, c.has_children, c.status, s.was
        )
        SELECT ARRAY(SELECT id FROM settled WHERE has_children),
               ARRAY(SELECT id FROM settled
                     WHERE has_children AND was = 'cancelled' AND status <> 'cancelled')
        INTO moved, reopened;
        -- A job this level brought back from `cancelled` had released its children on
        -- run_anyway edges: those still queued wait for it again.
        IF cardinality(reopened) > 0 THEN
            PERFORM sidelinja_hold_again(ARRAY(
                SELECT d.child_id FROM unnest(reopened) AS p(id)
                JOIN job_dependencies d ON d.parent_id = p.id));
        END IF;
        -- The next level: what the statement trigger settled for these rows' UPDATE before.
        children := sidelinja_held_children(moved);
    END LOOP;
    IF outermost THEN
        PERFORM set_config('sidelinja.settling', '', true);
    END IF;
END
$$;
