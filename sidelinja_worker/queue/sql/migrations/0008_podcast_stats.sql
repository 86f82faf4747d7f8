-- Podcast download statistics from Caddy access logs (stats_parse). All additive.

-- The result: IAB downloads per workspace, UTC day and episode, split by app family (from the
-- vendored user-agent list) and country ('' unless a GeoIP database is configured). Per-episode
-- totals are sums over app and country. Rows only grow, by upsert: re-running adds nothing.
CREATE TABLE IF NOT EXISTS podcast_downloads_daily (
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    day          DATE NOT NULL,
    episode      TEXT NOT NULL,
    app          TEXT NOT NULL DEFAULT '',
    country      TEXT NOT NULL DEFAULT '',
    downloads    INTEGER NOT NULL DEFAULT 0 CHECK (downloads >= 0),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, day, episode, app, country)
);

-- One row per listener (IP, IPv6 cut to /64, + User-Agent), episode and UTC day: the bytes they
-- received so far, because a listener's byte ranges can arrive in several runs, and whether
-- they were counted, so a listener is counted once a day. `listener` is a keyed hash under that
-- day's random salt (below); the raw IP is never stored. Kept only for a few days.
CREATE TABLE IF NOT EXISTS podcast_listener_days (
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    day          DATE NOT NULL,
    episode      TEXT NOT NULL,
    listener     BYTEA NOT NULL,
    app          TEXT NOT NULL DEFAULT '',
    country      TEXT NOT NULL DEFAULT '',
    bytes        BIGINT NOT NULL DEFAULT 0,
    whole        BOOLEAN NOT NULL DEFAULT false,
    counted      BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (workspace_id, day, episode, listener)
);

-- A random salt per workspace and day. Deleting it with that day's listener rows makes the
-- hashes unlinkable to any address, which is why it is not derived from a long-lived secret.
CREATE TABLE IF NOT EXISTS podcast_stats_salts (
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    day          DATE NOT NULL,
    salt         BYTEA NOT NULL,
    PRIMARY KEY (workspace_id, day)
);

-- How far each log text has been read. Keyed by a fingerprint of its first line, not by its
-- name: Caddy renames and compresses the live file when it rolls it, and the rotated file must
-- be known as the one already read up to `read_offset` (bytes of uncompressed text).
CREATE TABLE IF NOT EXISTS podcast_log_files (
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    fingerprint  TEXT NOT NULL,
    last_name    TEXT NOT NULL,
    read_offset  BIGINT NOT NULL CHECK (read_offset >= 0),
    complete     BOOLEAN NOT NULL DEFAULT false,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, fingerprint)
);
