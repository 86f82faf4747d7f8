-- Runtime SQL for transcripts (srt_parse), as named blocks; run only by transcripts_store.py.
-- Every statement is keyed by workspace_id: a job writes and reads its own workspace only.

-- name: upsert_transcript
-- Takes the transcript row's lock first, so two parses of one transcript serialise.
INSERT INTO transcripts (workspace_id, transcript_ref, language, source, plain_text, webvtt,
                         segment_count, duration_ms, job_id, parsed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now())
ON CONFLICT (workspace_id, transcript_ref) DO UPDATE
SET language = EXCLUDED.language, source = EXCLUDED.source, plain_text = EXCLUDED.plain_text,
    webvtt = EXCLUDED.webvtt, segment_count = EXCLUDED.segment_count,
    duration_ms = EXCLUDED.duration_ms, job_id = EXCLUDED.job_id, parsed_at = now()

-- name: delete_segments
DELETE FROM transcript_segments WHERE workspace_id = $1 AND transcript_ref = $2

-- name: insert_segments
INSERT INTO transcript_segments (workspace_id, transcript_ref, seq, start_ms, end_ms, text)
SELECT $1, $2, s.seq, s.start_ms, s.end_ms, s.text
FROM unnest($3::int[], $4::bigint[], $5::bigint[], $6::text[]) AS s(seq, start_ms, end_ms, text)

-- name: get_transcript
SELECT transcript_ref, language, source, plain_text, webvtt, segment_count, duration_ms, job_id,
       parsed_at
FROM transcripts WHERE workspace_id = $1 AND transcript_ref = $2

-- name: get_segments
SELECT seq, start_ms, end_ms, text
FROM transcript_segments WHERE workspace_id = $1 AND transcript_ref = $2
ORDER BY seq
