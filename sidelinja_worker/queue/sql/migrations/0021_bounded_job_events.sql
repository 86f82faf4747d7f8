-- Status events and wake-ups never break a write. A notification is a hint; the INSERT or UPDATE
-- that sends it is the job itself, so no value and no state of PostgreSQL's notification queue
-- may make the write fail.
--
-- 1. The payload limit. NOTIFY refuses payloads of 8000 bytes or more, and an error in an AFTER
--    trigger aborts the statement. Every field of an event but job_type has a bounded length:
--    a uuid, an enum label, smallints, and at most 150 ids and attempts per notification (a
--    batch of any size is cut into notifications of 150). The longest possible payload is
--    136 bytes of keys and fixed fields + 150 x 46 bytes of ids and attempts + job_type, so
--    job_type is sent only while its JSON text is at most 512 bytes (7,548 bytes at most in
--    all); a longer one is sent as "job_type": null, and the event still names its jobs.
--
-- 2. The queue's size. PostgreSQL keeps notifications until the slowest listening session has
--    read them; one that LISTENs and then stops reading (a hung client, a session left in an
--    open transaction) holds the queue's tail, and once the queue is full (8 GB of pages in
--    PostgreSQL 15 and 16; max_notify_queue_pages from 17) every transaction that notifies
--    fails at commit with "too many notifications in the NOTIFY queue". So the triggers look at
--    pg_notification_queue_usage() (the fraction of that maximum in use) first: status events
--    stop while it is at or above the queue setting `job_events_max_queue_usage` (default 0.5),
--    and wake-ups stop at 0.9 (workers then find new jobs by polling, every poll interval).
--    Job writes therefore never fill the queue past 90 %; what fills it further is someone
--    else's NOTIFY. `sidelinja_notify_queue_state()` reads the usage and which of the two are
--    paused: the alarm to graph (anything above a few percent means a listener stopped reading;
--    pg_stat_activity shows which session has been idle in transaction or has stopped).
--
-- The two bounds cost one settings query and one usage reading per statement: PostgreSQL's
-- instructions per job for a claim and its completion (bench/pg_instructions.py, fair claim,
-- 10 workspaces, claims of 1,000) 168,969 -> 169,118.

INSERT INTO queue_settings (name, value) VALUES ('job_events_max_queue_usage', '0.5')
ON CONFLICT (name) DO NOTHING;

-- The usage at or above which status events stop; a value that is not a number in [0, 1] reads
-- as the default rather than failing the write that asked.
CREATE OR REPLACE FUNCTION sidelinja_job_events_max_usage() RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT CASE WHEN jsonb_typeof(value) = 'number'
                     THEN CASE WHEN value::text::numeric BETWEEN 0 AND 1
                               THEN value::text::float8 END END
         FROM queue_settings WHERE name = 'job_events_max_queue_usage'),
        0.5)
$$;

CREATE OR REPLACE FUNCTION sidelinja_notify_queue_state(
    OUT usage float8, OUT events_paused boolean, OUT wakeups_paused boolean
)
LANGUAGE sql STABLE AS $$
    SELECT u, u >= sidelinja_job_events_max_usage(), u >= 0.9
    FROM pg_notification_queue_usage() AS u
$$;

CREATE OR REPLACE FUNCTION sidelinja_notify_job_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_notification_queue_usage() < 0.9 THEN
        PERFORM pg_notify('sidelinja_job_due', '');
    END IF;
    RETURN NULL;
END
$$;

-- The status-event trigger of 0014 with the two bounds above; the same channel, groups and JSON.
-- Both settings are read by one query whose plan PL/pgSQL keeps (a call of the SQL function
-- above would plan its body again for every statement).
CREATE OR REPLACE FUNCTION sidelinja_publish_job_events() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    switched_off boolean;
    max_usage float8;
BEGIN
    SELECT coalesce(bool_or(name = 'job_events' AND value = 'false'::jsonb), false),
           min(CASE WHEN name = 'job_events_max_queue_usage' AND jsonb_typeof(value) = 'number'
                    THEN CASE WHEN value::text::numeric BETWEEN 0 AND 1
                              THEN value::text::float8 END END)
    INTO switched_off, max_usage
    FROM queue_settings WHERE name IN ('job_events', 'job_events_max_queue_usage');
    IF switched_off OR pg_notification_queue_usage() >= coalesce(max_usage, 0.5) THEN
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
