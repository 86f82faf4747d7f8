"""`meeting_summarize`: a meeting transcript -> minutes: summary, decisions, action points (who,
what, due date when said); stored in `ai_results`."""

from __future__ import annotations

from datetime import date
from typing import Any

from pydantic import BaseModel, Field

from sidelinja_worker.jobs.ai.common import (
    AiTask,
    TranscriptSource,
    run_ai_task,
    source_text,
    store_result,
)
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType


class MeetingPayload(TranscriptSource):
    meeting_date: date | None = Field(default=None, description="turns 'on Friday' into a date")
    participants: list[str] = Field(default_factory=list, max_length=200)


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
    text = await source_text(ctx, payload)
    result = await run_ai_task(ctx, TASK, text, context_note(payload))
    return await store_result(ctx, TASK, result, payload.ref or payload.transcript_ref)


JOB_TYPE = JobType(
    name="meeting_summarize",
    handler=run,
    payload_model=MeetingPayload,
    default_priority=default_priority("meeting_summarize"),
    timeout_s=1800,
    description="meeting transcript -> summary, decisions, action points "
    "{transcript_ref | text, ref?, meeting_date?, participants?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
