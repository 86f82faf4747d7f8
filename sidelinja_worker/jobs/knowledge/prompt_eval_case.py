"""The two halves of a prompt_eval run (see prompt_eval.py): `prompt_eval_case`, one case asked
of every model and scored, and `prompt_eval_score`, the join that summarises the run and stores
it, with the result `prompt_eval` itself returned before runs were fanned out."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.jobs.knowledge import store as knowledge_store
from sidelinja_worker.jobs.knowledge.prompt_eval import (
    CASE_TYPE,
    SCORE_TYPE,
    Case,
    EvalPayload,
    Lab,
    Outcome,
    gather_bounded,
    run_guard,
    summarize,
)
from sidelinja_worker.jobs.knowledge.store import EvalRow
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.services.ai_answers import Usage


class CasePayload(EvalPayload):
    """A run's payload with exactly one case (and the judge model the run resolved)."""

    cases: list[Case] = Field(min_length=1, max_length=1)


class CaseRow(BaseModel):
    """One model's answer to the case, as a case job's result carries it to the score job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(max_length=500)
    case_id: str = Field(max_length=200)
    passed: bool
    output: str | None = Field(max_length=20_000)
    error: str | None = Field(max_length=20_000)
    scores: list[dict[str, Any]] = Field(max_length=100)
    latency_ms: int | None = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class CaseResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    rows: list[CaseRow] = Field(max_length=20)
    judge_usage: dict[str, int] = Field(default_factory=dict)


class ScoredCase(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: UUID
    id: str = Field(min_length=1, max_length=200)


class ScorePayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    ref: str = Field(min_length=1, max_length=500)
    prompt: str = Field(min_length=1)
    models: list[str] = Field(min_length=1, max_length=20)
    judge_model: str | None = None
    cases: list[ScoredCase] = Field(min_length=1, max_length=1000)


async def run_case(ctx: JobContext, payload: CasePayload) -> dict[str, Any]:
    """The case asked of every model, each answer scored. An outage raises (this case job is
    retried, alone); a refused answer is a failed row; the workspace's limits are checked
    again for this case's calls."""
    judge, guard = await run_guard(ctx, payload)
    lab = Lab(ctx, payload, judge, guard)
    (case,) = payload.cases
    outcomes = await gather_bounded([lab.run_case(case, model) for model in payload.models])
    usage = sum((o.judge_usage for o in outcomes), Usage())
    return {
        "rows": [asdict(o.row) for o in outcomes],
        "judge_usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "calls": usage.calls,
        },
    }


def failed_rows(case: ScoredCase, models: list[str], why: str) -> list[EvalRow]:
    return [EvalRow(m, case.id, False, None, why, [], None, 0, 0) for m in models]


async def score(ctx: JobContext, payload: ScorePayload) -> dict[str, Any]:
    """Every case job's rows, in the run's order of cases; a case job that did not complete
    (failed for good, or cancelled) or whose result is not a case's counts each of its models
    as an error naming it. Stores the run (replacing an earlier run of its ref)."""
    parents = {p.job_id: p for p in await ctx.parent_results()}
    run_job = next((p.job_id for p in parents.values() if p.job_type == "prompt_eval"), ctx.job_id)
    rows: list[EvalRow] = []
    judge_usage = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}
    for case in payload.cases:
        parent = parents.get(case.job_id)
        if parent is None or parent.job_type != CASE_TYPE:
            rows += failed_rows(case, payload.models, f"case job {case.job_id} is not a parent")
            continue
        if parent.status != "completed":
            why = f"case job {case.job_id} ended in {parent.status}"
            rows += failed_rows(case, payload.models, why)
            continue
        try:
            result = CaseResult.model_validate(parent.result)
        except ValidationError:
            rows += failed_rows(case, payload.models, f"case job {case.job_id}: bad result")
            continue
        rows += [EvalRow(**r.model_dump()) for r in result.rows if r.case_id == case.id]
        for key in judge_usage:
            judge_usage[key] += max(0, result.judge_usage.get(key, 0))
    if all(r.error for r in rows):  # nothing answered: a bad key or no credits, not a result
        raise PermanentError(f"every case failed: {rows[0].error}")
    summary = summarize(payload.models, [Outcome(r, Usage()) for r in rows])
    run_id = await knowledge_store.save_eval_run(
        ctx.services.pool,
        ctx.workspace_id,
        payload.ref,
        run_job,
        payload.prompt,
        payload.models,
        {"models": summary, "judge_model": payload.judge_model},
        rows,
    )
    await ctx.progress(f"Prompt-lab: {len(rows)}/{len(rows)} svar", 100)
    return {
        "run_id": str(run_id),
        "ref": payload.ref,
        "summary": summary,
        "judge_model": payload.judge_model,
        "judge_usage": judge_usage,
    }


CASE_JOB_TYPE = JobType(
    name=CASE_TYPE,
    handler=run_case,
    payload_model=CasePayload,
    default_priority=default_priority("prompt_eval"),
    timeout_s=900,
    description="one case of a prompt_eval run, asked of every model and scored "
    "(enqueued by prompt_eval) {prompt, cases: [one case], models, judge_model?, ...}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)

SCORE_JOB_TYPE = JobType(
    name=SCORE_TYPE,
    handler=score,
    payload_model=ScorePayload,
    default_priority=default_priority("prompt_eval"),
    timeout_s=600,
    description="the join of a prompt_eval run: summary per model, run stored "
    "(enqueued by prompt_eval) {ref, prompt, models, judge_model?, cases: [{job_id, id}]}",
)
