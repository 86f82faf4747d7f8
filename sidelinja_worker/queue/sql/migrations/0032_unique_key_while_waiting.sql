-- A job held by its parents (`waiting`, 0023) holds its unique key, as a queued job does: the
-- key's index covers `waiting` too. It did not, so a second job with the key went in beside a
-- waiting one (a plain-SQL insert, or the client's dedupe, which found no holder); when the
-- waiting job's parents completed, its release to `pending` broke the index, and the statement
-- that completed the last parent failed with it: the worker recorded that parent as an `error`
-- (its result could not be stored) and the child was cancelled.
--
-- Duplicates the old index let in are resolved first, so the new index can be built: of the
-- queued jobs sharing a workspace and key, the one that is not waiting keeps it (the old index
-- allowed one), else the oldest waiting one; every other one, always a waiting job, is
-- cancelled naming that holder, as the dedupe would have answered it. Its own waiting children
-- follow it (the graph trigger), and a retry brings them back once the key is free.
WITH queued AS (
    SELECT id, first_value(id) OVER w AS holder, row_number() OVER w AS place
    FROM job_queue
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running', 'waiting')
    WINDOW w AS (PARTITION BY workspace_id, unique_key
                 ORDER BY status = 'waiting', created_at, id)
)
UPDATE job_queue j
SET status = 'cancelled',
    completed_at = now(),
    error_msg = 'its unique key is held by job ' || q.holder
FROM queued q
WHERE j.id = q.id AND q.place > 1;

DROP INDEX IF EXISTS idx_job_queue_unique_key;
CREATE UNIQUE INDEX idx_job_queue_unique_key ON job_queue (workspace_id, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'retry', 'running', 'waiting');
