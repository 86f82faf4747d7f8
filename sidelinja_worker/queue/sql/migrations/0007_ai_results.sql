-- Results of the AI job types. Additive. The platform reads an episode's analysis,
-- a research clip, a cleaned-up note or meeting minutes by its workspace and by what it was made
-- from, long after job_queue rows are pruned, so the answer is kept here as well as in the job's
-- `result`. One row per (workspace, job type, source): a re-run replaces the earlier answer, and
-- two workspaces never share a row.

CREATE TABLE IF NOT EXISTS ai_results (
    id           UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id UUID NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,                              -- the job type that made it
    source_ref   TEXT NOT NULL CHECK (source_ref <> ''),     -- transcript_ref, the caller's ref, or job:<id>
    job_id       UUID,                                       -- the job that wrote this version (jobs are pruned: no FK)
    model        TEXT NOT NULL,
    result       JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT ai_results_one_per_source UNIQUE (workspace_id, kind, source_ref)
);
