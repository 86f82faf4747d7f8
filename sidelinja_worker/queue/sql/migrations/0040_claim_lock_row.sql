-- The claim lock is a row only the tables' owner may lock. It was an advisory lock on a fixed
-- key, and PostgreSQL lets every role take any advisory lock: a login with no grant at all (the
-- web app's, any workspace's) that held `pg_advisory_lock(7226133950251622721)` stopped every
-- claim that counts a cap, in every workspace, for as long as its session lasted. Locking a
-- row needs UPDATE on its table, which no role but the owner has here; a role without it
-- cannot take a table lock that conflicts with the row lock's either.
--
-- Workers of a version before this one still take the advisory lock: while both run against
-- one database their capped claims are not serialised with each other's, and a cap may be
-- passed by one claim's batch until the older workers stop.
CREATE TABLE IF NOT EXISTS job_claim_lock (
    one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one)
);
INSERT INTO job_claim_lock VALUES (true) ON CONFLICT DO NOTHING;
REVOKE ALL ON job_claim_lock FROM PUBLIC, sidelinja_app, sidelinja_platform_admin;
