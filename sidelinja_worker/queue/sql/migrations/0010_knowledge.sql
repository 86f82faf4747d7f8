-- Knowledge job types: embeddings of knowledge-graph nodes, the election quiz
-- (valgomat) and the prompt lab. Additive only. Every table is keyed by workspace_id, and every
-- runtime statement (sql/knowledge.sql) filters on it: a job reads and writes its own workspace.

-- The knowledge graph's node texts, as the platform writes them, so a `generate_embeddings`
-- payload can name nodes by id (a platform that keeps nodes elsewhere passes texts instead).
CREATE TABLE IF NOT EXISTS knowledge_nodes (
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    node_id      TEXT NOT NULL CHECK (node_id <> ''),
    content      TEXT NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, node_id)
);

-- Vectors need pgvector, which PostgreSQL 15 on Debian 12 cannot install, so
-- the embeddings table exists only where the extension is available; everything else in this
-- file works without it, and `generate_embeddings` fails permanently with a clear message where
-- the table is missing.
--
-- Dimension: the column is `vector` without a typmod, with the dimension in `dims`, so any
-- embedding model fits one table (models differ: 1536 for text-embedding-3-small, 3072 for
-- -large, 1024 for many open models, or what `dimensions` asks for). HNSW needs a fixed
-- dimension, so the index is a partial expression index for the default model's 1536; the
-- search for 1536 dimensions uses exactly that expression, and other dimensions are searched
-- exactly (still filtered by workspace and model, which keeps them small). Another dimension can
-- get its own partial index the same way in a later migration.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        RAISE NOTICE 'pgvector is not available on this server: knowledge_embeddings not created';
        RETURN;
    END IF;
    CREATE EXTENSION IF NOT EXISTS vector;
    CREATE TABLE IF NOT EXISTS knowledge_embeddings (
        workspace_id   UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
        ref            TEXT NOT NULL CHECK (ref <> ''),   -- node id, or the caller's ref for a text
        model          TEXT NOT NULL,
        dims           INTEGER NOT NULL CHECK (dims > 0),
        content_sha256 BYTEA NOT NULL,                   -- unchanged text + model: not embedded again
        embedding      vector NOT NULL,
        job_id         UUID,                             -- jobs are pruned: no FK
        updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (workspace_id, model, ref),
        CHECK (vector_dims(embedding) = dims)
    );
    CREATE INDEX IF NOT EXISTS knowledge_embeddings_hnsw_1536 ON knowledge_embeddings
        USING hnsw ((embedding::vector(1536)) vector_cosine_ops) WHERE dims = 1536;
END
$$;

-- Synthetic candidate profiles: one per (workspace, quiz, party); a re-run replaces it.
CREATE TABLE IF NOT EXISTS valgomat_profiles (
    id           UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    quiz_id      TEXT NOT NULL CHECK (quiz_id <> ''),
    party        TEXT NOT NULL CHECK (party <> ''),
    job_id       UUID,
    model        TEXT NOT NULL,
    profile      JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT valgomat_profiles_one_per_party UNIQUE (workspace_id, quiz_id, party)
);

-- A quiz's published questions, written by the platform. The moderation job fills in their
-- vectors (plain real[]: quizzes hold hundreds of questions, so cosine similarity in Python is
-- cheap and the duplicate check works without pgvector); the hash tells an edited question.
CREATE TABLE IF NOT EXISTS valgomat_questions (
    workspace_id     UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    quiz_id          TEXT NOT NULL CHECK (quiz_id <> ''),
    question_id      TEXT NOT NULL CHECK (question_id <> ''),
    text             TEXT NOT NULL,
    embedding_model  TEXT,
    embedding_sha256 BYTEA,
    embedding        REAL[],
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, quiz_id, question_id)
);

-- A user-submitted question after moderation, waiting for a moderator. A re-run replaces a
-- pending review but never one a moderator has decided.
CREATE TABLE IF NOT EXISTS valgomat_moderation (
    id             UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id   UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    quiz_id        TEXT NOT NULL CHECK (quiz_id <> ''),
    submission_ref TEXT NOT NULL CHECK (submission_ref <> ''),
    question       TEXT NOT NULL,
    duplicate_of   TEXT,               -- valgomat_questions.question_id, when over the threshold
    similarity     REAL,               -- of the closest existing question
    rewrite        TEXT NOT NULL,
    flags          TEXT[] NOT NULL DEFAULT '{}',
    result         JSONB NOT NULL,
    model          TEXT NOT NULL,
    job_id         UUID,
    status         TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'approved', 'rejected')),
    decided_at     TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT valgomat_moderation_one_per_submission UNIQUE (workspace_id, quiz_id, submission_ref)
);
CREATE INDEX IF NOT EXISTS valgomat_moderation_pending
    ON valgomat_moderation (workspace_id, quiz_id, created_at) WHERE status = 'pending';

-- The prompt lab: one run per (workspace, ref) with its per-model summary, and one row per
-- case x model. A re-run of the same ref replaces its results.
CREATE TABLE IF NOT EXISTS prompt_eval_runs (
    id           UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    run_ref      TEXT NOT NULL CHECK (run_ref <> ''),
    job_id       UUID,
    prompt       TEXT NOT NULL,
    models       TEXT[] NOT NULL,
    summary      JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT prompt_eval_runs_one_per_ref UNIQUE (workspace_id, run_ref)
);

CREATE TABLE IF NOT EXISTS prompt_eval_results (
    run_id            UUID NOT NULL REFERENCES prompt_eval_runs(id) ON DELETE CASCADE,
    workspace_id      UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    model             TEXT NOT NULL,
    case_id           TEXT NOT NULL,
    passed            BOOLEAN NOT NULL,
    output            TEXT,
    error             TEXT,               -- the gateway refused this case (the job went on)
    scores            JSONB NOT NULL,
    latency_ms        INTEGER,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, model, case_id)
);
