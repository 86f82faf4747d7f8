-- Job graphs: a job whose parents have not all finished is `waiting`. It is a status of its own,
-- not a far-off `scheduled_for`, so that waiting jobs are in none of the partial indexes of due
-- jobs (`status IN ('pending', 'retry')`): 100,000 of them cost the claim nothing. The value is
-- added in a migration of its own because a new enum value cannot be used in the transaction
-- that adds it.
ALTER TYPE job_status ADD VALUE IF NOT EXISTS 'waiting';
