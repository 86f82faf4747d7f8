"""`meeting_summarize`: a meeting transcript -> minutes: summary, decisions, action points (who,
what, due date when said); stored in `ai_results`."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidelinja_worker.jobs.ai.common import (
    DEFAULT_MODEL,
    AiRun,
    AiSettings,
    AiTask,
    TranscriptSource,
    combine_answers,
    resolve_settings,
    run_ai_task,
    source_text,
    store_result,
    system_message,
    user_message,
)
from sidelinja_worker.jobs.ai.text import budget_chars, split_text
from sidelinja_worker.jobs.silos import call_guard, check_planned_calls
from sidelinja_worker.queue.client import NewJob
from sidelinja_worker.queue.context import JobContext, ParentResult
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType, describe_validation_error
from sidelinja_worker.services.ai_answers import Usage
from sidelinja_worker.services.ai_gateway import AiGateway, CallGuard


class PartOf(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=1)
    count: int = Field(ge=2)


class MeetingPayload(TranscriptSource):
    meeting_date: date | None = Field(default=None, description="turns 'on Friday' into a date")
    participants: list[str] = Field(default_factory=list, max_length=200)
    # Map-reduce as a job graph: a transcript over the context budget becomes one child job
    # per part (run in parallel, on any worker, each retried on its own) and a join job that
    # combines their minutes. Off: the parts are summarised one after another in this job.
    fan_out: bool = False
    part: PartOf | None = None  # set on the graph's part jobs
    combine: bool = False  # set on the graph's join job


class PartUsage(BaseModel):
    model_config = ConfigDict(strict=True)

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    calls: int = Field(default=0, ge=0)


class ActionPoint(BaseModel):
    who: str | None = Field(default=None, description="who is responsible; null if not said")
    what: str = Field(min_length=1)
    due: str | None = Field(
        default=None,
        description="YYYY-MM-DD when it can be worked out, else as said; null if not said",
    )


class Minutes(BaseModel):
    summary: str = Field(min_length=1)
    decisions: list[str]
    action_points: list[ActionPoint]


PROMPT = (
    "You write minutes of a meeting at Sidelinja, a Norwegian media platform, from its "
    "transcript: a summary of what was discussed, the decisions that were made (only real "
    "decisions), and the action points: who does what, and by when if a due date is said. Do "
    "not invent owners or dates. Write in the language of the transcript."
)
COMBINE_PROMPT = (
    "You are given minutes of consecutive parts of one meeting, in order. Merge them into the "
    "minutes of the whole meeting: one summary covering every part, all decisions and action "
    "points without duplicates (a later part may change an earlier decision: keep the final one)."
)

TASK = AiTask("meeting_summarize", Minutes, PROMPT, COMBINE_PROMPT, "Skriver referat", "minutes")


class PartResult(BaseModel):
    """A part job's result as `_summarize_part` writes it."""

    part: int = Field(ge=1, strict=True)
    minutes: Minutes
    usage: PartUsage


def _part_result(parent: ParentResult) -> PartResult:
    """A parent's result read back from the table, where plain SQL in the workspace may have
    rewritten it: one that is not a part's fails the join for good, before any call is paid
    for, as a retry would read the same."""
    try:
        return PartResult.model_validate(parent.result)
    except ValidationError as exc:
        raise PermanentError(
            f"a part job's result is not what a part job writes (job {parent.job_id}): "
            f"{describe_validation_error(exc)}"
        ) from None


def context_note(payload: MeetingPayload) -> str:
    lines = []
    if payload.meeting_date:
        lines.append(
            f"Meeting date: {payload.meeting_date.isoformat()} "
            f"({payload.meeting_date.strftime('%A')})."
        )
    if payload.participants:
        lines.append("Participants: " + ", ".join(payload.participants) + ".")
    return "\n".join(lines)


async def run(ctx: JobContext, payload: MeetingPayload) -> dict[str, Any]:
    if payload.part is not None:
        return await _summarize_part(ctx, payload, payload.part)
    if payload.combine:
        return await _combine_parts(ctx, payload)
    text = await source_text(ctx, payload)
    if payload.fan_out:
        settings, _gateway, guard = await _gateway_for(ctx)
        parts = await asyncio.to_thread(split_text, text, budget_chars(settings.context_tokens))
        if len(parts) > 1:
            # The whole graph's calls, checked before any job of it is made: a call per part
            # and at most one fewer to combine.
            check_planned_calls(guard, 2 * len(parts) - 1, f"a text in {len(parts)} parts")
            return _fan_out(ctx, payload, parts)
    result = await run_ai_task(ctx, TASK, text, context_note(payload))
    return await store_result(ctx, TASK, result, payload.ref or payload.transcript_ref)


def _fan_out(ctx: JobContext, payload: MeetingPayload, parts: list[str]) -> dict[str, Any]:
    """One child per part and a join that combines them, committed with this job's completion."""
    shared = payload.model_dump(
        mode="json", include={"meeting_date", "participants"}, exclude_none=True
    )
    children = [
        ctx.add_child(
            NewJob(
                ctx.workspace_id,
                TASK.job_type,
                {**shared, "text": part, "part": {"index": i, "count": len(parts)}},
            )
        )
        for i, part in enumerate(parts, 1)
    ]
    join = payload.model_dump(mode="json", exclude_none=True) | {"fan_out": False, "combine": True}
    join_id = ctx.add_join(NewJob(ctx.workspace_id, TASK.job_type, join), children)
    return {"parts": len(parts), "part_jobs": [str(c) for c in children], "join": str(join_id)}


async def _gateway_for(ctx: JobContext) -> tuple[AiSettings, AiGateway, CallGuard]:
    """The settings and a gateway bounded by the workspace's models and paid-call limit."""
    raw = await ctx.workspace_settings()
    settings = resolve_settings(raw, TASK)
    guard = call_guard(raw, (DEFAULT_MODEL,))
    guard.allow_model(settings.model)
    return settings, AiGateway.from_services(ctx.services, guard), guard


async def _summarize_part(ctx: JobContext, payload: MeetingPayload, part: PartOf) -> dict[str, Any]:
    settings, gateway, _guard = await _gateway_for(ctx)
    assert payload.text is not None  # a part job carries its part's text
    messages = [
        system_message(settings.prompt, settings.names),
        user_message(payload.text, context_note(payload), part.index, part.count),
    ]
    got = await gateway.structured(settings.model, messages, Minutes)
    return {
        "part": part.index,
        "minutes": got.value.model_dump(mode="json"),
        "model": settings.model,
        "usage": asdict(got.usage),
    }


async def _combine_parts(ctx: JobContext, payload: MeetingPayload) -> dict[str, Any]:
    """The join: the parts' minutes, from its parents' results in part order, combined. The
    fan-out job is a parent too; its result holds no minutes."""
    parts = sorted(
        (
            _part_result(p)
            for p in await ctx.parent_results()
            if isinstance(p.result, dict) and "minutes" in p.result
        ),
        key=lambda r: r.part,
    )
    if not parts:
        raise PermanentError("a combine job needs its part jobs as parents")
    settings, gateway, _guard = await _gateway_for(ctx)
    answers = [r.minutes for r in parts]
    value, more = await combine_answers(gateway, TASK, settings, answers, context_note(payload))
    usage = Usage()
    for r in parts:
        usage += Usage(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.calls)
    run_ = AiRun(value, settings.model, len(parts), usage + more)
    return await store_result(ctx, TASK, run_, payload.ref or payload.transcript_ref)


JOB_TYPE = JobType(
    name="meeting_summarize",
    handler=run,
    payload_model=MeetingPayload,
    default_priority=default_priority("meeting_summarize"),
    timeout_s=1800,
    description="meeting transcript -> summary, decisions, action points "
    "{transcript_ref | text, ref?, meeting_date?, participants?, fan_out?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
