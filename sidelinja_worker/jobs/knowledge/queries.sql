-- Runtime SQL of the knowledge job types (generate_embeddings, valgomat_*, prompt_eval), as
-- named blocks; run only by knowledge_store.py. Every statement is keyed by workspace_id.

-- name: pgvector_ready
SELECT to_regclass('knowledge_embeddings') IS NOT NULL

-- name: node_texts
-- The nodes' texts, each only while it is at most $3 bytes and the texts so far (by node id) at
-- most $4: a node's content is any writer's text, up to a gigabyte, and a job may name 10,000.
-- `size` is each one's and `total` all of theirs, for the caller to refuse the job over a cap;
-- octet_length reads a stored text's size from its header, never decompressing it.
SELECT node_id, octet_length(content)::bigint AS size,
       CASE WHEN octet_length(content) <= $3
             AND sum(octet_length(content)::bigint) OVER (ORDER BY node_id) <= $4
            THEN content END AS content,
       (sum(octet_length(content)::bigint) OVER ())::bigint AS total
FROM knowledge_nodes
WHERE workspace_id = $1 AND node_id = ANY($2::text[])
ORDER BY node_id

-- name: embedding_state
SELECT ref, content_sha256, dims FROM knowledge_embeddings
WHERE workspace_id = $1 AND model = $2 AND ref = ANY($3::text[])

-- name: save_embedding
INSERT INTO knowledge_embeddings (workspace_id, ref, model, dims, content_sha256, embedding, job_id)
VALUES ($1, $2, $3, $4, $5, $6::text::vector, $7)
ON CONFLICT (workspace_id, model, ref) DO UPDATE
SET dims = EXCLUDED.dims, content_sha256 = EXCLUDED.content_sha256,
    embedding = EXCLUDED.embedding, job_id = EXCLUDED.job_id, updated_at = now()

-- name: exact_hnsw_scan
SET LOCAL hnsw.iterative_scan = strict_order

-- name: similar_1536
-- The expression and predicate of knowledge_embeddings_hnsw_1536, so the planner can use it.
SELECT ref, 1 - (embedding::vector(1536) <=> $3::text::vector(1536)) AS similarity
FROM knowledge_embeddings
WHERE workspace_id = $1 AND model = $2 AND dims = 1536
ORDER BY embedding::vector(1536) <=> $3::text::vector(1536)
LIMIT $4

-- name: similar_any
SELECT ref, 1 - (embedding <=> $3::text::vector) AS similarity
FROM knowledge_embeddings
WHERE workspace_id = $1 AND model = $2 AND dims = $5
ORDER BY embedding <=> $3::text::vector
LIMIT $4

-- name: save_profile
INSERT INTO valgomat_profiles (workspace_id, quiz_id, party, job_id, model, profile)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (workspace_id, quiz_id, party) DO UPDATE
SET job_id = EXCLUDED.job_id, model = EXCLUDED.model, profile = EXCLUDED.profile, updated_at = now()
RETURNING id

-- name: quiz_questions
-- A stored vector that is not a flat, non-empty list of finite numbers (NaN, Infinity or a NULL
-- element, written by plain SQL or taken from a gateway unchecked) reads as missing, so the job
-- embeds its question again: every similarity with it is NaN or fails, and its text and model
-- are unchanged, so nothing else ever would. NaN sorts above Infinity in PostgreSQL.
-- Questions are any writer's rows: at most $3 + 1 come back, `questions` counting them all
-- (and none with its vector when they are more than $3); a text or id over $4 bytes comes back
-- NULL with its `size`; a vector longer than 16,000 (no model's), a model name over 500 bytes
-- or a hash that is no SHA-256 reads as missing. The caller refuses the quiz over a cap, or
-- embeds the question again.
SELECT CASE WHEN size <= $4 THEN question_id ELSE left(question_id, 100) END AS question_id,
       CASE WHEN size <= $4 THEN text END AS text, size,
       CASE WHEN octet_length(embedding_model) <= 500 THEN embedding_model END AS embedding_model,
       CASE WHEN octet_length(embedding_sha256) = 32 THEN embedding_sha256 END AS embedding_sha256,
       CASE WHEN count(*) OVER () <= $3
             AND array_ndims(embedding) = 1 AND array_length(embedding, 1) <= 16000
             AND (SELECT bool_and(coalesce(x > '-Infinity' AND x < 'Infinity', false))
                  FROM unnest(embedding) AS x)
            THEN embedding END AS embedding,
       count(*) OVER () AS questions
FROM (SELECT *, greatest(octet_length(text), octet_length(question_id))::bigint AS size
      FROM valgomat_questions WHERE workspace_id = $1 AND quiz_id = $2) q
ORDER BY question_id
LIMIT $3 + 1

-- name: save_question_embedding
UPDATE valgomat_questions
SET embedding_model = $4, embedding_sha256 = $5, embedding = $6
WHERE workspace_id = $1 AND quiz_id = $2 AND question_id = $3

-- name: save_moderation
-- A review a moderator has decided is kept: the upsert then returns no row.
INSERT INTO valgomat_moderation (workspace_id, quiz_id, submission_ref, question, duplicate_of,
                                 similarity, rewrite, flags, result, model, job_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (workspace_id, quiz_id, submission_ref) DO UPDATE
SET question = EXCLUDED.question, duplicate_of = EXCLUDED.duplicate_of,
    similarity = EXCLUDED.similarity, rewrite = EXCLUDED.rewrite, flags = EXCLUDED.flags,
    result = EXCLUDED.result, model = EXCLUDED.model, job_id = EXCLUDED.job_id, updated_at = now()
WHERE valgomat_moderation.status = 'pending'
RETURNING id

-- name: moderation_status
SELECT id, status FROM valgomat_moderation
WHERE workspace_id = $1 AND quiz_id = $2 AND submission_ref = $3

-- name: save_eval_run
INSERT INTO prompt_eval_runs (workspace_id, run_ref, job_id, prompt, models, summary)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (workspace_id, run_ref) DO UPDATE
SET job_id = EXCLUDED.job_id, prompt = EXCLUDED.prompt, models = EXCLUDED.models,
    summary = EXCLUDED.summary, updated_at = now()
RETURNING id

-- name: clear_eval_results
DELETE FROM prompt_eval_results WHERE run_id = $1 AND workspace_id = $2

-- name: save_eval_result
INSERT INTO prompt_eval_results (run_id, workspace_id, model, case_id, passed, output, error,
                                 scores, latency_ms, prompt_tokens, completion_tokens)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
