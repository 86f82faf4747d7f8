-- Runtime SQL of the AI job types, as named blocks; run only by ai_store.py. Every statement is
-- keyed by workspace_id: a job reads and writes its own workspace only.

-- name: save_ai_result
INSERT INTO ai_results (workspace_id, kind, source_ref, job_id, model, result)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (workspace_id, kind, source_ref) DO UPDATE
SET job_id = EXCLUDED.job_id, model = EXCLUDED.model, result = EXCLUDED.result, updated_at = now()
RETURNING id

-- name: transcript_plain_text
SELECT plain_text FROM transcripts WHERE workspace_id = $1 AND transcript_ref = $2

-- name: transcript_segments
SELECT start_ms, text
FROM transcript_segments WHERE workspace_id = $1 AND transcript_ref = $2
ORDER BY seq
