-- The status-event threshold (`job_events_max_queue_usage`) reads any number in [0, 1] that
-- jsonb holds. 0021 and 0022 converted it to float8 through its text, and a number too small for
-- a float8 (1e-400: jsonb keeps numeric's range) made that conversion fail: the trigger on every
-- INSERT and UPDATE of job_queue failed with it (the web app's enqueues, every claim and every
-- completion), and so did the metrics' read of the queue state. Rounded to 15 decimals first,
-- it always fits; 1e-400 reads as 0, the smallest threshold (events paused). The functions are
-- those of 0021 and 0022 with that one change.

CREATE OR REPLACE FUNCTION sidelinja_job_events_max_usage() RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT CASE WHEN jsonb_typeof(value) = 'number'
                     THEN CASE WHEN value::text::numeric BETWEEN 0 AND 1
                               THEN round(value::text::numeric, 15)::float8 END END
         FROM queue_settings WHERE name = 'job_events_max_queue_usage'),
        0.5)
$$;

CREATE OR REPLACE FUNCTION sidelinja_publish_job_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    mode jsonb;
    max_usage float8;
BEGIN
    SELECT min(value::text) FILTER (WHERE name = 'job_events')::jsonb,
           min(CASE WHEN name = 'job_events_max_queue_usage' AND jsonb_typeof(value) = 'number'
                    THEN CASE WHEN value::text::numeric BETWEEN 0 AND 1
                              THEN round(value::text::numeric, 15)::float8 END END)
    INTO mode, max_usage
    FROM queue_settings WHERE name IN ('job_events', 'job_events_max_queue_usage');
    IF mode = 'false'::jsonb
       OR (mode = '"auto"'::jsonb
           AND NOT EXISTS (SELECT 1 FROM job_event_listeners WHERE expires_at > now()))
       OR pg_notification_queue_usage() >= coalesce(max_usage, 0.5) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('sidelinja_job_events',
                '{"workspace_id":"' || g.workspace_id || '","job_type":'
                || CASE WHEN octet_length(g.job_type_json) <= 512 THEN g.job_type_json
                        ELSE 'null' END
                || ',"status":"' || g.status || '","max_attempts":' || g.max_attempts
                || ',"ids":["' || array_to_string(g.ids[s:s + 149], '","')
                || '"],"attempts":[' || array_to_string(g.attempts[s:s + 149], ',') || ']}')
    FROM (SELECT n.workspace_id, to_json(n.job_type)::text AS job_type_json, n.status,
                 n.max_attempts, array_agg(n.id) AS ids, array_agg(n.attempts) AS attempts
          FROM new_rows n
          GROUP BY n.workspace_id, n.job_type, n.status, n.max_attempts) g,
         generate_series(1, cardinality(g.ids), 150) AS s;
    RETURN NULL;
END
$$;
