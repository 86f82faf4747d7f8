"""`research_clip`: pasted text (and where it came from) -> a clean, structured clip: title,
summary, key points, quotes, entities; stored in `ai_results`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from sidelinja_worker.jobs.ai.common import AiTask, run_ai_task, store_result
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.priorities import default_priority
from sidelinja_worker.queue.registry import JobType


class ClipPayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str = Field(min_length=1)
    source_url: HttpUrl | None = None
    ref: str | None = Field(default=None, min_length=1)


class Quote(BaseModel):
    text: str = Field(min_length=1, description="word for word from the text")
    speaker: str | None = None


class Entity(BaseModel):
    name: str = Field(min_length=1)
    kind: Literal["person", "organisation", "place", "other"]


class Clip(BaseModel):
    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    key_points: list[str]
    quotes: list[Quote]
    entities: list[Entity]


PROMPT = (
    "You clean up and structure research material pasted by a journalist at Sidelinja, a "
    "Norwegian media platform. Ignore navigation, ads and other page clutter. Write: a short "
    "title; a neutral summary of 2 to 5 sentences; the key points; the notable quotes word for "
    "word with their speaker when known; and the people, organisations and places named. Write "
    "in the language of the text. Use only what the text says."
)
COMBINE_PROMPT = (
    "You are given structured clips of consecutive parts of one text, in order. Merge them into "
    "one clip of the whole text: one title, one summary covering every part, the key points, "
    "quotes and entities of all parts without duplicates."
)

TASK = AiTask("research_clip", Clip, PROMPT, COMBINE_PROMPT, "Strukturerer klipp", "clip")


async def run(ctx: JobContext, payload: ClipPayload) -> dict[str, Any]:
    note = f"Source: {payload.source_url}" if payload.source_url else ""
    result = await run_ai_task(ctx, TASK, payload.text, note)
    stored = await store_result(ctx, TASK, result, payload.ref)
    return {**stored, "source_url": str(payload.source_url) if payload.source_url else None}


JOB_TYPE = JobType(
    name="research_clip",
    handler=run,
    payload_model=ClipPayload,
    default_priority=default_priority("research_clip"),
    timeout_s=600,
    description="pasted text -> title, summary, key points, quotes, entities "
    "{text, source_url?, ref?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
