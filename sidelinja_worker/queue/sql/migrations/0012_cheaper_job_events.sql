-- The status-event trigger of 0009, same channel and same payloads, at about half the cost.
-- 0009 numbered each row within its group with a window function, which sorts every changed row
-- of the statement, to cut the groups into notifications of at most 150 jobs; this groups with
-- a hash aggregate and cuts each group's id arrays into slices of 150. The trigger's own time
-- per changed row (EXPLAIN ANALYZE of an UPDATE of status, median of 4, PostgreSQL 15 on this
-- 2-core machine): 500 rows 2.8 -> 1.6 µs, 20,000 rows 2.4 -> 1.5 µs. A claim and a completion
-- of 500 jobs each fire it once.
CREATE OR REPLACE FUNCTION sidelinja_publish_job_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT value = 'false'::jsonb FROM queue_settings WHERE name = 'job_events') THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('sidelinja_job_events', json_build_object(
                'workspace_id', g.workspace_id, 'job_type', g.job_type, 'status', g.status,
                'max_attempts', g.max_attempts,
                'ids', g.ids[s:s + 149], 'attempts', g.attempts[s:s + 149])::text)
    FROM (SELECT n.workspace_id, n.job_type, n.status, n.max_attempts,
                 array_agg(n.id) AS ids, array_agg(n.attempts) AS attempts
          FROM new_rows n
          GROUP BY n.workspace_id, n.job_type, n.status, n.max_attempts) g,
         generate_series(1, cardinality(g.ids), 150) AS s;
    RETURN NULL;
END
$$;
