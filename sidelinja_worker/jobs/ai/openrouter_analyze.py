"""`openrouter_analyze`: metadata for an episode from its transcript — title suggestions,
summary, chapters with start times, topics, people — stored in `ai_results`."""

from __future__ import annotations

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


class AnalyzePayload(TranscriptSource):
    title: str | None = Field(default=None, description="the episode's working title, as context")


class Chapter(BaseModel):
    start: str = Field(
        pattern=r"^\d{1,2}:\d{2}:\d{2}$",
        description="start time H:MM:SS, taken from the transcript's timestamps",
    )
    title: str = Field(min_length=1)
    summary: str


class Person(BaseModel):
    name: str = Field(min_length=1)
    role: str | None = Field(default=None, description="who they are, when the transcript says")


class Analysis(BaseModel):
    title_suggestions: list[str] = Field(min_length=1, description="3 to 5 title suggestions")
    summary: str = Field(min_length=1)
    chapters: list[Chapter]
    topics: list[str]
    people: list[Person]


PROMPT = (
    "You analyse transcripts of podcast episodes for Sidelinja, a Norwegian media platform. "
    "From the transcript, write: 3 to 5 title suggestions; a summary of 3 to 6 sentences; "
    "chapters, each with its start time taken from the [H:MM:SS] timestamps in the transcript "
    "(0:00:00 if there are none), a short title and a one-sentence summary; the main topics; and "
    "the people who speak or are mentioned, with their role when it is said. Write in the "
    "language of the transcript (usually Norwegian bokmål). Use only what the transcript says."
)
COMBINE_PROMPT = (
    "You are given analyses of consecutive parts of one podcast episode, in order. Merge them "
    "into one analysis of the whole episode: title suggestions for the whole episode, one "
    "summary covering every part, all chapters in time order with their start times kept "
    "(merge a chapter that runs across a part boundary), and topics and people without "
    "duplicates. Write in the language of the analyses."
)

TASK = AiTask("openrouter_analyze", Analysis, PROMPT, COMBINE_PROMPT, "Analyserer", "analysis")


async def run(ctx: JobContext, payload: AnalyzePayload) -> dict[str, Any]:
    text = await source_text(ctx, payload)
    note = f"Episode: {payload.title}" if payload.title else ""
    result = await run_ai_task(ctx, TASK, text, note)
    return await store_result(ctx, TASK, result, payload.ref or payload.transcript_ref)


JOB_TYPE = JobType(
    name="openrouter_analyze",
    handler=run,
    payload_model=AnalyzePayload,
    default_priority=default_priority("openrouter_analyze"),
    timeout_s=1800,
    description="transcript -> title suggestions, summary, chapters, topics, people "
    "{transcript_ref | text, ref?, title?}",
    needs_settings=("AI_GATEWAY_URL", "AI_GATEWAY_KEY"),
)
