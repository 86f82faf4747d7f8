-- Adds the `cancelled` state (cancelling a job). Its own migration because a new enum
-- value cannot be used in the transaction that adds it. Additive: no existing value changes.
ALTER TYPE job_status ADD VALUE IF NOT EXISTS 'cancelled';
