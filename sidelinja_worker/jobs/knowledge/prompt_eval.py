"""`prompt_eval`, the prompt lab: a prompt and a test set, run case x model through the gateway,
each answer scored; per-case results and a per-model summary stored in `prompt_eval_runs` /
`prompt_eval_results`.

A run is a job graph: `prompt_eval` checks the run (payload, models, the workspace's call limit
for the whole run) and fans out one `prompt_eval_case` job per case, which asks every model and
scores its answers, and a `prompt_eval_score` join that runs once every case job has finished,
summarises and stores the run (prompt_eval_case.py). Case jobs run in parallel on any worker and
are retried one by one: a transient fault (timeout, 5xx, 429) retries that case alone. A case
the gateway refuses (a 4xx for that model or input) is recorded as failed within its case job. A
case job that fails for good does not stop the run: the score job records its models as errors
and scores the rest. The judge model comes from the payload or `ai.prompt_eval.judge_model` in
the workspace settings."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidelinja_worker.jobs.ai.common import DEFAULT_MODEL
from sidelinja_worker.jobs.knowledge.common import DEFAULT_EMBEDDING_MODEL
from sidelinja_worker.jobs.knowledge.prompt_eval_scoring import (
    Check,
    JudgeCheck,
    RegexCheck,
    Score,
    pattern_error,
    score_all,
)
from sidelinja_worker.jobs.knowledge.store import EvalRow
from sidelinja_worker.jobs.silos import call_guard, check_planned_calls
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway, CallGuard, GuardError

CASE_TYPE = "prompt_eval_case"
SCORE_TYPE = "prompt_eval_score"
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
MAX_OUTPUT_CHARS = 20_000  # stored per result; a runaway answer must not bloat the table
T = TypeVar("T")


class Case(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    inputs: dict[str, str | int | float | bool] = Field(default_factory=dict)
    expect: list[Check] = Field(default_factory=list, max_length=20)


class EvalPayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt: str = Field(min_length=1, description="the user message; {{name}} takes a case input")
    system: str | None = Field(default=None, min_length=1)
    cases: list[Case] = Field(min_length=1, max_length=1000)
    models: list[str] = Field(min_length=1, max_length=20)
    max_concurrency: int = Field(default=4, ge=1, le=32)
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    judge_model: str | None = Field(default=None, min_length=1)
    ref: str | None = Field(default=None, min_length=1, max_length=500)

    @model_validator(mode="after")
    def _check(self) -> EvalPayload:
        ids = [c.id for c in self.cases]
        if len(set(ids)) != len(ids):
            raise ValueError("case ids must be unique")
        if len(set(self.models)) != len(self.models):
            raise ValueError("models must be unique")
        for case in self.cases:
            missing = set(PLACEHOLDER.findall(self.prompt)) - set(case.inputs)
            if missing:
                raise ValueError(f"case {case.id!r} has no input {sorted(missing)[0]!r}")
        return self


class Verdict(BaseModel):
    passed: bool
    reason: str


JUDGE_PROMPT = (
    "You grade an answer produced by a language model against the given criteria. Judge only "
    "whether the answer meets the criteria; be strict. Give a one-sentence reason."
)


@dataclass(frozen=True)
class Outcome:
    row: EvalRow
    judge_usage: Usage


def render(prompt: str, inputs: dict[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: str(inputs[m.group(1)]), prompt)


def chat_body(payload: EvalPayload, case: Case, model: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": payload.system}] if payload.system else []
    messages.append({"role": "user", "content": render(payload.prompt, case.inputs)})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if payload.temperature is not None:
        body["temperature"] = payload.temperature
    if payload.max_tokens is not None:
        body["max_tokens"] = payload.max_tokens
    return body


class Lab:
    """One job's run: the gateway, the concurrency bound, the judge and the progress count."""

    def __init__(
        self, ctx: JobContext, payload: EvalPayload, judge_model: str | None, guard: CallGuard
    ) -> None:
        self.ctx = ctx
        self.payload = payload
        self.judge_model = judge_model
        self.gateway = AiGateway.from_services(ctx.services, guard)
        self.slots = asyncio.Semaphore(payload.max_concurrency)
        self.total = len(payload.cases) * len(payload.models)
        self.done = 0
        self.report_every = max(1, self.total // 50)

    async def run_case(self, case: Case, model: str) -> Outcome:
        async with self.slots:
            outcome = await self._run_case(case, model)
        self.done += 1
        if self.done % self.report_every == 0 or self.done == self.total:
            await self.ctx.progress(
                f"Prompt-lab: {self.done}/{self.total} svar", 5 + 90 * self.done / self.total
            )
        return outcome

    async def _run_case(self, case: Case, model: str) -> Outcome:
        started = time.monotonic()
        try:
            content, usage = await self.gateway.chat(chat_body(self.payload, case, model))
        except GuardError:
            raise  # past the workspace's limits: the whole job stops
        except PermanentError as exc:  # this model or input is refused; the others go on
            return Outcome(EvalRow(model, case.id, False, None, str(exc), [], None, 0, 0), Usage())
        latency_ms = round((time.monotonic() - started) * 1000)
        output = content or ""
        # In a thread: an answer can be megabytes, and JSON parsing and matching it is CPU.
        scores = await asyncio.to_thread(score_all, case.expect, output)
        judge_usage = Usage()
        for check in (c for c in case.expect if isinstance(c, JudgeCheck)):
            verdict, used = await self.judge(case, output, check)
            scores.append(verdict)
            judge_usage += used
        passed = bool(content) and all(s.passed for s in scores)
        row = EvalRow(
            model,
            case.id,
            passed,
            output[:MAX_OUTPUT_CHARS],
            None,
            [s.as_json() for s in scores],
            latency_ms,
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        return Outcome(row, judge_usage)

    async def judge(self, case: Case, output: str, check: JudgeCheck) -> tuple[Score, Usage]:
        assert self.judge_model is not None
        asked = render(self.payload.prompt, case.inputs)
        text = f"Criteria:\n{check.criteria}\n\nQuestion:\n{asked}\n\nAnswer to grade:\n{output}"
        try:
            got = await self.gateway.structured(
                self.judge_model,
                [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": text}],
                Verdict,
            )
        except GuardError:
            raise
        except PermanentError as exc:
            return Score("judge", False, f"judge failed: {exc}"), Usage()
        return Score("judge", got.value.passed, got.value.reason), got.usage


async def gather_bounded(tasks: Sequence[Awaitable[T]]) -> list[T]:
    """All results in order; the first failure cancels the rest and is raised as itself (an
    outage retries the job, rather than surfacing as an ExceptionGroup)."""
    try:
        async with asyncio.TaskGroup() as group:
            running: list[asyncio.Task[T]] = [group.create_task(t) for t in tasks]  # type: ignore[arg-type]
    except BaseExceptionGroup as exc:
        raise exc.exceptions[0] from None
    return [t.result() for t in running]


def summarize(models: Sequence[str], outcomes: Sequence[Outcome]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for model in models:
        rows = [o.row for o in outcomes if o.row.model == model]
        latencies = sorted(r.latency_ms for r in rows if r.latency_ms is not None)
        passed = sum(r.passed for r in rows)
        summary[model] = {
            "cases": len(rows),
            "passed": passed,
            "failed": len(rows) - passed,
            "errors": sum(r.error is not None for r in rows),
            "pass_rate": round(passed / len(rows), 4) if rows else 0.0,
            "latency_ms_mean": round(sum(latencies) / len(latencies)) if latencies else None,
            "latency_ms_p50": latencies[len(latencies) // 2] if latencies else None,
            "latency_ms_max": latencies[-1] if latencies else None,
            "prompt_tokens": sum(r.prompt_tokens for r in rows),
            "completion_tokens": sum(r.completion_tokens for r in rows),
        }
    return summary


async def resolve_judge(ctx: JobContext, payload: EvalPayload) -> str | None:
    settings = (await ctx.workspace_settings()).get("ai") or {}
    configured = (settings.get("prompt_eval") or {}).get("judge_model")
    judge = payload.judge_model or (
        configured if isinstance(configured, str) and configured else None
    )
    if judge is None and any(
        isinstance(c, JudgeCheck) for case in payload.cases for c in case.expect
    ):
        raise PermanentError(
            "a case has a judge check but no judge model is configured "
            "(payload judge_model or workspace setting ai.prompt_eval.judge_model)"
        )
    return judge


def planned_calls(payload: EvalPayload) -> tuple[int, str]:
    """The paid calls a run (or one case's job) needs: every case x model, and a judge call per
    judge check per model."""
    judged = sum(isinstance(c, JudgeCheck) for case in payload.cases for c in case.expect)
    what = f"{len(payload.cases)} cases x {len(payload.models)} models and {judged} judge checks"
    return len(payload.models) * (len(payload.cases) + judged), what


def check_patterns(payload: EvalPayload) -> None:
    """Refuses the payload, naming the check, when a regex check's pattern is one RE2 cannot
    run: such a check could never pass, and the models' calls would be paid for nothing. Each
    distinct pattern is parsed once; CPU, so run it in a thread."""
    parsed: set[str] = set()
    for i, case in enumerate(payload.cases):
        for j, check in enumerate(case.expect):
            if not isinstance(check, RegexCheck) or check.pattern in parsed:
                continue
            parsed.add(check.pattern)
            reason = pattern_error(check.pattern)
            if reason is not None:
                raise PermanentError(
                    f"invalid payload: cases.{i}.expect.{j}.pattern: not a regular expression "
                    f"RE2 can run ({reason}); backreferences and lookaround are not available"
                )


async def run_guard(ctx: JobContext, payload: EvalPayload) -> tuple[str | None, CallGuard]:
    """The judge model and the call guard for the payload's cases, refusing at once (before any
    call, or any case job) a regex check RE2 cannot run, a model the workspace does not allow or
    a plan over its call limit."""
    await asyncio.to_thread(check_patterns, payload)
    judge = await resolve_judge(ctx, payload)
    guard = call_guard(await ctx.workspace_settings(), (DEFAULT_MODEL, DEFAULT_EMBEDDING_MODEL))
    for model in [*payload.models, *([judge] if judge else [])]:
        guard.allow_model(model)
    check_planned_calls(guard, *planned_calls(payload))
    return judge, guard


async def run(ctx: JobContext, payload: EvalPayload) -> dict[str, Any]:
    """Checks the run and fans it out: a case job per case and the score job after them all,
    enqueued with this job's completion. ai.max_paid_calls_per_job applies to the run as a
    whole: a run whose cases need more calls than that fails here, before any case job exists;
    each case job is then held to its own case's calls."""
    judge, _guard = await run_guard(ctx, payload)
    ref = payload.ref or f"job:{ctx.job_id}"
    common = payload.model_dump(mode="json", exclude={"cases", "ref"}) | {"judge_model": judge}
    priority = default_priority("prompt_eval")
    cases = {
        ctx.add_child(
            NewJob(ctx.workspace_id, CASE_TYPE, {**common, "cases": [case]}, priority=priority)
        ): case["id"]
        for case in payload.model_dump(mode="json")["cases"]
    }
    # run_anyway: a case job that fails for good is scored as failed, it does not cancel the run.
    score = ctx.add_join(
        NewJob(
            ctx.workspace_id,
            SCORE_TYPE,
            {
                "ref": ref,
                "prompt": payload.prompt,
                "models": payload.models,
                "judge_model": judge,
                "cases": [
                    {"job_id": str(job_id), "id": case_id} for job_id, case_id in cases.items()
                ],
            },
            priority=priority,
            run_anyway=True,
        ),
        list(cases),
    )
    await ctx.progress(f"Prompt-lab: {len(cases)} tilfeller sendt ut", 100)
    return {"ref": ref, "cases": len(cases), "score_job": str(score)}


JOB_TYPE = JobType(
    name="prompt_eval",
    handler=run,
    payload_model=EvalPayload,
    default_priority=default_priority("prompt_eval"),
    timeout_s=3600,
    description="prompt + test set x models -> scored answers, latency and tokens per model "
    "{prompt, cases: [{id, inputs, expect}], models, max_concurrency?, judge_model?, ref?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
