-- Runtime SQL of the AI job types, as named blocks; run only by ai_store.py. Every statement is
-- keyed by workspace_id: a job reads and writes its own workspace only.

-- name: save_ai_result
INSERT INTO ai_results (workspace_id, kind, source_ref, job_id, model, result)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (workspace_id, kind, source_ref) DO UPDATE
SET job_id = EXCLUDED.job_id, model = EXCLUDED.model, result = EXCLUDED.result, updated_at = now()
RETURNING id

-- name: transcript_plain_text
-- The text only when it is at most $3 bytes, and its size: any writer's row may hold a gigabyte.
SELECT CASE WHEN octet_length(plain_text) <= $3 THEN plain_text END, octet_length(plain_text)
FROM transcripts WHERE workspace_id = $1 AND transcript_ref = $2

-- name: transcript_lines
-- `[H:MM:SS] text` per segment, in order, so the model can place chapters in time; NULL when
-- there are none. Built here, not in Python: for an episode of 200,000 segments, the rows and
-- the lines built from them held the worker's event loop 0.3 s. The lines come back only when
-- they are at most $3 bytes, with their size (any writer's segments may add up to a gigabyte).
SELECT CASE WHEN octet_length(lines) <= $3 THEN lines END, octet_length(lines)
FROM (SELECT string_agg(
    format(
        '[%s:%s:%s] %s',
        s / 3600,
        lpad((s % 3600 / 60)::text, 2, '0'),
        lpad((s % 60)::text, 2, '0'),
        btrim(text, E' \t\n\r\v\f')
    ) || E'\n',
    '' ORDER BY seq
)
FROM (
    SELECT seq, start_ms / 1000 AS s, text
    FROM transcript_segments WHERE workspace_id = $1 AND transcript_ref = $2
) AS segments) AS joined(lines)
