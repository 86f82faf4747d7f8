-- Admin view sessions that expire on the server. Logging in used to put the admin token itself
-- in the cookie, valid for as long as the token: a copied cookie was the token, and logging out
-- only asked the browser to forget it. A session is a random secret of its own (only its SHA-256
-- stored, like tokens), bound to the token that opened it, with a fixed end: it dies at
-- expires_at, at logout (its row is deleted) and with its token (revoked or deleted).
CREATE TABLE IF NOT EXISTS admin_sessions (
    id            UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    secret_sha256 BYTEA NOT NULL UNIQUE,
    token_id      UUID NOT NULL REFERENCES admin_tokens(id) ON DELETE CASCADE,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL
);
-- Expired rows are deleted at each login (admin.sql `session_prune`).
CREATE INDEX IF NOT EXISTS admin_sessions_expires ON admin_sessions (expires_at);
