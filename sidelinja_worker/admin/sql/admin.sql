-- The admin view's runtime SQL; admin/store.py has one typed function per block.
-- A job's type and unique key are read as their first 512 characters (store.TEXT_SHOWN): to a
-- plain-SQL writer they are text of any length, and a page or a live event must stay small.
-- Job queries run inside `scoped()`: as the role sidelinja_app with the token's workspace in
-- `sidelinja.workspace_id`, so row-level security confines them even if the code forgets to; a
-- platform token's queries run as sidelinja_platform_admin, the one role that sees every
-- workspace.

-- name: scope
SELECT set_config('sidelinja.workspace_id', $1::text, true);

-- name: statement_timeout
-- For this transaction only (an action's bound, in milliseconds).
SELECT set_config('statement_timeout', $1::text, true);

-- name: enter_app_role
SET LOCAL ROLE sidelinja_app;

-- name: enter_platform_role
SET LOCAL ROLE sidelinja_platform_admin;

-- name: leave_app_role
RESET ROLE;

-- name: token_create
INSERT INTO admin_tokens (token_sha256, workspace_id, all_workspaces, label)
VALUES ($1, $2, $2::uuid IS NULL, $3)
RETURNING id;

-- name: token_lookup
SELECT id, workspace_id
FROM admin_tokens
WHERE token_sha256 = $1 AND revoked_at IS NULL;

-- name: token_revoke
UPDATE admin_tokens SET revoked_at = now()
WHERE id = $1 AND revoked_at IS NULL
RETURNING id;

-- name: token_labels
-- The labels of the tokens named; a token with no label, or whose row is gone, has no row.
SELECT id, label
FROM admin_tokens
WHERE id = ANY($1::uuid[]) AND coalesce(label, '') <> '';

-- name: token_list
SELECT id, workspace_id, all_workspaces, label, created_at, revoked_at
FROM admin_tokens
ORDER BY created_at;

-- name: _list_jobs
-- One status's rows (list_jobs and list_jobs_newer add the cursor and the order). No OFFSET,
-- no count. admin/store.py `list_jobs` runs it (or _list_completed) once per status, in
-- STATUS_ORDER for the all-statuses list, so every page is a keyset scan of one status's index;
-- one query ordered across statuses had no index to follow and sorted the whole table
-- (0.6-0.9 s on 1,000,000 jobs). Errors, retries, cancellations and pending jobs page over the
-- idx_job_queue_admin_* indexes: `status = $1` (not LEAKPROOF, so never an index condition
-- under row-level security) proves the partial index's predicate, and the row comparison is
-- LEAKPROOF, so it stays an index condition (pending: idx_job_queue_admin_pending_by_id, 0013;
-- waiting: idx_job_queue_admin_waiting, 0027, whose predicate `status = $1` implies).
-- Running jobs have no index by time (every claim would write it): found through
-- idx_job_queue_running and sorted.
-- Search: an id prefix is a range of the primary key ($9..$10); a payload field is a
-- containment test ($11) on the rows of the status's index within the time window, which
-- admin/forms.py never leaves open for it (a day back by default): there is no payload index,
-- so the window is what keeps such a search to the rows of one day.
SELECT id, workspace_id, left(job_type, 512) AS job_type, status::text AS status, attempts,
       max_attempts, created_at, scheduled_for, completed_at, left(error_msg, 200) AS error_msg,
       created_at AS sort_at,
       -- A probe of job_dependencies' primary key per row shown (LIMIT 1: never a hashed
       -- subplan, which read every edge for each page).
       has_children OR coalesce((SELECT true FROM job_dependencies d
                                 WHERE d.child_id = job_queue.id LIMIT 1), false) AS in_graph
FROM job_queue
WHERE status = $1::job_status
  AND ($2::text IS NULL OR job_type = $2)
  AND ($3::uuid IS NULL OR workspace_id = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at < $5)
  AND ($9::uuid IS NULL OR id BETWEEN $9 AND $10::uuid)
  AND ($11::text IS NULL OR payload @> $11::text::jsonb)

-- name: list_jobs
-- One status's page, newest first: the page after ($6 sort_at, $7 id).
-- include: _list_jobs
  AND ($6::timestamptz IS NULL OR (created_at, id) < ($6, $7::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $8;

-- name: list_jobs_newer
-- The rows before ($6, $7) in list_jobs's order, the nearest first: the same index read the
-- other way.
-- include: _list_jobs
  AND ($6::timestamptz IS NULL OR (created_at, id) > ($6, $7::uuid))
ORDER BY created_at, id
LIMIT $8;

-- name: _list_completed
-- Completed jobs, most recently finished first, over idx_job_queue_finished (completed_at): the
-- bulk of a big table, which no index by created_at covers (it would slow every completion).
-- The time filter ($4, $5) is on completed_at too, the time this list is sorted by: on
-- created_at it could not bound the index scan, and a window days back scanned every job
-- finished since (130-220 ms on 1,000,000 jobs). Type and workspace are filters on the scan, so
-- a page costs in proportion to how rare the match is (0.25 s for a workspace of 60 jobs).
SELECT id, workspace_id, left(job_type, 512) AS job_type, status::text AS status, attempts,
       max_attempts, created_at, scheduled_for, completed_at, left(error_msg, 200) AS error_msg,
       completed_at AS sort_at,
       -- A probe of job_dependencies' primary key per row shown (LIMIT 1: never a hashed
       -- subplan, which read every edge for each page).
       has_children OR coalesce((SELECT true FROM job_dependencies d
                                 WHERE d.child_id = job_queue.id LIMIT 1), false) AS in_graph
FROM job_queue
WHERE status = 'completed' AND $1::job_status = 'completed'
  AND ($2::text IS NULL OR job_type = $2)
  AND ($3::uuid IS NULL OR workspace_id = $3)
  AND ($4::timestamptz IS NULL OR completed_at >= $4)
  AND ($5::timestamptz IS NULL OR completed_at < $5)
  AND ($9::uuid IS NULL OR id BETWEEN $9 AND $10::uuid)
  AND ($11::text IS NULL OR payload @> $11::text::jsonb)

-- name: list_completed
-- include: _list_completed
  AND ($6::timestamptz IS NULL OR (completed_at, id) < ($6, $7::uuid))
ORDER BY completed_at DESC, id DESC
LIMIT $8;

-- name: list_completed_newer
-- include: _list_completed
  AND ($6::timestamptz IS NULL OR (completed_at, id) > ($6, $7::uuid))
ORDER BY completed_at, id
LIMIT $8;

-- name: get_job
-- The payload, result and error history are shown only when each is at most $2 bytes, both
-- as stored and as JSON text (NULL otherwise, with the size that was too big beside it), and
-- progress at most 4 kB as in jobs_for_events: any plain-SQL writer of the row can make them
-- hundreds of megabytes, and a job page must stay a page. The stored size may be compressed
-- (10 MB of one letter is 115 kB), so the text is measured too, but only once the stored size
-- is within the bound: a CASE inside the CASE, so a giant value is never turned into text.
-- `*_hidden` says which were left out (a JSON null is shown; it is no giant).
SELECT j.id, j.workspace_id, left(j.job_type, 512) AS job_type,
       CASE WHEN p.text_bytes <= $2 THEN j.payload END AS payload,
       coalesce(p.text_bytes > $2, true) AS payload_hidden,
       pg_column_size(j.payload) AS payload_bytes, p.text_bytes AS payload_text_bytes,
       j.status::text AS status, j.priority,
       CASE WHEN r.text_bytes <= $2 THEN j.result END AS result,
       j.result IS NOT NULL AND coalesce(r.text_bytes > $2, true) AS result_hidden,
       pg_column_size(j.result) AS result_bytes, r.text_bytes AS result_text_bytes,
       left(j.error_msg, 20000) AS error_msg,  -- the worker writes at most 4,000 characters
       CASE WHEN e.text_bytes <= $2 THEN j.errors END AS errors,
       coalesce(e.text_bytes > $2, true) AS errors_hidden,
       pg_column_size(j.errors) AS errors_bytes, e.text_bytes AS errors_text_bytes,
       j.attempts, j.max_attempts, j.created_at, j.started_at,
       j.completed_at, j.scheduled_for, j.worker_id,
       CASE WHEN pg_column_size(j.progress) <= 4096 THEN
           CASE WHEN octet_length(j.progress::text) <= 4096 THEN j.progress END END AS progress,
       left(j.unique_key, 512) AS unique_key, j.timeout_s,
       j.cancel_requested_at, w.hostname AS worker_host, w.pid AS worker_pid,
       w.expires_at AS lease_expires_at, j.cancelled_by,
       j.has_children OR coalesce((SELECT true FROM job_dependencies d
                                   WHERE d.child_id = j.id LIMIT 1), false) AS in_graph
FROM job_queue j
LEFT JOIN job_workers w ON w.id = j.worker_id
CROSS JOIN LATERAL (SELECT CASE WHEN pg_column_size(j.payload) <= $2
                                THEN octet_length(j.payload::text) END) p(text_bytes)
CROSS JOIN LATERAL (SELECT CASE WHEN pg_column_size(j.result) <= $2
                                THEN octet_length(j.result::text) END) r(text_bytes)
CROSS JOIN LATERAL (SELECT CASE WHEN pg_column_size(j.errors) <= $2
                                THEN octet_length(j.errors::text) END) e(text_bytes)
WHERE j.id = $1;

-- name: retry_job
-- "Retry now": an error or retry job is due at once. An error job gets one more attempt.
UPDATE job_queue
SET status = 'pending', scheduled_for = now(), completed_at = NULL,
    max_attempts = greatest(max_attempts, least(attempts, 32766) + 1)
WHERE id = $1 AND status IN ('error', 'retry')
RETURNING id;

-- name: retry_root
-- What a retry of job $1 puts back: the job itself, or, for a job cancelled by a parent's
-- failure, the failed ancestor at the top of its `cancelled_by` chain (putting that one back
-- brings the whole cancelled branch back with it). Bounded: a chain is at most a graph's depth.
-- The walk stays in the job's workspace: `cancelled_by` is a column any writer of the row may
-- set, and a platform operator's retry of a job naming another workspace's failed job put
-- that one back (the job ends the walk, and nothing is retried).
WITH RECURSIVE up(id, workspace_id, status, cancelled_by, depth) AS (
    SELECT id, workspace_id, status, cancelled_by, 0 FROM job_queue WHERE id = $1
    UNION ALL
    SELECT j.id, j.workspace_id, j.status, j.cancelled_by, up.depth + 1
    FROM up JOIN job_queue j ON j.id = up.cancelled_by AND j.workspace_id = up.workspace_id
    WHERE up.status = 'cancelled' AND up.depth < 10000
)
SELECT id, status::text AS status, cancelled_by FROM up ORDER BY depth DESC LIMIT 1;

-- name: retry_cancelled
-- A job cancelled by hand, put back; settled against its parents at once, so a job whose
-- parents have not all completed waits for them again (`waiting`) instead of running early.
WITH back AS (
    UPDATE job_queue
    SET status = 'pending', scheduled_for = now(), completed_at = NULL, error_msg = NULL,
        cancel_requested_at = NULL, max_attempts = greatest(max_attempts, least(attempts, 32766) + 1)
    WHERE id = $1 AND status = 'cancelled' AND cancelled_by IS NULL
    RETURNING id
)
SELECT id FROM back;

-- name: settle
SELECT sidelinja_settle_children($1::uuid[]);

-- name: graph_nodes
-- The jobs joined to job $1 by edges in either direction, breadth first from it, at most $2
-- (ids of jobs the scope cannot see are walked through but never returned).
WITH RECURSIVE reach(id) AS (
    SELECT $1::uuid
    UNION
    SELECT n.id
    FROM reach r,
         LATERAL (SELECT d.child_id AS id FROM job_dependencies d WHERE d.parent_id = r.id
                  UNION ALL
                  SELECT d.parent_id FROM job_dependencies d WHERE d.child_id = r.id) n
)
SELECT j.id, left(j.job_type, 512) AS job_type, j.status::text AS status, j.attempts,
       j.max_attempts, j.cancelled_by,
       j.created_at
FROM (SELECT id, row_number() OVER () AS n FROM reach LIMIT $2) r
JOIN job_queue j ON j.id = r.id
ORDER BY r.n;

-- name: graph_edges
-- The edges among the given jobs, at most $2.
SELECT parent_id, child_id, run_anyway
FROM job_dependencies
WHERE child_id = ANY($1::uuid[]) AND parent_id = ANY($1::uuid[])
LIMIT $2;

-- name: bulk_retry
-- The filtered set of error/retry jobs (same filters as list_jobs), at most $6 of them. A job
-- whose unique key another queued job holds is left out (an `error` job holds none, and
-- putting it back would break idx_job_queue_unique_key and the whole statement), as is all but
-- the oldest of several with one key. A retry job holds its key already.
UPDATE job_queue
SET status = 'pending', scheduled_for = now(), completed_at = NULL,
    max_attempts = greatest(max_attempts, least(attempts, 32766) + 1)
WHERE id = ANY(ARRAY(
    SELECT DISTINCT ON (coalesce(c.unique_key, c.id::text), c.workspace_id) c.id
    FROM (
        SELECT id, workspace_id, unique_key, created_at FROM job_queue
        WHERE status IN ('error', 'retry')
          AND ($1::job_status IS NULL OR status = $1::job_status)
          AND ($2::text IS NULL OR job_type = $2)
          AND ($3::uuid IS NULL OR workspace_id = $3)
          AND ($4::timestamptz IS NULL OR created_at >= $4)
          AND ($5::timestamptz IS NULL OR created_at < $5)
          AND ($7::uuid IS NULL OR id BETWEEN $7 AND $8::uuid)
          AND ($9::text IS NULL OR payload @> $9::text::jsonb)
        LIMIT $6
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE c.unique_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM job_queue o
        WHERE o.workspace_id = c.workspace_id AND o.unique_key = c.unique_key
          AND o.id <> c.id AND o.status IN ('pending', 'retry', 'running', 'waiting'))
    ORDER BY coalesce(c.unique_key, c.id::text), c.workspace_id, c.created_at))
  AND status IN ('error', 'retry')
RETURNING id;

-- name: audit
INSERT INTO admin_audit (token_id, workspace_id, action, job_ids, detail)
VALUES ($1, $2, $3, $4, $5);

-- name: throughput
-- Finished jobs per minute over the last hour (idx_job_queue_finished).
SELECT date_trunc('minute', completed_at) AS minute, status::text AS status, count(*) AS n
FROM job_queue
WHERE status IN ('completed', 'error', 'cancelled')
  AND completed_at > now() - interval '1 hour'
GROUP BY 1, 2
ORDER BY 1;

-- name: type_counts
-- Waiting and running jobs of the job types $1 (those paused or capped), as the scope sees
-- them: the overview shows them beside the queue-wide pauses and caps, whose own queries run
-- privileged and count every workspace's jobs.
SELECT job_type,
       count(*) FILTER (WHERE status IN ('pending', 'retry')) AS waiting,
       count(*) FILTER (WHERE status = 'running') AS running
FROM job_queue
WHERE job_type = ANY($1::text[]) AND status IN ('pending', 'retry', 'running')
GROUP BY job_type;

-- name: job_type_queued
-- Whether any job, of any status, has the type. No index has job_type first: a type no job
-- has reads the whole table, so pauses.pausable asks only about a name that is no
-- registered job type.
SELECT EXISTS (SELECT 1 FROM job_queue WHERE job_type = $1);

-- name: workspace_names
SELECT id, name FROM workspaces WHERE id = ANY($1::uuid[]);

-- name: workspaces
SELECT id, name FROM workspaces ORDER BY name, id;

-- name: jobs_for_events
-- What a live stream sends: the rows a notification names, read again under the token's scope.
-- A progress report is a line for a page (the worker writes at most 500 characters); one a
-- plain-SQL writer made bigger than 4 kB, as stored or as JSON text (300 kB of one letter is
-- 3 kB compressed), is left out, not sent to every page. The text is measured only once the
-- stored size is within the bound.
SELECT id, workspace_id, left(job_type, 512) AS job_type, status::text AS status, attempts,
       max_attempts,
       CASE WHEN pg_column_size(progress) <= 4096 THEN
           CASE WHEN octet_length(progress::text) <= 4096 THEN progress END END AS progress
FROM job_queue
WHERE id = ANY($1::uuid[]);

-- name: session_create
INSERT INTO admin_sessions (secret_sha256, token_id, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
RETURNING id;

-- name: session_lookup
-- A live session of a live token: expiry and revocation both end it at once.
SELECT t.id, t.workspace_id
FROM admin_sessions s
JOIN admin_tokens t ON t.id = s.token_id
WHERE s.secret_sha256 = $1 AND s.expires_at > now() AND t.revoked_at IS NULL;

-- name: session_delete
DELETE FROM admin_sessions WHERE secret_sha256 = $1;

-- name: session_prune
DELETE FROM admin_sessions WHERE expires_at <= now();

-- name: dashboard_series
-- The dashboard's numbers come from job_minute_stats only (never job_queue), for workspace $1
-- (the nil workspace: the whole queue), a range of its primary key; row-level security scopes
-- it as well. Per job type, the minutes since $2 (as offsets from $2) with their completed and
-- failed counts, as three arrays: a day of rows travels and decodes as a few arrays, not
-- thousands of records.
SELECT job_type,
       array_agg((extract(epoch FROM minute - $2::timestamptz) / 60)::int ORDER BY minute) AS at,
       array_agg(completed ORDER BY minute) AS completed,
       array_agg(failed ORDER BY minute) AS failed
FROM job_minute_stats
WHERE workspace_id = $1 AND minute >= $2::timestamptz
GROUP BY job_type;

-- name: dashboard_buckets
-- Run-time bucket counts per job type since $2 (the last hour), summed in the database. The
-- worker writes no NULL, negative or overflowing count, but the table's owner may: each sum is
-- kept to 0..2^31-1 (a NULL in a bucket was a 500 for the workspace's token, an overflow one
-- for everyone's).
SELECT job_type, array_agg(n ORDER BY k) AS buckets
FROM (SELECT s.job_type, u.k, greatest(least(coalesce(sum(u.n), 0), 2147483647), 0)::int AS n
      FROM job_minute_stats s, unnest(s.run_buckets) WITH ORDINALITY AS u(n, k)
      WHERE s.workspace_id = $1 AND s.minute >= $2::timestamptz
      GROUP BY 1, 2) b
GROUP BY job_type;

-- name: dashboard_depth
-- Waiting jobs by type, and how many are due: the pending index's rows only. Types that share
-- their first 512 characters are counted together (no worker runs such a type). Any plain-SQL
-- writer may enqueue jobs of as many types as it likes: past the $1 types with the most waiting
-- jobs, the rest are one row under a NULL type, so the dashboard has a bounded number of rows.
WITH by_type AS (
    SELECT left(job_type, 512) AS job_type, count(*) AS waiting,
           count(*) FILTER (WHERE scheduled_for <= now()) AS due
    FROM job_queue
    WHERE status IN ('pending', 'retry')
    GROUP BY 1
), ranked AS (
    SELECT *, row_number() OVER (ORDER BY waiting DESC, job_type) AS place FROM by_type
)
SELECT CASE WHEN place <= $1 THEN job_type END AS job_type, sum(waiting)::bigint AS waiting,
       sum(due)::bigint AS due
FROM ranked
GROUP BY 1
ORDER BY 1;
