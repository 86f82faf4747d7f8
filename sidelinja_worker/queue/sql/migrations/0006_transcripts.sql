-- Transcripts parsed from SRT by `srt_parse`. Additive. A transcript is keyed by its
-- workspace and the platform's reference (episode id, file name…), so a re-parse of the same
-- transcript replaces the earlier one in one transaction and two workspaces never share rows.

CREATE TABLE IF NOT EXISTS transcripts (
    workspace_id   UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    transcript_ref TEXT NOT NULL CHECK (transcript_ref <> ''),
    language       TEXT,
    source         JSONB NOT NULL,            -- where the SRT came from (path or Forgejo ref)
    plain_text     TEXT NOT NULL,
    webvtt         TEXT NOT NULL,
    segment_count  INTEGER NOT NULL CHECK (segment_count >= 0),
    duration_ms    BIGINT NOT NULL CHECK (duration_ms >= 0),
    job_id         UUID,                      -- the srt_parse job that wrote this version
    parsed_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, transcript_ref)
);

-- One row per SRT cue, in order; times in milliseconds from the start of the audio.
CREATE TABLE IF NOT EXISTS transcript_segments (
    workspace_id   UUID NOT NULL,
    transcript_ref TEXT NOT NULL,
    seq            INTEGER NOT NULL CHECK (seq >= 1),
    start_ms       BIGINT NOT NULL CHECK (start_ms >= 0),
    end_ms         BIGINT NOT NULL,
    text           TEXT NOT NULL,
    PRIMARY KEY (workspace_id, transcript_ref, seq),
    FOREIGN KEY (workspace_id, transcript_ref)
        REFERENCES transcripts (workspace_id, transcript_ref) ON DELETE CASCADE,
    CHECK (end_ms >= start_ms)
);
