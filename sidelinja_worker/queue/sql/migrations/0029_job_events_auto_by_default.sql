-- Status events cost (almost) nothing while no one listens, by default: `job_events` becomes
-- "auto", so the status-event trigger publishes only while some listener holds a lease
-- (sidelinja_job_events_listen, renewed while it listens; see docs/sql-contract.md). The admin
-- process registers its LISTEN, and the SpacetimeDB bridge rides on it. Any other LISTENer on
-- `sidelinja_job_events` (the web app) must now register too, or it receives no status events;
-- progress reports are sent whatever the mode.
--
-- An operator's explicit choice stays: false and "auto" are kept, and true changes only while the
-- row still holds the default that migration 0009 wrote (updated_at equal to the time of that
-- migration's own transaction). A true written later with its updated_at stamped (as the
-- settings statement of the worker's store does) is kept; a bare `UPDATE ... SET value = 'true'`
-- cannot be told from the default and becomes "auto" (docs/sql-contract.md tells upgraders). A
-- missing row reads as "publish always" in the trigger, so it is written as the new default.

UPDATE queue_settings s
SET value = '"auto"'::jsonb, updated_at = now()
WHERE s.name = 'job_events'
  AND s.value = 'true'::jsonb
  AND s.updated_at = (SELECT m.applied_at FROM sidelinja_schema_migrations m WHERE m.version = 9);

INSERT INTO queue_settings (name, value) VALUES ('job_events', '"auto"')
ON CONFLICT (name) DO NOTHING;
