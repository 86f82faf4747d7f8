-- The admin list's pending jobs by (created_at DESC, id DESC), replacing 0011's index on
-- created_at alone (affordable since the client's ids are time-ordered).
--
-- 0011 left id out because a bulk enqueue gives its whole batch one created_at, and random
-- UUIDs put each insert at a random place among them: +10-19 % server CPU for enqueue_many of
-- 20,000 jobs. The cost fell on readers instead: a list page inside one batch sorted the batch
-- (20-45 ms inside 20,000 jobs, ~1.2 s inside one enqueue of 1,000,000). The Python client now
-- makes time-ordered UUIDv7 ids (ids.py), so a batch's entries go in at the index's edge in
-- order. Measured with bench/admin_list_bench.py's fill (2-core machine), each index freshly
-- built, enqueue_many of 20,000 in a rolled-back transaction, backend CPU:
--   1,000,000 jobs, median of 9: no pending index 380 ms, 0011's 470 ms, this one 430 ms
--   (ascending (created_at, id) 450 ms); 200,000 jobs, median of 15: 470, 510 and 540 ms.
--   Pending page, all workspaces or one workspace's token, 200,000 jobs: 27-37 ms -> 1.1-1.4
--   ms; on 1,000,000: 1.5-2.4 ms; all statuses of one workspace 21 pages deep: 45 -> 2.2 ms.
-- A plain-SQL multi-row INSERT still uses gen_random_uuid() (the seed's default): its rows share
-- a created_at and go in at random places among themselves only.
--
-- Partial on status = 'pending' as 0011's: a claim (-> running) and a completion never write it.
-- Built in the migration's transaction, so enqueues wait for one scan of the table.
CREATE INDEX IF NOT EXISTS idx_job_queue_admin_pending_by_id
    ON job_queue (created_at DESC, id DESC) WHERE status = 'pending';
DROP INDEX IF EXISTS idx_job_queue_admin_pending;
