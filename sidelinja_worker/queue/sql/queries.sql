-- The only runtime SQL of sidelinja-worker. Each block starts with `-- name: NAME`; store.py
-- has one typed function per block. Parameters are asyncpg's $1, $2, ...

-- The claims. One statement per algorithm; the worker picks one (store.claim_statement):
--   claim              oldest first, no cap counted (fairness off, or nothing capped);
--   claim_capped       oldest first, job type caps counted;
--   claim_fair         round-robin across workspaces, workspace caps counted;
--   claim_fair_capped  round-robin across workspaces, workspace and job type caps counted.
-- All take $1 worker, $2 how many, $3 job types, $4 "now" (NULL: statement_timestamp(); tests
-- pass a time). The one clock serves due-ness, the worker's lease, `started_at` and the wait.
-- statement_timestamp(), not now(): a capped claim first waits for the claim lock in its
-- transaction, and `started_at` must say when the job was really claimed. A worker whose lease
-- has lapsed (declared dead by another worker) claims nothing. The attempt is counted here, at
-- claim, so a job whose worker dies has used an attempt. Each claim locks its rows and then
-- updates them by their `ctid` (`ctid = ANY(ARRAY(...))`, a TID scan): the row version it just
-- locked, which nobody else can update before this statement ends, so the UPDATE reads each
-- row straight from its heap page instead of looking its id up in the primary key again (that
-- look-up, a bitmap scan of 2,000 ids, was ~4 % of PostgreSQL's work per job). Should a row
-- have moved between the snapshot and the lock (another writer updated it), its locked
-- version is not the one the TID scan finds, so it is left as it is, still due, for the next
-- claim: never claimed twice, never lost. The obvious `UPDATE ... FROM picked` is often
-- planned as a hash join over the whole table.
-- A claim looks each of its job types up among the pauses by key, never reads the pauses
-- whole: an operator's 100,000 pauses of other types made a claim of 50 take 12 ms, not 0.7.
-- Every claim ends in the same UPDATE of the rows it chose: `_claim_set` and
-- `_claim_returning` below, included (queries.parse).

-- name: _claim_set
-- Every value a claim computes from a row holds for any value plain SQL can write: the attempt
-- count stops at smallint's top (32767, a job long past any max_attempts) instead of failing
-- the statement, and (in _claim_returning) a scheduled_for of -infinity (due since ever) has
-- waited 0 s, as subtracting it fails too. Either failure would fail every claim of every
-- worker while that row was due: one row of one workspace would stop the whole queue.
SET status = 'running',
    started_at = coalesce($4::timestamptz, statement_timestamp()),
    attempts = least(attempts, 32766) + 1,
    worker_id = $1,
    cancel_requested_at = NULL

-- name: _claim_returning
-- A claim carries a payload only when it is stored uncompressed in at most 8 kB, so at most
-- that many bytes of JSON per job: a claim of 2,000 jobs must not bring a worker 2,000 giant
-- (or compressed, far bigger) payloads that any plain-SQL insert can write. Others come back
-- NULL (the column is NOT NULL, so NULL means "left behind"), and the executor reads each one
-- alone when its job runs (job_payload), within MAX_PAYLOAD_BYTES.
RETURNING id, workspace_id, job_type,
          CASE WHEN pg_column_size(payload) <= 8192 AND pg_column_compression(payload) IS NULL
               THEN payload END AS payload,
          priority, attempts, max_attempts, timeout_s,
          CASE WHEN isfinite(scheduled_for)
               THEN extract(epoch FROM coalesce($4::timestamptz, statement_timestamp())
                                       - scheduled_for)::float8
               ELSE 0 END AS waited_s, traceparent;

-- name: claim
-- Up to $2 due jobs, highest priority first, then oldest scheduled_for (the seed's order).
WITH picked AS (
    SELECT ctid
    FROM job_queue
    WHERE status IN ('pending', 'retry')
      AND scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
      AND ($3::text[] IS NULL OR job_type = ANY(ARRAY(
               SELECT t FROM unnest($3::text[]) AS t
               WHERE NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = t))))
      AND ($3::text[] IS NOT NULL
           OR NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = job_queue.job_type))
      AND EXISTS (SELECT 1 FROM job_workers w
                  WHERE w.id = $1 AND w.expires_at > coalesce($4::timestamptz, statement_timestamp()))
    ORDER BY priority DESC, scheduled_for
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue
-- include: _claim_set
WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked))
-- include: _claim_returning

-- name: claim_capped
-- `claim` with job type caps: a type with a cap has room for `cap - running` more, counted
-- exactly because the caller holds the claim lock (lock_limited_claims). Four times the claim
-- is locked as candidates, so that a capped type at the head of the queue does not leave the
-- claim empty while other types' jobs wait behind it.
WITH type_room AS (
    SELECT t.job_type,
           coalesce((SELECT greatest(l.max_running - (
                         SELECT count(*) FROM job_queue r
                         WHERE r.status = 'running' AND r.job_type = l.job_type), 0)
                     FROM job_type_limits l WHERE l.job_type = t.job_type), $2) AS room
    FROM unnest($3::text[]) AS t(job_type)
    WHERE NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = t.job_type)
), candidates AS (
    SELECT j.ctid, j.priority, j.scheduled_for, j.job_type
    FROM job_queue j
    WHERE j.status IN ('pending', 'retry')
      AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
      AND j.job_type = ANY(ARRAY(SELECT job_type FROM type_room WHERE room > 0))
    ORDER BY j.priority DESC, j.scheduled_for
    LIMIT $2 * 4
    FOR UPDATE SKIP LOCKED
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.job_type
                                   ORDER BY c.priority DESC, c.scheduled_for) AS type_rank
    FROM candidates c
), chosen AS (
    SELECT r.ctid
    FROM ranked r
    JOIN type_room tr ON tr.job_type = r.job_type
    WHERE r.type_rank <= tr.room
      AND EXISTS (SELECT 1 FROM job_workers w
                  WHERE w.id = $1 AND w.expires_at > coalesce($4::timestamptz, statement_timestamp()))
    ORDER BY r.priority DESC, r.scheduled_for
    LIMIT $2
)
UPDATE job_queue
-- include: _claim_set
WHERE ctid = ANY(ARRAY(SELECT ctid FROM chosen))
-- include: _claim_returning

-- name: claim_fair
-- Within a priority level, jobs are taken round-robin across workspaces, so 50,000 jobs of one
-- workspace do not starve another's single job. Priority still comes first.
-- 1. due_workspaces: the workspaces with a due job, by a skip scan of
--    idx_job_queue_workspace_pending (one index descent per such workspace, landing on its head
--    job), never a probe of every row of `workspaces`; ws: those with room under their cap
--    (workspace_limits, counted exactly under the claim lock the caller takes when one is set).
-- 2. asked: only the $2 workspaces whose head jobs come first in the fair order (priority, then
--    age: every head is a first turn) can be in the claim, so a claim of 50 locks ~50 rows,
--    not one per busy workspace. Each is asked for an even share, ceil($2 / asked). Heads of
--    equal priority and age (jobs inserted by one statement) are ordered by a draw made anew
--    for each claim: in workspace order instead, the same workspaces would win every tie, and
--    a busy one's next job (as old as its last) would keep coming before another's first.
-- 3. locked: each share, locked in its own index scan, so concurrent workers skip each other's
--    candidates. A job's turn is its place within its priority level in its workspace's
--    share. A workspace that gave its whole share may hold more: its next, unseen job is the
--    "frontier", and only candidates before the earliest frontier in the fair order
--    (priority DESC, turn) are taken. The claim may come back short, never out of order.
--    Priorities are negated as integers: smallint's lowest, -32768, which any writer may
--    give a job, has no negation in smallint, and failed every claim while it was due.
-- 4. locked_one: with one workspace asked, its queue order is the fair order, so its jobs are
--    taken straight from its index: no windows, no sort, no materialised rows (the common
--    case of a backlog from one workspace).
WITH RECURSIVE open_types AS MATERIALIZED (
    SELECT ARRAY(SELECT t FROM unnest($3::text[]) AS t
                 WHERE NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = t)) AS types
), due_workspaces AS (
    (SELECT j.workspace_id AS id, j.priority, j.scheduled_for
     FROM job_queue j
     WHERE j.status IN ('pending', 'retry')
       AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
       AND j.job_type = ANY((SELECT types FROM open_types)::text[])
     ORDER BY j.workspace_id, j.priority DESC, j.scheduled_for
     LIMIT 1)
    UNION ALL
    SELECT head.*
    FROM due_workspaces d
    CROSS JOIN LATERAL (
        SELECT j.workspace_id, j.priority, j.scheduled_for
        FROM job_queue j
        WHERE j.workspace_id > d.id
          AND j.status IN ('pending', 'retry')
          AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
          AND j.job_type = ANY((SELECT types FROM open_types)::text[])
        ORDER BY j.workspace_id, j.priority DESC, j.scheduled_for
        LIMIT 1
    ) head
), ws AS MATERIALIZED (
    SELECT * FROM (
        SELECT d.id, d.priority AS head_priority, d.scheduled_for AS head_scheduled_for,
               CASE WHEN wl.max_running IS NULL THEN $2
                    ELSE least($2, greatest(wl.max_running - (
                        SELECT count(*) FROM job_queue r
                        WHERE r.status = 'running' AND r.workspace_id = d.id), 0))
               END AS room
        FROM due_workspaces d
        LEFT JOIN workspace_limits wl ON wl.workspace_id = d.id
    ) w
    WHERE room > 0
), asked AS MATERIALIZED (  -- none when this worker's lease has lapsed
    SELECT id, room, random() AS luck FROM ws
    WHERE EXISTS (SELECT 1 FROM job_workers w
                  WHERE w.id = $1 AND w.expires_at > coalesce($4::timestamptz, statement_timestamp()))
    ORDER BY head_priority DESC, head_scheduled_for, luck
    LIMIT $2
), share AS (
    SELECT ((count(*) + $2 - 1) / greatest(count(*), 1))::int AS k,
           count(*) = 1 AS one
    FROM asked
), locked AS MATERIALIZED (
    SELECT c.ctid, c.priority, c.scheduled_for, c.place - c.level_start + 1 AS turn, a.luck,
           c.place = share.k AND share.k < a.room AS frontier  -- its share is full: more may wait
    FROM asked a
    CROSS JOIN share
    CROSS JOIN LATERAL (
        SELECT q.*,
               row_number() OVER (ORDER BY q.priority DESC, q.scheduled_for) AS place,
               rank() OVER (ORDER BY q.priority DESC) AS level_start  -- its level's first place
        FROM (
            SELECT j.ctid, j.priority, j.scheduled_for
            FROM job_queue j
            WHERE j.workspace_id = a.id
              AND j.status IN ('pending', 'retry')
              AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
              AND j.job_type = ANY((SELECT types FROM open_types)::text[])
            ORDER BY j.priority DESC, j.scheduled_for
            LIMIT least(a.room, share.k)
            FOR UPDATE SKIP LOCKED
        ) q
    ) c
    WHERE NOT share.one
), locked_one AS (
    SELECT j.ctid
    FROM job_queue j
    WHERE (SELECT one FROM share)
      AND j.workspace_id = (SELECT id FROM asked LIMIT 1)
      AND j.status IN ('pending', 'retry')
      AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
      AND j.job_type = ANY((SELECT types FROM open_types)::text[])
    ORDER BY j.priority DESC, j.scheduled_for
    LIMIT (SELECT room FROM asked LIMIT 1)
    FOR UPDATE SKIP LOCKED
), frontier AS (
    SELECT -priority::int AS neg_priority, turn FROM locked WHERE frontier
    ORDER BY 1, turn LIMIT 1
), chosen AS (
    SELECT c.ctid
    FROM locked c
    WHERE NOT EXISTS (  -- behind the frontier: an unseen job of a cut workspace comes first
        SELECT 1 FROM frontier f WHERE (-c.priority::int, c.turn) > (f.neg_priority, f.turn))
    ORDER BY c.priority DESC, c.turn, c.scheduled_for, c.luck
    LIMIT $2
)
UPDATE job_queue
-- include: _claim_set
WHERE ctid = ANY(ARRAY(SELECT ctid FROM chosen UNION ALL SELECT ctid FROM locked_one))
-- include: _claim_returning

-- name: claim_fair_capped
-- `claim_fair` with job type caps (type_room, as in `claim_capped`). Every busy workspace with
-- room is asked, not only the first $2: a capped type's heads could fill the first $2 and
-- starve the other types' jobs behind them. Within the fair order, a job is taken only while
-- its type has room (type_rank).
WITH RECURSIVE type_room AS (
    SELECT t.job_type,
           coalesce((SELECT greatest(l.max_running - (
                         SELECT count(*) FROM job_queue r
                         WHERE r.status = 'running' AND r.job_type = l.job_type), 0)
                     FROM job_type_limits l WHERE l.job_type = t.job_type), $2) AS room
    FROM unnest($3::text[]) AS t(job_type)
    WHERE NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = t.job_type)
), open_types AS MATERIALIZED (
    SELECT coalesce(array_agg(job_type), '{}') AS types FROM type_room WHERE room > 0
), due_workspaces AS (
    (SELECT j.workspace_id AS id
     FROM job_queue j
     WHERE j.status IN ('pending', 'retry')
       AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
       AND j.job_type = ANY((SELECT types FROM open_types)::text[])
     ORDER BY j.workspace_id, j.priority DESC, j.scheduled_for
     LIMIT 1)
    UNION ALL
    SELECT head.*
    FROM due_workspaces d
    CROSS JOIN LATERAL (
        SELECT j.workspace_id
        FROM job_queue j
        WHERE j.workspace_id > d.id
          AND j.status IN ('pending', 'retry')
          AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
          AND j.job_type = ANY((SELECT types FROM open_types)::text[])
        ORDER BY j.workspace_id, j.priority DESC, j.scheduled_for
        LIMIT 1
    ) head
), asked AS MATERIALIZED (
    SELECT * FROM (
        SELECT d.id, random() AS luck,
               CASE WHEN wl.max_running IS NULL THEN $2
                    ELSE least($2, greatest(wl.max_running - (
                        SELECT count(*) FROM job_queue r
                        WHERE r.status = 'running' AND r.workspace_id = d.id), 0))
               END AS room
        FROM due_workspaces d
        LEFT JOIN workspace_limits wl ON wl.workspace_id = d.id
    ) w
    WHERE room > 0
), share AS (
    SELECT ((count(*) + $2 - 1) / greatest(count(*), 1))::int AS k FROM asked
), locked AS MATERIALIZED (
    SELECT c.ctid, c.priority, c.scheduled_for, c.job_type, c.place - c.level_start + 1 AS turn,
           a.luck, c.place = share.k AND share.k < a.room AS frontier
    FROM asked a
    CROSS JOIN share
    CROSS JOIN LATERAL (
        SELECT q.*,
               row_number() OVER (ORDER BY q.priority DESC, q.scheduled_for) AS place,
               rank() OVER (ORDER BY q.priority DESC) AS level_start
        FROM (
            SELECT j.ctid, j.priority, j.scheduled_for, j.job_type
            FROM job_queue j
            WHERE j.workspace_id = a.id
              AND j.status IN ('pending', 'retry')
              AND j.scheduled_for <= coalesce($4::timestamptz, statement_timestamp())
              AND j.job_type = ANY((SELECT types FROM open_types)::text[])
            ORDER BY j.priority DESC, j.scheduled_for
            LIMIT least(a.room, share.k)
            FOR UPDATE SKIP LOCKED
        ) q
    ) c
), frontier AS (
    SELECT -priority::int AS neg_priority, turn FROM locked WHERE frontier
    ORDER BY 1, turn LIMIT 1
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.job_type
                                   ORDER BY c.priority DESC, c.turn, c.scheduled_for, c.luck)
               AS type_rank
    FROM locked c
    WHERE NOT EXISTS (
        SELECT 1 FROM frontier f WHERE (-c.priority::int, c.turn) > (f.neg_priority, f.turn))
), chosen AS (
    SELECT r.ctid
    FROM ranked r
    JOIN type_room tr ON tr.job_type = r.job_type
    WHERE r.type_rank <= tr.room
      AND EXISTS (SELECT 1 FROM job_workers w
                  WHERE w.id = $1 AND w.expires_at > coalesce($4::timestamptz, statement_timestamp()))
    ORDER BY r.priority DESC, r.turn, r.scheduled_for, r.luck
    LIMIT $2
)
UPDATE job_queue
-- include: _claim_set
WHERE ctid = ANY(ARRAY(SELECT ctid FROM chosen))
-- include: _claim_returning

-- name: lock_limited_claims
-- Serialises the claims that count running jobs against a cap, cluster-wide, for one
-- transaction. Claims with no cap in play never take it. A row lock, not an advisory one:
-- any role may take any advisory lock, and a web role's would stop every capped claim
-- (migration 0040).
SELECT one FROM job_claim_lock FOR UPDATE;

-- name: limits
-- Everything a worker caches about limits; re-read on `sidelinja_limits_changed` and every few
-- seconds: the caps of the worker's job types $1 (NULL: every type), whether any workspace has
-- a cap, and whether claims are fair. Only what the worker's claims need, however many rows the
-- tables hold: the caps of every type ever written, names of any length included, came back
-- as one JSON object, and past 256 MB PostgreSQL refused to build it, failing every worker's
-- start. Rate limits are read at each call (rate_acquire), never cached.
SELECT
    (SELECT coalesce(jsonb_object_agg(job_type, max_running), '{}') FROM job_type_limits
     WHERE $1::text[] IS NULL OR job_type = ANY($1::text[])) AS type_caps,
    EXISTS (SELECT FROM workspace_limits) AS workspace_capped,
    (SELECT coalesce((SELECT value = 'true' FROM queue_settings WHERE name = 'fair_workspaces'), true)) AS fair;

-- name: rate_acquire
-- One call to the service `$1` if the limit allows it now: records the grant and returns
-- (true, …); otherwise (false, seconds until a call may be allowed). A key with no row (no
-- limit, never paused) is always granted. The UPDATE re-checks its
-- WHERE against the row's latest version under the row lock, so concurrent workers never
-- overrun the limit. clock_timestamp(), not now(): a grant is recorded at the moment it is
-- made, after any wait for the row lock (concurrent workers queue on it), not when the
-- statement began; with now() a call that waited 0.3 s for the lock was recorded 0.3 s early,
-- and the window it opened closed 0.3 s too soon. $2: a safety margin added to the window, so
-- that differences in the time from grant to the request reaching the service never let a 21st
-- call into a window. A pause until 'infinity' waits a year (as in `limits`), and a window
-- written by SQL longer than 366 days (31,622,400 s; per_s is a float, so 'Infinity' or 1e300,
-- which no interval holds) counts as that long: the job is deferred, never failed by the
-- arithmetic. A grant time later than the clock is no grant: grants are recorded at this clock,
-- so such a time was written by SQL ('infinity', which fails the arithmetic too) or before the
-- clock was set back (a jump ahead, corrected), and counted it would fill the window until that
-- time (the service's calls deferred, a week at a time, for as long). Dropping it lets a
-- clock set back by a few seconds admit that many seconds' grants again, once.
WITH granted AS (
    UPDATE rate_limits
    SET recent = CASE WHEN max_requests IS NULL THEN '{}'::timestamptz[]
                      ELSE array(SELECT t FROM unnest(recent) t
                                 WHERE t <= clock_timestamp()
                                   AND t > clock_timestamp()
                                           - make_interval(secs => least(per_s, 31622400) + $2))
                           || clock_timestamp()
                 END
    WHERE key = $1
      AND paused_until <= clock_timestamp()
      AND (max_requests IS NULL
           OR (SELECT count(*) FROM unnest(recent) t
               WHERE t <= clock_timestamp()
                 AND t > clock_timestamp()
                         - make_interval(secs => least(per_s, 31622400) + $2)) < max_requests)
    RETURNING key
)
SELECT EXISTS (SELECT 1 FROM granted)
           OR NOT EXISTS (SELECT 1 FROM rate_limits WHERE key = $1) AS granted,
       coalesce((
           SELECT greatest(
               extract(epoch FROM least(greatest(paused_until, clock_timestamp()),
                                        clock_timestamp() + interval '1 year')
                                  - clock_timestamp()),
               coalesce(extract(epoch FROM (
                   SELECT t FROM unnest(recent) t
                   WHERE t <= clock_timestamp() AND t > clock_timestamp() - w.span
                   ORDER BY t DESC OFFSET max_requests - 1 LIMIT 1)
                   + w.span - clock_timestamp()), 0),
               0.01)
           FROM rate_limits
           CROSS JOIN LATERAL (SELECT make_interval(secs => least(per_s, 31622400) + $2)) AS w(span)
           WHERE key = $1), 0.01) AS wait_s;

-- name: rate_pause
-- A 429 with Retry-After: no worker calls the service `$1` for `$2` seconds.
INSERT INTO rate_limits (key, paused_until)
VALUES ($1, now() + make_interval(secs => $2))
ON CONFLICT (key) DO UPDATE
SET paused_until = greatest(rate_limits.paused_until, EXCLUDED.paused_until);

-- name: set_type_limit
INSERT INTO job_type_limits (job_type, max_running) VALUES ($1, $2)
ON CONFLICT (job_type) DO UPDATE SET max_running = EXCLUDED.max_running, updated_at = now();

-- name: clear_type_limit
DELETE FROM job_type_limits WHERE job_type = $1;

-- name: set_workspace_limit
INSERT INTO workspace_limits (workspace_id, max_running) VALUES ($1, $2)
ON CONFLICT (workspace_id) DO UPDATE SET max_running = EXCLUDED.max_running, updated_at = now();

-- name: clear_workspace_limit
DELETE FROM workspace_limits WHERE workspace_id = $1;

-- name: set_rate_limit
INSERT INTO rate_limits (key, max_requests, per_s) VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE
SET max_requests = EXCLUDED.max_requests, per_s = EXCLUDED.per_s, updated_at = now();

-- name: clear_rate_limit
DELETE FROM rate_limits WHERE key = $1;

-- name: set_queue_setting
INSERT INTO queue_settings (name, value) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = now();

-- name: list_limits
SELECT 'job type' AS kind, job_type AS name, max_running::text AS limit_text,
       (SELECT count(*) FROM job_queue r WHERE r.status = 'running' AND r.job_type = l.job_type) AS running,
       NULL::timestamptz AS paused_until
FROM job_type_limits l
UNION ALL
SELECT 'workspace', w.workspace_id::text, w.max_running::text,
       (SELECT count(*) FROM job_queue r WHERE r.status = 'running' AND r.workspace_id = w.workspace_id),
       NULL
FROM workspace_limits w
UNION ALL
SELECT 'rate', key,
       CASE WHEN max_requests IS NULL THEN 'no spacing'
            ELSE max_requests || ' per ' || per_s || ' s' END,
       NULL, nullif(paused_until, '-infinity')
FROM rate_limits
UNION ALL
SELECT 'setting', name, value::text, NULL, NULL
FROM queue_settings
ORDER BY 1, 2;

-- name: report_progress
-- Stored on the job and published for live pages; only while this worker holds it. The type is
-- sent only while its JSON text is at most 512 bytes, as the status-event trigger sends it
-- (null otherwise: pages read it from the row): NOTIFY refuses a payload of 8000 bytes, and
-- the refusal would roll the report back.
WITH updated AS (
    UPDATE job_queue
    SET progress = jsonb_build_object('message', $3::text, 'percent', $4::float8,
                                      'attempt', attempts, 'max_attempts', max_attempts,
                                      'at', now())
    WHERE id = $1 AND worker_id = $2 AND status = 'running'
    RETURNING id, workspace_id, job_type, status, progress
)
SELECT pg_notify('sidelinja_job_events', jsonb_build_object(
           'id', id, 'workspace_id', workspace_id,
           'job_type', CASE WHEN octet_length(to_jsonb(job_type)::text) <= 512 THEN job_type END,
           'status', status, 'progress', progress)::text)
FROM updated;

-- name: workspace_settings
-- The workspace's settings: their size as JSON text, and the settings only when that size is
-- within $2, as job_payload does. Every job of most types reads them, some twice, and the web
-- app writes them: settings of 100 MB were decoded on the worker's event loop for each read.
SELECT s.size, CASE WHEN s.size <= $2 THEN w.settings END AS settings
FROM workspaces w
CROSS JOIN LATERAL (
    SELECT CASE WHEN pg_column_size(w.settings) > $2 THEN pg_column_size(w.settings)::bigint
                ELSE octet_length(w.settings::text)::bigint END AS size
) s
WHERE w.id = $1;

-- name: complete
-- Batched success. The worker_id check drops the outcome of a job that was rescued from this
-- worker meanwhile (it has been, or will be, run again elsewhere).
UPDATE job_queue j
SET status = 'completed',
    result = r.result,
    completed_at = now()
FROM unnest($1::uuid[], $2::jsonb[]) AS r(id, result)
WHERE j.id = r.id
  AND j.status = 'running'
  AND j.worker_id = $3
RETURNING j.id;

-- name: fail
-- Batched failure. A permanent failure, or the last attempt, ends in `error`; otherwise `retry`
-- after the delay the worker computed (backoff, or the service's Retry-After). Every failure is
-- appended to `errors` while that history is stored in at most 1 MB (here and wherever a failure
-- is recorded: a history any plain-SQL writer made near jsonb's 255 MB limit must not fail the
-- whole batch, nor the rescue of every dead worker's jobs); `error_msg` keeps the latest, as
-- the seed has it.
UPDATE job_queue j
SET status = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                  THEN 'error' ELSE 'retry' END::job_status,
    scheduled_for = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                         THEN j.scheduled_for
                         ELSE now() + make_interval(secs => f.delay_s) END,
    completed_at = CASE WHEN f.permanent OR j.attempts >= j.max_attempts THEN now() END,
    error_msg = f.message,
    errors = CASE WHEN pg_column_size(j.errors) <= 1048576  -- the history stops at 1 MB
                  THEN j.errors || jsonb_build_array(jsonb_build_object(
                      'attempt', j.attempts, 'at', now(), 'class', f.kind, 'message', f.message))
                  ELSE j.errors END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bool[], $5::float8[])
     AS f(id, kind, message, permanent, delay_s)
WHERE j.id = f.id
  AND j.status = 'running'
  AND j.worker_id = $6;

-- name: _give_back_set
-- The end of a give-back's SET (`release`, `release_lost`): the job goes back to the queue
-- with the attempt taken at claim returned, it was not a failed attempt; or, when its cancel
-- was requested (cancel_requested_at), it ends `cancelled`, as its handler would have: put
-- back, its next claim cleared the request and ran it again.
    status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN j.attempts <= 1 THEN 'pending'
                  ELSE 'retry' END::job_status,
    attempts = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.attempts
                    ELSE greatest(j.attempts - 1, 0) END,
    started_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.started_at END,
    completed_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now()
                        ELSE j.completed_at END,
    error_msg = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled while running'
                     ELSE j.error_msg END,
    errors = CASE WHEN j.cancel_requested_at IS NOT NULL
                       AND pg_column_size(j.errors) <= 1048576  -- the history stops at 1 MB
                  THEN j.errors || jsonb_build_array(jsonb_build_object(
                      'attempt', j.attempts, 'at', now(), 'class', 'cancelled',
                      'message', 'cancelled while running'))
                  ELSE j.errors END,
    worker_id = NULL

-- name: release
-- Batched give-back: a deferral (resource governor, rate limit) or a job unfinished at shutdown
-- goes back to the queue at $2[i] (a job whose cancel was requested ends instead:
-- `_give_back_set`). A deferral's reason ($3[i]) is recorded in `progress` for `jobs why`.
UPDATE job_queue j
SET scheduled_for = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.scheduled_for
                         ELSE coalesce(r.run_at, now()) END,
    progress = CASE WHEN r.reason IS NULL THEN j.progress
                    ELSE jsonb_build_object('message', r.reason, 'deferred_until',
                                            coalesce(r.run_at, now()), 'at', now()) END,
-- include: _give_back_set
FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) AS r(id, run_at, reason)
WHERE j.id = r.id
  AND j.status = 'running'
  AND j.worker_id = $4;

-- name: cancelled
-- Batched end of running jobs whose cancellation was requested and honoured by the handler.
UPDATE job_queue j
SET status = 'cancelled',
    completed_at = now(),
    error_msg = 'cancelled while running',
    errors = CASE WHEN pg_column_size(j.errors) <= 1048576  -- the history stops at 1 MB
                  THEN j.errors || jsonb_build_array(jsonb_build_object(
                      'attempt', j.attempts, 'at', now(), 'class', 'cancelled',
                      'message', 'cancelled while running'))
                  ELSE j.errors END
WHERE j.id = ANY($1::uuid[])
  AND j.status = 'running'
  AND j.worker_id = $2;

-- name: enqueue
-- One round trip for any number of jobs. Ids are made by the client so that the caller gets them
-- back in its own order. A job whose unique key is already held by a queued (pending, retry,
-- waiting) or running job of its workspace is not inserted (the unique index decides, for every
-- writer); the caller then looks up the holder with `find_by_unique_keys`.
INSERT INTO job_queue (id, workspace_id, job_type, payload, priority, scheduled_for,
                       max_attempts, unique_key, timeout_s, traceparent)
SELECT j.id, j.workspace_id, j.job_type, j.payload, j.priority,
       coalesce(j.scheduled_for, now() + make_interval(secs => coalesce(j.delay_s, 0))),
       j.max_attempts, j.unique_key, j.timeout_s, j.traceparent
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::jsonb[], $5::smallint[],
            $6::timestamptz[], $7::float8[], $8::smallint[], $9::text[], $10::integer[],
            $11::text[])
     AS j(id, workspace_id, job_type, payload, priority, scheduled_for, delay_s,
          max_attempts, unique_key, timeout_s, traceparent)
ON CONFLICT (workspace_id, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running', 'waiting')
DO NOTHING
RETURNING id;

-- name: add_dependencies
-- Edges of a job graph (parent, child, run_anyway); the triggers of job_dependencies hold or
-- cancel the children and refuse cycles.
INSERT INTO job_dependencies (parent_id, child_id, run_anyway)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bool[])
ON CONFLICT DO NOTHING;

-- name: job_payload
-- A payload the claim left behind: its size as JSON text, its arrays and objects (every `[`
-- and `{` of its text, those inside strings too: an upper bound), and the payload itself only
-- when that size is within $2 and those within $3. A value stored bigger than $2 is refused
-- before it is decompressed. Each array or object is a Python object to make when decoded, on
-- the event loop: 4 MB of `[]` took the loop 0.8-5 s.
SELECT s.size, c.containers,
       CASE WHEN s.size <= $2 AND c.containers <= $3 THEN j.payload END AS payload
FROM job_queue j
CROSS JOIN LATERAL (
    SELECT CASE WHEN pg_column_size(j.payload) > $2 THEN pg_column_size(j.payload)::bigint
                ELSE octet_length(j.payload::text)::bigint END AS size
) s
CROSS JOIN LATERAL (
    SELECT CASE WHEN s.size > $2 THEN 0
                ELSE length(t.text) - length(translate(t.text, '[{', '')) END AS containers
    FROM (SELECT j.payload::text AS text) t
) c
WHERE j.id = $1;

-- name: parent_results
-- A job's parents with their results, for its handler (read only when the handler asks). A
-- join may have thousands of parents and any plain-SQL writer can make a result huge, so a
-- result comes back only while the results so far fit in $2 bytes of JSON, and `total` is
-- all of theirs together, for the caller to refuse a join over it. A result stored bigger than
-- $2 is counted by its stored size, never decompressed. A parent's type is any text a writer
-- gave it, megabytes included; no job type is longer than its first 200 characters. At most $3
-- parents come back, `parents` counting them all: any writer may give a job a million.
-- Only parents of the job's own workspace: the graph's triggers keep every edge within one,
-- and a role that may bypass triggers (a restore under session_replication_role) still
-- cannot hand a job another workspace's results.
SELECT p.id, left(p.job_type, 200) AS job_type, p.status::text AS status,
       CASE WHEN sum(s.size) OVER (ORDER BY p.created_at, p.id) <= $2 THEN p.result END AS result,
       sum(s.size) OVER () AS total, count(*) OVER () AS parents
FROM job_queue c
JOIN job_dependencies d ON d.child_id = c.id
JOIN job_queue p ON p.id = d.parent_id AND p.workspace_id = c.workspace_id
CROSS JOIN LATERAL (
    SELECT CASE WHEN pg_column_size(p.result) > $2 THEN pg_column_size(p.result)::bigint
                ELSE coalesce(octet_length(p.result::text), 0)::bigint END AS size
) s
WHERE c.id = $1
ORDER BY p.created_at, p.id
LIMIT $3;

-- name: job_relatives
-- A job's parents and children, for `jobs show`, `jobs why` and `ctx.children()`; each type to
-- its first 200 characters, as in `parent_results`. At most $2 of each, unfinished ones first
-- (what `jobs why` names), then by type and id: any writer may give a job a million
-- relatives, and each came back. `more` is how many of that relation are left out. Only
-- relatives in the job's own workspace, as in `parent_results`.
(SELECT 'parent' AS relation, p.id, left(p.job_type, 200) AS job_type, p.status::text AS status,
        d.run_anyway, greatest(count(*) OVER () - $2, 0) AS more
 FROM job_queue j
 JOIN job_dependencies d ON d.child_id = j.id
 JOIN job_queue p ON p.id = d.parent_id AND p.workspace_id = j.workspace_id
 WHERE j.id = $1
 ORDER BY p.status IN ('completed', 'error', 'cancelled'), 3, 2
 LIMIT $2)
UNION ALL
(SELECT 'child', c.id, left(c.job_type, 200), c.status::text, d.run_anyway,
        greatest(count(*) OVER () - $2, 0)
 FROM job_queue j
 JOIN job_dependencies d ON d.parent_id = j.id
 JOIN job_queue c ON c.id = d.child_id AND c.workspace_id = j.workspace_id
 WHERE j.id = $1
 ORDER BY c.status IN ('completed', 'error', 'cancelled'), 3, 2
 LIMIT $2)
ORDER BY 1 DESC, 3, 2;

-- name: has_child
-- Whether the job has a child of type $2 in its own workspace, looked up without reading its
-- other children (a child elsewhere, written past the graph's triggers, would keep
-- whisper_transcribe from adding the one its own workspace needs).
SELECT EXISTS (SELECT FROM job_queue j
               JOIN job_dependencies d ON d.parent_id = j.id
               JOIN job_queue c ON c.id = d.child_id AND c.workspace_id = j.workspace_id
               WHERE j.id = $1 AND c.job_type = $2);

-- name: find_by_unique_keys
-- The holders of (workspace, key) pairs: a key is unique within its workspace only.
SELECT j.workspace_id, j.unique_key, j.id
FROM job_queue j
JOIN unnest($1::uuid[], $2::text[]) AS k(workspace_id, unique_key)
  ON j.workspace_id = k.workspace_id AND j.unique_key = k.unique_key
WHERE j.status IN ('pending', 'retry', 'running', 'waiting');

-- name: register_worker
-- Returns the database's clock, which the worker keeps its own times on (clock.py).
INSERT INTO job_workers
    (id, hostname, pid, job_types, expires_at, version, concurrency, sessions)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7, $8)
RETURNING now();

-- name: heartbeat
-- Renews the lease of every job this worker runs in one row write, and says whether an
-- operator asked it to drain, and reads the database's clock (clock.py). No row back means
-- another worker declared this one dead and rescued its jobs.
UPDATE job_workers
SET expires_at = now() + make_interval(secs => $2),
    last_heartbeat_at = now()
WHERE id = $1
RETURNING drain_requested_at IS NOT NULL AS drain, now() AS at;

-- name: cancel_requests
-- Which of the jobs $2, which this worker runs, their rows ask to cancel (the fallback for a
-- lost notification, and the path for a plain-SQL cancel). Only these: any writer may set
-- rows `running` under this worker by the hundred thousand.
SELECT id
FROM job_queue
WHERE id = ANY($2::uuid[])
  AND worker_id = $1
  AND status = 'running'
  AND cancel_requested_at IS NOT NULL;

-- name: release_lost
-- Up to $3 of the rows `running` under this worker that it does not know ($2: the jobs it runs,
-- holds or is writing the outcome of), back to the queue with the attempt returned, as
-- `release` does: claimed for it, their answer lost on the way (a connection that died), or
-- set so by another writer. A batch at a time, for any writer may set them by the hundred
-- thousand, and the claim lock is held meanwhile. At exit, after every outcome is written, it
-- runs with $2 empty: anything still `running` under the worker then never reached it.
-- A job whose cancel was requested ends instead (`_give_back_set`).
WITH lost AS (
    SELECT id FROM job_queue
    WHERE worker_id = $1
      AND status = 'running'
      AND id NOT IN (SELECT unnest($2::uuid[]))
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue j
SET scheduled_for = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.scheduled_for
                         ELSE now() END,
-- include: _give_back_set
FROM lost
WHERE j.id = lost.id
RETURNING j.id;

-- name: unregister_worker
DELETE FROM job_workers WHERE id = $1;

-- name: reap_workers
-- The first step of a rescue: deletes the rows of workers whose lease expired (killed, lost
-- power, lost the connection) and returns their ids, whose jobs `rescue` then puts back. A
-- worker that is renewing is never touched: its row is only deleted once its expiry has
-- passed, and the DELETE rechecks that against a concurrent heartbeat. A worker learns it was
-- declared dead by its heartbeat finding no row, before any of its jobs can run elsewhere.
-- Each comes back with its sessions' application_name and the reap's time, for `end_sessions`.
DELETE FROM job_workers
WHERE expires_at < now()
RETURNING id, sessions, now() AS reaped_at;

-- name: end_sessions
-- Ends the database sessions of the workers just reaped: those in this database named $1
-- (their `sessions`) that opened before the reap ($2), so that a stopped or cut-off worker's
-- open transactions let go of their locks now rather than when it wakes, and none it opens
-- once it learns it was declared dead (a new id, the same name) is touched. Never this
-- process's own sessions (a worker whose own lease ran out declares itself dead by its
-- heartbeat), never a session not named as a worker's (a row written by hand naming the
-- admin view's or the web app's sessions), and only sessions this role may end (a member of
-- their role, or of pg_signal_backend; a superuser's only by a superuser), so the statement
-- never fails on permissions: a session it may not end is left. Each is waited for up to a
-- second, so that the rescue that follows finds their row locks gone. Returns how many.
SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid, 1000))
FROM pg_stat_activity a
JOIN pg_roles r ON r.oid = a.usesysid
WHERE a.application_name = ANY($1::text[])
  AND a.application_name LIKE 'sidelinja-worker %'
  AND a.backend_start < $2
  AND a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.application_name <> current_setting('application_name')
  AND (pg_has_role(a.usesysid, 'MEMBER') OR pg_has_role('pg_signal_backend', 'MEMBER'))
  AND (NOT r.rolsuper OR current_setting('is_superuser') = 'on');

-- name: rescue
-- Puts back up to $3 running jobs of dead workers, each counted as an attempt: those of the
-- workers $2 (reaped by `reap_workers`), and orphans, whose worker has no row. $1: how long
-- an orphan is left alone (seconds): only while it started within that long (a claim that
-- raced its worker's end, or a reaped worker's job whose rescuer stopped halfway). No claim
-- writes a start in the future ('infinity', say, by plain SQL): such a row is rescued too,
-- where it was left running for ever, holding a slot of its type's and its workspace's caps.
-- A batch at a time, and rows another rescue holds are passed over: any writer may set rows
-- running under a worker by the hundred thousand, and one statement for all of them outlasts
-- its timeout while every worker runs it at once.
-- A job whose cancel was requested (cancel_requested_at) ends `cancelled` instead: put back,
-- its next claim cleared the request and ran it again.
WITH lost AS (
    SELECT id, cancel_requested_at IS NOT NULL AS cancelling,
           CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled: ' ELSE '' END
           || 'rescued from a dead worker (' || coalesce(worker_id::text, 'none')
           || ') whose lease expired' AS message
    FROM job_queue j
    WHERE j.status = 'running'
      AND (j.worker_id = ANY($2::uuid[])
           OR (NOT EXISTS (SELECT 1 FROM job_workers w WHERE w.id = j.worker_id)
               AND (j.started_at BETWEEN now() - make_interval(secs => $1) AND now())
                   IS NOT TRUE))
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue j
SET status = CASE WHEN lost.cancelling THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'error'
                  ELSE 'retry' END::job_status,
    scheduled_for = now(),
    completed_at = CASE WHEN lost.cancelling OR j.attempts >= j.max_attempts THEN now() END,
    error_msg = lost.message,
    errors = CASE WHEN pg_column_size(j.errors) <= 1048576  -- the history stops at 1 MB
                  THEN j.errors || jsonb_build_array(jsonb_build_object(
                      'attempt', j.attempts, 'at', now(),
                      'class', CASE WHEN lost.cancelling THEN 'cancelled' ELSE 'rescued' END,
                      'message', lost.message))
                  ELSE j.errors END,
    worker_id = NULL
FROM lost
WHERE j.id = lost.id
RETURNING j.id;

-- name: prune
-- Deletes up to $3 finished jobs: completed/cancelled older than $1 seconds, errors older than
-- $2 seconds. Small batches keep locks and WAL bursts short. A job in a graph goes only with
-- its whole graph (every job joined to it by edges, either way), once all of it is past
-- retention: a graph never loses a parent while a child remains, nor a failed job's children
-- while that job may still be retried. Jobs outside graphs pay one has_children test and one
-- primary-key probe of job_dependencies.
-- Graph jobs are taken in (completed_at, id) order after the cursor ($4, $5; NULL: from the
-- start), and the last one taken comes back (NULL: none), for the next batch to start after
-- it. Without a cursor, a graph that must stay whole with $3 finished jobs or more (a join
-- waiting on a parent due next year) filled every batch, was kept, and no other graph was
-- ever pruned. The walk is sidelinja_graph_of (0034), by index whatever the statistics say.
-- $6: jobs of graphs an earlier batch of this prune found kept, which this batch passes over,
-- and the kept graphs' jobs come back: a kept graph of 100,000 finished jobs was walked whole
-- again by each of the hundred batches that took its jobs (103 s a prune, deleting nothing).
-- /* unreferenced */ stands for the prune_guard below (store.prune fills it in): a job another
-- table still references counts as not past retention, so it and its graph stay.
-- The DELETE checks each row's status and age again: a job a writer retries while the prune
-- runs (its snapshot saw the job failed) is waited for and then kept, where matching its id
-- alone deleted the job just put back in the queue. Such a job's graph may lose its other
-- finished jobs in that race (its parents' deletion lets it run, as any deleted parent does).
WITH old AS NOT MATERIALIZED (
    SELECT id, has_children, completed_at FROM job_queue j
    WHERE status IN ('completed', 'error', 'cancelled')
      AND completed_at < now() - make_interval(secs => $1)
      AND (status <> 'error' OR completed_at < now() - make_interval(secs => $2))
      /* unreferenced */
), batch AS (  -- jobs outside graphs: never held up behind graph jobs that must stay
    SELECT id FROM old o
    WHERE NOT o.has_children
      AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = o.id)
    LIMIT $3
), in_graph AS (
    SELECT id, completed_at FROM old o
    WHERE (o.has_children OR EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = o.id))
      AND ($4::timestamptz IS NULL OR (o.completed_at, o.id) > ($4::timestamptz, $5::uuid))
      AND NOT EXISTS (SELECT 1 FROM unnest($6::uuid[]) AS k(id) WHERE k.id = o.id)
    ORDER BY o.completed_at, o.id
    LIMIT $3
), graph AS MATERIALIZED (  -- the whole graphs of the batch's graph jobs (by index: 0034)
    SELECT id FROM sidelinja_graph_of(ARRAY(SELECT id FROM in_graph)) AS g(id)
), kept AS MATERIALIZED (  -- joined to a job not past retention: its graph stays whole
    SELECT id FROM sidelinja_graph_of(ARRAY(
        SELECT g.id FROM graph g JOIN job_queue j ON j.id = g.id
        WHERE (j.status IN ('completed', 'error', 'cancelled')
               AND j.completed_at < now() - make_interval(secs => $1)
               AND (j.status <> 'error' OR j.completed_at < now() - make_interval(secs => $2))
               /* unreferenced */)
              IS NOT TRUE)) AS k(id)
), gone AS (  -- each row checked again as it is deleted: a writer may put one back meanwhile
    DELETE FROM job_queue
    WHERE id = ANY(ARRAY(
        SELECT id FROM batch
        UNION ALL
        SELECT id FROM graph WHERE id NOT IN (SELECT id FROM kept)
    ))
      AND status IN ('completed', 'error', 'cancelled')
      AND completed_at < now() - make_interval(secs => $1)
      AND (status <> 'error' OR completed_at < now() - make_interval(secs => $2))
    RETURNING 1
), last AS (
    SELECT completed_at, id FROM in_graph ORDER BY completed_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM gone) AS deleted,
       (SELECT completed_at FROM last) AS last_at,
       (SELECT id FROM last) AS last_id,
       ARRAY(SELECT id FROM kept) AS kept;

-- name: prune_guard
-- What keeps a job of alias j from the prune: a row of another table that references it
-- through a foreign key whose ON DELETE is NO ACTION or RESTRICT (a web app's table, say).
-- Deleting such a job fails the whole DELETE, and a prune that failed at every turn kept every
-- job past retention. One "AND NOT EXISTS (...)" per such key, names quoted by PostgreSQL;
-- NULL when there is none. `readable`: whether this role may read every referencing table.
SELECT string_agg(format(
           'AND NOT EXISTS (SELECT 1 FROM %s r WHERE %s)',
           c.conrelid::regclass,
           (SELECT string_agg(format('r.%I = j.%I', a.attname, fa.attname), ' AND ')
            FROM unnest(c.conkey, c.confkey) AS k(ck, fk)
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.ck
            JOIN pg_attribute fa ON fa.attrelid = c.confrelid AND fa.attnum = k.fk)),
           ' ' ORDER BY c.oid) AS clause,
       coalesce(bool_and(has_table_privilege(c.conrelid, 'SELECT')), true) AS readable,
       string_agg(c.conrelid::regclass::text, ', ' ORDER BY c.oid) AS tables
FROM pg_constraint c
WHERE c.contype = 'f' AND c.confrelid = 'job_queue'::regclass AND c.confdeltype IN ('a', 'r');

-- name: request_cancel
-- Cancel: a queued job is cancelled at once; a running one is flagged and its worker notified.
-- Returns the job's status after the statement (NULL: no such job or already finished).
WITH target AS (
    SELECT id, status FROM job_queue WHERE id = $1 FOR UPDATE
), changed AS (
    UPDATE job_queue j
    SET status = CASE WHEN t.status = 'running' THEN j.status ELSE 'cancelled' END::job_status,
        completed_at = CASE WHEN t.status = 'running' THEN j.completed_at ELSE now() END,
        error_msg = CASE WHEN t.status = 'running' THEN j.error_msg ELSE 'cancelled' END,
        cancel_requested_at = now()
    FROM target t
    WHERE j.id = t.id AND t.status IN ('pending', 'retry', 'running', 'waiting')
    RETURNING j.id, j.status, pg_notify('sidelinja_job_cancel', j.id::text)
)
SELECT (SELECT status::text FROM changed) AS new_status,
       (SELECT status::text FROM target) AS old_status;

-- name: get_job
SELECT id, workspace_id, job_type, payload, status::text AS status, priority, result, error_msg,
       attempts, max_attempts, created_at, started_at, completed_at, scheduled_for,
       worker_id, errors, unique_key, timeout_s, cancel_requested_at
FROM job_queue
WHERE id = $1;

-- name: queue_state
-- Due and running jobs of these types, cluster-wide: a burst worker whose claim came back empty
-- keeps waiting while due jobs are only held back by a cap that a running job will free.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM job_queue
        WHERE status IN ('pending', 'retry') AND scheduled_for <= now()
          AND job_type = ANY(ARRAY(
                  SELECT t FROM unnest($1::text[]) AS t
                  WHERE NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = t)))
        LIMIT 1) d) AS due,
    (SELECT count(*) FROM job_queue WHERE status = 'running' AND job_type = ANY($1::text[]))
        AS running;

-- name: ensure_workspace
INSERT INTO workspaces (id, name)
VALUES ($1, $2)
ON CONFLICT (id) DO NOTHING;

-- name: workspace_exists
SELECT EXISTS (SELECT 1 FROM workspaces WHERE id = $1);

-- name: why_facts
-- Everything `jobs why` needs to say why a job is not running, in one round trip.
WITH j AS (
    SELECT * FROM job_queue WHERE id = $1
)
SELECT
    j.status::text AS status, j.job_type, j.workspace_id, j.priority, j.scheduled_for,
    j.scheduled_for > now() AS not_due, j.progress, j.worker_id, j.started_at, j.error_msg,
    now() AS now,
    (SELECT count(*) FROM job_workers w
     WHERE w.expires_at > now() AND (w.job_types IS NULL OR j.job_type = ANY(w.job_types)))
        AS live_workers,
    (SELECT max_running FROM job_type_limits l WHERE l.job_type = j.job_type) AS type_cap,
    (SELECT coalesce(array_agg(r.id ORDER BY r.started_at), '{}') FROM job_queue r
     WHERE r.status = 'running' AND r.job_type = j.job_type) AS type_running,
    (SELECT max_running FROM workspace_limits l WHERE l.workspace_id = j.workspace_id)
        AS workspace_cap,
    (SELECT count(*) FROM job_queue r
     WHERE r.status = 'running' AND r.workspace_id = j.workspace_id) AS workspace_running,
    (SELECT coalesce(jsonb_object_agg(key, paused_until), '{}') FROM rate_limits
     WHERE paused_until > now()) AS paused_services,
    (SELECT jsonb_build_object('by', p.paused_by, 'at', p.paused_at, 'reason', p.reason)
     FROM job_type_pauses p WHERE p.job_type = j.job_type) AS type_paused,
    (SELECT count(*) FROM job_queue a
     WHERE a.status IN ('pending', 'retry') AND a.scheduled_for <= now() AND a.id <> j.id
       AND (a.priority > j.priority
            OR (a.priority = j.priority AND a.scheduled_for < j.scheduled_for))) AS ahead
FROM j;

-- name: counts
-- Jobs by status and type (the worker's gauges, the admin overview; RLS scopes it there). A
-- job type is text of any length and number to a plain-SQL writer: each is named by its first
-- 512 characters, and past the $1 most numerous types of a status the rest are counted
-- together under a NULL type, so a gauge has a bounded number of series.
WITH by_type AS (
    SELECT status::text AS status, left(job_type, 512) AS job_type, count(*) AS n
    FROM job_queue
    GROUP BY 1, 2
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY status ORDER BY n DESC, job_type) AS place
    FROM by_type
)
SELECT status, CASE WHEN place <= $1 THEN job_type END AS job_type, sum(n)::bigint AS n
FROM ranked
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: oldest_due_s
-- NULL with no due job. A scheduled_for of -infinity (any plain-SQL writer may set it) cannot
-- be subtracted: left out, such a job alone reads 0. Jobs of a type an operator paused wait by
-- choice and are left out: an alert on the gauge fired for as long as any pause lasted, and
-- hid a queue that fell behind meanwhile (the pauses list counts their waiting jobs).
SELECT CASE WHEN count(*) > 0
            THEN coalesce(extract(epoch FROM now() - min(scheduled_for)
                                                  FILTER (WHERE isfinite(scheduled_for))), 0)
       END::float8
FROM job_queue
WHERE status IN ('pending', 'retry') AND scheduled_for <= now()
  AND NOT EXISTS (SELECT FROM job_type_pauses p WHERE p.job_type = job_queue.job_type);

-- name: notify_queue_state
-- PostgreSQL's notification queue, cluster-wide: the fraction in use and what job writes have
-- paused because of it (the metrics task's refresh; never per job).
SELECT usage, events_paused, wakeups_paused FROM sidelinja_notify_queue_state();

-- name: statistics_state
-- Whether the planner's picture of job_queue is stale enough to plan claims badly, and whether
-- this role may refresh it (ANALYZE needs the table's or the database's owner). Stale: more
-- rows changed since the last ANALYZE than the table held then, and at least $1. That is the
-- table grown from (nearly) empty, where a claim's cached generic plan scans and sorts the
-- whole table once per workspace; autovacuum's threshold (a tenth) comes first otherwise.
-- n_mod_since_analyze is 0 in a table nothing has counted yet (a new cluster's stats).
SELECT coalesce(s.n_mod_since_analyze, 0) > greatest($1::float8, c.reltuples) AS stale,
       pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE') AS may_analyze
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
CROSS JOIN pg_database d
WHERE c.oid = 'job_queue'::regclass
  AND d.datname = current_database();

-- name: try_statistics_lock
-- One worker at a time refreshes the statistics; the others see them fresh afterwards.
SELECT pg_try_advisory_xact_lock(7226133950251622723);

-- name: analyze_queue
ANALYZE job_queue;

-- name: abandon_worker
-- A worker whose internal task died (crash-only): its running jobs go back to the queue at
-- once, each counted as an attempt (so a job that kills every worker it reaches ends in
-- `error` after max_attempts instead of looping), rather than after its lease. $2 says why,
-- in `errors`. Up to $3 rows a statement, as `release_lost`; the worker leaves the workers
-- table (unregister_worker) only once none is left, so rows it did not reach stay its own,
-- for the rescue to find when its lease expires.
-- A job whose cancel was requested (cancel_requested_at) ends `cancelled` instead: put back,
-- its next claim cleared the request and ran it again.
WITH held AS (
    SELECT id, cancel_requested_at IS NOT NULL AS cancelling,
           CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled: ' ELSE '' END
           || 'abandoned by worker ' || $1::uuid::text || ': ' || $2::text AS message
    FROM job_queue
    WHERE worker_id = $1::uuid
      AND status = 'running'
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue j
SET status = CASE WHEN held.cancelling THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'error'
                  ELSE 'retry' END::job_status,
    scheduled_for = now(),
    completed_at = CASE WHEN held.cancelling OR j.attempts >= j.max_attempts THEN now() END,
    error_msg = held.message,
    errors = CASE WHEN pg_column_size(j.errors) <= 1048576  -- the history stops at 1 MB
                  THEN j.errors || jsonb_build_array(jsonb_build_object(
                      'attempt', j.attempts, 'at', now(),
                      'class', CASE WHEN held.cancelling THEN 'cancelled' ELSE 'rescued' END,
                      'message', held.message))
                  ELSE j.errors END,
    worker_id = NULL
FROM held
WHERE j.id = held.id
RETURNING j.id;

-- name: cancel_requested
-- Whether the row of a job this worker runs asks for its cancellation: a notification on the
-- cancel channel only makes the worker look here (anyone may send one).
SELECT EXISTS (
    SELECT 1 FROM job_queue
    WHERE id = $1 AND worker_id = $2 AND status = 'running' AND cancel_requested_at IS NOT NULL
);


-- name: pause_type
-- Pauses a job type cluster-wide (the trigger writes the audit entry and wakes no one); a type
-- already paused keeps its first pause. Returns whether this call paused it.
INSERT INTO job_type_pauses (job_type, paused_by, reason)
VALUES ($1, $2, $3)
ON CONFLICT (job_type) DO NOTHING
RETURNING job_type;

-- name: resume_type
-- Resumes a paused job type; who and why go to the audit entry through the transaction's
-- settings, which the trigger reads. Returns whether it was paused.
WITH who AS (
    SELECT set_config('sidelinja.actor', $2, true), set_config('sidelinja.reason', $3, true)
)
DELETE FROM job_type_pauses
WHERE job_type = $1 AND EXISTS (SELECT 1 FROM who)
RETURNING job_type;

-- name: list_pauses
SELECT job_type, paused_at, paused_by, reason,
       (SELECT count(*) FROM job_queue j
        WHERE j.job_type = p.job_type AND j.status IN ('pending', 'retry')) AS waiting
FROM job_type_pauses p
ORDER BY job_type;

-- name: drain_worker
-- Asks one worker to finish its jobs and claim no more ($2: who asked), or, with $3 false,
-- to claim again. The worker reads it at its next heartbeat. Returns whether it exists.
UPDATE job_workers
SET drain_requested_at = CASE WHEN $3 THEN coalesce(drain_requested_at, now()) END,
    drain_requested_by = CASE WHEN $3 THEN $2 END
WHERE id = $1
RETURNING id;

-- name: list_workers
-- Every worker with a row (a dead one keeps it until a rescue deletes it and frees its jobs),
-- how many jobs each holds now, and the first five of them: a worker holds up to its prefetch
-- (thousands of short jobs) and a page or `top` shows five, so the rest never leave the server.
SELECT w.id, w.hostname, w.pid, w.version, w.job_types, w.concurrency, w.started_at,
       w.last_heartbeat_at, w.expires_at, w.expires_at > now() AS alive,
       w.drain_requested_at, w.drain_requested_by,
       (SELECT count(*) FROM job_queue j
        WHERE j.worker_id = w.id AND j.status = 'running') AS running_count,
       ARRAY(SELECT j.id FROM job_queue j
             WHERE j.worker_id = w.id AND j.status = 'running'
             ORDER BY j.started_at, j.id LIMIT 5) AS running
FROM job_workers w
ORDER BY w.hostname, w.started_at, w.id;

-- name: add_minute_stats
-- Adds one worker's counts to the per-minute aggregates. The bucket arrays travel as
-- comma-separated text (asyncpg has no array of arrays); the upsert adds element by element.
INSERT INTO job_minute_stats AS s (minute, workspace_id, job_type, completed, failed, run_buckets)
SELECT r.minute, r.workspace_id, r.job_type, r.completed, r.failed,
       string_to_array(r.buckets, ',')::integer[]
FROM unnest($1::timestamptz[], $2::uuid[], $3::text[], $4::integer[], $5::integer[], $6::text[])
     AS r(minute, workspace_id, job_type, completed, failed, buckets)
ON CONFLICT (workspace_id, minute, job_type) DO UPDATE
SET completed = s.completed + EXCLUDED.completed,
    failed = s.failed + EXCLUDED.failed,
    run_buckets = ARRAY(SELECT coalesce(a, 0) + coalesce(b, 0)
                        FROM unnest(s.run_buckets, EXCLUDED.run_buckets) AS u(a, b));

-- name: prune_minute_stats
DELETE FROM job_minute_stats WHERE minute < now() - make_interval(secs => $1);

-- name: top_throughput
-- Completed and failed attempts per job type over the last $1 minutes, whole queue (the
-- dashboard's aggregates, never job_queue).
SELECT job_type, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed
FROM job_minute_stats
WHERE workspace_id = '00000000-0000-0000-0000-000000000000'
  AND minute >= date_trunc('minute', now()) - make_interval(mins => $1)
GROUP BY job_type;

-- name: top_depth
-- Waiting, due and running jobs by type: the pending and running indexes' rows only. A job type
-- is text of any length and number to a plain-SQL writer: as the dashboard does, each is named
-- by its first 512 characters, and past the 100 types with the most waiting and running jobs
-- (cli/top.py's TOP_MAX_TYPES) the rest are one row under a NULL type, so a view of `top` has
-- a bounded number of rows of bounded size.
WITH by_type AS (
    SELECT left(job_type, 512) AS job_type,
           count(*) FILTER (WHERE status IN ('pending', 'retry')) AS waiting,
           count(*) FILTER (WHERE status IN ('pending', 'retry') AND scheduled_for <= now()) AS due,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM job_queue
    WHERE status IN ('pending', 'retry', 'running')
    GROUP BY 1
), ranked AS (
    SELECT *, row_number() OVER (ORDER BY waiting + running DESC, job_type) AS place FROM by_type
)
SELECT CASE WHEN place <= 100 THEN job_type END AS job_type, sum(waiting)::bigint AS waiting,
       sum(due)::bigint AS due, sum(running)::bigint AS running
FROM ranked
GROUP BY 1;
