-- The W3C trace context of whoever enqueued the job (`00-<trace id>-<span id>-<flags>`), so that
-- the worker's span for each attempt joins the enqueuer's trace. Optional: a plain SQL insert
-- may set it or leave it NULL. The worker uses only a well-formed version 00 value and starts a
-- new trace for anything else; the constraint only keeps a giant value out of the table (a valid
-- one is 55 characters). NOT VALID: every existing row is NULL, so there is nothing to check and
-- no reason to scan the table under the lock ADD COLUMN holds; new and updated rows are checked.
ALTER TABLE job_queue
    ADD COLUMN IF NOT EXISTS traceparent TEXT,
    ADD CONSTRAINT job_queue_traceparent_length CHECK (octet_length(traceparent) <= 256) NOT VALID;
