-- The prune's walk of a graph (queries.sql `prune`) goes by index whatever the statistics say.
-- It looked up each job's edges in a lateral subquery the planner costed from the statistics
-- of job_dependencies: once ANALYZE had seen a fan-out (100,000 edges from one parent, so one
-- distinct parent_id), it took every lookup of a parent's children for the whole table and
-- scanned every edge for each job it walked. Pruning that one finished graph of 100,001 jobs
-- took 372 s; the worker's prune statement (10 s timeout) failed at every turn, and, as each
-- prune starts with the oldest graph jobs, nothing past retention was pruned any more.
--
-- Now the walk is this function, planned with sequential scans off: each job's edges are read
-- by idx_job_dependencies_parent and the primary key, a few rows each, so a graph costs its
-- size once (100,001 jobs: ~1 s), whatever ANALYZE saw.
CREATE OR REPLACE FUNCTION sidelinja_graph_of(seeds UUID[]) RETURNS SETOF UUID
LANGUAGE sql STABLE SET enable_seqscan = off AS $$
    WITH RECURSIVE graph(id) AS (
        SELECT unnest(seeds)
        UNION
        SELECT n.id
        FROM graph g
        CROSS JOIN LATERAL (
            SELECT d.child_id AS id FROM job_dependencies d WHERE d.parent_id = g.id
            UNION ALL
            SELECT d.parent_id FROM job_dependencies d WHERE d.child_id = g.id
        ) n
    )
    SELECT id FROM graph
$$;
