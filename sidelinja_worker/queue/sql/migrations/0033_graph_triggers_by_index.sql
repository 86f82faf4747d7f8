-- Job graphs of any size or shape stay cheap to declare and to settle. Three changes:
--
-- 1. The cycle check of new edges looks from the smaller side. Before (0024), each new
-- edge walked everything below its child among the jobs of its instant, whole, under the
-- advisory lock every edge insert of the database waits for. A chain built from its end up, one
-- edge per statement (each new parent above the chain so far), walked the whole chain each
-- time: 1,000 jobs took 82 s in a new database (its statistics from an empty table), 400 took
-- 6 s, and every other graph insert of every workspace waited that long.
--
-- A cycle through a new edge p -> c means c reaches p. Now the check first walks, for all the
-- statement's new edges at once, up from their parents (everything that reaches a new parent)
-- and down from their children (everything a new child reaches), each walk within its edges'
-- instant and stopped at a bound that grows fourfold per round. As soon as one walk ends below
-- its bound it is whole, and it settles the question for every edge if no new child is among
-- the parents' ancestors (or no new parent among the children's descendants): no new edge can
-- then close a cycle. A chain built from either end, a fan-out or a fan-in thus costs a few
-- rows per edge, whatever the graph's size. Only when a new child does reach a new parent (the
-- statement inserts a path of several new edges, or a real cycle) or both walks outgrow 65,536
-- rows does the check look further: it gathers the jobs on paths from a new child to a new
-- parent and peels them (Kahn's algorithm) in a temporary table, in time linear in those jobs
-- (sidelinja_job_on_a_cycle). Before, each new edge walked down from its child on its own: a
-- chain of 5,000 jobs declared in one statement (as the client declares a graph) took 15 s, now
-- 1 s. A role that may not create temporary tables gets that per-edge walk still.
--
-- Each step of a walk looks up the edges of the jobs it reached, and their jobs' instants, by
-- index, one job at a time (a lateral subquery the planner may not flatten: OFFSET 0). Before,
-- the planner, which takes a recursive walk's rows for a handful, joined each level of a walk
-- to the whole edge table by hashing it, so every level cost a scan of every edge ever made.
-- The walks' estimates are guesses far above what a walk does, so the functions that walk run
-- without JIT, which compiled each walk for ~140 ms whatever its size.
--
-- 2. The settle (0031) and the finish trigger found a level's held children, and the settle each
--    child's unfinished and failed parents, with joins the planner ordered by its statistics,
--    which are always stale for a graph being declared: its jobs and edges are new to its own
--    transaction. It scanned the waiting index and, for each waiting job, the edge table, and
--    for each child all edges (a fast-start plan for EXISTS): each edge insert of a graph built
--    one edge per statement cost the square of the graph so far. They now go from the jobs at
--    hand, edges by index and jobs by primary key, in lateral subqueries the planner may not
--    flatten (OFFSET 0). A chain of 400 built from its end up read 724,000 rows of job_queue
--    and job_dependencies, now ~10,000 (tests/test_workflows.py).
--
-- 3. The message a cancelled child gets from its failed parent is bounded. Before, it held the
--    parent's job type and error whole, and a child cancelled by a cancelled parent held that
--    parent's message whole, so each level of a graph carried the messages of all the levels
--    above it. A chain of 10,000 jobs failing at its head wrote 3.5 billion characters of
--    messages (each row's compressed for TOAST): 65 s in one statement, so the statement that
--    failed the head (the worker's, with its 10 s timeout; a rescue; a cancel) could not finish.
--    Every child of a parent copied the parent's error and type, which a plain-SQL writer makes
--    any size: 1,000 children of a parent whose error is 1 MB took 24 s and 1 GB.
--
--    Now the message names the parent with at most 200 characters of its type and 1,000 of its
--    error (for a cancelled parent, its own message: the nearest levels above it), so a child's
--    message is at most ~1,300 characters whatever the graph: the chain of 10,000 is cancelled in
--    1.5 s, the 1,000 children in 0.1 s and 3 MB. The failed ancestor itself is found by
--    following `cancelled_by` (as the admin's retry does).

-- The jobs that reach any of `jobs` (themselves included) through edges, and those any of them
-- reach, each walk within its start's instant (created_at), at most `bound` rows (NULL: all).
-- Each step looks up the edges of the jobs it reached, and their jobs' instants, by index, one
-- job at a time, in a lateral subquery the planner may not flatten (OFFSET 0). The walk is lazy:
-- it stops once `bound` rows are read.
CREATE OR REPLACE FUNCTION sidelinja_jobs_above(instants timestamptz[], jobs UUID[], bound int)
RETURNS TABLE (instant timestamptz, node UUID)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up(instant, node) AS (
        SELECT i, j FROM unnest(instants, jobs) AS s(i, j)
        UNION
        SELECT u.instant, n.node
        FROM up u
        CROSS JOIN LATERAL (
            SELECT d.parent_id AS node FROM job_dependencies d
            WHERE d.child_id = u.node
              AND (SELECT j.created_at FROM job_queue j WHERE j.id = d.parent_id) = u.instant
            OFFSET 0
        ) n
    )
    SELECT instant, node FROM up LIMIT bound
$$;

CREATE OR REPLACE FUNCTION sidelinja_jobs_below(instants timestamptz[], jobs UUID[], bound int)
RETURNS TABLE (instant timestamptz, node UUID)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE down(instant, node) AS (
        SELECT i, j FROM unnest(instants, jobs) AS s(i, j)
        UNION
        SELECT w.instant, n.node
        FROM down w
        CROSS JOIN LATERAL (
            SELECT d.child_id AS node FROM job_dependencies d
            WHERE d.parent_id = w.node
              AND (SELECT j.created_at FROM job_queue j WHERE j.id = d.child_id) = w.instant
            OFFSET 0
        ) n
    )
    SELECT instant, node FROM down LIMIT bound
$$;

CREATE OR REPLACE FUNCTION sidelinja_edges_added() RETURNS trigger
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    bad RECORD;
    parents uuid[];
    children uuid[];
    instants timestamptz[];
    bound int := 4;
    whole bool;
    hit bool;
    settled bool := false;
    checked bool;
    cyclic uuid;
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
    SELECT array_agg(e.parent_id), array_agg(e.child_id), array_agg(p.created_at)
    INTO parents, children, instants
    FROM new_edges e
    JOIN job_queue p ON p.id = e.parent_id
    JOIN job_queue c ON c.id = e.child_id
    WHERE p.created_at = c.created_at;
    IF parents IS NULL THEN
        settled := true;
    END IF;
    WHILE NOT settled AND bound <= 65536 LOOP
        -- Up from the new parents: is a new child among what reaches them?
        WITH seen AS MATERIALIZED (
            SELECT instant, node FROM sidelinja_jobs_above(instants, parents, bound)
        )
        SELECT (SELECT count(*) FROM seen) < bound,
               EXISTS (SELECT 1 FROM seen s
                       JOIN unnest(instants, children) AS c(i, node)
                         ON c.node = s.node AND c.i = s.instant)
        INTO whole, hit;
        IF whole THEN
            settled := NOT hit;
            EXIT;
        END IF;
        -- Down from the new children: is a new parent among what they reach?
        WITH seen AS MATERIALIZED (
            SELECT instant, node FROM sidelinja_jobs_below(instants, children, bound)
        )
        SELECT (SELECT count(*) FROM seen) < bound,
               EXISTS (SELECT 1 FROM seen s
                       JOIN unnest(instants, parents) AS p(i, node)
                         ON p.node = s.node AND p.i = s.instant)
        INTO whole, hit;
        IF whole THEN
            settled := NOT hit;
            EXIT;
        END IF;
        bound := bound * 4;
    END LOOP;
    IF NOT settled THEN
        SELECT c.checked, c.job INTO checked, cyclic
        FROM sidelinja_job_on_a_cycle(parents, children, instants) c;
        IF cyclic IS NOT NULL THEN
            RAISE EXCEPTION 'job dependencies would form a cycle through job %', cyclic
                USING ERRCODE = 'check_violation';
        END IF;
        -- No temporary table here (the role may not make one): each new edge's own walk.
        IF NOT checked THEN
            WITH RECURSIVE reach(origin, instant, node) AS (
                SELECT p, i, c FROM unnest(parents, instants, children) AS s(p, i, c)
                UNION
                SELECT r.origin, r.instant, n.node
                FROM reach r
                CROSS JOIN LATERAL (
                    SELECT d.child_id AS node FROM job_dependencies d
                    WHERE d.parent_id = r.node
                      AND (SELECT j.created_at FROM job_queue j WHERE j.id = d.child_id) = r.instant
                    OFFSET 0
                ) n
            )
            SELECT origin AS parent_id, node AS child_id INTO bad
            FROM reach WHERE node = origin LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'job dependencies would form a cycle through job %', bad.parent_id
                    USING ERRCODE = 'check_violation';
            END IF;
        END IF;
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

-- Whether the jobs on the statement's paths from a new child to a new parent (every cycle a new
-- edge closes runs through them) hold a cycle, by Kahn's peeling in a temporary table: in time
-- linear in those jobs and their edges, plus a statement per level. `job` is a job on a cycle,
-- found by walking back through jobs left over, each of which keeps a parent left over. A role
-- that may not create a temporary table gets checked = false, and the caller walks per edge.
CREATE OR REPLACE FUNCTION sidelinja_job_on_a_cycle(
    parents UUID[], children UUID[], instants timestamptz[], OUT checked bool, OUT job UUID
)
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    frontier UUID[];
    total bigint;
    peeled bigint := 0;
    seen bool;
BEGIN
    checked := true;
    BEGIN
        IF to_regclass('pg_temp.sidelinja_cycle_jobs') IS NULL THEN
            CREATE TEMPORARY TABLE sidelinja_cycle_jobs (
                node UUID PRIMARY KEY,
                parents_left int NOT NULL DEFAULT 0,
                seen bool NOT NULL DEFAULT false
            ) ON COMMIT DELETE ROWS;
            -- Any role this session later takes (SET ROLE, as poolers and PostgREST do) uses it
            -- too: a temporary table is the session's alone, and its maker owns it.
            GRANT ALL ON TABLE pg_temp.sidelinja_cycle_jobs TO PUBLIC;
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        checked := false;
        RETURN;
    END;
    DELETE FROM pg_temp.sidelinja_cycle_jobs;
    -- The jobs both below a new child and above a new parent, within the edges' instants.
    INSERT INTO pg_temp.sidelinja_cycle_jobs (node)
    SELECT DISTINCT u.node
    FROM sidelinja_jobs_above(instants, parents, NULL) u
    JOIN sidelinja_jobs_below(instants, children, NULL) w ON w.node = u.node
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS total = ROW_COUNT;
    UPDATE pg_temp.sidelinja_cycle_jobs t SET parents_left = k.n
    FROM (
        SELECT e.child_id, count(*) AS n
        FROM pg_temp.sidelinja_cycle_jobs p
        CROSS JOIN LATERAL (
            SELECT d.child_id FROM job_dependencies d WHERE d.parent_id = p.node OFFSET 0
        ) e
        GROUP BY e.child_id
    ) k
    WHERE t.node = k.child_id;
    frontier := ARRAY(SELECT node FROM pg_temp.sidelinja_cycle_jobs WHERE parents_left = 0);
    WHILE cardinality(frontier) > 0 LOOP
        peeled := peeled + cardinality(frontier);
        WITH hit AS (
            SELECT e.child_id, count(*) AS n
            FROM unnest(frontier) AS f(node)
            CROSS JOIN LATERAL (
                SELECT d.child_id FROM job_dependencies d WHERE d.parent_id = f.node OFFSET 0
            ) e
            GROUP BY e.child_id
        ), peeled_now AS (
            UPDATE pg_temp.sidelinja_cycle_jobs t SET parents_left = t.parents_left - h.n
            FROM hit h
            WHERE t.node = h.child_id
            RETURNING t.node, t.parents_left
        )
        SELECT coalesce(array_agg(node) FILTER (WHERE parents_left = 0), '{}')
        INTO frontier FROM peeled_now;
    END LOOP;
    IF peeled = total THEN
        RETURN;
    END IF;
    SELECT node INTO job FROM pg_temp.sidelinja_cycle_jobs WHERE parents_left > 0 LIMIT 1;
    LOOP
        UPDATE pg_temp.sidelinja_cycle_jobs t SET seen = true
        FROM pg_temp.sidelinja_cycle_jobs o
        WHERE t.node = job AND o.node = t.node
        RETURNING o.seen INTO seen;
        EXIT WHEN seen;
        SELECT d.parent_id INTO job
        FROM job_dependencies d
        JOIN pg_temp.sidelinja_cycle_jobs t ON t.node = d.parent_id AND t.parents_left > 0
        WHERE d.child_id = job
        LIMIT 1;
    END LOOP;
END
$$;

-- The children of these parents that a settle may move: waiting, or cancelled by a parent. From
-- each parent, its edges by the parent index and each child's row by its primary key, in a
-- lateral subquery the planner may not flatten (OFFSET 0). Flattened, a plan made while the
-- table held few waiting jobs (every graph's own transaction: its jobs are new) scanned the
-- waiting index and, for each of its jobs, every edge: each edge insert of a graph built one
-- edge per statement cost the square of the graph so far.
CREATE OR REPLACE FUNCTION sidelinja_held_children(parents UUID[]) RETURNS UUID[]
LANGUAGE sql STABLE AS $$
    SELECT ARRAY(
        SELECT DISTINCT n.child_id
        FROM unnest(parents) AS m(id)
        CROSS JOIN LATERAL (
            SELECT d.child_id FROM job_dependencies d
            WHERE d.parent_id = m.id
              AND (SELECT c.status = 'waiting'
                          OR (c.status = 'cancelled' AND c.cancelled_by IS NOT NULL)
                   FROM job_queue c WHERE c.id = d.child_id)
            OFFSET 0
        ) n)
$$;

-- 0031's settle, each next level read by sidelinja_held_children, its messages bounded (3).
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

-- 0031's trigger function, its children read by sidelinja_held_children.
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
    PERFORM sidelinja_settle_children(sidelinja_held_children(parents));
    RETURN NULL;
END
$$;
