-- Runtime SQL of stats_parse (podcast download statistics), loaded by stats_store.py.

-- name: file_states
SELECT fingerprint, read_offset, complete
FROM podcast_log_files
WHERE workspace_id = $1 AND fingerprint = ANY($2::text[]);

-- name: lock_workspace
-- Serialises the commits of stats_parse runs of one workspace (a scheduled run and a manual one,
-- say): the second sees the first's offsets and re-reads from there instead of counting twice.
SELECT pg_advisory_xact_lock(hashtextextended('stats_parse:' || $1::uuid::text, 0));

-- name: add_salts
INSERT INTO podcast_stats_salts (workspace_id, day, salt)
SELECT $1, d.day, d.salt FROM unnest($2::date[], $3::bytea[]) AS d(day, salt)
ON CONFLICT (workspace_id, day) DO NOTHING;

-- name: salts
SELECT day, salt FROM podcast_stats_salts WHERE workspace_id = $1 AND day = ANY($2::date[]);

-- name: add_listens
INSERT INTO podcast_listener_days AS l (workspace_id, day, episode, listener, app, country,
                                        bytes, whole)
SELECT $1, r.day, r.episode, r.listener, r.app, r.country, r.bytes, r.whole
FROM unnest($2::date[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::bigint[],
            $8::boolean[]) AS r(day, episode, listener, app, country, bytes, whole)
ON CONFLICT (workspace_id, day, episode, listener)
-- The sum stops at BIGINT's top (the row's bytes are any writer's, and many runs add to one):
-- past it, the statement failed, and with it every run of the workspace.
DO UPDATE SET bytes = CASE WHEN l.bytes > 9223372036854775807 - EXCLUDED.bytes
                           THEN 9223372036854775807 ELSE l.bytes + EXCLUDED.bytes END,
              whole = l.whole OR EXCLUDED.whole;

-- name: count_downloads
-- Listeners of the touched days and episodes who now reached their episode's threshold (or, with
-- no size known, received a whole 200 response) are counted, once: `counted` flips only once.
WITH th AS (
    SELECT * FROM unnest($2::text[], $3::bigint[]) AS t(episode, threshold)
), newly AS (
    UPDATE podcast_listener_days l
    SET counted = true
    FROM th
    WHERE l.workspace_id = $1 AND l.day = ANY($4::date[]) AND l.episode = th.episode
      AND NOT l.counted
      AND CASE WHEN th.threshold IS NULL THEN l.whole ELSE l.bytes >= th.threshold END
    RETURNING l.day, l.episode, l.app, l.country
), added AS (
    INSERT INTO podcast_downloads_daily AS d (workspace_id, day, episode, app, country, downloads)
    SELECT $1, day, episode, app, country, count(*) FROM newly GROUP BY day, episode, app, country
    ON CONFLICT (workspace_id, day, episode, app, country)
    DO UPDATE SET downloads = d.downloads + EXCLUDED.downloads, updated_at = now()
    RETURNING 1
)
SELECT count(*) FROM newly;

-- name: save_files
INSERT INTO podcast_log_files AS f (workspace_id, fingerprint, last_name, read_offset, complete)
SELECT $1, r.fingerprint, r.name, r.read_offset, r.complete
FROM unnest($2::text[], $3::text[], $4::bigint[], $5::boolean[])
     AS r(fingerprint, name, read_offset, complete)
ON CONFLICT (workspace_id, fingerprint)
DO UPDATE SET last_name = EXCLUDED.last_name, read_offset = EXCLUDED.read_offset,
              complete = EXCLUDED.complete, updated_at = now();

-- name: prune
-- Listener rows and salts older than $2 go: a day that is over needs no more deduplication, and
-- without its salt a hash cannot be tied to an address. Log states unseen for $3 days go too
-- (Caddy keeps rotated files 90 days by default).
WITH l AS (DELETE FROM podcast_listener_days WHERE workspace_id = $1 AND day < $2),
     s AS (DELETE FROM podcast_stats_salts WHERE workspace_id = $1 AND day < $2)
DELETE FROM podcast_log_files
WHERE workspace_id = $1 AND updated_at < now() - make_interval(days => $3);

-- name: daily_downloads
SELECT day, episode, app, country, downloads
FROM podcast_downloads_daily
WHERE workspace_id = $1
ORDER BY day, episode, app, country;
