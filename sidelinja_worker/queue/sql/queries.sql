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
RETURNING id, workspace_id, job_type, payload, priority, attempts, max_attempts, timeout_s,
          extract(epoch FROM now() - scheduled_for)::float8 AS waited_s;

-- name: claim_fair
-- The claim when fairness or limits apply; otherwise `claim` above, which is cheaper.
-- Fair: within a priority level, jobs are taken round-robin across workspaces, so 50,000 jobs of
-- one workspace do not starve another's single job. Priority still comes first.
--   The workspaces with a due job are found first (a skip scan of
--   idx_job_queue_workspace_pending, no lock), and each is asked for an even share of the claim,
--   ceil($2 / workspaces), so a claim locks about as many rows as it takes whatever the number
--   of workspaces (asking each for all $2 locked 3,200 rows to claim 32 at 100 workspaces and
--   took 15x the plain claim). A workspace that gave its whole share may hold more: its next,
--   unseen job is the "frontier", and only candidates before the earliest frontier in the fair
--   order (priority DESC, turn) are taken. The claim may come back short, never out of order.
-- Limits: a workspace cap (workspace_limits) and a job type cap (job_type_limits) leave room
-- for `cap - running` more. For the count to be exact the caller runs this statement after
-- taking the cluster-wide advisory lock in the same transaction (only when a cap applies).
-- One workspace: when a single workspace has due jobs and no job type cap could bite, its own
-- queue order is the fair order (its share is the whole claim, and a lone frontier cuts
-- nothing), so `locked_one` takes them straight from its index, and `locked`, with its windows,
-- sort and materialised rows, is never run. That is the common case of a backlog from one
-- workspace. Taking `locked`'s rows instead cost PostgreSQL 8,400 more instructions per job
-- (claim and completion: 156,400 -> 148,000; the plain claim 144,400; bench/pg_instructions.py).
-- $1 worker, $2 how many, $3 job types, $4 fair (false: one queue, oldest first).
-- statement_timestamp(), not now(): after waiting for the claim lock, `started_at` must say
-- when the job was really claimed, not when the transaction began.
WITH RECURSIVE type_room AS (
    SELECT t.job_type,
           coalesce((SELECT greatest(l.max_running - (
                         SELECT count(*) FROM job_queue r
                         WHERE r.status = 'running' AND r.job_type = l.job_type), 0)
                     FROM job_type_limits l WHERE l.job_type = t.job_type), $2) AS room
    FROM unnest($3::text[]) AS t(job_type)
), open_types AS MATERIALIZED (
    SELECT coalesce(array_agg(job_type), '{}') AS types FROM type_room WHERE room > 0
), due_workspaces AS (
    -- The workspaces with a due job, by a skip scan of idx_job_queue_workspace_pending: one
    -- index descent per such workspace, each starting past the previous one, and landing on
    -- that workspace's head job (its first in queue order). Probing every row of `workspaces`
    -- instead cost a claim ~5 ms more at 10,000 workspaces with one busy.
    (SELECT j.workspace_id AS id, j.priority, j.scheduled_for
     FROM job_queue j
     WHERE $4
       AND j.status IN ('pending', 'retry')
       AND j.scheduled_for <= statement_timestamp()
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
          AND j.scheduled_for <= statement_timestamp()
          AND j.job_type = ANY((SELECT types FROM open_types)::text[])
        ORDER BY j.workspace_id, j.priority DESC, j.scheduled_for
        LIMIT 1
    ) head
), ws AS MATERIALIZED (
    SELECT d.id, d.priority AS head_priority, d.scheduled_for AS head_scheduled_for,
           CASE WHEN wl.max_running IS NULL THEN $2
                ELSE least($2, greatest(wl.max_running - (
                    SELECT count(*) FROM job_queue r
                    WHERE r.status = 'running' AND r.workspace_id = d.id), 0))
           END AS room
    FROM due_workspaces d
    LEFT JOIN workspace_limits wl ON wl.workspace_id = d.id
), type_capped AS MATERIALIZED (  -- a job type cap could cut this claim short
    SELECT EXISTS (SELECT 1 FROM type_room WHERE room < $2) AS yes
), busy AS MATERIALIZED (  -- workspaces with a due job and room for it
    SELECT count(*) AS n FROM ws WHERE room > 0
), one_workspace AS MATERIALIZED (
    SELECT (SELECT n FROM busy) = 1 AND NOT (SELECT yes FROM type_capped) AS one
), asked AS MATERIALIZED (
    -- The workspaces asked for a share. When more have room than the claim takes, each share
    -- is one job, and only the $2 workspaces whose head jobs come first in the fair order
    -- (priority, then age: every head is a first turn) can be in the claim: the others are
    -- not asked, so a claim of 50 locks ~50 rows, not one per busy workspace (1,000 busy of
    -- 10,000 workspaces: 12.6 -> 6.8 ms). Not with a type cap: a capped type's heads could
    -- fill the first $2 and starve the other types' jobs behind them.
    SELECT id, room FROM ws
    WHERE room > 0
      AND ((SELECT yes FROM type_capped) OR (SELECT n FROM busy) <= $2)
    UNION ALL
    (SELECT id, room FROM ws
     WHERE room > 0
       AND NOT (SELECT yes FROM type_capped)
       AND (SELECT n FROM busy) > $2
     ORDER BY head_priority DESC, head_scheduled_for
     LIMIT $2)
), share AS (
    SELECT ((count(*) + $2 - 1) / greatest(count(*), 1))::int AS k FROM asked
), locked AS (
    -- Each workspace's share, locked here, in its own index scan, so that concurrent workers
    -- skip each other's candidates instead of choosing the same ones and coming back half
    -- empty. Locks on candidates that are not chosen end with the statement. With one
    -- workspace the share is the whole claim, so this is that workspace's queue order.
    -- Each workspace's turns are numbered here, over its own share in queue order (a sort of
    -- that share, ~100 rows, instead of two sorts of the whole claim): a job's turn is its
    -- place within its priority level (its place in the share minus the higher levels').
    SELECT c.id, c.priority, c.scheduled_for, c.job_type, c.place - c.level_start + 1 AS turn,
           c.place = share.k AND share.k < ws.room AS frontier  -- its share is full: more may wait
    FROM asked ws
    CROSS JOIN share
    CROSS JOIN LATERAL (
        SELECT q.*,
               row_number() OVER (ORDER BY q.priority DESC, q.scheduled_for) AS place,
               rank() OVER (ORDER BY q.priority DESC) AS level_start  -- its level's first place
        FROM (
            SELECT j.id, j.priority, j.scheduled_for, j.job_type
            FROM job_queue j
            WHERE j.workspace_id = ws.id
              AND j.status IN ('pending', 'retry')
              AND j.scheduled_for <= statement_timestamp()
              AND j.job_type = ANY((SELECT types FROM open_types)::text[])
            ORDER BY j.priority DESC, j.scheduled_for
            LIMIT least(ws.room, share.k)
            FOR UPDATE SKIP LOCKED
        ) q
    ) c
    WHERE NOT (SELECT one FROM one_workspace)
), locked_one AS (  -- the one workspace's share, in its queue order: no windows, no sort
    SELECT j.id
    FROM job_queue j
    WHERE (SELECT one FROM one_workspace)
      AND j.workspace_id = (SELECT id FROM ws WHERE room > 0 LIMIT 1)
      AND j.status IN ('pending', 'retry')
      AND j.scheduled_for <= statement_timestamp()
      AND j.job_type = ANY((SELECT types FROM open_types)::text[])
      AND EXISTS (SELECT 1 FROM job_workers w WHERE w.id = $1 AND w.expires_at > statement_timestamp())
    ORDER BY j.priority DESC, j.scheduled_for
    LIMIT (SELECT room FROM ws WHERE room > 0 LIMIT 1)
    FOR UPDATE SKIP LOCKED
), plain_candidates AS (
    SELECT j.id, j.priority, j.scheduled_for, j.job_type, 1::bigint AS turn, false AS frontier
    FROM job_queue j
    WHERE NOT $4
      AND j.status IN ('pending', 'retry')
      AND j.scheduled_for <= statement_timestamp()
      AND j.job_type = ANY((SELECT types FROM open_types)::text[])
    ORDER BY j.priority DESC, j.scheduled_for
    LIMIT $2 * 4
    FOR UPDATE SKIP LOCKED
), candidates AS MATERIALIZED (
    SELECT * FROM locked UNION ALL SELECT * FROM plain_candidates
), frontier AS (
    SELECT -priority AS neg_priority, turn FROM candidates WHERE frontier
    ORDER BY -priority, turn LIMIT 1
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.job_type
                                   ORDER BY c.priority DESC, c.turn, c.scheduled_for) AS type_rank
    FROM candidates c
    WHERE NOT EXISTS (  -- behind the frontier: an unseen job of a cut workspace comes first
        SELECT 1 FROM frontier f WHERE (-c.priority, c.turn) > (f.neg_priority, f.turn))
), chosen AS (
    SELECT r.id
    FROM ranked r
    JOIN type_room tr ON tr.job_type = r.job_type
    WHERE NOT (SELECT one FROM one_workspace)
      AND (SELECT yes FROM type_capped)
      AND r.type_rank <= tr.room
      AND EXISTS (SELECT 1 FROM job_workers w WHERE w.id = $1 AND w.expires_at > statement_timestamp())
    ORDER BY r.priority DESC, r.turn, r.scheduled_for
    LIMIT $2
), chosen_uncapped AS (  -- `chosen` without the per-type ranking no cap needs
    SELECT c.id
    FROM candidates c
    WHERE NOT (SELECT one FROM one_workspace)
      AND NOT (SELECT yes FROM type_capped)
      AND NOT EXISTS (
          SELECT 1 FROM frontier f WHERE (-c.priority, c.turn) > (f.neg_priority, f.turn))
      AND EXISTS (SELECT 1 FROM job_workers w WHERE w.id = $1 AND w.expires_at > statement_timestamp())
    ORDER BY c.priority DESC, c.turn, c.scheduled_for
    LIMIT $2
)
UPDATE job_queue
SET status = 'running',
    started_at = statement_timestamp(),
    attempts = attempts + 1,
    worker_id = $1,
    cancel_requested_at = NULL
WHERE id = ANY(ARRAY(SELECT id FROM chosen UNION ALL SELECT id FROM chosen_uncapped
                     UNION ALL SELECT id FROM locked_one))
RETURNING id, workspace_id, job_type, payload, priority, attempts, max_attempts, timeout_s,
          extract(epoch FROM now() - scheduled_for)::float8 AS waited_s;

-- name: lock_limited_claims
-- Serialises the claims that count running jobs against a cap, cluster-wide, for one
-- transaction. Claims with no cap in play never take it.
SELECT pg_advisory_xact_lock(7226133950251622721);

-- name: limits
-- Everything a worker caches about limits; re-read on `sidelinja_limits_changed`.
SELECT
    (SELECT coalesce(jsonb_object_agg(job_type, max_running), '{}') FROM job_type_limits) AS type_caps,
    (SELECT count(*) FROM workspace_limits) AS workspace_caps,
    (SELECT coalesce((SELECT value = 'true' FROM queue_settings WHERE name = 'fair_workspaces'), true)) AS fair,
    (SELECT coalesce(jsonb_object_agg(key, jsonb_build_object(
         'max_requests', max_requests, 'per_s', per_s,
         'paused_for_s', extract(epoch FROM greatest(paused_until, now()) - now()))), '{}')
     FROM rate_limits) AS rates;

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
-- call into a window.
WITH granted AS (
    UPDATE rate_limits
    SET recent = CASE WHEN max_requests IS NULL THEN '{}'::timestamptz[]
                      ELSE array(SELECT t FROM unnest(recent) t
                                 WHERE t > clock_timestamp() - make_interval(secs => per_s + $2)) || clock_timestamp()
                 END
    WHERE key = $1
      AND paused_until <= clock_timestamp()
      AND (max_requests IS NULL
           OR (SELECT count(*) FROM unnest(recent) t
               WHERE t > clock_timestamp() - make_interval(secs => per_s + $2)) < max_requests)
    RETURNING key
)
SELECT EXISTS (SELECT 1 FROM granted)
           OR NOT EXISTS (SELECT 1 FROM rate_limits WHERE key = $1) AS granted,
       coalesce((
           SELECT greatest(
               extract(epoch FROM greatest(paused_until, clock_timestamp()) - clock_timestamp()),
               coalesce(extract(epoch FROM (
                   SELECT t FROM unnest(recent) t
                   WHERE t > clock_timestamp() - make_interval(secs => per_s + $2)
                   ORDER BY t DESC OFFSET max_requests - 1 LIMIT 1)
                   + make_interval(secs => per_s + $2) - clock_timestamp()), 0),
               0.01)
           FROM rate_limits WHERE key = $1), 0.01) AS wait_s;

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
-- Stored on the job and published for live pages (issue 5); only while this worker holds it.
WITH updated AS (
    UPDATE job_queue
    SET progress = jsonb_build_object('message', $3::text, 'percent', $4::float8,
                                      'attempt', attempts, 'max_attempts', max_attempts,
                                      'at', now())
    WHERE id = $1 AND worker_id = $2 AND status = 'running'
    RETURNING id, workspace_id, job_type, status, progress
)
SELECT pg_notify('sidelinja_job_events', jsonb_build_object(
           'id', id, 'workspace_id', workspace_id, 'job_type', job_type,
           'status', status, 'progress', progress)::text)
FROM updated;

-- name: workspace_settings
SELECT settings FROM workspaces WHERE id = $1;

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
-- Batched give-back: a deferral (resource governor, rate limit) or a job unfinished at shutdown
-- goes back to the queue at $2[i] and the attempt taken at claim is returned: it was not a
-- failed attempt. A deferral's reason ($3[i]) is recorded in `progress` for `jobs why`.
UPDATE job_queue j
SET status = CASE WHEN j.attempts <= 1 THEN 'pending' ELSE 'retry' END::job_status,
    attempts = greatest(j.attempts - 1, 0),
    scheduled_for = coalesce(r.run_at, now()),
    started_at = NULL,
    worker_id = NULL,
    progress = CASE WHEN r.reason IS NULL THEN j.progress
                    ELSE jsonb_build_object('message', r.reason, 'deferred_until',
                                            coalesce(r.run_at, now()), 'at', now()) END
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
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'class', 'cancelled',
        'message', 'cancelled while running'))
WHERE j.id = ANY($1::uuid[])
  AND j.status = 'running'
  AND j.worker_id = $2;

-- name: enqueue
-- One round trip for any number of jobs. Ids are made by the client so that the caller gets them
-- back in its own order. A job whose unique key is already held by a pending/retry/running job
-- of its workspace is not inserted (the unique index decides, for every writer); the caller
-- then looks up the holder with `find_by_unique_keys`.
INSERT INTO job_queue (id, workspace_id, job_type, payload, priority, scheduled_for,
                       max_attempts, unique_key, timeout_s)
SELECT j.id, j.workspace_id, j.job_type, j.payload, j.priority,
       coalesce(j.scheduled_for, now() + make_interval(secs => coalesce(j.delay_s, 0))),
       j.max_attempts, j.unique_key, j.timeout_s
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::jsonb[], $5::smallint[],
            $6::timestamptz[], $7::float8[], $8::smallint[], $9::text[], $10::integer[])
     AS j(id, workspace_id, job_type, payload, priority, scheduled_for, delay_s,
          max_attempts, unique_key, timeout_s)
ON CONFLICT (workspace_id, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running')
DO NOTHING
RETURNING id;

-- name: add_dependencies
-- Edges of a job graph (parent, child, run_anyway); the triggers of job_dependencies hold or
-- cancel the children and refuse cycles.
INSERT INTO job_dependencies (parent_id, child_id, run_anyway)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bool[])
ON CONFLICT DO NOTHING;

-- name: parent_results
-- A job's parents with their results, for its handler (read only when the handler asks).
SELECT p.id, p.job_type, p.status::text AS status, p.result
FROM job_dependencies d
JOIN job_queue p ON p.id = d.parent_id
WHERE d.child_id = $1
ORDER BY p.created_at, p.id;

-- name: job_relatives
-- A job's parents and children, for `jobs show` and `jobs why`.
SELECT 'parent' AS relation, p.id, p.job_type, p.status::text AS status, d.run_anyway
FROM job_dependencies d JOIN job_queue p ON p.id = d.parent_id
WHERE d.child_id = $1
UNION ALL
SELECT 'child', c.id, c.job_type, c.status::text, d.run_anyway
FROM job_dependencies d JOIN job_queue c ON c.id = d.child_id
WHERE d.parent_id = $1
ORDER BY 1 DESC, 3, 2;

-- name: find_by_unique_keys
-- The holders of (workspace, key) pairs: a key is unique within its workspace only.
SELECT j.workspace_id, j.unique_key, j.id
FROM job_queue j
JOIN unnest($1::uuid[], $2::text[]) AS k(workspace_id, unique_key)
  ON j.workspace_id = k.workspace_id AND j.unique_key = k.unique_key
WHERE j.status IN ('pending', 'retry', 'running');

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
-- $2 seconds. Small batches keep locks and WAL bursts short. A job in a graph goes only with
-- its whole graph (every job joined to it by edges, either way), once all of it is past
-- retention: a graph never loses a parent while a child remains, nor a failed job's children
-- while that job may still be retried. Jobs outside graphs pay one has_children test and one
-- primary-key probe of job_dependencies.
WITH RECURSIVE old AS NOT MATERIALIZED (
    SELECT id, has_children FROM job_queue
    WHERE status IN ('completed', 'error', 'cancelled')
      AND completed_at < now() - make_interval(secs => $1)
      AND (status <> 'error' OR completed_at < now() - make_interval(secs => $2))
), batch AS (  -- jobs outside graphs: never held up behind graph jobs that must stay
    SELECT id FROM old o
    WHERE NOT o.has_children
      AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = o.id)
    LIMIT $3
), in_graph AS (
    SELECT id FROM old o
    WHERE o.has_children OR EXISTS (SELECT 1 FROM job_dependencies d WHERE d.child_id = o.id)
    LIMIT $3
), graph(id) AS (  -- the whole graphs of the batch's graph jobs
    SELECT id FROM in_graph
    UNION
    SELECT n.id
    FROM graph g
    CROSS JOIN LATERAL (
        SELECT d.child_id AS id FROM job_dependencies d WHERE d.parent_id = g.id
        UNION ALL
        SELECT d.parent_id FROM job_dependencies d WHERE d.child_id = g.id
    ) n
), kept(id) AS (  -- joined to a job not past retention: its graph stays whole
    SELECT g.id FROM graph g JOIN job_queue j ON j.id = g.id
    WHERE (j.status IN ('completed', 'error', 'cancelled')
           AND j.completed_at < now() - make_interval(secs => $1)
           AND (j.status <> 'error' OR j.completed_at < now() - make_interval(secs => $2)))
          IS NOT TRUE
    UNION
    SELECT n.id
    FROM kept k
    CROSS JOIN LATERAL (
        SELECT d.child_id AS id FROM job_dependencies d WHERE d.parent_id = k.id
        UNION ALL
        SELECT d.parent_id FROM job_dependencies d WHERE d.child_id = k.id
    ) n
)
DELETE FROM job_queue
WHERE id = ANY(ARRAY(
    SELECT id FROM batch
    UNION ALL
    SELECT id FROM graph WHERE id NOT IN (SELECT id FROM kept)
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
          AND job_type = ANY($1::text[])
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
    (SELECT count(*) FROM job_queue a
     WHERE a.status IN ('pending', 'retry') AND a.scheduled_for <= now() AND a.id <> j.id
       AND (a.priority > j.priority
            OR (a.priority = j.priority AND a.scheduled_for < j.scheduled_for))) AS ahead
FROM j;

-- name: counts
-- Jobs by status and type (the worker's gauges, the admin overview; RLS scopes it there).
SELECT status::text AS status, job_type, count(*) AS n
FROM job_queue
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: oldest_due_s
SELECT coalesce(extract(epoch FROM now() - min(scheduled_for)), 0)::float8
FROM job_queue
WHERE status IN ('pending', 'retry') AND scheduled_for <= now();

-- name: abandon_worker
-- A worker whose internal task died (crash-only): it leaves the workers table and its running
-- jobs go back to the queue at once, each counted as an attempt (so a job that kills every
-- worker it reaches ends in `error` after max_attempts instead of looping), rather than after
-- its lease. $2 says why, in `errors`.
WITH gone AS (
    DELETE FROM job_workers WHERE id = $1
)
UPDATE job_queue j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'error' ELSE 'retry' END::job_status,
    scheduled_for = now(),
    completed_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    error_msg = 'abandoned by worker ' || $1::text || ': ' || $2::text,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'class', 'rescued',
        'message', 'abandoned by worker ' || $1::text || ': ' || $2::text)),
    worker_id = NULL
WHERE j.worker_id = $1
  AND j.status = 'running'
RETURNING j.id;

-- name: cancel_requested
-- Whether the row of a job this worker runs asks for its cancellation: a notification on the
-- cancel channel only makes the worker look here (anyone may send one).
SELECT EXISTS (
    SELECT 1 FROM job_queue
    WHERE id = $1 AND worker_id = $2 AND status = 'running' AND cancel_requested_at IS NOT NULL
);
