-- Status events that cost (almost) nothing while no one listens. Building and sending the events
-- is most of the status-event trigger's work, and every claim and completion pays it even when no
-- admin page, SpacetimeDB bridge or other client is listening. PostgreSQL cannot tell a session
-- who else LISTENs, so listeners say so here: a listener registers with a lease and renews it
-- while it listens, and with the queue setting `job_events` = "auto" the trigger publishes only
-- while some lease is live. A listener that dies stops the events within its lease.
--
--   SELECT sidelinja_job_events_listen('<listener uuid>', 'admin', 60);  -- register or renew
--   SELECT sidelinja_job_events_unlisten('<listener uuid>');              -- done listening
--   UPDATE queue_settings SET value = '"auto"' WHERE name = 'job_events';
--
-- `job_events` stays true (always publish) until every listener of the deployment registers:
-- a listener that does not register would see nothing in auto mode. false still turns events
-- off. In auto mode the trigger itself still runs: PostgreSQL keeps the transition table for it
-- whatever it decides, which is the part that remains (bench/pg_instructions.py --pieces).
--
-- The trigger function becomes SECURITY DEFINER, so that a role inserting jobs (the web app)
-- needs no rights on the settings and listener tables; it reads only those two tables and the
-- statement's own new rows, and sets its search_path.

CREATE TABLE IF NOT EXISTS job_event_listeners (
    id         UUID PRIMARY KEY,
    label      TEXT NOT NULL DEFAULT '',
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE OR REPLACE FUNCTION sidelinja_job_events_listen(listener UUID, label TEXT, lease_s float8)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO job_event_listeners (id, label, expires_at)
    VALUES (listener, coalesce(label, ''),
            now() + make_interval(secs => least(greatest(lease_s, 1), 3600)))
    ON CONFLICT (id) DO UPDATE SET label = EXCLUDED.label, expires_at = EXCLUDED.expires_at;
    DELETE FROM job_event_listeners WHERE expires_at < now() - interval '1 hour';
$$;

CREATE OR REPLACE FUNCTION sidelinja_job_events_unlisten(listener UUID)
RETURNS void LANGUAGE sql AS $$
    DELETE FROM job_event_listeners WHERE id = listener;
$$;

-- The trigger of 0021 with the auto mode; the same channel, groups, JSON and bounds.
CREATE OR REPLACE FUNCTION sidelinja_publish_job_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    mode jsonb;
    max_usage float8;
BEGIN
    SELECT min(value::text) FILTER (WHERE name = 'job_events')::jsonb,
           min(CASE WHEN name = 'job_events_max_queue_usage' AND jsonb_typeof(value) = 'number'
                    THEN CASE WHEN value::text::numeric BETWEEN 0 AND 1
                              THEN value::text::float8 END END)
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
