-- The only runtime SQL of sidelinja-worker. Each block starts with `-- name: NAME`; store.py
-- has one typed function per block. Parameters are asyncpg's $1, $2, ...

-- name: claim
-- One statement claims up to $2 due jobs for worker $1, highest priority first, then oldest
-- scheduled_for (the seed's order). `id = ANY(ARRAY(...))` keeps the UPDATE on the primary
-- key; the obvious `UPDATE ... FROM picked` is often planned as a hash join over the whole
-- table. A worker whose lease has lapsed (declared dead by another worker) claims nothing.
-- The attempt is counted here, at claim, so a job whose worker dies has used an attempt.
WITH picked AS (
    SELECT id
    FROM job_queue
    WHERE status IN ('pending', 'retry')
      AND scheduled_for <= now()
      AND ($3::text[] IS NULL OR job_type = ANY($3::text[]))
      AND EXISTS (SELECT 1 FROM job_workers w WHERE w.id = $1 AND w.expires_at > now())
    ORDER BY priority DESC, scheduled_for
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue
SET status = 'running',
    started_at = now(),
    attempts = attempts + 1,
    worker_id = $1,
    cancel_requested_at = NULL
WHERE id = ANY(ARRAY(SELECT id FROM picked))
RETURNING id, workspace_id, job_type, payload, priority, attempts, max_attempts, timeout_s;

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
  AND j.worker_id = $3;

-- name: fail
-- Batched failure. A permanent failure, or the last attempt, ends in `error`; otherwise `retry`
-- after the delay the worker computed (backoff, or the service's Retry-After). Every failure is
-- appended to `errors`; `error_msg` keeps the latest, as the seed has it.
UPDATE job_queue j
SET status = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                  THEN 'error' ELSE 'retry' END::job_status,
    scheduled_for = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                         THEN j.scheduled_for
                         ELSE now() + make_interval(secs => f.delay_s) END,
    completed_at = CASE WHEN f.permanent OR j.attempts >= j.max_attempts THEN now() END,
    error_msg = f.message,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'class', f.kind, 'message', f.message))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bool[], $5::float8[])
     AS f(id, kind, message, permanent, delay_s)
WHERE j.id = f.id
  AND j.status = 'running'
  AND j.worker_id = $6;

-- name: release
-- Batched give-back: a deferral (resource governor) or a job unfinished at shutdown goes back to
-- the queue at $2[i] and the attempt taken at claim is returned: it was not a failed attempt.
UPDATE job_queue j
SET status = CASE WHEN j.attempts <= 1 THEN 'pending' ELSE 'retry' END::job_status,
    attempts = greatest(j.attempts - 1, 0),
    scheduled_for = coalesce(r.run_at, now()),
    started_at = NULL,
    worker_id = NULL
FROM unnest($1::uuid[], $2::timestamptz[]) AS r(id, run_at)
WHERE j.id = r.id
  AND j.status = 'running'
  AND j.worker_id = $3;

-- name: cancelled
-- Batched end of running jobs whose cancellation was requested and honoured by the handler.
UPDATE job_queue j
SET status = 'cancelled',
    completed_at = now(),
    error_msg = 'cancelled while running',
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'class', 'cancelled',
        'message', 'cancelled while running'))
WHERE j.id = ANY($1::uuid[])
  AND j.status = 'running'
  AND j.worker_id = $2;

-- name: enqueue
-- One round trip for any number of jobs. Ids are made by the client so that the caller gets them
-- back in its own order. A job whose unique key is already held by a pending/retry/running job
-- is not inserted (the unique index decides, for every writer); the caller then looks up the
-- holder with `find_by_unique_keys`.
INSERT INTO job_queue (id, workspace_id, job_type, payload, priority, scheduled_for,
                       max_attempts, unique_key, timeout_s)
SELECT j.id, j.workspace_id, j.job_type, j.payload, j.priority,
       coalesce(j.scheduled_for, now() + make_interval(secs => coalesce(j.delay_s, 0))),
       j.max_attempts, j.unique_key, j.timeout_s
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::jsonb[], $5::smallint[],
            $6::timestamptz[], $7::float8[], $8::smallint[], $9::text[], $10::integer[])
     AS j(id, workspace_id, job_type, payload, priority, scheduled_for, delay_s,
          max_attempts, unique_key, timeout_s)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running')
DO NOTHING
RETURNING id;

-- name: find_by_unique_keys
SELECT unique_key, id
FROM job_queue
WHERE unique_key = ANY($1::text[])
  AND status IN ('pending', 'retry', 'running');

-- name: register_worker
INSERT INTO job_workers (id, hostname, pid, job_types, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5));

-- name: heartbeat
-- Renews the lease of every job this worker runs in one row write. No row back means another
-- worker declared this one dead and rescued its jobs.
UPDATE job_workers
SET expires_at = now() + make_interval(secs => $2)
WHERE id = $1
RETURNING id;

-- name: held_jobs
-- The jobs the database says this worker runs, and whether their cancellation was requested
-- (the fallback for a lost notification, and the path for a plain-SQL cancel).
SELECT id, cancel_requested_at IS NOT NULL AS cancel_requested
FROM job_queue
WHERE worker_id = $1
  AND status = 'running';

-- name: release_held
-- At exit, after every outcome is written: anything still `running` under this worker was
-- claimed but never reached it (the connection died while the claim's answer was in flight).
-- Back to the queue, the attempt returned.
UPDATE job_queue
SET status = CASE WHEN attempts <= 1 THEN 'pending' ELSE 'retry' END::job_status,
    attempts = greatest(attempts - 1, 0),
    scheduled_for = now(),
    started_at = NULL,
    worker_id = NULL
WHERE worker_id = $1
  AND status = 'running'
RETURNING id;

-- name: unregister_worker
DELETE FROM job_workers WHERE id = $1;

-- name: rescue
-- Puts back the jobs of workers whose lease expired (killed, lost power, lost the connection),
-- counted as an attempt. A worker that is renewing is never touched: its row is only deleted
-- once its expiry has passed, and the DELETE rechecks that against a concurrent heartbeat.
-- $1: how long a running job without any worker row is left alone (seconds).
WITH dead AS (
    DELETE FROM job_workers
    WHERE expires_at < now()
    RETURNING id
)
UPDATE job_queue j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'error' ELSE 'retry' END::job_status,
    scheduled_for = now(),
    completed_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    error_msg = 'rescued from a dead worker (' || coalesce(j.worker_id::text, 'none')
                || ') whose lease expired',
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'class', 'rescued',
        'message', 'rescued from a dead worker (' || coalesce(j.worker_id::text, 'none')
                   || ') whose lease expired')),
    worker_id = NULL
WHERE j.status = 'running'
  AND (j.worker_id IN (SELECT id FROM dead)
       OR (NOT EXISTS (SELECT 1 FROM job_workers w WHERE w.id = j.worker_id)
           AND coalesce(j.started_at, '-infinity') < now() - make_interval(secs => $1)))
RETURNING j.id;

-- name: prune
-- Deletes up to $3 finished jobs: completed/cancelled older than $1 seconds, errors older than
-- $2 seconds. Small batches keep locks and WAL bursts short.
DELETE FROM job_queue
WHERE id = ANY(ARRAY(
    SELECT id FROM job_queue
    WHERE status IN ('completed', 'error', 'cancelled')
      AND completed_at < now() - make_interval(secs => $1)
      AND (status <> 'error' OR completed_at < now() - make_interval(secs => $2))
    LIMIT $3
));

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
    WHERE j.id = t.id AND t.status IN ('pending', 'retry', 'running')
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

-- name: count_due
SELECT count(*)
FROM job_queue
WHERE status IN ('pending', 'retry')
  AND scheduled_for <= now()
  AND ($1::text[] IS NULL OR job_type = ANY($1::text[]));

-- name: ensure_workspace
INSERT INTO workspaces (id, name)
VALUES ($1, $2)
ON CONFLICT (id) DO NOTHING;

-- name: workspace_exists
SELECT EXISTS (SELECT 1 FROM workspaces WHERE id = $1);
