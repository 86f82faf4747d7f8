-- The application_name of a worker's database sessions (db.session_name: "sidelinja-worker"
-- and a tag of its process's own), so that the rescue that declares the worker dead can end
-- them (`end_sessions`). A worker stopped rather than killed (SIGSTOP, a paused VM, a machine
-- cut off with its connections left open) kept every lock of its open transactions for as
-- long as it stayed so: a handler's row locks, which the rescued job's next run waited on,
-- and, while the server was sending it a claim's answer it never read, the cluster-wide claim
-- lock every capped claim waits on. NULL (a worker registered by plain SQL, or by a version
-- before this column): nothing is ended.
ALTER TABLE job_workers ADD COLUMN IF NOT EXISTS sessions TEXT;
